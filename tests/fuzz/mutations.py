"""Shared pieces of the property-based fuzz tests: settings, byte mutations, outcome comparison.

``STROM_FUZZ_EXAMPLES`` scales every property (examples per test; the default keeps the whole
directory well under a minute); e.g. ``STROM_FUZZ_EXAMPLES=20000 pytest tests/fuzz``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fuzz.common import batches_identical
from strom.errors import StromError

EXAMPLES = int(os.environ.get("STROM_FUZZ_EXAMPLES", "150"))
assert EXAMPLES > 0

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # CI reruns from scratch; a failure prints its reproducer (@reproduce_failure / @example)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# int32 values that make length and count fields lie in the interesting ways
INTERESTING_INT32 = (-(2**31), -1, 0, 1, 2, 7, 8, 127, 128, 255, 4096, 2**16, 2**24, 2**31 - 1)


def _flip_bits(data: bytearray, draw: Any) -> None:
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, len(data) - 1))
        data[index] ^= 1 << draw(st.integers(0, 7))


def _set_bytes(data: bytearray, draw: Any) -> None:
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, len(data) - 1))
        data[index] = draw(st.sampled_from((0x00, 0x01, 0x7F, 0x80, 0xFF)) | st.integers(0, 255))


def _overwrite_int32(data: bytearray, draw: Any) -> None:
    if len(data) < 4:
        return
    index = draw(st.integers(0, len(data) - 4))
    value = draw(st.sampled_from(INTERESTING_INT32) | st.integers(-(2**31), 2**31 - 1))
    struct.pack_into(draw(st.sampled_from(("<i", ">i"))), data, index, value)


@st.composite
def mutated(draw: Any, data: bytes, protected_prefix_size: int = 0) -> bytes:
    """``data`` with one to three mutations: bit flips, byte sets, int32 lies, truncation, insertion,
    deletion, duplication, or a splice of random bytes. ``protected_prefix_size`` bytes at the front are
    left alone by the in-place mutations (a test fixes them up itself, e.g. a CRC)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.integers(0, 7))
        body_size = len(out) - protected_prefix_size
        if kind in (0, 1, 2) and body_size > 0:
            body = out[protected_prefix_size:]
            (_flip_bits, _set_bytes, _overwrite_int32)[kind](body, draw)
            out[protected_prefix_size:] = body
        elif kind == 3:
            del out[draw(st.integers(0, len(out))) :]
        elif kind == 4:
            index = draw(st.integers(protected_prefix_size, max(protected_prefix_size, len(out))))
            out[index:index] = draw(st.binary(min_size=1, max_size=16))
        elif kind == 5 and body_size > 0:
            start = draw(st.integers(protected_prefix_size, len(out) - 1))
            del out[start : start + draw(st.integers(1, 16))]
        elif kind == 6 and body_size > 0:
            start = draw(st.integers(protected_prefix_size, len(out) - 1))
            chunk = out[start : start + draw(st.integers(1, 32))]
            out[start:start] = chunk
        else:
            out += draw(st.binary(max_size=24))
    return bytes(out)


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) or ("error", (exception type, message))."""
    try:
        return "ok", call()
    except Exception as exc:
        return "error", (type(exc), str(exc))


def assert_clean_error(result: tuple[str, Any], allowed: tuple[type[BaseException], ...], context: str) -> None:
    """A failure, if any, is one of the ``allowed`` clear errors (never IndexError, struct.error, ...)."""
    kind, value = result
    if kind == "error":
        exc_type, message = value
        assert issubclass(exc_type, allowed), f"{context}: {exc_type.__name__}: {message}"


STROM_ERRORS = (StromError,)
ROW_ERRORS = (ValueError,)  # row decoders document ValueError (MalformedRowError at the server)


def assert_same_outcome(fast: tuple[str, Any], reference: tuple[str, Any], context: str) -> None:
    """The C path and the Python path agree: equal results, or the same error type and message."""
    assert fast[0] == reference[0], f"{context}: native {fast!r:.400} vs python {reference!r:.400}"
    if fast[0] == "error":
        assert fast[1] == reference[1], context
    elif isinstance(fast[1], pa.RecordBatch):
        assert batches_identical(fast[1], reference[1]), f"{context}:\n{fast[1]}\n!=\n{reference[1]}"
    else:
        assert fast[1] == reference[1], context
