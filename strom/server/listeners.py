"""The listeners after the first of ``bind.listeners`` (Fluss's ``NAME://HOST:PORT,NAME://HOST:PORT``).

Each is a port of its own with its own protocol (PLAINTEXT or SASL, from ``security.protocol.map``),
served by its own :class:`~strom.rpc.server.RpcServer` over the same handlers. GetMetadata answers on a
listener with that listener's address, as Fluss does, so a client that bootstrapped on it keeps talking
to it (the coordinator knows only the main listener's address). Authorization is the same on every
listener: strom has no internal listener whose requests skip it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from strom.rpc.api_keys import ApiKey
from strom.rpc.server import Handler, RequestContext, RpcServer, bind_listener
from strom.security.authenticator import PlainAuthenticator
from strom.security.server_security import ListenerSecurity

RpcServerFactory = Callable[[Mapping[ApiKey, Handler], PlainAuthenticator | None], RpcServer]


class ExtraListeners:
    """Binds, serves and stops the extra listeners. Used on the server's event loop only."""

    def __init__(self, listeners: Sequence[ListenerSecurity], advertised_host: str | None) -> None:
        self._listeners = tuple(listeners)
        self._advertised_host = advertised_host
        self._sockets: list[socket.socket] = []
        self.servers: list[RpcServer] = []
        self.ports: dict[str, int] = {}
        """Listener name → bound port (a configured 0 becomes the port the system picked)."""

    def bind(self) -> None:
        """Bind every extra listener (before start-up ends, so a port clash stops the start).

        Raises:
            OSError: a port is taken.
        """
        for security in self._listeners:
            sock = bind_listener(security.listener.host, security.listener.port)
            self._sockets.append(sock)
            self.ports[security.listener.name] = sock.getsockname()[1]

    async def start(self, handlers: Mapping[ApiKey, Handler], make_server: RpcServerFactory) -> None:
        assert len(self._sockets) == len(self._listeners)
        for security, sock in zip(self._listeners, self._sockets, strict=True):
            host = self._advertised_host or security.listener.host
            if host in ("0.0.0.0", "::", ""):
                host = "127.0.0.1"
            served = dict(handlers)
            metadata = served.get(ApiKey.GET_METADATA)
            if metadata is not None:
                served[ApiKey.GET_METADATA] = _advertising(metadata, host, self.ports[security.listener.name])
            server = make_server(served, security.authenticator)
            await server.start(sock, security.tls)
            self.servers.append(server)

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()
        self.servers.clear()
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()


def _advertising(handler: Handler, host: str, port: int) -> Handler:
    """``handler`` (GetMetadata, which never waits) answering with ``host:port`` as every node's address."""

    def metadata(request: Any, context: RequestContext) -> Any:
        response = handler(request, context)
        assert not hasattr(response, "__await__"), "GetMetadata is expected to answer inline"
        for node in (response.coordinator_server, *response.tablet_servers):  # type: ignore[union-attr]
            node.host = host
            node.port = port
        return response

    return metadata
