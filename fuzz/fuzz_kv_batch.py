"""Fuzz target: KV record batches (PutKv) and value record batches (LimitScan/ScanKv), C against Python.

Input: byte 0 picks the parser (bit 1: value batch, else kv batch) and, for kv batches, bit 0 asks for
the CRC to be recomputed. Allowed outcome: CorruptRecordError; the native parsers must return what the
Python references return, or raise the same error with the same message.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import crc32c

from fuzz.common import instrumented, main

with instrumented():
    from strom.errors import CorruptRecordError
    from strom.records import kv_batch


def fix_crc(data: bytes) -> bytes:
    out = bytearray(data)
    if len(out) >= kv_batch.KV_HEADER_SIZE_BYTES:
        (length,) = struct.unpack_from("<i", out, 0)
        end = min(len(out), max(kv_batch.KV_CRC_START, length + 4))
        struct.pack_into("<I", out, 5, crc32c.crc32c(bytes(out[kv_batch.KV_CRC_START : end])))
    return bytes(out)


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except CorruptRecordError as exc:
        return "error", str(exc)


def _value_batch_python(data: bytes) -> list[bytes]:
    saved = kv_batch.native
    kv_batch.native = None
    try:
        return kv_batch.parse_value_batch(data)
    finally:
        kv_batch.native = saved


def test_one_input(data: bytes) -> None:
    if not data:
        return
    body = data[1:]
    if data[0] & 2:
        fast = _outcome(lambda: kv_batch.parse_value_batch(body))
        reference = _outcome(lambda: _value_batch_python(body))
        assert fast == reference, (fast, reference)
        return
    records = fix_crc(body) if data[0] & 1 else body
    _outcome(lambda: kv_batch.parse_kv_batches(records))
    if len(records) >= kv_batch.KV_HEADER_SIZE_BYTES:
        (count,) = struct.unpack_from("<i", records, 24)
        view = memoryview(records)
        start = kv_batch.KV_HEADER_SIZE_BYTES
        reference = _outcome(lambda: kv_batch._parse_records_python(view, start, len(records), count))
        if kv_batch.native is not None:
            fast = _outcome(lambda: kv_batch.parse_kv_records(view, start, len(records), count))
            assert fast == reference, (fast, reference)


if __name__ == "__main__":
    main("kv_batch", test_one_input)
    sys.exit(0)
