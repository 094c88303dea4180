"""Client side of a Fluss RPC connection: pipelined requests matched to responses by request id.

One connection carries any number of concurrent requests. A lost connection fails every pending request
with :class:`~strom.errors.NetworkError`; the caller decides whether to reconnect and retry.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any, TypeVar

from strom.errors import (
    AuthenticationError,
    ConnectionFailedError,
    CorruptMessageError,
    NetworkError,
    RequestTimeoutError,
    UnsupportedVersionError,
    error_for_code,
)
from strom.rpc import framing
from strom.rpc.api_keys import STROM_CLIENT_NAME, ApiKey, ApiVersionRange
from strom.rpc.auth import ClientCredentials
from strom.rpc.messages import DecodeError, EncodedRequest, Message, pb, response_class

M = TypeVar("M", bound=Message)

CLIENT_SOFTWARE_NAME = STROM_CLIENT_NAME
CLIENT_SOFTWARE_VERSION = "0.1.0"
SWEEP_INTERVAL_S = 0.1
AUTHENTICATE_ROUNDS_MAX = 8


class _ResponseProtocol(asyncio.Protocol):
    """Reads response frames and completes the matching request futures as bytes arrive (no reader task:
    a response wakes its caller directly)."""

    def __init__(self, connection: RpcConnection) -> None:
        self._connection = connection
        self._frames = framing.FrameBuffer(framing.RESPONSE_FRAME_SIZE_BYTES_MAX, framing.RESPONSE_HEADER_SIZE_BYTES)
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._frames.feed(data)
        except ValueError as exc:
            self._connection._fail_pending(NetworkError(f"malformed response frame: {exc}"))
            if self.transport is not None:
                self.transport.close()
            return
        pending = self._connection._pending
        for frame in frames:
            response_type, request_id = framing.RESPONSE_HEADER.unpack_from(frame, 0)
            future = pending.get(request_id)
            if future is not None and not future.done():
                future.set_result((response_type, frame[framing.RESPONSE_HEADER_SIZE_BYTES :]))

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection._fail_pending(exc or NetworkError("the server closed the connection"))
        self._release_drain_waiters()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._release_drain_waiters()

    def _release_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def paused(self) -> bool:
        """The transport's write buffer is over its high-water mark: writers wait in :meth:`drain`."""
        return self._paused

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark (back pressure)."""
        if self._paused and self._connection._closed_error is None:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter


class RpcConnection:
    """A connection to one server, after the ApiVersions handshake."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._protocol = _ResponseProtocol(self)
        self._pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._deadlines: dict[int, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._next_request_id = 0
        self._server_versions: dict[int, ApiVersionRange] = {}
        self._closed_error: Exception | None = None

    @classmethod
    async def connect(
        cls, host: str, port: int, *, timeout_ms: int = 10_000, credentials: ClientCredentials | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> RpcConnection:
        """Connect (over TLS, given ``tls``), exchange ApiVersions and, given ``credentials``, authenticate
        (SASL).

        Raises:
            ConnectionFailedError: nothing answers at ``host:port``, the TLS handshake failed, or the
                ApiVersions or SASL exchange timed out or lost the connection.
            AuthenticationError: the server refused the credentials.
        """
        connection = cls(f"{host}:{port}")
        loop = asyncio.get_running_loop()
        try:
            # asyncio.timeout, not wait_for: before Python 3.12 wait_for returns the result instead of
            # raising when it is cancelled just as the connection completes, and the cancelled caller goes on
            async with asyncio.timeout(timeout_ms / 1000):
                await loop.create_connection(lambda: connection._protocol, host, port, ssl=tls,
                                             server_hostname=host if tls is not None else None)
        except (TimeoutError, OSError) as exc:
            raise ConnectionFailedError(f"cannot connect to {host}:{port}: {exc or 'timed out'}") from exc
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
            if credentials is not None:
                await connection._authenticate(credentials, timeout_ms)
        except (RequestTimeoutError, NetworkError) as exc:
            # No request of the caller's went out, so say so: a process stopped (SIGSTOP) or hung still has
            # its connections accepted by the kernel, and only the handshake finds out nothing answers.
            await connection.close()
            raise ConnectionFailedError(f"no handshake with {host}:{port}: {exc}") from exc
        except BaseException:
            await connection.close()
            raise
        for version in response.api_versions:
            connection._server_versions[version.api_key] = ApiVersionRange(version.min_version, version.max_version)
        return connection

    async def _authenticate(self, credentials: ClientCredentials, timeout_ms: int) -> None:
        exchange = credentials.exchange()
        token = exchange.first()
        for _ in range(AUTHENTICATE_ROUNDS_MAX):
            response = await self._send(
                ApiKey.AUTHENTICATE, 0, pb.AuthenticateRequest(protocol=credentials.mechanism, token=token),
                pb.AuthenticateResponse, timeout_ms,
            )
            if not response.HasField("challenge"):
                exchange.finish()  # a mutual login refuses a server that never proved itself
                return
            token = exchange.respond(response.challenge)
        raise AuthenticationError(f"{self.address} kept challenging after {AUTHENTICATE_ROUNDS_MAX} rounds")

    @property
    def is_closed(self) -> bool:
        return self._closed_error is not None

    def server_supports(self, key: ApiKey) -> bool:
        return int(key) in self._server_versions

    async def request(
        self, key: ApiKey, message: Message | EncodedRequest, *, timeout_ms: int = 30_000, version: int | None = None
    ) -> Any:
        """Send ``message`` as api ``key`` at ``version`` (default: the highest version both sides know); return
        the response (for an EncodedRequest, what its ``parse`` makes of the body)."""
        versions = self._server_versions.get(int(key))
        if versions is None:
            raise UnsupportedVersionError(f"server {self.address} does not support {key.name}")
        cls = response_class(key)
        assert cls is not None, key
        return await self._send(key, versions.max_version if version is None else version, message, cls, timeout_ms)

    async def _send(
        self, key: ApiKey, version: int, message: Message | EncodedRequest, cls: type[M], timeout_ms: int
    ) -> Any:
        transport = self._protocol.transport
        if self._closed_error is not None or transport is None or transport.is_closing():
            raise NetworkError(f"connection to {self.address} is closed: {self._closed_error}")
        request_id = self._next_request_id
        self._next_request_id = (self._next_request_id + 1) & framing.REQUEST_ID_MASK
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self._pending[request_id] = future
        if isinstance(message, EncodedRequest):
            body, parse = message.body, message.parse
        else:
            body, parse = message.SerializeToString(), cls.FromString
        transport.write(framing.encode_request(int(key), version, request_id, body))
        # One sweeper per connection expires requests, instead of a timer (or asyncio.wait_for's extra
        # task) per request: a request may time out up to SWEEP_INTERVAL_S late.
        self._deadlines[request_id] = loop.time() + timeout_ms / 1000
        if self._sweeper is None:
            self._sweeper = loop.call_later(SWEEP_INTERVAL_S, self._sweep)
        try:
            if self._protocol.paused:
                await self._protocol.drain()
            response_type, response_body = await future
        except TimeoutError as exc:
            raise RequestTimeoutError(f"{key.name} to {self.address} timed out after {timeout_ms} ms") from exc
        except (ConnectionError, OSError) as exc:
            raise NetworkError(f"connection to {self.address} failed: {exc}") from exc
        finally:
            self._pending.pop(request_id, None)
            self._deadlines.pop(request_id, None)
        try:
            if response_type == framing.RESPONSE_ERROR:
                error = pb.ErrorResponse.FromString(response_body)
                raise error_for_code(error.error_code, error.error_message or None)
            if response_type != framing.RESPONSE_SUCCESS:
                raise CorruptMessageError(f"{key.name} from {self.address}: unknown response type {response_type}")
            return parse(response_body)
        except (DecodeError, ValueError) as exc:  # the caller gets a strom error, never a protobuf internals one
            raise CorruptMessageError(f"{key.name} from {self.address}: unparsable response: {exc}") from exc

    def _sweep(self) -> None:
        self._sweeper = None
        now = asyncio.get_running_loop().time()
        for request_id, deadline in list(self._deadlines.items()):
            if deadline <= now:
                future = self._pending.get(request_id)
                if future is not None and not future.done():
                    future.set_exception(TimeoutError())
        if self._deadlines and self._closed_error is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self._sweep)

    def _fail_pending(self, exc: Exception) -> None:
        if self._closed_error is None:
            self._closed_error = exc
        for future in self._pending.values():
            if not future.done():
                future.set_exception(NetworkError(f"connection to {self.address} lost: {exc!r}"))

    def abort(self) -> None:
        """Drop the connection at once (what a network failure looks like; used by tests)."""
        if self._protocol.transport is not None:
            self._protocol.transport.abort()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._fail_pending(NetworkError("closed by the client"))
        transport = self._protocol.transport
        if transport is not None and not transport.is_closing():
            transport.close()

