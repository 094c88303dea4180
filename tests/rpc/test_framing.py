"""Frame reassembly and the request/response headers, byte for byte."""

from __future__ import annotations

import random
import struct

import pytest

from strom.rpc import framing
from strom.rpc.framing import FrameBuffer


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def bodies_of_sizes(sizes: list[int]) -> list[bytes]:
    return [bytes([index % 251]) * size for index, size in enumerate(sizes)]


def test_a_request_frame_is_length_then_key_version_id_then_body() -> None:
    encoded = framing.encode_request(1000, 0, 0, b"\x0a\x02hi")
    assert encoded == bytes.fromhex("0000000c 03e8 0000 00000000 0a02") + b"hi"
    header = framing.decode_request_header(encoded[4:])
    assert (header.api_key, header.api_version, header.request_id) == (1000, 0, 0)


def test_request_ids_are_masked_to_31_bits() -> None:
    encoded = framing.encode_request(1012, 0, 0x80000005, b"")
    assert framing.decode_request_header(encoded[4:]).request_id == 5


def test_a_response_frame_is_length_then_type_and_request_id_then_body() -> None:
    assert framing.encode_response(framing.RESPONSE_ERROR, 2, b"\x08\x01") == bytes.fromhex("00000007 01 00000002 0801")
    assert framing.encode_response(framing.RESPONSE_SUCCESS, 1, b"") == bytes.fromhex("00000005 00 00000001")


def test_whole_frames_in_one_chunk_come_out_in_order() -> None:
    buffer = FrameBuffer(1 << 20, 8)
    bodies = bodies_of_sizes([8, 20, 8, 300])
    assert buffer.feed(b"".join(frame(b) for b in bodies)) == bodies
    assert buffer.buffered_size_bytes == 0


def test_a_frame_split_at_every_byte_comes_out_once_complete() -> None:
    buffer = FrameBuffer(1 << 20, 8)
    data = frame(b"0123456789abcdef")
    for index in range(len(data) - 1):
        assert buffer.feed(data[index : index + 1]) == []
    assert buffer.buffered_size_bytes == len(data) - 1
    assert buffer.feed(data[-1:]) == [b"0123456789abcdef"]
    assert buffer.buffered_size_bytes == 0


@pytest.mark.parametrize("seed", range(20))
def test_randomly_split_and_merged_chunks_reassemble_exactly(seed: int) -> None:
    rng = random.Random(seed)
    bodies = bodies_of_sizes([rng.choice([8, 9, 100, 4096, 70_000]) for _ in range(40)])
    stream = b"".join(frame(b) for b in bodies)
    buffer = FrameBuffer(1 << 20, 8)
    received: list[bytes] = []
    position = 0
    while position < len(stream):
        size = rng.choice([1, 3, 4, 5, 100, 5000, 80_000])
        received += buffer.feed(stream[position : position + size])
        position += size
    assert received == bodies, f"seed={seed}"
    assert buffer.buffered_size_bytes == 0, f"seed={seed}"


def test_a_pending_partial_frame_survives_buffer_compaction() -> None:
    buffer = FrameBuffer(1 << 20, 8)
    bodies = bodies_of_sizes([1000] * 70)  # > 64 KiB consumed, then a partial frame left over
    tail = frame(b"x" * 500)
    out = buffer.feed(b"".join(frame(b) for b in bodies) + tail[:200])
    assert out == bodies
    assert buffer.buffered_size_bytes == 200
    assert buffer.feed(tail[200:]) == [b"x" * 500]


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 7, 1025, 2**31 - 1])
def test_a_length_outside_the_limits_is_rejected_before_the_body_arrives(length: int) -> None:
    buffer = FrameBuffer(1024, 8)
    with pytest.raises(ValueError, match=f"frame length {length} outside"):
        buffer.feed(struct.pack(">i", length))


def test_lengths_at_the_limits_are_accepted() -> None:
    buffer = FrameBuffer(1024, 8)
    assert buffer.feed(frame(b"m" * 8) + frame(b"M" * 1024)) == [b"m" * 8, b"M" * 1024]


def test_a_bad_length_after_good_frames_in_the_same_chunk_is_rejected() -> None:
    buffer = FrameBuffer(1024, 8)
    with pytest.raises(ValueError):
        buffer.feed(frame(b"g" * 8) + struct.pack(">i", 5000))
