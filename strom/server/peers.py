"""Connections from one server of a cluster to the others (coordinator to tablet servers, and back).

One connection per address, opened on first use and opened again once it broke; a request that fails
because the peer is down raises the RPC layer's error to the caller, which decides whether to retry.
"""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import Message

from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection

log = logging.getLogger(__name__)

PEER_REQUEST_TIMEOUT_MS = 30_000


class PeerConnections:
    """Owned by one event loop."""

    def __init__(self, timeout_ms: int = PEER_REQUEST_TIMEOUT_MS) -> None:
        self._timeout_ms = timeout_ms
        self._connections: dict[str, RpcConnection] = {}
        self._opening: dict[str, asyncio.Lock] = {}

    async def request(self, host: str, port: int, key: ApiKey, message: Message) -> Message:
        connection = await self._connection(host, port)
        return await connection.request(key, message, timeout_ms=self._timeout_ms)

    async def _connection(self, host: str, port: int) -> RpcConnection:
        address = f"{host}:{port}"
        lock = self._opening.setdefault(address, asyncio.Lock())
        async with lock:
            connection = self._connections.get(address)
            if connection is None or connection.is_closed:
                connection = self._connections[address] = await RpcConnection.connect(
                    host, port, timeout_ms=self._timeout_ms
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
