"""``strom gateway``: serve the REST gateway (docs/gateway.md) in front of a cluster."""

from __future__ import annotations

import logging

import click

from strom.cli.common import key_value_pairs


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


@click.command("gateway")
@click.option("--bootstrap", "bootstrap_servers", default="127.0.0.1:9123", show_default=True,
              envvar="STROM_BOOTSTRAP_SERVERS", help="The cluster's bootstrap address, HOST:PORT.")
@click.option("--bind", default="127.0.0.1:8080", show_default=True, help="Where the gateway listens, HOST:PORT.")
@click.option("-D", "defines", multiple=True, metavar="KEY=VALUE",
              help="Gateway option (gateway.max-body-size=16mb, gateway.max-user-connections=64) or client "
                   "option for its connections (e.g. -D client.security.protocol=SASL).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def gateway(bootstrap_servers: str, bind: str, defines: tuple[str, ...], log_level: str) -> None:
    """Serve the REST gateway (Fluss FIP-49's shape) for the cluster at --bootstrap.

    Needs the `gateway` extra (FastAPI and uvicorn)."""
    try:
        import uvicorn

        from strom.gateway.app import create_app
    except ImportError as exc:
        raise click.ClickException(f"{exc}; install strom's `gateway` extra: pip install 'strom[gateway]'") from None
    host, port = _address(bind)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(bootstrap_servers, key_value_pairs(defines, "-D"))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), server_header=False)
