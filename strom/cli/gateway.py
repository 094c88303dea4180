"""``strom gateway``: serve the REST gateway (docs/gateway.md) in front of a cluster."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import click

from strom.cli.common import key_value_pairs
from strom.gateway.options import DEFAULT_LISTEN, LISTEN, parse_address

GATEWAY_KEY_PREFIX = "gateway."
"""``-D`` keys of ``strom server`` with this prefix configure its embedded gateway, not the server."""
START_TIMEOUT_S = 30.0


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("gateway")
@click.option("--bootstrap", "bootstrap_servers", default="127.0.0.1:9123", show_default=True,
              envvar="STROM_BOOTSTRAP_SERVERS", help="The cluster's bootstrap address, HOST:PORT.")
@click.option("--bind", default=None,
              help="Where the gateway listens, HOST:PORT (default: -D gateway.rest.listen, else 127.0.0.1:8080).")
@click.option("-D", "defines", multiple=True, metavar="KEY=VALUE",
              help="Gateway option (Fluss's gateway.rest.write.max-request-bytes=32mb, "
                   "gateway.rest.lookup.max-keys=128, ...; gateway.auth.token-file=PATH, "
                   "gateway.console.metrics-endpoints=HOST:PORT,...; docs/gateway.md lists them) or client "
                   "option for its connections (e.g. -D client.security.protocol=SASL).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def gateway(bootstrap_servers: str, bind: str | None, defines: tuple[str, ...], log_level: str) -> None:
    """Serve the REST gateway (Fluss FIP-49's shape) for the cluster at --bootstrap.

    Needs the `gateway` extra (FastAPI and uvicorn)."""
    try:
        import uvicorn

        from strom.gateway.app import create_app
    except ImportError as exc:
        raise click.ClickException(f"{exc}; install strom's `gateway` extra: pip install 'strom[gateway]'") from None
    options = key_value_pairs(defines, "-D")
    host, port = _address(bind or options.get(LISTEN) or DEFAULT_LISTEN)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(bootstrap_servers, options)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    # uvicorn stops on SIGTERM/SIGINT and then raises the signal again for the handler it found: a no-op one
    # here, so that a clean stop exits 0 (as `strom server` does) instead of dying by the signal
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: None)
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), server_header=False)


class EmbeddedGateway:
    """The REST gateway inside ``strom server --gateway HOST:PORT``: uvicorn on a thread of its own (its own
    event loop, so the gateway's work never runs on the server's), a client of that server like any other."""

    def __init__(self, bind: str, options: dict[str, str]) -> None:
        self.bind = bind
        self._host, self._port = _address(bind)
        self._options = options
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, bootstrap: str, log_level: str) -> None:
        """Serve, once the server at ``bootstrap`` listens; returns when the gateway listens.

        Raises:
            RuntimeError: the `gateway` extra is missing, or the gateway did not start (its port is taken).
            ValueError: a gateway option that does not parse.
        """
        try:
            import uvicorn

            from strom.gateway.app import create_app
        except ImportError as exc:
            raise RuntimeError(f"{exc}; install strom's `gateway` extra: pip install 'strom[gateway]'") from None
        app = create_app(bootstrap, self._options)
        config = uvicorn.Config(app, host=self._host, port=self._port, log_level=log_level.lower(),
                                server_header=False, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="strom-gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start (see the log above: is the port taken?)")
            time.sleep(0.05)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(START_TIMEOUT_S)
