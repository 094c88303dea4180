"""An asyncio server for Fluss RPC frames.

Each connection's requests run concurrently and their responses go out in completion order: the official
client multiplexes everything (admin calls, writes, 500 ms FetchLog long-polls) over one connection per
server and matches responses by request id. Limits keep a misbehaving client from hurting the others:
frames longer than ``frame_size_bytes_max`` close the connection before their body is read; at most
``in_flight_count_max`` requests per connection run at once (reading pauses beyond that); requests
answered inline (lookups, limit scans) run at most ``INLINE_BATCH_COUNT`` per turn of the event loop and
not at all while the client is not reading its answers; and a server-wide budget bounds the bytes of
large frames still being received (:mod:`strom.rpc.budget`).

Shared across tasks: ``RpcServer._connections`` (mutated only on the event loop thread).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from strom.errors import (
    AuthenticationError,
    CorruptMessageError,
    StromError,
    UnsupportedVersionError,
    code_for_exception,
)
from strom.rpc import framing
from strom.rpc.admission import ConnectionAdmission
from strom.rpc.api_keys import EXTENSION_KEYS, STROM_CLIENT_NAME, ApiKey, version_range
from strom.rpc.auth import (
    ANONYMOUS,
    Authenticator,
    Challenge,
    Principal,
    SaslServerExchange,
    unauthenticated_error,
)
from strom.rpc.budget import SMALL_FRAME_SIZE_BYTES, BufferedRequestBudget
from strom.rpc.messages import DecodeError, Message, pb, request_class

_AUTHENTICATE = int(ApiKey.AUTHENTICATE)
_API_VERSIONS = int(ApiKey.API_VERSIONS)
"""Compared with every request's api key as plain ints (an enum member's lookup costs ~0.1 µs)."""

log = logging.getLogger(__name__)

INLINE_BATCH_COUNT = 16
"""Inline requests one connection may run before other connections get a turn."""


@dataclass(slots=True)
class RequestContext:
    """What a handler may know about the request besides its body."""

    api_key: ApiKey
    api_version: int
    request_id: int
    peer: str
    connection_id: int
    principal: Principal | None = None
    """Who the connection authenticated as (``User:ANONYMOUS`` on a listener without authentication)."""
    listener: str | None = None
    """The name of the listener the request came in on (None: a server with unnamed listeners)."""


Response: TypeAlias = Message | bytes
"""A handler's answer: a message, or its body already serialized (Lookup writes its own bytes,
lookup_wire.py)."""

Handler = (
    Callable[[Message, RequestContext], Awaitable[Response]]
    | Callable[[Message, RequestContext], Response | Awaitable[Response]]
)
"""An RPC handler: a coroutine function, or a plain function for handlers that rarely wait (lookups,
metadata reads). Plain ones run inline as their frame is read, without a task per request; one that must
wait for a request (a lookup that inserts missing keys) returns an awaitable, which gets a task then."""


@dataclass(frozen=True, slots=True)
class WithBodyPath:
    """A handler with a short path that answers the common requests from their body's bytes, before any
    protobuf object or request context is made: ``answer(body)`` returns the response body (or an awaitable
    of it, for an answer that waits), or None to leave the request to ``handler``. A point lookup is nearly
    all such overhead (lookup_wire.py).

    The short path is taken only while this object is the route's handler itself: a handler wrapped by the
    access rules (authorization on) is a plain function again, so every request then goes through them.
    """

    handler: Handler
    answer: Callable[[bytes], bytes | Awaitable[bytes] | None]

    def __call__(self, request: Message, context: RequestContext) -> Response | Awaitable[Response]:
        return self.handler(request, context)


@dataclass(frozen=True, slots=True)
class _Route:
    key: ApiKey
    handler: Handler
    request_class: type[Message]
    min_version: int
    max_version: int
    inline: bool
    answer_body: Callable[[bytes], bytes | Awaitable[bytes] | None] | None = None


@dataclass(frozen=True, slots=True)
class _Pending:
    """A request whose short path (:class:`WithBodyPath`) answers later: its body once ``answer`` is done."""

    context: RequestContext
    answer: Awaitable[bytes]


@dataclass(slots=True)
class ServerStats:
    """Counters for tests and metrics; mutated only on the event loop."""

    connections_opened: int = 0
    connections_closed_on_bad_frame: int = 0
    requests: int = 0
    requests_by_api: dict[int, int] = field(default_factory=dict)
    """Requests routed, by api key (what the metrics' per-API rates come from)."""
    error_responses: int = 0
    failed_authentications: int = 0
    internal_errors: list[str] = field(default_factory=list)


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0 picks a free port), bound before the handlers exist so the
    server can advertise its real port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


UNAUTHENTICATED_FRAME_SIZE_BYTES_MAX = 512 * 1024
"""Kafka's ``sasl.server.max.receive.size``: what a connection may send before it has authenticated."""
FAILED_AUTHENTICATION_DELAY_MS = 100
"""Kafka's ``connection.failed.authentication.delay.ms``."""
FAILURE_LOG_INTERVAL_S = 10.0


class _RateLimitedLog:
    """At most one warning per interval; the next one says how many were left out."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._next_s = 0.0
        self._suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next_s:
            self._suppressed += 1
            return
        if self._suppressed:
            message += f" ({self._suppressed} more such failures not logged)"
            self._suppressed = 0
        self._next_s = now + self._interval_s
        log.warning(message, *args)


class RpcServer:
    """Serves Fluss RPC on one TCP port and dispatches each api key to its handler."""

    def __init__(
        self,
        handlers: Mapping[ApiKey, Handler],
        *,
        frame_size_bytes_max: int,
        in_flight_count_max: int,
        idle_timeout_ms: int,
        buffered_request_bytes_max: int | None = None,
        on_connection_closed: Callable[[int], None] | None = None,
        authenticator: Authenticator | None = None,
        authentication_required: bool | None = None,
        unauthenticated_frame_size_bytes_max: int = UNAUTHENTICATED_FRAME_SIZE_BYTES_MAX,
        failed_authentication_delay_ms: int = FAILED_AUTHENTICATION_DELAY_MS,
        listener: str | None = None,
        admission: ConnectionAdmission | None = None,
        unauthenticated_idle_timeout_ms: int | None = None,
    ) -> None:
        """``authenticator`` checks Authenticate requests. ``authentication_required`` (by default: whether
        there is an authenticator): a connection may send only ApiVersions and Authenticate until it has
        authenticated; otherwise it starts as ``User:ANONYMOUS`` and may authenticate (a cluster's servers
        do, on any listener).

        Until a connection on a listener that requires authentication has authenticated, its frames may be
        at most ``unauthenticated_frame_size_bytes_max`` (Kafka's ``sasl.server.max.receive.size``), take
        nothing of the shared buffered-request budget, and bytes that complete no frame do not keep it from
        the idle timeout. A failed authentication is answered after ``failed_authentication_delay_ms`` and
        the connection closed (Kafka's ``connection.failed.authentication.delay.ms``). ``listener``: the
        listener's name, which handlers see in :attr:`RequestContext.listener`."""
        assert frame_size_bytes_max > framing.REQUEST_HEADER_SIZE_BYTES
        assert in_flight_count_max >= 1
        self._routes: dict[int, _Route] = {}
        self.set_handlers(handlers)
        self._frame_size_bytes_max = frame_size_bytes_max
        self._in_flight_count_max = in_flight_count_max
        self._idle_timeout_ms = idle_timeout_ms
        self.budget = BufferedRequestBudget(max(buffered_request_bytes_max or 0, frame_size_bytes_max + 4))
        self._on_connection_closed = on_connection_closed
        self.listener = listener
        self._authenticator = authenticator
        self._authentication_required = (
            authenticator is not None if authentication_required is None else authentication_required
        )
        self._unauthenticated_frame_size_bytes_max = min(unauthenticated_frame_size_bytes_max, frame_size_bytes_max)
        self._failed_authentication_delay_s = failed_authentication_delay_ms / 1000
        self._failure_log = _RateLimitedLog(FAILURE_LOG_INTERVAL_S)
        self.admission = admission
        """Connection counts, unauthenticated memory and failed logins, shared by a process's listeners."""
        self._unauthenticated_idle_timeout_ms = min(unauthenticated_idle_timeout_ms or idle_timeout_ms, idle_timeout_ms)
        assert authenticator is not None or not self._authentication_required
        self._server: asyncio.AbstractServer | None = None
        self._connections: dict[int, _Connection] = {}
        self._next_connection_id = 0
        self._idle_task: asyncio.Task[None] | None = None
        self.stats = ServerStats()

    async def start(self, sock: socket.socket, tls: ssl.SSLContext | None = None) -> None:
        """Serve connections on a socket from :func:`bind_listener`, over TLS given ``tls``."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_connection, sock=sock, ssl=tls)
        self._idle_task = asyncio.create_task(self._close_idle_connections())

    async def stop(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections.values()):
            connection.close()
        for connection in list(self._connections.values()):
            await connection.cancel_in_flight()
        if self._server is not None:
            await self._server.wait_closed()

    def _new_connection(self) -> _Connection:
        self._next_connection_id += 1
        self.stats.connections_opened += 1
        return _Connection(self, self._next_connection_id)

    async def _close_idle_connections(self) -> None:
        """Close connections idle past the idle timeout; those that have not logged in, past the shorter
        unauthenticated one."""
        interval_s = max(0.05, min(self._unauthenticated_idle_timeout_ms / 1000 / 4, 30.0))
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            deadline = now - self._idle_timeout_ms / 1000
            unauthenticated_deadline = now - self._unauthenticated_idle_timeout_ms / 1000
            for connection in list(self._connections.values()):
                limit = deadline if connection.principal is not None else unauthenticated_deadline
                if connection.in_flight_count == 0 and connection.last_active < limit and not connection.refusing:
                    log.info("closing idle connection %s", connection.peer)
                    connection.close()

    def set_handlers(self, handlers: Mapping[ApiKey, Handler]) -> None:
        """Serve ``handlers`` from the next request on (a standby coordinator that became the active one)."""
        routes = dict(handlers)
        routes.setdefault(ApiKey.API_VERSIONS, self._api_versions)
        built: dict[int, _Route] = {}
        for key, handler in routes.items():
            message_class = request_class(key)
            if message_class is None:
                continue  # not in our protocol definitions: answered as unsupported
            versions = version_range(key)
            inline = not inspect.iscoroutinefunction(handler)
            answer_body = handler.answer if isinstance(handler, WithBodyPath) else None
            built[int(key)] = _Route(key, handler, message_class, versions.min_version, versions.max_version, inline,
                                     answer_body)
        self._routes = built

    def _api_versions(self, request: Message, context: RequestContext) -> Message:
        response = pb.ApiVersionsResponse()
        include_extensions = request.client_software_name == STROM_CLIENT_NAME  # type: ignore[attr-defined]
        for key in ApiKey:
            if key in EXTENSION_KEYS and not include_extensions:
                continue
            versions = version_range(key)
            response.api_versions.add(
                api_key=int(key), min_version=versions.min_version, max_version=versions.max_version
            )
        # server_type stays unset: one port serves both the coordinator and the tablet-server role, and
        # the client rejects a node whose declared type differs from the role it expected.
        return response

    def route(self, frame: bytes, connection: _Connection) -> tuple[_Route, Message, RequestContext] | _Pending | bytes:
        """Parse and validate one request frame: its route, request and context; or the response frame (an
        error, or a short path's answer), or a short path's answer to come."""
        self.stats.requests += 1
        api_key, api_version, request_id = framing.REQUEST_HEADER.unpack_from(frame, 0)  # no header object
        if api_key == _AUTHENTICATE or (connection.principal is None and api_key != _API_VERSIONS):
            return self._authenticate(framing.RequestHeader(api_key, api_version, request_id), frame, connection)
        route = self._routes.get(api_key)
        if route is None:
            try:
                name = f"{ApiKey(api_key).name} ({api_key})"
            except ValueError:
                return self._error_frame(request_id, UnsupportedVersionError(f"unknown api key {api_key}"))
            return self._error_frame(request_id, UnsupportedVersionError(f"strom does not serve {name}"))
        by_api = self.stats.requests_by_api
        by_api[api_key] = by_api.get(api_key, 0) + 1
        if not route.min_version <= api_version <= route.max_version:
            return self._error_frame(
                request_id,
                UnsupportedVersionError(f"{route.key.name} version {api_version} is not supported"),
            )
        if route.answer_body is not None:
            try:
                answer = route.answer_body(frame[framing.REQUEST_HEADER_SIZE_BYTES :])
            except Exception as exc:  # answered as the handler's failure would be
                context = RequestContext(route.key, api_version, request_id, connection.peer, connection.connection_id)
                return self.respond(context, exc)
            if isinstance(answer, bytes):
                return framing.encode_response(framing.RESPONSE_SUCCESS, request_id, answer)
            if answer is not None:
                return _Pending(RequestContext(route.key, api_version, request_id, connection.peer,
                                               connection.connection_id), answer)
        try:
            request = route.request_class.FromString(frame[framing.REQUEST_HEADER_SIZE_BYTES :])
        except (DecodeError, ValueError, RuntimeError) as exc:
            return self._error_frame(request_id, CorruptMessageError(f"cannot parse {route.key.name} body: {exc}"))
        if not request.IsInitialized():
            # Python's parser accepts a body without its required fields (for example one cut off at a field
            # boundary); handlers would then act on default values the client never sent.
            missing = ", ".join(request.FindInitializationErrors())
            return self._error_frame(
                request_id, CorruptMessageError(f"{route.key.name} body lacks required fields: {missing}")
            )
        context = RequestContext(
            route.key, api_version, request_id, connection.peer, connection.connection_id,
            connection.principal, self.listener,
        )
        return route, request, context

    def _authenticate(self, header: framing.RequestHeader, frame: bytes, connection: _Connection) -> bytes:
        """Answer Authenticate, or refuse a request sent before authentication completed (Fluss's rules)."""
        if header.api_key != ApiKey.AUTHENTICATE:
            return self._error_frame(header.request_id, unauthenticated_error())
        try:
            request = pb.AuthenticateRequest.FromString(frame[framing.REQUEST_HEADER_SIZE_BYTES :])
        except (DecodeError, ValueError, RuntimeError) as exc:
            return self._error_frame(header.request_id, CorruptMessageError(f"cannot parse Authenticate body: {exc}"))
        if self._authenticator is None:
            return self._error_frame(header.request_id, AuthenticationError("this listener does not use SASL"))
        try:
            # also on a connection that authenticated before: new credentials are checked like the first
            if connection.login is None or connection.login[0] != request.protocol:
                connection.login = (request.protocol, self._authenticator.begin(request.protocol))
            result = connection.login[1].step(request.token)
        except Exception as exc:
            connection.login = None
            if self.admission is not None:
                connection.failure_delay_s = self.admission.login_failed(connection.address)
            # whatever a token does to an authenticator, it is a failed login: delayed, counted, logged at
            # most once per interval, never a dropped connection with a traceback
            failure = exc if isinstance(exc, StromError) else AuthenticationError("authentication failed: malformed token")
            self.stats.failed_authentications += 1
            self._failure_log.warning("authentication from %s failed: %s", connection.peer,
                                      exc if isinstance(exc, StromError) else repr(exc))
            connection.failed_authentication = True  # answered after a delay, then closed
            return self._error_frame(header.request_id, failure)
        if isinstance(result, Challenge):  # another round: the connection stays unauthenticated meanwhile
            body = pb.AuthenticateResponse(challenge=result.data).SerializeToString()
            return framing.encode_response(framing.RESPONSE_SUCCESS, header.request_id, body)
        connection.login = None
        connection.authenticated(result, self._frame_size_bytes_max)
        body = pb.AuthenticateResponse().SerializeToString()  # complete: no challenge
        return framing.encode_response(framing.RESPONSE_SUCCESS, header.request_id, body)

    def respond(self, context: RequestContext, response: Response | BaseException) -> bytes:
        """The response frame for a handler's result or failure."""
        if isinstance(response, BaseException):
            exc = response
            if not isinstance(exc, StromError):  # every failure becomes an error response; the server keeps serving
                if isinstance(exc, AssertionError):
                    self.stats.internal_errors.append(f"{context.api_key.name}: {exc!r}")
                log.error("%s from %s failed", context.api_key.name, context.peer, exc_info=exc)
            return self._error_frame(context.request_id, exc)
        if isinstance(response, bytes):
            return framing.encode_response(framing.RESPONSE_SUCCESS, context.request_id, response)
        try:
            body = response.SerializeToString()
        except Exception as exc:
            log.exception("%s from %s: unserialisable response", context.api_key.name, context.peer)
            return self._error_frame(context.request_id, exc)
        return framing.encode_response(framing.RESPONSE_SUCCESS, context.request_id, body)

    def _error_frame(self, request_id: int, exc: BaseException) -> bytes:
        self.stats.error_responses += 1
        code, message = code_for_exception(exc)
        body = pb.ErrorResponse(error_code=code, error_message=message[:4096]).SerializeToString()
        return framing.encode_response(framing.RESPONSE_ERROR, request_id, body)


class _Connection(asyncio.Protocol):
    """One client connection: reassembles frames and runs each request as its own task."""

    def __init__(self, server: RpcServer, connection_id: int) -> None:
        self._server = server
        self.connection_id = connection_id
        self.principal: Principal | None = None if server._authentication_required else ANONYMOUS
        self.failed_authentication = False
        """The last Authenticate failed: its answer goes out after the server's delay, then the connection closes."""
        self.login: tuple[str, SaslServerExchange] | None = None
        """A login under way (mechanism, exchange): a challenge was sent, its answer is awaited."""
        self.failure_delay_s = server._failed_authentication_delay_s
        """How long the answer to a failed login waits (longer for an address that failed before)."""
        self.refusing = False
        """A failed login's answer is pending, then the connection closes (not idle for the idle sweep)."""
        self.address = "?"
        self._admitted = False
        self._unauthenticated_bytes = 0
        """Bytes of partial frames this connection holds of the server's budget for unauthenticated ones."""
        frame_limit = server._frame_size_bytes_max if self.principal is not None else server._unauthenticated_frame_size_bytes_max
        self._frames = framing.FrameBuffer(frame_limit, framing.REQUEST_HEADER_SIZE_BYTES)
        self._transport: asyncio.Transport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Frames read but not started: one read may carry many frames, and at most in_flight_count_max of
        # them run at once. Reading stays paused while any wait, so this holds at most one read's worth.
        self._waiting: collections.deque[bytes] = collections.deque()
        self._reading_paused = False
        self._reserved_bytes = 0  # of the server's buffered-request budget, for the frame being received
        self._waiting_for_budget = False
        self._start_scheduled = False
        self._writing_paused = False
        self.peer = "?"
        self.in_flight_count = 0
        self.last_active = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peername = transport.get_extra_info("peername")
        self.peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        self.address = str(peername[0]) if peername else "?"
        admission = self._server.admission
        if admission is not None:
            if admission.admit(self.address) is not None:
                transport.abort()  # type: ignore[attr-defined]  # over a limit: closed before anything is read
                return
            self._admitted = True
        self._server._connections[self.connection_id] = self

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.pop(self.connection_id, None)
        admission = self._server.admission
        if admission is not None and self._admitted:
            self._admitted = False
            admission.release(self.address)
            self._give_back_unauthenticated_bytes()
        self._transport = None
        self._waiting.clear()  # nobody can receive their answers; the client retries what it needs
        self._server.budget.forget(self.connection_id)
        if self._reserved_bytes:
            reserved, self._reserved_bytes = self._reserved_bytes, 0
            self._server.budget.release(reserved)
        if self._server._on_connection_closed is not None:
            self._server._on_connection_closed(self.connection_id)

    def authenticated(self, principal: Principal, frame_size_bytes_max: int) -> None:
        self.principal = principal
        self._frames.set_frame_size_bytes_max(frame_size_bytes_max)
        self._give_back_unauthenticated_bytes()

    def _give_back_unauthenticated_bytes(self) -> None:
        """Return what this connection holds of the server's budget for connections not logged in."""
        if self._server.admission is not None and self._unauthenticated_bytes:
            self._server.admission.hold_unauthenticated(-self._unauthenticated_bytes)
            self._unauthenticated_bytes = 0

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._frames.feed(data)
        except ValueError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self._server.stats.connections_closed_on_bad_frame += 1
            self.close()
            return
        if frames or self.principal is not None:  # before authentication only whole frames count as activity
            self.last_active = time.monotonic()
        admission = self._server.admission
        if admission is not None and self.principal is None:
            held = self._frames.buffered_size_bytes
            change, self._unauthenticated_bytes = held - self._unauthenticated_bytes, held
            if not admission.hold_unauthenticated(change):
                self.close()
                return
        if len(frames) == 1 and not self._waiting and self._serving_every_frame():
            self._run(frames[0])  # the common read, one whole request: nothing waits, nothing is reserved
            if self.in_flight_count >= self._server._in_flight_count_max:
                self._update_reading()
            return
        self._waiting.extend(frames)
        self._start_waiting()
        self.retry_reservation()

    def _serving_every_frame(self) -> bool:
        """Whether a frame read now runs at once: reading is not paused (for answers the client does not
        read, a budget awaited or requests in flight at the limit) and no partial frame holds budget."""
        return not (self._reading_paused or self._writing_paused or self._reserved_bytes or self._waiting_for_budget
                    or self._frames.buffered_size_bytes) and self._transport is not None

    def retry_reservation(self) -> None:
        """Reserve budget for the large frame being received, or stop reading until it fits."""
        if self._transport is None:
            return
        if not (self._reserved_bytes or self._waiting_for_budget or self._frames.buffered_size_bytes):
            self._update_reading()  # whole frames only, no budget held or awaited: only reading to decide
            return
        budget = self._server.budget
        pending = self._frames.pending_frame_size_bytes
        # an unauthenticated connection's frames are small (bounded above) and reserve nothing
        needed = pending if pending > SMALL_FRAME_SIZE_BYTES and self.principal is not None else 0
        if needed != self._reserved_bytes:
            if self._reserved_bytes:
                reserved, self._reserved_bytes = self._reserved_bytes, 0
                budget.release(reserved)
            if needed and budget.try_reserve(needed):
                self._reserved_bytes = needed
        self._waiting_for_budget = needed != self._reserved_bytes
        if self._waiting_for_budget:
            budget.wait(self.connection_id, self)
        self._update_reading()

    def _start_waiting(self) -> None:
        in_flight_count_max = self._server._in_flight_count_max
        inline_count = 0
        in_flight_before = self.in_flight_count
        while self._waiting and self.in_flight_count < in_flight_count_max and not self._writing_paused:
            if inline_count >= INLINE_BATCH_COUNT:  # let other connections run; continue on the next turn
                self._schedule_start()
                break
            frame = self._waiting.popleft()
            if not self._run(frame):
                return
            if self.in_flight_count == in_flight_before:
                inline_count += 1  # answered inline (a task's answer comes on a later turn)
            in_flight_before = self.in_flight_count
        assert self.in_flight_count <= in_flight_count_max

    def _run(self, frame: bytes) -> bool:
        """Answer one request frame now, or start the task that answers it; False once the connection
        refuses further frames (a failed login's answer is delayed, then it closes)."""
        server = self._server
        routed = server.route(frame, self)
        if isinstance(routed, bytes):  # an error, or an answer from a short path (WithBodyPath)
            if self.failed_authentication:
                self._refuse_after_delay(routed)
                return False
            self._write(routed)
            return True
        if isinstance(routed, _Pending):
            self._start_task(None, None, routed.context, routed.answer)
            return True
        route, request, context = routed
        if route.inline:  # never waits: answer now, without the cost of a task
            try:
                response = route.handler(request, context)
            except Exception as exc:
                response = exc
            if isinstance(response, (bytes, Message, BaseException)) or not inspect.isawaitable(response):
                self._write(server.respond(context, response))  # type: ignore[arg-type]
            else:
                self._start_task(route, request, context, response)
            return True
        self._start_task(route, request, context)
        return True

    def _start_task(self, route: _Route | None, request: Message | None, context: RequestContext,
                    started: Awaitable[Response] | None = None) -> None:
        self.in_flight_count += 1
        task = asyncio.ensure_future(self._handle(route, request, context, started))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse_after_delay(self, answer: bytes) -> None:
        """Stop reading, answer the failed authentication after the server's delay, and close: a guesser
        gets one attempt per connection and a paced answer."""
        self.refusing = True  # closed once answered: not an idle connection for the idle sweep
        self._waiting.clear()
        if self._transport is not None and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True

        def answer_and_close() -> None:
            self._write(answer)
            self.close()

        asyncio.get_running_loop().call_later(self.failure_delay_s, answer_and_close)

    def _schedule_start(self) -> None:
        if not self._start_scheduled:
            self._start_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_start)

    def _scheduled_start(self) -> None:
        self._start_scheduled = False
        if self._transport is not None:
            self._start_waiting()
            self._update_reading()

    def _write(self, response: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(response)

    async def _handle(
        self, route: _Route | None, request: Message | None, context: RequestContext,
        started: Awaitable[Response] | None = None,
    ) -> None:
        """Answer one request from its handler's coroutine (``started``: one an inline handler or a short
        path returned)."""
        try:
            try:
                if started is None:
                    assert route is not None and request is not None
                    pending = route.handler(request, context)
                else:
                    pending = started
                response: Response | BaseException = await pending  # type: ignore[misc]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                response = exc
            self._write(self._server.respond(context, response))
        finally:
            self.in_flight_count -= 1
            self.last_active = time.monotonic()
            if self._transport is not None:
                self._start_waiting()
            self._update_reading()

    def _update_reading(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        should_pause = (
            self._writing_paused
            or bool(self._waiting)
            or self.in_flight_count >= self._server._in_flight_count_max
            or self._waiting_for_budget
        )
        if should_pause and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self._transport.resume_reading()
            self._reading_paused = False

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._start_waiting()  # frames held back while the client was not reading its answers
        self._update_reading()

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    async def cancel_in_flight(self) -> None:
        self._waiting.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
