"""Every listener of a server process (Fluss's ``bind.listeners``: ``NAME://HOST:PORT,NAME://HOST:PORT``).

Each listener is a port of its own with its own protocol (PLAINTEXT, SASL, SSL or SASL_SSL, from
``security.protocol.map``), served by its own :class:`~strom.rpc.server.RpcServer` over the same handlers,
which know the listener a request came in on: GetMetadata answers with every server's endpoint of that
listener, so a client that bootstrapped on it keeps talking to it. Authorization is the same on every
listener; the servers of a cluster log in to each other on the internal one.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping

from strom.rpc.api_keys import ApiKey
from strom.rpc.endpoints import Endpoint, advertised_endpoints
from strom.rpc.server import Handler, RpcServer, bind_listener
from strom.security.authenticator import PlainAuthenticator
from strom.security.server_security import ListenerSecurity, ServerSecurity

log = logging.getLogger(__name__)

RpcServerFactory = Callable[[Mapping[ApiKey, Handler], PlainAuthenticator | None, str], RpcServer]
"""Builds the RPC server of one listener from its handlers, client authenticator and name."""


class ServerListeners:
    """Binds, serves and stops a process's listeners. Used on the server's event loop only.

    The main listener's address is given apart (``--bind`` sets it, a test passes port 0); the others are
    those after the first of ``bind.listeners``.
    """

    def __init__(self, security: ServerSecurity, host: str, port: int) -> None:
        main = ListenerSecurity(Endpoint(security.listener.name, host, port), security.authenticator, security.tls)
        self._listeners = (main, *security.extra_listeners)
        self._sockets: list[socket.socket] = []
        self.servers: list[RpcServer] = []
        self.bound: list[Endpoint] = []
        """Each listener with the port it got (a configured 0 becomes the port the system picked)."""

    @property
    def main(self) -> RpcServer | None:
        """The main listener's server (once started)."""
        return self.servers[0] if self.servers else None

    @property
    def main_port(self) -> int:
        return self.bound[0].port

    def bind(self) -> None:
        """Bind every listener (before start-up ends, so a port clash stops the start).

        Raises:
            OSError: a port is taken.
        """
        for security in self._listeners:
            sock = bind_listener(security.listener.host, security.listener.port)
            self._sockets.append(sock)
            self.bound.append(Endpoint(security.listener.name, security.listener.host, sock.getsockname()[1]))

    def advertised(self, advertised_listeners: str | None, advertised_host: str | None) -> tuple[Endpoint, ...]:
        """What this process announces (``advertised.listeners``, ``advertised.host``), once bound.

        Raises:
            InvalidConfigError: ``advertised.listeners`` names a listener that is not bound.
        """
        assert self.bound, "bind() first"
        return tuple(advertised_endpoints(self.bound, advertised_listeners, advertised_host))

    async def start(self, handlers: Mapping[ApiKey, Handler], make_server: RpcServerFactory) -> None:
        assert len(self._sockets) == len(self._listeners)
        for security, sock in zip(self._listeners, self._sockets, strict=True):
            server = make_server(handlers, security.authenticator, security.listener.name)
            await server.start(sock, security.tls)
            self.servers.append(server)
        self._log_protocols()

    def _log_protocols(self) -> None:
        """Say at start what each listener protects, and warn of one that is weaker than the others: SASL
        without TLS sends passwords in clear, and a listener without login beside ones that require it
        lets anyone in."""
        any_login = any(security.authenticator is not None for security in self._listeners)
        for security, bound in zip(self._listeners, self.bound, strict=True):
            login, tls, protocol = security.authenticator is not None, security.tls is not None, security.protocol
            if login and not tls:
                log.warning("listener %s on %s:%d is SASL without TLS: passwords and data cross the network in "
                            "clear", bound.name, bound.host, bound.port)
            elif any_login and not login:
                log.warning("listener %s on %s:%d takes no login (%s) while others require one: anyone who "
                            "reaches it is let in", bound.name, bound.host, bound.port, protocol)
            else:
                log.info("listener %s on %s:%d: %s", bound.name, bound.host, bound.port, protocol)

    def set_handlers(self, handlers: Mapping[ApiKey, Handler]) -> None:
        """Serve ``handlers`` on every listener from now on (a standby coordinator that became active)."""
        for server in self.servers:
            server.set_handlers(handlers)

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()
        self.servers.clear()
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()


__all__ = ["RpcServerFactory", "ServerListeners"]
