"""Fluss RPC frames: a big-endian int32 length, then a header and one protobuf message.

Request:  length | api_key:i16 | api_version:i16 | request_id:i32 | body
Response: length | type:i8 (0 success, 1 error) | request_id:i32 | body (the response, or ErrorResponse)

Fluss also defines type 2 (server failure, no request id); the official Rust client cannot parse it, so
strom never sends it: a failure it cannot attribute to a request closes the connection instead.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

LENGTH = struct.Struct(">i")
REQUEST_HEADER = struct.Struct(">hhi")
RESPONSE_HEADER = struct.Struct(">bi")
RESPONSE_PREFIX = struct.Struct(">ibi")
"""A response's length and header in one ``pack``."""
LENGTH_SIZE_BYTES = 4
REQUEST_HEADER_SIZE_BYTES = 8
RESPONSE_HEADER_SIZE_BYTES = 5
assert LENGTH.size == LENGTH_SIZE_BYTES
assert REQUEST_HEADER.size == REQUEST_HEADER_SIZE_BYTES
assert RESPONSE_HEADER.size == RESPONSE_HEADER_SIZE_BYTES

RESPONSE_FRAME_SIZE_BYTES_MAX = 1 << 30  # the client accepts responses of any size a server may send
RESPONSE_SUCCESS = 0
RESPONSE_ERROR = 1
REQUEST_ID_MASK = 0x7FFFFFFF


class RequestHeader(NamedTuple):
    """A request frame's header (a tuple: built for every request, so as cheaply as Python builds anything)."""

    api_key: int
    api_version: int
    request_id: int


def encode_request(api_key: int, api_version: int, request_id: int, body: bytes) -> bytes:
    header = REQUEST_HEADER.pack(api_key, api_version, request_id & REQUEST_ID_MASK)
    return LENGTH.pack(REQUEST_HEADER_SIZE_BYTES + len(body)) + header + body


def encode_response(response_type: int, request_id: int, body: bytes) -> bytes:
    return RESPONSE_PREFIX.pack(RESPONSE_HEADER_SIZE_BYTES + len(body), response_type, request_id) + body


def decode_request_header(frame: bytes | memoryview) -> RequestHeader:
    """Parse the header of a frame body (the bytes after the length); the caller checked its size."""
    return RequestHeader._make(REQUEST_HEADER.unpack_from(frame, 0))


class FrameBuffer:
    """Reassembles length-prefixed frames from a byte stream without copying each frame twice.

    A frame length outside ``[min_size_bytes, frame_size_bytes_max]`` raises ``ValueError`` as soon as the
    length is read, before any of the body is buffered.
    """

    __slots__ = ("_buffer", "_frame_size_bytes_max", "_min_size_bytes", "_start")

    def __init__(self, frame_size_bytes_max: int, min_size_bytes: int) -> None:
        assert frame_size_bytes_max > min_size_bytes >= 0
        self._buffer = bytearray()
        self._start = 0
        self._frame_size_bytes_max = frame_size_bytes_max
        self._min_size_bytes = min_size_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the complete frame bodies now available, in order."""
        if not self._buffer and len(data) >= LENGTH_SIZE_BYTES:  # most reads: exactly one whole frame
            (length,) = LENGTH.unpack_from(data, 0)
            if len(data) == LENGTH_SIZE_BYTES + length and self._min_size_bytes <= length <= self._frame_size_bytes_max:
                return [data[LENGTH_SIZE_BYTES:]]
        self._buffer += data
        frames: list[bytes] = []
        buffer = self._buffer
        start = self._start
        end = len(buffer)
        with memoryview(buffer) as view:  # released before the buffer is resized below
            while end - start >= LENGTH_SIZE_BYTES:
                (length,) = LENGTH.unpack_from(view, start)
                if length < self._min_size_bytes or length > self._frame_size_bytes_max:
                    raise ValueError(
                        f"frame length {length} outside [{self._min_size_bytes}, {self._frame_size_bytes_max}]"
                    )
                frame_end = start + LENGTH_SIZE_BYTES + length
                if frame_end > end:
                    break
                frames.append(bytes(view[start + LENGTH_SIZE_BYTES : frame_end]))  # the one copy
                start = frame_end
        if start == end:
            buffer.clear()
            start = 0
        elif start > 1 << 16:
            del buffer[:start]
            start = 0
        self._start = start
        return frames

    def set_frame_size_bytes_max(self, frame_size_bytes_max: int) -> None:
        """Change the largest frame accepted from the next length read on (a connection that authenticated
        may send full-size frames)."""
        assert frame_size_bytes_max > self._min_size_bytes
        self._frame_size_bytes_max = frame_size_bytes_max

    @property
    def buffered_size_bytes(self) -> int:
        return len(self._buffer) - self._start

    @property
    def pending_frame_size_bytes(self) -> int:
        """The declared size of the frame being received (once its length is in), else 0."""
        if len(self._buffer) - self._start < LENGTH_SIZE_BYTES:
            return 0
        (length,) = LENGTH.unpack_from(self._buffer, self._start)
        return int(length) + LENGTH_SIZE_BYTES
