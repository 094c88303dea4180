"""What the ``strom`` subcommands that talk to a running server share: options, the connect-run-close
helper, time and lease formatting, and ``KEY=VALUE`` parsing."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import click

from strom.errors import StromError

T = TypeVar("T")

bootstrap_option = click.option(
    "--bootstrap-servers", "-b", default="127.0.0.1:9123", show_default=True, help="HOST:PORT of a strom server."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")


TRUSTSTORE = "strom.truststore"


def _remember_truststore(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    ctx.meta[TRUSTSTORE] = value


def credential_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--username``/``--password``: authenticate with SASL/PLAIN (the server's listener requires it);
    ``--truststore``: connect with TLS, trusting the CAs in that PEM file (SSL or SASL_SSL listeners)."""
    function = click.option(
        "--truststore", envvar="STROM_SSL_TRUSTSTORE", default=None, expose_value=False, callback=_remember_truststore,
        help="Connect with TLS, trusting the CAs in this PEM file (env STROM_SSL_TRUSTSTORE).",
    )(function)
    function = click.option(
        "--password", envvar="STROM_SASL_PASSWORD", default=None, help="SASL/PLAIN password (env STROM_SASL_PASSWORD)."
    )(function)
    return click.option(
        "--username", "-u", envvar="STROM_SASL_USERNAME", default=None,
        help="SASL/PLAIN user name (env STROM_SASL_USERNAME); omit for a listener without authentication.",
    )(function)


def client_config(bootstrap_servers: str, username: str | None, password: str | None) -> dict[str, str]:
    """The client options for the connection (Fluss's client option names), with ``--truststore``'s TLS."""
    config = {"bootstrap.servers": bootstrap_servers}
    context = click.get_current_context(silent=True)
    truststore = context.meta.get(TRUSTSTORE) if context is not None else None
    if truststore:
        config.update({"client.security.protocol": "SSL", "client.security.ssl.truststore": truststore})
    if username is not None:
        if password is None:
            raise click.BadParameter("--password (or STROM_SASL_PASSWORD) is needed with --username")
        config.update({
            "client.security.protocol": "SASL_SSL" if truststore else "SASL",
            "client.security.sasl.mechanism": "PLAIN",
            "client.security.sasl.username": username,
            "client.security.sasl.password": password,
        })
    return config


def run_on_server(bootstrap: str | Mapping[str, str], action: Callable[[Any], Awaitable[T]]) -> T:
    """Connect, run ``action(connection)``, close; errors become one clear line (exit code 1).

    ``bootstrap``: ``HOST:PORT``, or the whole client config (with credentials, for example)."""
    from strom.client import Connection

    async def main() -> T:
        async with await Connection.create(bootstrap) as connection:
            return await action(connection)

    try:
        return asyncio.run(main())
    except StromError as exc:
        raise click.ClickException(f"{type(exc).__name__} (code {exc.code}): {exc}") from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def format_time(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def lease_json(lease: Any) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "expiration_ms": lease.expiration_ms,
        "snapshots": [
            {"table_id": b.table_id, "partition_id": b.partition_id, "bucket": b.bucket, "snapshot_id": s}
            for b, s in sorted(lease.snapshots.items(), key=lambda item: (item[0].table_id, item[0].partition_id or -1, item[0].bucket))
        ],
    }


def key_value_pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments of a repeatable flag as a dict (the last of a repeated key wins)."""
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{flag} expects KEY=VALUE, got {value!r}")
        pairs[key.strip()] = rest.strip()
    return pairs
