"""Fluss log record batches, magic V0, V1 and V2: the unit of ProduceLog, FetchLog and the on-disk log.

All integers are little-endian (unlike the RPC header). V0, a 48-byte header then the records:

    0 base_offset i64 | 8 length i32 (bytes after this field) | 12 magic i8 | 13 commit_timestamp i64
    21 crc u32 (CRC-32C of bytes [25, end)) | 25 schema_id i16 | 27 attributes i8 (bit 0: append-only)
    28 last_offset_delta i32 | 32 writer_id i64 | 40 batch_sequence i32 | 44 record_count i32 | 48 records

V1 (Fluss 0.9, batch statistics) adds ``statistics_length i32`` at 48, then that many bytes of statistics
(:mod:`strom.records.batch_statistics`), then the records. V2 adds ``leader_epoch i32`` at 21 (the epoch of
the leader that appended the batch), moving the CRC to 25 and the fields after it by four bytes; its CRC
covers [29, end). Every version's CRC covers the schema id to the end, statistics included.

The records are one Arrow IPC encapsulated RecordBatch message (no schema, no end-of-stream marker); a
changelog batch (append-only bit clear) puts ``record_count`` change-type bytes before it. The base offset,
commit timestamp and leader epoch sit before the CRC'd range, so the server stamps them without
recomputing the CRC.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import crc32c
import pyarrow as pa

from strom.errors import CorruptRecordError
from strom.records.arrow_compression import ArrowCompression, compressed_message

HEADER = struct.Struct("<qibqIhbiqii")
HEADER_SIZE_BYTES = 48
"""V0's header: the smallest of every version's (what a reader needs before it can read the magic)."""
assert HEADER.size == HEADER_SIZE_BYTES
_HEADER_V1 = struct.Struct("<qibqIhbiqiii")
_HEADER_V2 = struct.Struct("<qibqiIhbiqiii")
LENGTH_OFFSET = 8
MAGIC_OFFSET = 12
LOG_OVERHEAD_BYTES = 12  # base_offset + length: the bytes not counted by `length`
CRC_OFFSET = 21
SCHEMA_ID_OFFSET = 25
STAMP = struct.Struct("<q")
COMMIT_TIMESTAMP_OFFSET = 13
LEADER_EPOCH_OFFSET = 21
"""V2 only: where the leader's epoch is stamped."""
MAGIC_V0, MAGIC_V1, MAGIC_V2 = 0, 1, 2
MAGICS = (MAGIC_V0, MAGIC_V1, MAGIC_V2)
NO_LEADER_EPOCH = -1
"""The leader epoch of a batch written before V2, or not yet stamped."""
APPEND_ONLY_FLAG = 0x01
NO_WRITER_ID = -1
NO_BATCH_SEQUENCE = -1
REPLAYABLE_WRITER_ID_MIN = 1 << 62
"""Writer ids from here up are chosen by the client, never handed out by InitWriter (a strom extension): a
*replayable writer* writes the same batches with the same ids and sequences each time it runs again (an
exactly-once Spark task after a crash); see ``strom/log/writer_state.py`` for how a bucket answers them."""
RUN_SEQUENCE_SPAN = 1 << 16
"""Sequences of one run (a micro-batch) of a replayable writer start at a multiple of this in each bucket."""
REPLAYABLE_RUNS_MAX = 0x7FFFFFFF // RUN_SEQUENCE_SPAN - 1
"""The last run of one replayable writer id: batch sequences are int32, each run has RUN_SEQUENCE_SPAN of them."""
_LENGTH = struct.Struct("<i")
_CRC = struct.Struct("<I")


class ChangeType(IntEnum):
    APPEND_ONLY = 0
    INSERT = 1
    UPDATE_BEFORE = 2
    UPDATE_AFTER = 3
    DELETE = 4


CHANGE_INSERT = bytes([ChangeType.INSERT])
CHANGE_UPDATE_PAIR = bytes([ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER])
"""``-U old`` then ``+U new``: an update under the FULL changelog image."""
CHANGE_UPDATE_AFTER = bytes([ChangeType.UPDATE_AFTER])
CHANGE_DELETE = bytes([ChangeType.DELETE])
"""A changelog's change types as the bytes its planners append, one per record."""


@dataclass(frozen=True, slots=True)
class LogBatchHeader:
    base_offset: int
    length: int
    magic: int
    commit_timestamp: int
    crc: int
    schema_id: int
    attributes: int
    last_offset_delta: int
    writer_id: int
    batch_sequence: int
    record_count: int
    statistics_length: int = 0
    """V1 and V2: the bytes of statistics between the header and the records (0: none)."""
    leader_epoch: int = NO_LEADER_EPOCH
    """V2: the epoch of the leader that appended the batch."""

    @property
    def size_bytes(self) -> int:
        return self.length + LOG_OVERHEAD_BYTES

    @property
    def header_size(self) -> int:
        """The fixed header's bytes (statistics excluded)."""
        return _HEADER_SIZES[self.magic]

    @property
    def records_offset(self) -> int:
        """Where the records start, from the batch's first byte (after the header and any statistics)."""
        return _HEADER_SIZES[self.magic] + self.statistics_length

    @property
    def crc_start(self) -> int:
        """Where the CRC'd range starts (the schema id), from the batch's first byte."""
        return _CRC_STARTS[self.magic]

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def is_append_only(self) -> bool:
        return bool(self.attributes & APPEND_ONLY_FLAG)


_HEADER_SIZES = {MAGIC_V0: HEADER_SIZE_BYTES, MAGIC_V1: _HEADER_V1.size, MAGIC_V2: _HEADER_V2.size}
HEADER_SIZE_BYTES_MAX = _HEADER_V2.size
"""The largest fixed header (V2's): a reader holding this many bytes can read any batch's header."""
_CRC_STARTS = {MAGIC_V0: SCHEMA_ID_OFFSET, MAGIC_V1: SCHEMA_ID_OFFSET, MAGIC_V2: SCHEMA_ID_OFFSET + 4}


def header_size(magic: int) -> int:
    """The fixed header's bytes of a batch of ``magic``; CorruptRecordError for a magic no version has."""
    size = _HEADER_SIZES.get(magic)
    if size is None:
        raise CorruptRecordError(f"unsupported log batch magic {magic}")
    return size


def read_header(buffer: bytes | bytearray | memoryview, position: int = 0) -> LogBatchHeader:
    """The header of the batch at ``position``, whichever its version; the buffer must hold the whole
    fixed header of that version (:func:`header_size` of the magic at ``position + MAGIC_OFFSET``)."""
    magic = buffer[position + MAGIC_OFFSET]
    if magic == MAGIC_V0:
        return LogBatchHeader(*HEADER.unpack_from(buffer, position))
    if magic == MAGIC_V1:
        return LogBatchHeader(*_HEADER_V1.unpack_from(buffer, position))
    if magic == MAGIC_V2:
        (base_offset, length, magic, commit_timestamp, leader_epoch, crc, schema_id, attributes,
         last_offset_delta, writer_id, batch_sequence, record_count, statistics_length) = _HEADER_V2.unpack_from(
            buffer, position)
        return LogBatchHeader(base_offset, length, magic, commit_timestamp, crc, schema_id, attributes,
                              last_offset_delta, writer_id, batch_sequence, record_count, statistics_length,
                              leader_epoch)
    raise CorruptRecordError(f"unsupported log batch magic {magic} at byte {position}")


def check_framing(header: LogBatchHeader, position: int, available: int) -> None:
    """Raise CorruptRecordError unless the batch's fields agree with each other and its bytes are all
    there (``available``: the bytes from ``position`` to the end of the buffer)."""
    size = header.size_bytes
    if header.length < header.header_size - LOG_OVERHEAD_BYTES or size > available:
        raise CorruptRecordError(f"log batch at byte {position} claims {size} bytes, {available} present")
    if header.statistics_length < 0 or header.records_offset > size:
        raise CorruptRecordError(
            f"log batch at byte {position}: {header.statistics_length} bytes of statistics do not fit its {size} bytes"
        )
    if header.record_count < 0 or header.last_offset_delta != max(header.record_count - 1, 0):
        raise CorruptRecordError(
            f"log batch at byte {position}: record_count {header.record_count} "
            f"disagrees with last_offset_delta {header.last_offset_delta}"
        )


def iter_batches(
    buffer: bytes | bytearray | memoryview, *, verify_crc: bool = True
) -> Iterator[tuple[int, LogBatchHeader]]:
    """Yield ``(position, header)`` of each batch in ``buffer``, validating framing (and CRCs).

    Raises CorruptRecordError for a truncated batch, an unknown magic, a length that disagrees with the
    record count or the statistics, or a bad CRC — a client's request is then rejected as a whole, so
    nothing is half-written.
    """
    view = memoryview(buffer)
    position = 0
    end = len(view)
    while position < end:
        left = end - position
        if left <= MAGIC_OFFSET or left < _HEADER_SIZES.get(view[position + MAGIC_OFFSET], HEADER_SIZE_BYTES):
            raise CorruptRecordError(f"truncated log batch header at byte {position} ({left} bytes left)")
        header = read_header(view, position)
        check_framing(header, position, left)
        size = header.size_bytes
        if verify_crc:
            actual = crc32c.crc32c(view[position + header.crc_start : position + size])
            if actual != header.crc:
                raise CorruptRecordError(
                    f"log batch at byte {position}: CRC-32C {actual:#010x} != header {header.crc:#010x}"
                )
        yield position, header
        position += size


def stamp(buffer: bytearray | memoryview, position: int, base_offset: int, commit_timestamp: int) -> None:
    """Write the server-assigned base offset and commit timestamp (outside the CRC'd range, at the same
    place in every version)."""
    STAMP.pack_into(buffer, position, base_offset)
    STAMP.pack_into(buffer, position + COMMIT_TIMESTAMP_OFFSET, commit_timestamp)


def build_batch(
    *,
    schema_id: int,
    record_count: int,
    records: bytes | bytearray | memoryview,
    append_only: bool,
    writer_id: int = NO_WRITER_ID,
    batch_sequence: int = NO_BATCH_SEQUENCE,
    base_offset: int = 0,
    commit_timestamp: int = 0,
    magic: int = MAGIC_V0,
    statistics: bytes = b"",
    leader_epoch: int = NO_LEADER_EPOCH,
) -> bytes:
    """Assemble a batch of ``magic`` around already encoded ``records`` (change-type bytes + Arrow
    message); V1 and V2 carry ``statistics`` (empty: none), V2 ``leader_epoch``."""
    assert record_count >= 0
    assert magic != MAGIC_V0 or not statistics, "V0 has no statistics"
    head = _HEADER_SIZES[magic]
    size = head + len(statistics) + len(records)
    buffer = bytearray(size)
    fields = (schema_id, APPEND_ONLY_FLAG if append_only else 0, max(record_count - 1, 0), writer_id, batch_sequence,
              record_count)
    if magic == MAGIC_V0:
        HEADER.pack_into(buffer, 0, base_offset, size - LOG_OVERHEAD_BYTES, magic, commit_timestamp, 0, *fields)
    elif magic == MAGIC_V1:
        _HEADER_V1.pack_into(buffer, 0, base_offset, size - LOG_OVERHEAD_BYTES, magic, commit_timestamp, 0, *fields,
                             len(statistics))
    else:
        _HEADER_V2.pack_into(buffer, 0, base_offset, size - LOG_OVERHEAD_BYTES, magic, commit_timestamp, leader_epoch,
                             0, *fields, len(statistics))
    buffer[head : head + len(statistics)] = statistics
    buffer[head + len(statistics) :] = records
    crc_start = _CRC_STARTS[magic]
    _CRC.pack_into(buffer, crc_start - 4, crc32c.crc32c(memoryview(buffer)[crc_start:]))
    return bytes(buffer)


COMPRESSION_MIN_BYTES = 4096


def arrow_message(batch: pa.RecordBatch, compression: ArrowCompression | None = None) -> bytes:
    """One Arrow IPC encapsulated RecordBatch message, body-compressed with ``compression`` if set
    (:mod:`strom.records.arrow_compression`).

    A batch under ``COMPRESSION_MIN_BYTES`` goes uncompressed (a message without body compression, which
    every Arrow reader accepts): compressing its few small buffers costs more than the few hundred bytes it
    saves."""
    if compression is None or not batch.num_rows or batch.get_total_buffer_size() < COMPRESSION_MIN_BYTES:
        return batch.serialize().to_pybytes()
    return compressed_message(batch, compression)


def build_arrow_batch(
    batch: pa.RecordBatch,
    *,
    schema_id: int,
    change_types: bytes | None = None,
    compression: ArrowCompression | None = None,
    writer_id: int = NO_WRITER_ID,
    batch_sequence: int = NO_BATCH_SEQUENCE,
    statistics: bytes = b"",
) -> bytes:
    """A log batch holding ``batch``: append-only when ``change_types`` is None, a changelog otherwise; a V1
    batch carrying ``statistics`` when given (:mod:`strom.records.batch_statistics`), else V0."""
    body = arrow_message(batch, compression) if batch.num_rows or change_types is not None else b""
    if change_types is not None:
        assert len(change_types) == batch.num_rows
        body = bytes(change_types) + body if batch.num_rows else b""
    return build_batch(
        schema_id=schema_id,
        record_count=batch.num_rows,
        records=body,
        append_only=change_types is None,
        writer_id=writer_id,
        batch_sequence=batch_sequence,
        magic=MAGIC_V1 if statistics else MAGIC_V0,
        statistics=statistics,
    )


def read_arrow(
    buffer: bytes | bytearray | memoryview, position: int, header: LogBatchHeader, schema: pa.Schema
) -> tuple[bytes | None, pa.RecordBatch]:
    """Decode one batch's change types (None for append-only) and rows with the table's Arrow schema."""
    view = memoryview(buffer)[position + header.records_offset : position + header.size_bytes]
    if header.record_count == 0:
        return (None if header.is_append_only else b""), _empty(schema)
    change_types = None
    if not header.is_append_only:
        change_types = bytes(view[: header.record_count])
        view = view[header.record_count :]
    try:
        batch = pa.ipc.read_record_batch(pa.py_buffer(view), schema)
        # Reading only checks the message's framing; offsets pointing outside their buffers would pass and
        # crash whoever reads the values later (a projection, the lake tiering, a client), so check them all.
        _validate_full(batch)
    except (pa.ArrowException, OSError, EOFError) as exc:  # EOFError: the body is an end-of-stream marker
        raise CorruptRecordError(f"log batch at offset {header.base_offset} holds no valid Arrow data: {exc}") from exc
    if batch.num_rows != header.record_count:
        raise CorruptRecordError(
            f"log batch at offset {header.base_offset}: {batch.num_rows} Arrow rows, header says {header.record_count}"
        )
    return change_types, batch


def _validate_full(batch: pa.RecordBatch) -> None:
    """Arrow's full validation (offsets and indexes in bounds, UTF-8, decimal precision) of ``batch``,
    except the range of TIME values: Fluss does not bound them (a CompactedRow TIME is any int32 of
    millis), so strom's own changelog may hold TIMEs beyond one day, which are harmless to read."""
    types = _time_as_integers(batch.schema)
    if types is not None:
        batch = pa.RecordBatch.from_arrays(
            [column.view(t) for column, t in zip(batch.columns, types, strict=True)], names=batch.schema.names
        )
    batch.validate(full=True)


@functools.lru_cache(maxsize=256)
def _time_as_integers(schema: pa.Schema) -> tuple[pa.DataType, ...] | None:
    """The schema's column types with every TIME (at any depth) as the integer of its width, or None
    when it has no TIME."""
    types = tuple(_integer_time(f.type) for f in schema)
    return None if types == tuple(schema.types) else types


def _integer_time(t: pa.DataType) -> pa.DataType:
    if pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_integer_time(t.key_type)), t.item_field.with_type(_integer_time(t.item_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_integer_time(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_integer_time(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_integer_time(f.type)) for f in t])
    return t


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


def project(
    buffer: bytes | bytearray | memoryview,
    position: int,
    header: LogBatchHeader,
    schema: pa.Schema,
    columns: list[int],
    compression: ArrowCompression | None,
) -> bytes:
    """The batch with only ``columns`` (in that order), re-encoded with a fresh CRC; offsets are kept. The
    projection is a V0 batch whatever the original's version: statistics name the full row's columns."""
    change_types, batch = read_arrow(buffer, position, header, schema)
    projected = batch.select(columns)
    body = b""
    if header.record_count:
        body = (change_types or b"") + arrow_message(projected, compression)
    return build_batch(
        schema_id=header.schema_id,
        record_count=header.record_count,
        records=body,
        append_only=header.is_append_only,
        writer_id=header.writer_id,
        batch_sequence=header.batch_sequence,
        base_offset=header.base_offset,
        commit_timestamp=header.commit_timestamp,
    )
