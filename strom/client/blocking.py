"""Blocking point lookups for latency-sensitive synchronous code (no event loop in the request path).

An asyncio round trip costs this machine ~100 µs at the median; a blocking socket, ~65 µs (deps-lab).
``BlockingLookuper`` keeps one plain TCP connection per bucket leader and sends each Lookup on the
calling thread. It takes bucket leaders and partition ids from the connection's metadata cache (filled
when the table was loaded, or by an async lookup of the partition), so it never awaits anything.

Not thread-safe: use one per thread. Close it when done.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from strom.client import encoding
from strom.client.lookup import _KeyedReader, one_bucket_values
from strom.client.table_handle import TableHandle
from strom.errors import (
    ConnectionFailedError,
    CorruptMessageError,
    LeaderNotAvailableError,
    NetworkError,
    error_for_code,
)
from strom.ids import TableBucket
from strom.rpc import framing, lookup_wire
from strom.rpc.api_keys import STROM_CLIENT_NAME, ApiKey
from strom.rpc.messages import DecodeError, pb

LOOKUP_VERSION = 1
_LOOKUP = int(ApiKey.LOOKUP)  # a plain int: an enum member's lookup costs ~0.1 µs a lookup
TIMEOUT_S = 30.0
RECEIVE_BYTES = 1 << 16
"""The first read of a response takes up to this much: a point lookup's answer in one system call."""


def use_kernel_timeouts(sock: socket.socket, timeout_s: float) -> None:
    """Let the kernel time out a send or receive (SO_SNDTIMEO, SO_RCVTIMEO) and put the socket in blocking
    mode: a Python socket with a timeout polls before every send and receive, two system calls where one
    does (~3 µs of a ~60 µs lookup here). A timed-out call raises an OSError (EAGAIN), as a Python timeout
    raises one."""
    seconds = int(timeout_s)
    interval = struct.pack("ll", seconds, int((timeout_s - seconds) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, interval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, interval)
    sock.settimeout(None)


class _BlockingRpc:
    """One blocking socket to a server, after the ApiVersions handshake."""

    def __init__(self, address: str, timeout_s: float) -> None:
        host, _, port = address.rpartition(":")
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        except OSError as exc:
            raise ConnectionFailedError(f"cannot connect to {address}: {exc}") from exc
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        use_kernel_timeouts(self._sock, timeout_s)
        self._fd = self._sock.fileno()
        self._address = address
        self._request_id = 0
        hello = pb.ApiVersionsRequest(client_software_name=STROM_CLIENT_NAME, client_software_version="0.1.0")
        try:
            self.call(ApiKey.API_VERSIONS, 0, hello, pb.ApiVersionsResponse)
        except NetworkError as exc:  # as the asyncio client says: no request of the caller's went out
            raise ConnectionFailedError(f"no handshake with {address}: {exc}") from exc

    def call(self, key: ApiKey, version: int, message: Any, response_class: Any) -> Any:
        return response_class.FromString(self.call_bytes(key, version, message.SerializeToString()))

    def call_bytes(self, key: ApiKey, version: int, body: bytes) -> bytes:
        """Send a serialized request body; the response body, or the error it carries raised."""
        self._request_id = (self._request_id + 1) & framing.REQUEST_ID_MASK
        try:
            self._sock.sendall(framing.encode_request(int(key), version, self._request_id, body))
            frame = self._read_frame()
        except OSError as exc:
            self.close()
            raise NetworkError(f"connection to {self._address} failed: {exc}") from exc
        response_type, request_id = framing.RESPONSE_HEADER.unpack_from(frame, 0)
        if request_id != self._request_id:
            self.close()
            raise NetworkError(f"{self._address} answered request {request_id}, expected {self._request_id}")
        body = frame[framing.RESPONSE_HEADER_SIZE_BYTES :]
        if response_type == framing.RESPONSE_SUCCESS:
            return body
        if response_type != framing.RESPONSE_ERROR:
            raise CorruptMessageError(f"{self._address} answered with unknown response type {response_type}")
        try:  # the caller gets a strom error, never a protobuf internals one (as from the asyncio client)
            error = pb.ErrorResponse.FromString(body)
        except DecodeError as exc:
            raise CorruptMessageError(f"{self._address} sent an unparsable ErrorResponse: {exc}") from exc
        if not error.HasField("error_code"):
            raise CorruptMessageError(f"{self._address} sent an ErrorResponse without its error_code")
        raise error_for_code(error.error_code, error.error_message or None)

    def lookup_one(self, table_id: int, partition_id: int | None, bucket_id: int, key: bytes) -> bytes | None:
        """The stored value of one key of one bucket (None: no row); raises the bucket's error. One C call
        where the module is built: a single lookup's client side is then mostly its two system calls."""
        round_trip = lookup_wire.lookup_round_trip
        if round_trip is None:
            body = lookup_wire.lookup_request(table_id, partition_id, bucket_id, (key,))
            return one_bucket_values(self.call_bytes(ApiKey.LOOKUP, LOOKUP_VERSION, body), 1)[0]
        self._request_id = request_id = (self._request_id + 1) & framing.REQUEST_ID_MASK
        try:
            answer = round_trip(self._fd, _LOOKUP, LOOKUP_VERSION, request_id, table_id, partition_id, bucket_id, key)
        except OSError as exc:
            self.close()
            raise NetworkError(f"connection to {self._address} failed: {exc}") from exc
        except ValueError as exc:
            raise CorruptMessageError(str(exc)) from exc
        if isinstance(answer, tuple):
            raise error_for_code(*answer)
        return answer

    def _read_frame(self) -> bytes:
        """The response frame after its length: usually one ``recv`` (one request is in flight, so anything
        past the frame is a protocol error)."""
        data = self._sock.recv(RECEIVE_BYTES)
        if len(data) < framing.LENGTH_SIZE_BYTES:
            data += self._read(framing.LENGTH_SIZE_BYTES - len(data))
        (length,) = framing.LENGTH.unpack_from(data, 0)
        if length < framing.RESPONSE_HEADER_SIZE_BYTES or length > framing.RESPONSE_FRAME_SIZE_BYTES_MAX:
            self.close()
            raise NetworkError(f"malformed response frame of {length} bytes from {self._address}")
        end = framing.LENGTH_SIZE_BYTES + length
        if len(data) < end:
            data += self._read(end - len(data))
        elif len(data) > end:
            self.close()
            raise NetworkError(f"{self._address} sent {len(data) - end} bytes no request asked for")
        return data[framing.LENGTH_SIZE_BYTES:]

    def _read(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self._sock.recv(size)
            if not chunk:
                raise ConnectionResetError("the server closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        self._fd = -1  # the number may name another file once closed
        self._sock.close()


class BlockingLookuper(_KeyedReader):
    """``lookuper.lookup({"id": 1})`` → the row as a dict, or None, without asyncio."""

    def __init__(self, table: TableHandle, timeout_s: float = TIMEOUT_S) -> None:
        """Raises ValueError on a connection that authenticates or speaks TLS: the blocking path has neither."""
        if table.connection.tls is not None or table.connection.authenticates:
            raise ValueError("the blocking lookuper speaks neither SASL nor TLS; use create_lookuper()")
        super().__init__(table, table.layout.primary_key)
        self._timeout_s = timeout_s
        self._metadata = table.connection.metadata
        self._servers: dict[str, _BlockingRpc] = {}
        self._leaders: dict[tuple[int, str | None], tuple[int, _BlockingRpc, int, int | None]] = {}
        """(bucket id, partition name) → (the metadata cache's leaders version, the leader's connection, table
        id, partition id): a lookup's route without a metadata lookup."""

    def lookup(self, key: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any] | None:
        """Raises LeaderNotAvailableError if the table's (or partition's) metadata is not cached: load it
        with ``await connection.get_table(...)`` (or one async lookup into the partition) first."""
        simple = self._simple_key(key)
        if simple is None:
            layout = self._table.layout
            batch = self._full_row_batch([key])
            encoded = encoding.encode(layout, batch, with_rows=False, with_keys=True)
            assert encoded.keys is not None
            partitions = encoding.partition_names(layout, batch)
            simple = (encoded.keys[0], encoded.buckets[0], partitions[0] if partitions else None)
        key_bytes, bucket_id, partition_name = simple
        leader = self._leaders.get((bucket_id, partition_name))
        if leader is None or leader[0] != self._metadata.leaders_version or leader[1].closed:
            leader = self._leader(bucket_id, partition_name)
        _version, server, table_id, partition_id = leader
        value = server.lookup_one(table_id, partition_id, bucket_id, key_bytes)
        return None if value is None else self._decode_one(value)

    def _leader(self, bucket_id: int, partition_name: str | None) -> tuple[int, _BlockingRpc, int, int | None]:
        """The connection to a bucket's leader, as the metadata cache names it now (kept until the cache's
        leaders move or the connection fails), with the ids a request names the bucket by."""
        metadata = self._metadata
        version = metadata.leaders_version
        info = self._table.layout.info
        partition_id = None
        if partition_name is not None:
            partition_id = metadata.cached_partition_id(info.table_id, partition_name)
            if partition_id is None:
                raise LeaderNotAvailableError(
                    f"partition {partition_name!r} of {info.path} is not in the metadata cache; "
                    "look it up once with the async Lookuper"
                )
        bucket = TableBucket(info.table_id, bucket_id, partition_id)
        address = metadata.cached_leader_address(bucket)
        if address is None:
            raise LeaderNotAvailableError(f"no cached leader for {bucket}; reload the table with get_table()")
        server = self._servers.get(address)
        if server is None or server.closed:  # a connection that failed is opened again
            server = self._servers[address] = _BlockingRpc(address, self._timeout_s)
        leader = self._leaders[(bucket_id, partition_name)] = (version, server, info.table_id, partition_id)
        return leader

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        self._leaders.clear()

    def __enter__(self) -> BlockingLookuper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
