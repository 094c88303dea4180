"""Client side of a Fluss RPC connection: pipelined requests matched to responses by request id.

One connection carries any number of concurrent requests. A lost connection fails every pending request
with :class:`~strom.errors.NetworkError`; the caller decides whether to reconnect and retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TypeVar

from strom.errors import (
    ConnectionFailedError,
    CorruptMessageError,
    NetworkError,
    RequestTimeoutError,
    UnsupportedVersionError,
    error_for_code,
)
from strom.rpc import framing
from strom.rpc.api_keys import STROM_CLIENT_NAME, ApiKey, ApiVersionRange
from strom.rpc.messages import DecodeError, Message, pb, response_class

M = TypeVar("M", bound=Message)

CLIENT_SOFTWARE_NAME = STROM_CLIENT_NAME
CLIENT_SOFTWARE_VERSION = "0.1.0"


class RpcConnection:
    """A connection to one server, after the ApiVersions handshake."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str) -> None:
        self.address = address
        self._reader = reader
        self._writer = writer
        self._pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._next_request_id = 0
        self._server_versions: dict[int, ApiVersionRange] = {}
        self._closed_error: Exception | None = None
        self._reader_task = asyncio.create_task(self._read_responses())

    @classmethod
    async def connect(cls, host: str, port: int, *, timeout_ms: int = 10_000) -> RpcConnection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_ms / 1000)
        except (TimeoutError, OSError) as exc:
            raise ConnectionFailedError(f"cannot connect to {host}:{port}: {exc or 'timed out'}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = cls(reader, writer, f"{host}:{port}")
        try:
            response = await connection._send(
                ApiKey.API_VERSIONS,
                0,
                pb.ApiVersionsRequest(
                    client_software_name=CLIENT_SOFTWARE_NAME, client_software_version=CLIENT_SOFTWARE_VERSION
                ),
                pb.ApiVersionsResponse,
                timeout_ms,
            )
        except BaseException:
            await connection.close()
            raise
        for version in response.api_versions:
            connection._server_versions[version.api_key] = ApiVersionRange(version.min_version, version.max_version)
        return connection

    @property
    def is_closed(self) -> bool:
        return self._closed_error is not None

    def server_supports(self, key: ApiKey) -> bool:
        return int(key) in self._server_versions

    async def request(self, key: ApiKey, message: Message, *, timeout_ms: int = 30_000) -> Message:
        """Send ``message`` as api ``key`` at the highest version both sides know; return the response."""
        versions = self._server_versions.get(int(key))
        if versions is None:
            raise UnsupportedVersionError(f"server {self.address} does not support {key.name}")
        cls = response_class(key)
        assert cls is not None, key
        return await self._send(key, versions.max_version, message, cls, timeout_ms)

    async def _send(self, key: ApiKey, version: int, message: Message, cls: type[M], timeout_ms: int) -> M:
        if self._closed_error is not None:
            raise NetworkError(f"connection to {self.address} is closed: {self._closed_error}")
        request_id = self._next_request_id
        self._next_request_id = (self._next_request_id + 1) & framing.REQUEST_ID_MASK
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._writer.write(framing.encode_request(int(key), version, request_id, message.SerializeToString()))
        try:
            await self._writer.drain()
            response_type, body = await asyncio.wait_for(future, timeout_ms / 1000)
        except TimeoutError as exc:
            raise RequestTimeoutError(f"{key.name} to {self.address} timed out after {timeout_ms} ms") from exc
        except (ConnectionError, OSError) as exc:
            raise NetworkError(f"connection to {self.address} failed: {exc}") from exc
        finally:
            self._pending.pop(request_id, None)
        try:
            if response_type == framing.RESPONSE_ERROR:
                error = pb.ErrorResponse.FromString(body)
                raise error_for_code(error.error_code, error.error_message or None)
            if response_type != framing.RESPONSE_SUCCESS:
                raise CorruptMessageError(f"{key.name} from {self.address}: unknown response type {response_type}")
            return cls.FromString(body)
        except DecodeError as exc:  # the caller gets a strom error, never a protobuf internals one
            raise CorruptMessageError(f"{key.name} from {self.address}: unparsable response: {exc}") from exc

    async def _read_responses(self) -> None:
        try:
            while True:
                length_bytes = await self._reader.readexactly(framing.LENGTH_SIZE_BYTES)
                (length,) = framing.LENGTH.unpack(length_bytes)
                if length < framing.RESPONSE_HEADER_SIZE_BYTES:
                    raise NetworkError(f"malformed response frame of {length} bytes")
                frame = await self._reader.readexactly(length)
                response_type, request_id = framing.RESPONSE_HEADER.unpack_from(frame, 0)
                future = self._pending.get(request_id)
                if future is not None and not future.done():
                    future.set_result((response_type, frame[framing.RESPONSE_HEADER_SIZE_BYTES :]))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, NetworkError) as exc:
            self._fail_pending(exc)
        except asyncio.CancelledError:
            self._fail_pending(NetworkError("connection closed"))
            raise

    def _fail_pending(self, exc: Exception) -> None:
        self._closed_error = exc
        for future in self._pending.values():
            if not future.done():
                future.set_exception(NetworkError(f"connection to {self.address} lost: {exc!r}"))

    async def close(self) -> None:
        if self._closed_error is None:
            self._closed_error = NetworkError("closed by the client")
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader_task
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
