"""KV record batches (PutKv) and value record batches (LimitScan, ScanKv); little-endian throughout.

KvRecordBatch, 28-byte header then records:

    0 length i32 (bytes after this field) | 4 magic i8 | 5 crc u32 (CRC-32C of bytes [9, end))
    9 schema_id i16 | 11 attributes i8 | 12 writer_id i64 | 20 batch_sequence i32 | 24 record_count i32

Each record: ``size i32`` (bytes after it), ``varint key_length``, key, then the value — whatever bytes
remain, a row *without* a schema id. A record with no value bytes is a delete.

Value record batch: ``length i32 | magic i8 | record_count i32`` then per record ``size i32`` and a stored
value (``schema_id i16`` + row bytes).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import crc32c

from strom.errors import CorruptRecordError
from strom.records.compacted import write_varint32
from strom.records.rowcodec_native import NATIVE_AVAILABLE, native

KV_HEADER = struct.Struct("<ibIhbqii")
KV_HEADER_SIZE_BYTES = 28
assert KV_HEADER.size == KV_HEADER_SIZE_BYTES
KV_CRC_START = 9
KV_MAGIC = 0
VALUE_HEADER = struct.Struct("<ibi")
VALUE_HEADER_SIZE_BYTES = 9
assert VALUE_HEADER.size == VALUE_HEADER_SIZE_BYTES
SCHEMA_ID = struct.Struct("<h")
_INT32 = struct.Struct("<i")


@dataclass(frozen=True, slots=True)
class KvBatch:
    """The decoded content of one KvRecordBatch; ``values[i] is None`` means delete ``keys[i]``."""

    schema_id: int
    writer_id: int
    batch_sequence: int
    keys: list[bytes]
    values: list[bytes | None]
    size_bytes: int = 0
    """The batch's bytes on the wire: what its rows weigh in the pre-write buffer (back-pressure)."""


def parse_kv_batches(buffer: bytes | memoryview) -> list[KvBatch]:
    """Parse every KvRecordBatch in ``buffer``, verifying framing and CRC; raises CorruptRecordError."""
    view = memoryview(buffer)
    batches: list[KvBatch] = []
    position = 0
    end = len(view)
    while position < end:
        if end - position < KV_HEADER_SIZE_BYTES:
            raise CorruptRecordError(f"truncated kv batch header at byte {position}")
        length, magic, crc, schema_id, _attributes, writer_id, sequence, count = KV_HEADER.unpack_from(view, position)
        batch_end = position + 4 + length
        if magic != KV_MAGIC:
            raise CorruptRecordError(f"unsupported kv batch magic {magic}")
        if length < KV_HEADER_SIZE_BYTES - 4 or batch_end > end:
            raise CorruptRecordError(f"kv batch at byte {position} claims {length + 4} bytes, {end - position} present")
        actual = crc32c.crc32c(view[position + KV_CRC_START : batch_end])
        if actual != crc:
            raise CorruptRecordError(f"kv batch CRC-32C {actual:#010x} != header {crc:#010x}")
        if count < 0:
            raise CorruptRecordError(f"kv batch record count {count} is negative")
        keys, values = _parse_records(view, position + KV_HEADER_SIZE_BYTES, batch_end, count)
        batches.append(KvBatch(schema_id, writer_id, sequence, keys, values, batch_end - position))
        position = batch_end
    return batches


def _parse_records(view: memoryview, position: int, end: int, count: int) -> tuple[list[bytes], list[bytes | None]]:
    """The records of one batch body; the native parser when built, else ``_parse_records_python``."""
    if NATIVE_AVAILABLE:
        return parse_kv_records(view, position, end, count)
    return _parse_records_python(view, position, end, count)


def _parse_records_python(
    view: memoryview, position: int, end: int, count: int
) -> tuple[list[bytes], list[bytes | None]]:
    """The reference parser: the native one raises the same errors with the same messages."""
    keys: list[bytes] = []
    values: list[bytes | None] = []
    unpack_int32 = _INT32.unpack_from
    for _ in range(count):
        if end - position < 4:
            raise CorruptRecordError("truncated kv record size")
        (size,) = unpack_int32(view, position)
        record_start = position + 4
        record_end = record_start + size
        if size < 1 or record_end > end:
            raise CorruptRecordError(f"kv record of {size} bytes overruns its batch")
        key_length = 0
        shift = 0
        cursor = record_start
        while True:
            if cursor >= record_end or shift > 28:
                raise CorruptRecordError("malformed kv record key length")
            byte = view[cursor]
            cursor += 1
            key_length |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        key_end = cursor + key_length
        if key_end > record_end:
            raise CorruptRecordError(f"kv record key of {key_length} bytes overruns its record")
        keys.append(bytes(view[cursor:key_end]))
        values.append(bytes(view[key_end:record_end]) if key_end < record_end else None)
        position = record_end
    if position != end:
        raise CorruptRecordError(f"kv batch has {end - position} trailing bytes after {count} records")
    return keys, values


@functools.lru_cache(maxsize=1024)
def _key_length_prefix(length: int) -> bytes:
    """The varint of a key length (keys of a table mostly share a few lengths)."""
    prefix = bytearray()
    write_varint32(prefix, length)
    return bytes(prefix)


def _kv_records_python(keys: Sequence[bytes], values: Sequence[bytes | None]) -> bytes:
    """The records of a KvRecordBatch body; the reference of the compiled ``build_kv_records``."""
    parts: list[bytes] = []
    append = parts.append
    pack = _INT32.pack
    for key, value in zip(keys, values, strict=True):
        key_length = _key_length_prefix(len(key))
        size = len(key_length) + len(key)
        if value:
            append(pack(size + len(value)))
            append(key_length)
            append(key)
            append(value)
        else:
            append(pack(size))
            append(key_length)
            append(key)
    return b"".join(parts)


def build_kv_batch(
    schema_id: int,
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    *,
    writer_id: int = -1,
    batch_sequence: int = -1,
) -> bytes:
    """Encode a KvRecordBatch (what a client sends in PutKv); ``None`` values are deletes."""
    if len(keys) != len(values):
        raise ValueError("keys and values differ in length")
    records = _kv_records_python(keys, values) if native is None else native.build_kv_records(keys, values)
    buffer = bytearray(KV_HEADER_SIZE_BYTES) + records
    KV_HEADER.pack_into(buffer, 0, len(buffer) - 4, KV_MAGIC, 0, schema_id, 0, writer_id, batch_sequence, len(keys))
    struct.pack_into("<I", buffer, 5, crc32c.crc32c(memoryview(buffer)[KV_CRC_START:]))
    return bytes(buffer)


def build_value_batch(values: Sequence[bytes]) -> bytes:
    """A value record batch of stored values (each already ``schema_id i16`` + row bytes)."""
    parts = [b""]
    size = VALUE_HEADER_SIZE_BYTES
    for value in values:
        parts.append(_INT32.pack(len(value)))
        parts.append(value)
        size += 4 + len(value)
    parts[0] = VALUE_HEADER.pack(size - 4, 0, len(values))
    return b"".join(parts)


def parse_value_batch(buffer: bytes | memoryview) -> list[bytes]:
    """The stored values of a value record batch (empty input means no records)."""
    view = memoryview(buffer)
    if len(view) == 0:
        return []
    if len(view) < VALUE_HEADER_SIZE_BYTES:
        raise CorruptRecordError("truncated value batch header")
    length, _magic, count = VALUE_HEADER.unpack_from(view, 0)
    end = 4 + length
    if end > len(view):
        raise CorruptRecordError("value batch overruns its buffer")
    if native is not None:
        try:
            values: list[bytes] = native.parse_value_records(view, VALUE_HEADER_SIZE_BYTES, end, count)
        except ValueError as exc:
            raise CorruptRecordError(str(exc)) from exc
        return values
    if end < VALUE_HEADER_SIZE_BYTES or count < 0:  # a negative length or count: as the native parser says
        raise CorruptRecordError("value batch bounds are outside the buffer")
    values = []
    position = VALUE_HEADER_SIZE_BYTES
    for _ in range(count):
        if position + 4 > end:
            raise CorruptRecordError(f"value batch claims {count} records but ends after {len(values)}")
        (size,) = _INT32.unpack_from(view, position)
        position += 4
        if size < 0 or position + size > end:
            raise CorruptRecordError(f"value record of {size} bytes overruns its batch")
        values.append(bytes(view[position : position + size]))
        position += size
    if position != end:
        raise CorruptRecordError("value batch length disagrees with its records")
    return values


# ---- record bodies in C (the references are the Python above and below) ----


def parse_kv_records(
    buffer: bytes | memoryview, position: int, end: int, count: int
) -> tuple[list[bytes], list[bytes | None]]:
    """Keys and values (None: delete) of the records in ``buffer[position:end]``, parsed in C;
    ``kv_batch`` parses them in Python where the native module is not built.

    Raises:
        CorruptRecordError: the records do not fill the range exactly.
        RuntimeError: the native module is not built.
    """
    if native is None:
        raise RuntimeError("the native row codec is not built; use kv_batch.parse_kv_batches")
    try:
        keys, values = native.parse_kv_records(buffer, position, end, count)
    except ValueError as e:
        raise CorruptRecordError(str(e)) from None
    return keys, values




def fill_value_batch_python(
    values: Iterator[bytes], lookahead: bytes | None, batch_size_bytes: int, limit: int
) -> tuple[bytes, int, bytes | None]:
    """The reference of ``fill_value_batch``: one value record batch from ``values``.

    ``lookahead`` (a value pulled earlier) comes first; values are taken until the batch reaches
    ``batch_size_bytes`` (at least one), ``limit`` values were taken (negative: no limit) or the
    iterator ends. Returns the batch, its record count, and the first value of the next batch (None
    when the scan is complete).
    """
    taken: list[bytes] = []
    size = VALUE_HEADER_SIZE_BYTES
    pending = lookahead
    following: bytes | None = None
    while limit < 0 or len(taken) < limit:
        value = pending if pending is not None else next(values, None)
        pending = None
        if value is None:
            break
        if taken and size >= batch_size_bytes:
            following = value
            break
        taken.append(value)
        size += 4 + len(value)
    return build_value_batch(taken), len(taken), following


def fill_value_batch(
    values: Iterator[bytes], lookahead: bytes | None, batch_size_bytes: int, limit: int
) -> tuple[bytes, int, bytes | None]:
    """``fill_value_batch_python`` in C when built (the per-row loop of every ScanKv response)."""
    if native is not None:
        result: tuple[bytes, int, bytes | None] = native.fill_value_batch(values, lookahead, batch_size_bytes, limit)
        return result
    return fill_value_batch_python(values, lookahead, batch_size_bytes, limit)
