"""Connections from one server of a cluster to the others (coordinator to tablet servers, and back), and
:class:`ServerNode`, where a server of the cluster answers.

One connection per address, opened on first use and opened again once it broke; a request that fails
because the peer is down raises the RPC layer's error to the caller, which decides whether to retry.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from strom.rpc.api_keys import ApiKey
from strom.rpc.auth import ClientCredentials
from strom.rpc.client import RpcConnection
from strom.rpc.endpoints import Endpoint
from strom.rpc.messages import pb

log = logging.getLogger(__name__)

PEER_REQUEST_TIMEOUT_MS = 30_000
ALL_BUCKETS = -1
"""The bucket id of a StopReplica entry that stands for every bucket of the table (or partition)."""


@dataclass(frozen=True, slots=True)
class ServerNode:
    """A server of the cluster: its id, the address the other servers reach it at (its internal listener),
    and every listener's endpoint, from which a client is told the one of the listener it came through."""

    node_id: int
    host: str
    port: int
    endpoints: tuple[Endpoint, ...] = ()
    """Every listener's advertised endpoint; empty for a server known by one address only."""
    rack: str | None = None
    """``tablet-server.rack``: where replicas are spread over (None: not given)."""
    memory_bytes: int | None = None
    """The memory a tablet server registered (``tablet-server.advertised-resource.memory-size`` or what it
    found), for the coordinator's KV leader replica capacity; None: not reported."""

    def for_listener(self, listener: str | None) -> ServerNode | None:
        """This server as a client on ``listener`` reaches it; None when it has no such listener (clients on
        that listener are not told about it, as in Fluss). A node without endpoints, or no listener name,
        answers with its one address."""
        if listener is None or not self.endpoints:
            return self
        for endpoint in self.endpoints:
            if endpoint.name == listener:
                return ServerNode(self.node_id, endpoint.host, endpoint.port, rack=self.rack)
        return None

    def to_pb(self) -> Any:
        node = pb.PbServerNode(node_id=self.node_id, host=self.host, port=self.port)
        if self.rack is not None:
            node.rack = self.rack
        return node


class PeerConnections:
    """Owned by one event loop."""

    def __init__(
        self, timeout_ms: int = PEER_REQUEST_TIMEOUT_MS,
        credentials: Callable[[str], ClientCredentials | None] | None = None, tls: ssl.SSLContext | None = None,
    ) -> None:
        """``credentials(server_name)``: how this server logs in to the server it reaches by that name
        (``strom.security.internal``: the login names the server it is meant for); ``tls``: how it reaches
        them when they listen with TLS."""
        self._timeout_ms = timeout_ms
        self._credentials = credentials
        self._tls = tls
        self._connections: dict[tuple[str, str], RpcConnection] = {}
        self._opening: dict[tuple[str, str], asyncio.Lock] = {}

    async def request(self, host: str, port: int, key: ApiKey, message: Message, *, server_name: str) -> Message:
        """Send ``message`` to the server ``server_name`` (``coordinator``, ``tablet-server-<id>``) at
        ``host:port``."""
        connection = await self._connection(host, port, server_name)
        return await connection.request(key, message, timeout_ms=self._timeout_ms)

    async def _connection(self, host: str, port: int, server_name: str) -> RpcConnection:
        key = (f"{host}:{port}", server_name)
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            connection = self._connections.get(key)
            if connection is None or connection.is_closed:
                credentials = self._credentials(server_name) if self._credentials is not None else None
                connection = self._connections[key] = await RpcConnection.connect(
                    host, port, timeout_ms=self._timeout_ms, credentials=credentials, tls=self._tls
                )
            return connection

    async def close(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            try:
                await connection.close()
            except Exception as exc:  # closing a broken connection must not stop the shutdown
                log.debug("closing a peer connection failed: %s", exc)


__all__ = ["PEER_REQUEST_TIMEOUT_MS", "PeerConnections"]
