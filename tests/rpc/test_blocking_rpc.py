"""The blocking lookuper's socket reads a response frame however the bytes arrive, and refuses a stream
that carries more than the one answer it asked for."""

from __future__ import annotations

import itertools
import socket
import threading

import pytest

from strom.client.blocking import _BlockingRpc, use_kernel_timeouts
from strom.errors import ConnectionFailedError, NetworkError
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb


def rpc_over(sock: socket.socket) -> _BlockingRpc:
    rpc = object.__new__(_BlockingRpc)
    rpc._sock = sock
    rpc._address = "test"
    rpc._request_id = 0
    return rpc


def answer(pieces: list[bytes]) -> tuple[_BlockingRpc, threading.Thread]:
    """A client socket whose peer reads one request and sends ``pieces`` one by one."""
    client, server = socket.socketpair()
    client.settimeout(5)

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
