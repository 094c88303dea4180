"""The blocking lookuper's socket reads a response frame however the bytes arrive, and refuses a stream
that carries more than the one answer it asked for. A single lookup's round trip in C (``lookup_one``) sends
the bytes the Python frames send and answers as they do, frame errors, bucket errors and malformed answers
included."""

from __future__ import annotations

import itertools
import socket
import threading

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from strom.client.blocking import LOOKUP_VERSION, _BlockingRpc, use_kernel_timeouts
from strom.errors import (
    ConnectionFailedError,
    CorruptMessageError,
    InvalidTableError,
    NetworkError,
    NotLeaderOrFollowerError,
    StromError,
)
from strom.rpc import framing, lookup_wire
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb


def rpc_over(sock: socket.socket) -> _BlockingRpc:
    rpc = object.__new__(_BlockingRpc)
    rpc._sock = sock
    rpc._fd = sock.fileno()
    rpc._address = "test"
    rpc._request_id = 0
    return rpc


def answer(pieces: list[bytes]) -> tuple[_BlockingRpc, threading.Thread]:
    """A client socket whose peer reads one request and sends ``pieces`` one by one."""
    client, server = socket.socketpair()
    use_kernel_timeouts(client, 5)  # blocking, as the lookuper's own sockets are

    def serve() -> None:
        with server:
            server.recv(1 << 16)
            for piece in pieces:
                server.sendall(piece)
                threading.Event().wait(0.01)  # separate segments: the client's reads see them apart

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return rpc_over(client), thread


def lookup_answer(request_id: int) -> bytes:
    body = pb.LookupResponse(buckets_resp=[pb.PbLookupRespForBucket(bucket_id=3)]).SerializeToString()
    return framing.encode_response(framing.RESPONSE_SUCCESS, request_id, body)


@pytest.mark.parametrize("cuts", [[], [2], [4], [7], [4, 9, 12]])
def test_a_frame_arriving_in_pieces_is_read_whole(cuts: list[int]) -> None:
    frame = lookup_answer(1)
    bounds = [0, *cuts, len(frame)]
    rpc, thread = answer([frame[a:b] for a, b in itertools.pairwise(bounds)])
    response = rpc.call(ApiKey.LOOKUP, 1, pb.LookupRequest(table_id=1), pb.LookupResponse)
    assert response.buckets_resp[0].bucket_id == 3
    thread.join(5)
    rpc.close()


def test_bytes_past_the_answer_close_the_connection() -> None:
    rpc, thread = answer([lookup_answer(1) + lookup_answer(2)])
    with pytest.raises(NetworkError, match="no request asked for"):
        rpc.call(ApiKey.LOOKUP, 1, pb.LookupRequest(table_id=1), pb.LookupResponse)
    assert rpc._sock.fileno() == -1
    thread.join(5)


def test_a_malformed_length_closes_the_connection() -> None:
    rpc, thread = answer([framing.LENGTH.pack(2) + b"xx"])
    with pytest.raises(NetworkError, match="malformed response frame"):
        rpc.call(ApiKey.LOOKUP, 1, pb.LookupRequest(table_id=1), pb.LookupResponse)
    assert rpc._sock.fileno() == -1
    thread.join(5)


def test_a_closed_connection_is_a_network_error() -> None:
    rpc, thread = answer([lookup_answer(1)[:3]])
    with pytest.raises(NetworkError, match="closed the connection"):
        rpc.call(ApiKey.LOOKUP, 1, pb.LookupRequest(table_id=1), pb.LookupResponse)
    thread.join(5)


def test_an_answer_that_never_comes_times_out_in_the_kernel_and_closes_the_connection() -> None:
    client, server = socket.socketpair()
    use_kernel_timeouts(client, 0.3)
    assert client.gettimeout() is None  # blocking: one system call per receive, no poll before it
    rpc = rpc_over(client)
    with server, pytest.raises(NetworkError, match="failed"):
        rpc.call(ApiKey.LOOKUP, 1, pb.LookupRequest(table_id=1), pb.LookupResponse)
    assert client.fileno() == -1


def test_a_listener_that_never_answers_the_handshake_is_a_failed_connection() -> None:
    """As with the asyncio client: a stopped server's kernel accepts the connection, the handshake times out,
    and no request of the caller's went out."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(ConnectionFailedError, match="handshake"):
            _BlockingRpc(address, 0.3)


# ------------------------------------------------------------------------- a single lookup's round trip

LANES = ["compiled", "python"]


@pytest.fixture(params=LANES)
def lane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``lookup_one`` through the C round trip, or through the Python frames that are its reference."""
    if request.param == "compiled":
        if lookup_wire.lookup_round_trip is None:
            pytest.skip("strom.rpc._lookupwire was not built")
    else:
        monkeypatch.setattr(lookup_wire, "lookup_round_trip", None)
    return str(request.param)


def answered(frame: bytes) -> tuple[_BlockingRpc, socket.socket]:
    """A client whose answer (``frame``) already waits in its socket; the peer keeps the request unread."""
    client, server = socket.socketpair()
    use_kernel_timeouts(client, 5)
    server.sendall(frame)
    return rpc_over(client), server


def lookup_frame(request_id: int, *entries: bytes) -> bytes:
    return framing.encode_response(framing.RESPONSE_SUCCESS, request_id, b"".join(entries))


def outcome(rpc: _BlockingRpc) -> object:
    """What ``lookup_one`` gives: the value, or the type and message of what it raised."""
    try:
        return rpc.lookup_one(7, None, 3, b"key")
    except StromError as exc:
        return type(exc), str(exc)


def test_a_single_lookup_sends_the_request_the_python_frames_send(lane: str) -> None:
    rpc, server = answered(lookup_frame(1, lookup_wire.lookup_bucket_entry_python(3, 42, [b"\x01\x00v"])))
    with server:
        assert rpc.lookup_one(7, 42, 3, b"key") == b"\x01\x00v"
        sent = server.recv(1 << 16)
    body = lookup_wire.lookup_request_python(7, 42, 3, [b"key"])
    assert sent == framing.encode_request(int(ApiKey.LOOKUP), LOOKUP_VERSION, 1, body)
    rpc.close()


def test_a_missing_row_a_bucket_error_and_an_error_frame_answer_alike(lane: str) -> None:
    rpc, server = answered(lookup_frame(1, lookup_wire.lookup_bucket_entry_python(3, None, [None])))
    with server:
        assert rpc.lookup_one(7, None, 3, b"key") is None
    moved = pb.LookupResponse()
    moved.buckets_resp.add(bucket_id=3, error_code=NotLeaderOrFollowerError.code, error_message="moved")
    rpc, server = answered(lookup_frame(1, moved.SerializeToString()))
    with server, pytest.raises(NotLeaderOrFollowerError, match="moved"):
        rpc.lookup_one(7, None, 3, b"key")
    assert not rpc.closed  # an answer, not a broken connection
    refused = pb.ErrorResponse(error_code=InvalidTableError.code, error_message="no such table").SerializeToString()
    rpc, server = answered(framing.encode_response(framing.RESPONSE_ERROR, 1, refused))
    with server, pytest.raises(InvalidTableError, match="no such table"):
        rpc.lookup_one(7, None, 3, b"key")
    assert not rpc.closed


def test_answers_that_do_not_fit_one_key_are_corrupt_and_keep_the_connection(lane: str) -> None:
    two_values = lookup_wire.lookup_bucket_entry_python(3, None, [b"\x01\x00a", None])
    one_value = lookup_wire.lookup_bucket_entry_python(3, None, [b"\x01\x00a"])
    for entries, message in (((two_values,), "2 values"), ((one_value, one_value), "2 bucket entries"),
                             ((b"\x0a\x05",), "malformed")):
        rpc, server = answered(lookup_frame(1, *entries))
        with server, pytest.raises(CorruptMessageError, match=message):
            rpc.lookup_one(7, None, 3, b"key")
        assert not rpc.closed


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (lookup_frame(2, lookup_wire.lookup_bucket_entry_python(3, None, [None])), "answered request 2, expected 1"),
        (lookup_frame(1) + lookup_frame(2), "no request asked for"),
        (framing.LENGTH.pack(2) + b"xx", "malformed response frame"),
        (framing.LENGTH.pack(-1) + b"xxxxx", "malformed response frame"),
        (lookup_frame(1)[:3], "closed the connection"),
    ],
)
def test_a_frame_that_does_not_answer_the_request_closes_the_connection(lane: str, frame: bytes, message: str) -> None:
    rpc, server = answered(frame)
    if frame == lookup_frame(1)[:3]:
        server.shutdown(socket.SHUT_WR)  # the server goes away mid-frame
    with server, pytest.raises(NetworkError, match=message):
        rpc.lookup_one(7, None, 3, b"key")
    assert rpc.closed and rpc._sock.fileno() == -1
    with pytest.raises(NetworkError):  # a closed connection is never written to again
        rpc.lookup_one(7, None, 3, b"key")


def test_an_answer_that_never_comes_times_out_and_closes_the_connection(lane: str) -> None:
    client, server = socket.socketpair()
    use_kernel_timeouts(client, 0.3)
    rpc = rpc_over(client)
    with server, pytest.raises(NetworkError, match="failed"):
        rpc.lookup_one(7, None, 3, b"key")
    assert rpc.closed


@pytest.mark.parametrize("cuts", [[2], [4], [7], [4, 9, 12]])
def test_a_single_lookups_answer_arriving_in_pieces_is_read_whole(lane: str, cuts: list[int]) -> None:
    frame = lookup_frame(1, lookup_wire.lookup_bucket_entry_python(3, None, [b"\x01\x00value"]))
    bounds = [0, *cuts, len(frame)]
    rpc, thread = answer([frame[a:b] for a, b in itertools.pairwise(bounds)])
    assert rpc.lookup_one(7, None, 3, b"key") == b"\x01\x00value"
    thread.join(5)
    rpc.close()


def test_a_large_value_and_a_large_key_cross_the_socket_whole(lane: str) -> None:
    """Past the 16 KiB the C round trip keeps on its stack, both ways."""
    value = b"\x01\x00" + bytes(range(256)) * 1000
    key = b"k" * 50_000
    client, server = socket.socketpair()
    use_kernel_timeouts(client, 5)
    rpc = rpc_over(client)
    received = bytearray()

    def serve() -> None:
        with server:
            want = framing.LENGTH_SIZE_BYTES + len(framing.encode_request(0, 0, 0, lookup_wire.lookup_request_python(
                7, None, 3, [key]))) - framing.LENGTH_SIZE_BYTES
            while len(received) < want:
                received.extend(server.recv(1 << 16))
            server.sendall(lookup_frame(1, lookup_wire.lookup_bucket_entry_python(3, None, [value])))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert rpc.lookup_one(7, None, 3, key) == value
    thread.join(5)
    assert bytes(received) == framing.encode_request(int(ApiKey.LOOKUP), LOOKUP_VERSION, 1,
                                                     lookup_wire.lookup_request_python(7, None, 3, [key]))
    rpc.close()


response_bodies = st.one_of(
    st.binary(max_size=60),
    st.lists(st.tuples(st.integers(-5, 5), st.one_of(st.none(), st.integers(-3, 3)),
                       st.lists(st.one_of(st.none(), st.binary(max_size=12)), max_size=3)), max_size=3).map(
        lambda entries: b"".join(lookup_wire.lookup_bucket_entry_python(b, p, v) for b, p, v in entries)),
)


@settings(max_examples=300, deadline=None)
@given(body=response_bodies, kind=st.sampled_from([framing.RESPONSE_SUCCESS, framing.RESPONSE_ERROR, 2, -1]))
@example(body=bytes([8, 5, 18, 2, 0xFF, 0xFE]), kind=framing.RESPONSE_ERROR)  # an error_message not UTF-8
def test_any_answer_gives_what_the_python_frames_give(body: bytes, kind: int) -> None:
    """Whatever a server answers, the C round trip returns the same value or raises the same error as the
    reference; it may only be stricter (a corrupt answer where protobuf reads one)."""
    if lookup_wire.lookup_round_trip is None:
        pytest.skip("strom.rpc._lookupwire was not built")
    frame = framing.encode_response(kind, 1, body)
    rpc, server = answered(frame)
    with server:
        compiled = outcome(rpc)
    compiled_lane, lookup_wire.lookup_round_trip = lookup_wire.lookup_round_trip, None
    try:
        rpc, server = answered(frame)
        with server:
            reference = outcome(rpc)
    finally:
        lookup_wire.lookup_round_trip = compiled_lane
    if compiled != reference:
        assert isinstance(compiled, tuple) and compiled[0] is CorruptMessageError, (compiled, reference)
