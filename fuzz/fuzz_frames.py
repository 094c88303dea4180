"""Fuzz target: the RPC request path, bytes off the socket to a routed request or an error frame.

Input: a byte stream as a client would send it. The first byte sets the read size the stream is cut
into. Allowed outcomes: FrameBuffer's ValueError for a length outside its limits (the server closes the
connection); otherwise every frame is routed to a request or answered with an error frame.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

from fuzz.common import instrumented, main

with instrumented():
    from strom.rpc import framing
    from strom.rpc.api_keys import ApiKey
    from strom.rpc.messages import Message, pb, request_class
    from strom.rpc.server import RpcServer

FRAME_SIZE_BYTES_MAX = 1 << 20
_CONNECTION = SimpleNamespace(peer="fuzz:0", connection_id=1, principal=SimpleNamespace(name="fuzz"))


def _refuse(request: Message, context: Any) -> Message:
    raise AssertionError("routing must not run a handler")


_SERVER = RpcServer(
    {key: _refuse for key in ApiKey if request_class(key) is not None},
    frame_size_bytes_max=FRAME_SIZE_BYTES_MAX,
    in_flight_count_max=8,
    idle_timeout_ms=60_000,
)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    read_size_bytes = 1 + data[0] * 4
    stream = data[1:]
    buffer = framing.FrameBuffer(FRAME_SIZE_BYTES_MAX, framing.REQUEST_HEADER_SIZE_BYTES)
    frames: list[bytes] = []
    try:
        for start in range(0, len(stream), read_size_bytes):
            frames += buffer.feed(stream[start : start + read_size_bytes])
    except ValueError as exc:
        assert "frame length" in str(exc), exc
    for frame in frames:
        assert framing.REQUEST_HEADER_SIZE_BYTES <= len(frame) <= FRAME_SIZE_BYTES_MAX
        header = framing.decode_request_header(frame)
        routed = _SERVER.route(frame, _CONNECTION)
        if isinstance(routed, bytes):
            response_type, request_id = framing.RESPONSE_HEADER.unpack_from(routed, framing.LENGTH_SIZE_BYTES)
            assert (response_type, request_id) == (framing.RESPONSE_ERROR, header.request_id)
            error = pb.ErrorResponse.FromString(routed[framing.LENGTH_SIZE_BYTES + framing.RESPONSE_HEADER_SIZE_BYTES :])
            assert error.error_code != 0
        else:
            _route, request, context = routed
            assert request.IsInitialized()
            assert context.request_id == header.request_id


if __name__ == "__main__":
    main("frames", test_one_input)
    sys.exit(0)
