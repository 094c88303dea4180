"""Fuzz target: ARROW log batches as ProduceLog carries them and readers of the log decode them.

Input: byte 0 bit 0 set means "recompute the first batch's CRC" (so mutations reach the Arrow reader
behind it); the rest is the records buffer. Allowed outcome: CorruptRecordError. A batch that parses is
read to Python values and projected, as FetchLog, the tiering and clients would.
"""

from __future__ import annotations

import struct
import sys

import crc32c

from fuzz.common import instrumented, main

with instrumented():
    import pyarrow as pa

    from strom.errors import CorruptRecordError
    from strom.records import log_batch

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("tags", pa.list_(pa.int64())),
        pa.field("price", pa.decimal128(10, 2)),
        pa.field("raw", pa.binary()),
    ]
)


def fix_crc(data: bytes) -> bytes:
    out = bytearray(data)
    if len(out) >= log_batch.HEADER_SIZE_BYTES:
        (length,) = struct.unpack_from("<i", out, log_batch.LENGTH_OFFSET)
        end = min(len(out), max(log_batch.SCHEMA_ID_OFFSET, length + log_batch.LOG_OVERHEAD_BYTES))
        struct.pack_into("<I", out, log_batch.CRC_OFFSET, crc32c.crc32c(bytes(out[log_batch.SCHEMA_ID_OFFSET : end])))
    return bytes(out)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    records = fix_crc(data[1:]) if data[0] & 1 else data[1:]
    try:
        for position, header in log_batch.iter_batches(records):
            _change_types, batch = log_batch.read_arrow(records, position, header, SCHEMA)
            batch.to_pylist()
            log_batch.project(records, position, header, SCHEMA, [1, 0], "zstd")
    except CorruptRecordError:
        pass


if __name__ == "__main__":
    main("log_batch", test_one_input)
    sys.exit(0)
