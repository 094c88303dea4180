"""RpcServer and RpcConnection in one process over loopback: dispatch, errors, limits, concurrency."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from strom.errors import (
    ConnectionFailedError,
    CorruptMessageError,
    DatabaseNotExistError,
    NetworkError,
    UnknownServerError,
    UnsupportedVersionError,
)
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import Message, pb
from strom.rpc.server import RequestContext, RpcServer, WithBodyPath, bind_listener

FRAME_SIZE_BYTES_MAX = 1 << 16
IN_FLIGHT_COUNT_MAX = 3


class Handlers:
    """Handlers whose behaviour the test steers; they record what they saw."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()
        self.release.set()

    async def list_databases(self, request: Message, _context: RequestContext) -> Message:
        self.started.append("list")
        await self.release.wait()
        return pb.ListDatabasesResponse(database_name=["fluss", "other"])

    async def get_database_info(self, request: Any, _context: RequestContext) -> Message:
        name = request.database_name
        if name == "missing":
            raise DatabaseNotExistError(f"Database '{name}' does not exist.")
        if name == "bug":
            raise KeyError("an unexpected failure")
        if name == "slow":
            await asyncio.sleep(0.2)
        return pb.GetDatabaseInfoResponse(database_json=name.encode(), created_time=1, modified_time=2)


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[RpcServer, Handlers, int]]:
    handlers = Handlers()
    server = RpcServer(
        {ApiKey.LIST_DATABASES: handlers.list_databases, ApiKey.GET_DATABASE_INFO: handlers.get_database_info},
        frame_size_bytes_max=FRAME_SIZE_BYTES_MAX,
        in_flight_count_max=IN_FLIGHT_COUNT_MAX,
        idle_timeout_ms=600_000,
    )
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    await server.start(sock)
    try:
        yield server, handlers, port
    finally:
        handlers.release.set()
        await server.stop()


async def connect(port: int) -> RpcConnection:
    return await RpcConnection.connect("127.0.0.1", port)


@pytest.mark.asyncio
async def test_a_request_reaches_its_handler_and_the_response_comes_back(served: Any) -> None:
    server, _handlers, port = served
    connection = await connect(port)
    try:
        response = await connection.request(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest())
        assert list(response.database_name) == ["fluss", "other"]
        assert connection.server_supports(ApiKey.PUT_KV)  # every key is advertised, served or not
    finally:
        await connection.close()
    assert server.stats.requests == 2  # the handshake and the call


@pytest.mark.asyncio
async def test_handler_errors_come_back_as_their_codes_and_the_connection_keeps_serving(served: Any) -> None:
    server, _handlers, port = served
    connection = await connect(port)
    try:
        with pytest.raises(DatabaseNotExistError, match="missing"):
            await connection.request(ApiKey.GET_DATABASE_INFO, pb.GetDatabaseInfoRequest(database_name="missing"))
        with pytest.raises(UnknownServerError, match="KeyError"):
            await connection.request(ApiKey.GET_DATABASE_INFO, pb.GetDatabaseInfoRequest(database_name="bug"))
        with pytest.raises(UnsupportedVersionError):  # advertised but not served here
            await connection.request(ApiKey.PUT_KV, pb.PutKvRequest(acks=-1, table_id=1, timeout_ms=1))
        response = await connection.request(ApiKey.GET_DATABASE_INFO, pb.GetDatabaseInfoRequest(database_name="db"))
        assert response.database_json == b"db"
    finally:
        await connection.close()
    assert server.stats.error_responses == 3
    assert server.stats.internal_errors == []  # a KeyError is a failure, not a broken invariant


@pytest.mark.asyncio
async def test_responses_go_out_as_handlers_finish_not_in_request_order(served: Any) -> None:
    _server, _handlers, port = served
    connection = await connect(port)
    try:
        finished: list[str] = []

        async def call(name: str) -> None:
            await connection.request(ApiKey.GET_DATABASE_INFO, pb.GetDatabaseInfoRequest(database_name=name))
            finished.append(name)

        await asyncio.gather(call("slow"), call("fast"))
        assert finished == ["fast", "slow"]
    finally:
        await connection.close()


@pytest.mark.asyncio
async def test_a_connection_runs_at_most_in_flight_count_max_requests_at_once(served: Any) -> None:
    _server, handlers, port = served
    handlers.release.clear()
    connection = await connect(port)
    try:
        calls = [
            asyncio.ensure_future(connection.request(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest()))
            for _ in range(IN_FLIGHT_COUNT_MAX + 4)
        ]
        for _ in range(100):
            await asyncio.sleep(0.005)
            if len(handlers.started) >= IN_FLIGHT_COUNT_MAX:
                break
        await asyncio.sleep(0.05)  # time for any excess request to (wrongly) start
        assert len(handlers.started) == IN_FLIGHT_COUNT_MAX
        handlers.release.set()
        responses = await asyncio.wait_for(asyncio.gather(*calls), 10)
        assert len(responses) == IN_FLIGHT_COUNT_MAX + 4
        assert len(handlers.started) == IN_FLIGHT_COUNT_MAX + 4
    finally:
        await connection.close()


@pytest.mark.asyncio
async def test_a_body_missing_required_fields_is_corrupt_message(served: Any) -> None:
    _server, _handlers, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        body = pb.GetDatabaseInfoRequest().SerializePartialToString()  # database_name (required) unset
        writer.write(framing.encode_request(int(ApiKey.GET_DATABASE_INFO), 0, 7, body))
        await writer.drain()
        (length,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
        frame = await reader.readexactly(length)
        assert framing.RESPONSE_HEADER.unpack_from(frame, 0) == (framing.RESPONSE_ERROR, 7)
        error = pb.ErrorResponse.FromString(frame[framing.RESPONSE_HEADER_SIZE_BYTES :])
        assert error.error_code == CorruptMessageError.code
        assert "database_name" in error.error_message
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_an_oversized_frame_closes_only_its_connection(served: Any) -> None:
    server, _handlers, port = served
    victim = await connect(port)
    bystander = await connect(port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(struct.pack(">i", FRAME_SIZE_BYTES_MAX + 1))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert server.stats.connections_closed_on_bad_frame == 1
        response = await bystander.request(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest())
        assert list(response.database_name) == ["fluss", "other"]
        assert not victim.is_closed
    finally:
        await victim.close()
        await bystander.close()


@pytest.mark.asyncio
async def test_the_client_fails_pending_requests_when_the_server_goes_away(served: Any) -> None:
    server, handlers, port = served
    handlers.release.clear()
    connection = await connect(port)
    try:
        pending = asyncio.ensure_future(connection.request(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest()))
        for _ in range(1000):
            if handlers.started:
                break
            await asyncio.sleep(0.005)
        await server.stop()
        with pytest.raises(NetworkError):
            await asyncio.wait_for(pending, 5)
        assert connection.is_closed
        with pytest.raises(NetworkError):
            await connection.request(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest())
    finally:
        await connection.close()


@pytest.mark.asyncio
async def test_an_unparsable_response_is_a_corrupt_message_error_for_the_caller() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for body in (pb.ApiVersionsResponse(api_versions=[pb.PbApiVersion(api_key=1003, min_version=0, max_version=0)])
                     .SerializeToString(), b"\xff"):
            (length,) = struct.unpack(">i", await reader.readexactly(4))
            header = framing.decode_request_header(await reader.readexactly(length))
            writer.write(framing.encode_response(framing.RESPONSE_SUCCESS, header.request_id, body))
            await writer.drain()
        await reader.read()
        writer.close()

    fake = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = fake.sockets[0].getsockname()[1]
    try:
        connection = await connect(port)
        try:
            with pytest.raises(CorruptMessageError, match="unparsable"):
                await connection.request(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest())
        finally:
            await connection.close()
    finally:
        fake.close()
        await fake.wait_closed()


@pytest.mark.asyncio
async def test_a_server_that_accepts_but_never_answers_the_handshake_is_a_failed_connection() -> None:
    """A stopped process (SIGSTOP) still has its connections accepted by the kernel. Its handshake timing out
    means no request of the caller's was sent, so the failure is ConnectionFailedError, the error a caller
    (coordinator_request) may resend on, not RequestTimeoutError, which may hide a processed request."""
    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    fake = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = fake.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectionFailedError, match="handshake"):
            await RpcConnection.connect("127.0.0.1", port, timeout_ms=300)
    finally:
        fake.close()
        await fake.wait_closed()


@pytest.mark.asyncio
async def test_a_short_path_answers_from_the_body_and_leaves_the_rest_to_the_handler() -> None:
    """``WithBodyPath``: the answer function sees the body's bytes first; None hands the request to the
    handler, a failure is answered as the handler's would be, and a wrapped handler (authorization on)
    never takes the short path."""
    seen: list[str] = []

    def answer(body: bytes) -> bytes | None:
        name = pb.GetDatabaseInfoRequest.FromString(body).database_name
        seen.append(f"short {name}")
        if name == "bug":
            raise KeyError("an unexpected failure")
        return pb.GetDatabaseInfoResponse(database_json=b"short", created_time=0, modified_time=0).SerializeToString() \
            if name == "short" else None

    def handler(request: Any, _context: RequestContext) -> Message:
        seen.append(f"handler {request.database_name}")
        return pb.GetDatabaseInfoResponse(database_json=b"handler", created_time=0, modified_time=0)

    def wrapped(request: Any, context: RequestContext) -> Any:  # as an access rule wraps a handler
        return short(request, context)

    short = WithBodyPath(handler, answer)
    for handlers, expected in (({ApiKey.GET_DATABASE_INFO: short}, [b"short", b"handler"]),
                               ({ApiKey.GET_DATABASE_INFO: wrapped}, [b"handler", b"handler"])):
        seen.clear()
        server = RpcServer(handlers, frame_size_bytes_max=FRAME_SIZE_BYTES_MAX,
                           in_flight_count_max=IN_FLIGHT_COUNT_MAX, idle_timeout_ms=600_000)
        sock = bind_listener("127.0.0.1", 0)
        await server.start(sock)
        connection = await connect(sock.getsockname()[1])
        try:
            answers = [(await connection.request(ApiKey.GET_DATABASE_INFO, pb.GetDatabaseInfoRequest(database_name=name)))
                       .database_json for name in ("short", "long")]
            assert answers == expected
            if handlers[ApiKey.GET_DATABASE_INFO] is short:
                assert seen == ["short short", "short long", "handler long"]
                with pytest.raises(UnknownServerError, match="unexpected failure"):
                    await connection.request(ApiKey.GET_DATABASE_INFO, pb.GetDatabaseInfoRequest(database_name="bug"))
                answer_again = await connection.request(ApiKey.GET_DATABASE_INFO, pb.GetDatabaseInfoRequest(database_name="short"))
                assert answer_again.database_json == b"short"  # the connection keeps serving after the failure
            else:
                assert seen == ["handler short", "handler long"]
        finally:
            await connection.close()
            await server.stop()
