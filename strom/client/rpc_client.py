"""The RPC plumbing of strom's client: one RPC connection per server (the protocol multiplexes every request
over it), the metadata cache, and requests to the active coordinator and to bucket leaders that are sent
again while a coordinator or a leadership moves. A server connection that was lost is reconnected once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from strom.client.backpressure import MAX_THROTTLE_DEFAULT, MAX_THROTTLE_KEY, BucketThrottle
from strom.client.metadata import MetadataCache
from strom.config import parse_duration
from strom.errors import (
    ConnectionFailedError,
    LeaderNotAvailableError,
    NetworkError,
    NotCoordinatorLeaderError,
    NotLeaderOrFollowerError,
    StromError,
    UnknownTableOrBucketError,
)
from strom.ids import TableBucket
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import EncodedRequest, Message
from strom.security.credentials import credentials_from_config
from strom.security.tls import client_context_from_config


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bootstrap.servers entries must be HOST:PORT, got {address!r}")
    return host, int(port)


COORDINATOR_ATTEMPTS_MAX = 20
COORDINATOR_RETRY_S = 0.25
"""A request to the coordinator that was surely not processed is tried again for about 5 s while another
coordinator takes over (or the one named is still a standby)."""

T = TypeVar("T")

LEADER_ATTEMPTS_MAX = 40
LEADER_RETRY_MS = 100
"""A read sent to a bucket's former leader is re-sent to the one the metadata names next, for about 35 s
(backing off 0.1 s more per attempt, up to 1 s), as long as the writer retries: an election after a
tablet server's loss waits for its ZooKeeper session to time out."""
LEADERSHIP_MOVED = (
    NotLeaderOrFollowerError, LeaderNotAvailableError, UnknownTableOrBucketError, ConnectionFailedError, NetworkError
)
"""What a request to a bucket's leader meets while that leadership moves: ask the metadata again."""


class ClusterRpc:
    """The RPC side of a :class:`~strom.client.connection.Connection`: one RPC connection per server, the
    metadata cache, and requests to the coordinator and to bucket leaders that follow their leadership.
    Admin, tables, writers and scanners send through it."""

    def __init__(self, config: Mapping[str, str]) -> None:
        servers = config.get("bootstrap.servers")
        if not servers:
            raise ValueError("the client config needs 'bootstrap.servers' (HOST:PORT[,HOST:PORT...])")
        self.config = dict(config)
        self._bootstrap = [_split_address(entry) for entry in servers.split(",") if entry.strip()]
        self.request_timeout_ms = int(
            parse_duration(config.get("client.request-timeout", "30s")).total_seconds() * 1000
        )
        self.connect_timeout_ms = int(
            parse_duration(config.get("client.connect-timeout", "10s")).total_seconds() * 1000
        )
        # SASL credentials (client.security.protocol=SASL …), sent on every server connection
        self._credentials = credentials_from_config(config)
        # TLS (client.security.protocol SSL or SASL_SSL) on every server connection
        self.tls = client_context_from_config(config)
        self._connections: dict[str, RpcConnection] = {}
        self._connecting: dict[str, asyncio.Future[RpcConnection]] = {}
        self.metadata = MetadataCache(self)
        self.write_throttle = BucketThrottle(
            parse_duration(config.get(MAX_THROTTLE_KEY, MAX_THROTTLE_DEFAULT)).total_seconds()
        )
        """Buckets whose writes wait for their server's back-pressure (strom/client/backpressure.py)."""
        self._closed = False

    @property
    def authenticates(self) -> bool:
        """Whether server connections log in (SASL)."""
        return self._credentials is not None

    def _open_connection(self, address: str) -> RpcConnection | None:
        """The connection to ``address`` if it is open: found without a coroutine (every request asks)."""
        existing = self._connections.get(address)
        return existing if existing is not None and not existing.is_closed else None

    async def _server(self, address: str) -> RpcConnection:
        existing = self._open_connection(address)
        if existing is not None:
            return existing
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[RpcConnection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            host, port = _split_address(address)
            connection = await RpcConnection.connect(
                host, port, timeout_ms=self.connect_timeout_ms, credentials=self._credentials, tls=self.tls
            )
            self._connections[address] = connection
            future.set_result(connection)
            return connection
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            self._connecting.pop(address, None)

    async def request(self, address: str, key: ApiKey, message: Message | EncodedRequest) -> Any:
        """Send one request to ``address``, reconnecting once if the connection had been lost."""
        if self._closed:
            raise NetworkError("the connection is closed")
        for attempt in range(2):
            connection = self._open_connection(address) or await self._server(address)
            try:
                return await connection.request(key, message, timeout_ms=self.request_timeout_ms)
            except NetworkError:
                if attempt == 1 or not connection.is_closed:
                    raise
        raise AssertionError("unreachable")

    async def bootstrap_request(self, key: ApiKey, message: Message) -> Message:
        """Send to the first bootstrap server that answers."""
        last: Exception | None = None
        for host, port in self._bootstrap:
            try:
                return await self.request(f"{host}:{port}", key, message)
            except (ConnectionFailedError, NetworkError) as exc:
                last = exc
        raise ConnectionFailedError(f"no bootstrap server answered: {last}")

    async def coordinator_request(self, key: ApiKey, message: Message) -> Message:
        """Send to the active coordinator. When it cannot be reached or answers that it is a standby
        (another coordinator took over), the metadata is refreshed and a request that surely was not
        processed is sent again to the coordinator the cluster names then, for a few seconds."""
        for attempt in range(COORDINATOR_ATTEMPTS_MAX):
            address = await self.metadata.coordinator_address()
            try:
                return await self.request(address, key, message)
            except (ConnectionFailedError, NotCoordinatorLeaderError, NetworkError) as exc:
                unsent = isinstance(exc, (ConnectionFailedError, NotCoordinatorLeaderError))
                if not unsent or attempt == COORDINATOR_ATTEMPTS_MAX - 1:
                    raise  # the request may have been processed before the connection broke
                await self.metadata.refresh()
                if await self.metadata.coordinator_address() == address:
                    await asyncio.sleep(COORDINATOR_RETRY_S)  # an election is under way
        raise AssertionError("unreachable")

    async def leader_request(self, bucket: TableBucket, key: ApiKey, message: Message) -> Message:
        return await self.request(await self.metadata.leader_address(bucket), key, message)

    async def while_leadership_moves(self, buckets: Iterable[TableBucket], read: Callable[[], Awaitable[T]]) -> T:
        """Run ``read`` (a request that may be repeated) against the leaders of ``buckets``; while one of
        their leaderships moves (NotLeaderOrFollower, LeaderNotAvailable, UnknownTableOrBucket, or the leader
        unreachable) forget their leaders and run it again, for about 35 s. Any other error is raised."""
        for attempt in range(LEADER_ATTEMPTS_MAX):
            try:
                return await read()
            except LEADERSHIP_MOVED:
                if attempt == LEADER_ATTEMPTS_MAX - 1:
                    raise
                for bucket in buckets:
                    self.metadata.invalidate(bucket)
                await asyncio.sleep(LEADER_RETRY_MS * min(attempt + 1, 10) / 1000)
        raise AssertionError("unreachable")

    async def read_from_leader(
        self, bucket: TableBucket, key: ApiKey, message: Message | EncodedRequest,
        bucket_error: Callable[[Any], StromError | None],
    ) -> tuple[Any, str]:
        """Send a read that may be repeated (a lookup, a scan's opening) to ``bucket``'s leader, following its
        leadership (:meth:`while_leadership_moves`); return the response, whose per-bucket error
        ``bucket_error`` extracts, and the address that answered."""

        async def read() -> tuple[Any, str]:
            address = self.metadata.cached_leader_address(bucket) or await self.metadata.leader_address(bucket)
            response = await self.request(address, key, message)
            error = bucket_error(response)
            if error is not None:
                raise error
            return response, address

        return await self.while_leadership_moves([bucket], read)

    async def close(self) -> None:
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(connection.close() for connection in connections), return_exceptions=True)


__all__ = ["LEADERSHIP_MOVED", "LEADER_RETRY_MS", "ClusterRpc"]
