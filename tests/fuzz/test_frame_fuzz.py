"""Property-based fuzzing of the RPC frame layer: length-prefixed framing, request headers, protobuf bodies.

* ``FrameBuffer`` reassembles the same frames however the stream is cut into reads, and a length outside
  its limits raises ValueError (the server closes that connection) before any body is buffered;
* every request and response message of the protocol, filled with random values, round-trips, and any
  mutation of its bytes parses or raises protobuf's DecodeError (the server's CorruptMessageError);
* ``RpcServer.route`` turns any frame at all into a request or an error frame, and never raises.
"""

from __future__ import annotations

import itertools
import random
import struct
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import example, given
from hypothesis import strategies as st

from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import DecodeError, Message, pb, request_class, response_class
from tests.fuzz.mutations import FUZZ_SETTINGS, mutated

pytestmark = pytest.mark.timeout(120)

FRAME_SIZE_BYTES_MAX = 1 << 16
MESSAGE_CLASSES = sorted(
    {cls for key in ApiKey for cls in (request_class(key), response_class(key)) if cls is not None}
    | {pb.ErrorResponse},
    key=lambda cls: cls.DESCRIPTOR.full_name,
)


# ---- framing ----


@st.composite
def request_frames(draw: st.DrawFn) -> list[bytes]:
    bodies = draw(st.lists(st.binary(max_size=300), max_size=8))
    keys = st.integers(-(2**15), 2**15 - 1)
    return [
        framing.encode_request(draw(keys), draw(keys), draw(st.integers(0, 2**31 - 1)), body) for body in bodies
    ]


def _cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


@FUZZ_SETTINGS
@given(request_frames(), st.lists(st.integers(0, 3000), max_size=20))
def test_frames_come_out_whole_and_in_order_however_the_stream_is_cut(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frames)
    buffer = framing.FrameBuffer(FRAME_SIZE_BYTES_MAX, framing.REQUEST_HEADER_SIZE_BYTES)
    received: list[bytes] = []
    for chunk in _cut(stream, cuts):
        received += buffer.feed(chunk)
    assert received == [frame[framing.LENGTH_SIZE_BYTES :] for frame in frames]
    assert buffer.buffered_size_bytes == 0
    for body, frame in zip(received, frames, strict=True):
        header = framing.decode_request_header(body)
        assert framing.encode_request(header.api_key, header.api_version, header.request_id, body[8:]) == frame


@FUZZ_SETTINGS
@given(st.data(), request_frames(), st.lists(st.integers(0, 3000), max_size=8))
@example(data=None, frames=[struct.pack(">i", 2**31 - 1)], cuts=[]).via("a huge length")
@example(data=None, frames=[struct.pack(">i", -1) + b"\x00" * 8], cuts=[]).via("a negative length")
@example(data=None, frames=[struct.pack(">i", 7) + b"\x00" * 7], cuts=[]).via("shorter than a header")
def test_a_mutated_stream_yields_frames_within_the_limits_or_value_error(
    data: st.DataObject | None, frames: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(frames)
    if data is not None:
        stream = data.draw(mutated(stream))
    buffer = framing.FrameBuffer(FRAME_SIZE_BYTES_MAX, framing.REQUEST_HEADER_SIZE_BYTES)
    try:
        for chunk in _cut(stream, cuts):
            for body in buffer.feed(chunk):
                assert framing.REQUEST_HEADER_SIZE_BYTES <= len(body) <= FRAME_SIZE_BYTES_MAX
                framing.decode_request_header(body)
    except ValueError as exc:
        assert "frame length" in str(exc)
    # never more buffered than one frame's worth of a length it accepted (plus one read)
    assert buffer.buffered_size_bytes <= FRAME_SIZE_BYTES_MAX + framing.LENGTH_SIZE_BYTES + len(stream)


# ---- protobuf bodies ----


def _random_scalar(rng: random.Random, field: FieldDescriptor) -> Any:
    t = field.type
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return rng.choice((0, 1, -1, 2**31 - 1, -(2**31), rng.randrange(-1000, 1000)))
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return rng.choice((0, 1, -1, 2**63 - 1, -(2**63), rng.randrange(-(10**6), 10**6)))
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return rng.choice((0, 1, 2**32 - 1, rng.randrange(10**6)))
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return rng.choice((0, 1, 2**64 - 1, rng.randrange(10**6)))
    if t == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return rng.choice((0.0, -1.5, 1e30))
    if t == FieldDescriptor.TYPE_STRING:
        return "".join(rng.choice("ab_é漢😀") for _ in range(rng.randrange(8)))
    if t == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.randrange(40))
    if t == FieldDescriptor.TYPE_ENUM:
        return rng.choice(field.enum_type.values).number
    raise TypeError(field)


def fill(message: Message, rng: random.Random, depth: int = 0) -> Message:
    """Set every field of ``message`` (repeated ones 0-2 times, nested messages to depth 3) at random."""
    for field in message.DESCRIPTOR.fields:
        repeated = field.is_repeated
        if not repeated and not field.is_required and rng.random() < 0.3:
            continue
        count = rng.randrange(3) if repeated else 1
        if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
            if field.message_type.GetOptions().map_entry:
                continue
            if depth >= 3 and not field.is_required:
                continue
            for _ in range(count):
                child = getattr(message, field.name).add() if repeated else getattr(message, field.name)
                if not repeated:
                    child.SetInParent()
                fill(child, rng, depth + 1)
        elif repeated:
            getattr(message, field.name).extend(_random_scalar(rng, field) for _ in range(count))
        else:
            setattr(message, field.name, _random_scalar(rng, field))
    return message


@FUZZ_SETTINGS
@given(st.sampled_from(MESSAGE_CLASSES), st.randoms(use_true_random=False))
def test_every_message_round_trips(cls: type[Message], rng: random.Random) -> None:
    message = fill(cls(), rng)
    body = message.SerializeToString()
    assert cls.FromString(body) == message


@FUZZ_SETTINGS
@given(st.data(), st.sampled_from(MESSAGE_CLASSES), st.randoms(use_true_random=False))
def test_a_mutated_body_parses_or_raises_decode_error(
    data: st.DataObject, cls: type[Message], rng: random.Random
) -> None:
    bad = data.draw(mutated(fill(cls(), rng).SerializeToString()))
    try:
        message = cls.FromString(bad)
    except DecodeError:
        return
    if message.IsInitialized():  # the server answers CorruptMessageError otherwise
        assert cls.FromString(message.SerializeToString()) == message
    else:
        assert message.FindInitializationErrors()


# ---- routing ----


def _server() -> Any:
    from strom.rpc.server import RpcServer

    def handler(request: Message, context: Any) -> Message:
        raise AssertionError("route() must not call handlers")

    handlers = {key: handler for key in ApiKey if request_class(key) is not None}
    return RpcServer(
        handlers, frame_size_bytes_max=FRAME_SIZE_BYTES_MAX, in_flight_count_max=8, idle_timeout_ms=60_000
    )


_CONNECTION = SimpleNamespace(peer="fuzz:0", connection_id=1, principal=SimpleNamespace(name="fuzz"))


@st.composite
def routed_frames(draw: st.DrawFn) -> bytes:
    """A frame body (header + protobuf) for a real api key with a filled request, then maybe mutated."""
    key = draw(st.sampled_from([k for k in ApiKey if request_class(k) is not None]))
    cls = request_class(key)
    assert cls is not None
    body = fill(cls(), draw(st.randoms(use_true_random=False))).SerializeToString()
    version = draw(st.sampled_from((0, 1, 2, -1, 99)))
    frame = framing.encode_request(int(key), version, draw(st.integers(0, 2**31 - 1)), body)[4:]
    if draw(st.booleans()):
        frame = draw(mutated(frame))
    return frame


@FUZZ_SETTINGS
@given(routed_frames() | st.binary(min_size=framing.REQUEST_HEADER_SIZE_BYTES, max_size=200))
def test_route_answers_any_frame_with_a_request_or_an_error_frame(frame: bytes) -> None:
    if len(frame) < framing.REQUEST_HEADER_SIZE_BYTES:
        frame += b"\x00" * framing.REQUEST_HEADER_SIZE_BYTES  # FrameBuffer guarantees a whole header
    server = _server()
    routed = server.route(frame, _CONNECTION)
    if isinstance(routed, bytes):
        (length,) = framing.LENGTH.unpack_from(routed, 0)
        assert length == len(routed) - framing.LENGTH_SIZE_BYTES
        response_type, request_id = framing.RESPONSE_HEADER.unpack_from(routed, 4)
        assert response_type == framing.RESPONSE_ERROR
        assert request_id == framing.decode_request_header(frame).request_id
        error = pb.ErrorResponse.FromString(routed[4 + framing.RESPONSE_HEADER_SIZE_BYTES :])
        assert error.error_code != 0
    else:
        _route, request, context = routed
        assert request.IsInitialized()
        assert context.request_id == framing.decode_request_header(frame).request_id
