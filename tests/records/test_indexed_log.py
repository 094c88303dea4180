"""INDEXED log batches: Fluss's record layout byte for byte, decoding into Arrow, and every framing error."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from strom.errors import CorruptRecordError, InvalidColumnProjectionError, InvalidTableError
from strom.records import log_batch, row_log
from strom.records.indexed import IndexedRowEncoder
from strom.records.log_batch import ChangeType
from strom.records.types import BigIntType, IntType, RowType, StringType

ROW_TYPE = RowType.of(("id", IntType()), ("name", StringType()), ("score", BigIntType()))
ARROW_SCHEMA = pa.schema([("id", pa.int32()), ("name", pa.string()), ("score", pa.int64())])


def java_row(row_id: int, name: str | None, score: int) -> bytes:
    """An IndexedRow written out by hand: null bitset, one i32 length per variable-length field, values."""
    if name is None:
        return bytes([0b010]) + struct.pack("<i", 0) + struct.pack("<iq", row_id, score)
    payload = name.encode()
    return (
        bytes([0])
        + struct.pack("<i", len(payload))
        + struct.pack("<i", row_id)
        + payload
        + struct.pack("<q", score)
    )


def java_record(change_type: int, row: bytes) -> bytes:
    """IndexedLogRecord: length (change type byte + row), change type, row."""
    return struct.pack("<i", len(row) + 1) + bytes([change_type]) + row


def decoder() -> row_log.LogBatchDecoder:
    return row_log.LogBatchDecoder(row_log.INDEXED, ROW_TYPE, ARROW_SCHEMA)


def read_one(batch: bytes) -> tuple[bytes | None, pa.RecordBatch]:
    ((position, header),) = list(log_batch.iter_batches(batch))
    return decoder().read(batch, position, header)


def test_an_append_only_batch_has_fluss_record_layout_after_the_v0_header() -> None:
    encoder = IndexedRowEncoder(ROW_TYPE)
    rows = [encoder.encode((1, "ab", 10)), encoder.encode((2, None, -5))]

    batch = row_log.build_row_batch(rows, schema_id=1, writer_id=7, batch_sequence=3)

    header = log_batch.read_header(batch)
    assert (header.magic, header.schema_id, header.record_count, header.last_offset_delta) == (0, 1, 2, 1)
    assert header.is_append_only
    assert (header.writer_id, header.batch_sequence) == (7, 3)
    assert rows == [java_row(1, "ab", 10), java_row(2, None, -5)]
    assert batch[log_batch.HEADER_SIZE_BYTES :] == java_record(0, rows[0]) + java_record(0, rows[1])
    list(log_batch.iter_batches(batch))  # the CRC covers the records


def test_a_hand_built_batch_decodes_into_the_table_arrow_schema() -> None:
    body = java_record(0, java_row(1, "héllo", 2**40)) + java_record(0, java_row(-3, None, 0))
    batch = log_batch.build_batch(schema_id=1, record_count=2, records=body, append_only=True)

    change_types, decoded = read_one(batch)

    assert change_types is None
    assert decoded.schema == ARROW_SCHEMA
    assert decoded.to_pylist() == [
        {"id": 1, "name": "héllo", "score": 2**40},
        {"id": -3, "name": None, "score": 0},
    ]


def test_a_changelog_batch_returns_each_record_change_type() -> None:
    kinds = bytes([ChangeType.INSERT, ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER, ChangeType.DELETE])
    rows = [java_row(i, f"n{i}", i) for i in range(4)]

    change_types, decoded = read_one(row_log.build_row_batch(rows, schema_id=1, change_types=kinds))

    assert change_types == kinds
    assert decoded.column("id").to_pylist() == [0, 1, 2, 3]


def test_an_empty_batch_decodes_to_no_rows() -> None:
    change_types, decoded = read_one(row_log.build_row_batch([], schema_id=1))
    assert change_types is None
    assert decoded.num_rows == 0 and decoded.schema == ARROW_SCHEMA


def test_an_arrow_batch_sent_to_an_indexed_table_is_refused_as_the_wrong_format() -> None:
    arrow = log_batch.build_arrow_batch(
        pa.record_batch(
            [pa.array([1], pa.int32()), pa.array(["x"]), pa.array([2], pa.int64())], schema=ARROW_SCHEMA
        ),
        schema_id=1,
    )
    with pytest.raises(InvalidTableError, match="INDEXED"):
        read_one(arrow)


@pytest.mark.parametrize(
    ("body", "record_count", "append_only", "problem"),
    [
        (java_record(0, java_row(1, "a", 1))[:-3], 1, True, "claims"),
        (java_record(0, java_row(1, "a", 1)) + b"\x01\x00", 1, True, "truncated record"),
        (java_record(0, java_row(1, "a", 1)), 2, True, "1 records, header says 2"),
        (struct.pack("<i", 0) + b"\x00", 1, True, "claims 0 bytes"),
        (java_record(ChangeType.INSERT, java_row(1, "a", 1)), 1, True, "in an append-only batch"),
        (java_record(9, java_row(1, "a", 1)), 1, False, "change type 9"),
        (java_record(0, java_row(1, "a", 1)[:-2]), 1, True, "not of the table's type"),
    ],
    ids=[
        "overrun",
        "trailing-bytes",
        "count",
        "zero-length",
        "append-only-insert",
        "unknown-kind",
        "short-row",
    ],
)
def test_malformed_records_are_corrupt(
    body: bytes, record_count: int, append_only: bool, problem: str
) -> None:
    batch = log_batch.build_batch(
        schema_id=1, record_count=record_count, records=body, append_only=append_only
    )
    with pytest.raises(CorruptRecordError, match=problem):
        read_one(batch)


def test_only_arrow_logs_can_be_projected() -> None:
    row_log.LogBatchDecoder(row_log.ARROW, ROW_TYPE, ARROW_SCHEMA).check_projection("t")
    with pytest.raises(InvalidColumnProjectionError, match="INDEXED log format"):
        decoder().check_projection("t")


def test_the_log_format_property_is_read_case_insensitively_with_arrow_as_default() -> None:
    assert row_log.log_format({}) == "ARROW"
    assert row_log.log_format({"table.log.format": " indexed "}) == "INDEXED"


def test_an_arrow_batch_round_trips_through_indexed_records() -> None:
    source = pa.record_batch(
        [pa.array([1, 2, None], pa.int32()), pa.array(["a", None, "ccc"]), pa.array([5, 6, 7], pa.int64())],
        schema=ARROW_SCHEMA,
    )
    encoded = row_log.encode_row_batch(source, IndexedRowEncoder(ROW_TYPE), schema_id=1)
    _, decoded = read_one(encoded)
    assert decoded.equals(source)


def _varint(value: int) -> bytes:
    """An unsigned LEB128 varint, as CompactedRow writes integers."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def compacted_row(row_id: int, name: str | None, score: int) -> bytes:
    """A CompactedRow written out by hand: null bitset (one byte for three fields), then the non-null
    values back to back, INT and BIGINT as varints, STRING as a varint length and its UTF-8 bytes."""
    if name is None:
        return bytes([0b010]) + _varint(row_id) + _varint(score)
    payload = name.encode()
    return bytes([0]) + _varint(row_id) + _varint(len(payload)) + payload + _varint(score)


def test_a_compacted_batch_is_fluss_record_layout_around_compacted_rows() -> None:
    rows = [(7, "seven", 70), (300, None, 3000)]
    by_hand = b"".join(java_record(0, compacted_row(*row)) for row in rows)  # CompactedLogRecord: same framing
    encoder = row_log.row_encoder(row_log.COMPACTED, ROW_TYPE)
    assert row_log.encode_records([encoder.encode(list(row)) for row in rows]) == by_hand
    data = log_batch.build_batch(schema_id=1, record_count=2, records=by_hand, append_only=True)
    [(position, header)] = list(log_batch.iter_batches(data))
    change_types, batch = row_log.LogBatchDecoder(row_log.COMPACTED, ROW_TYPE, ARROW_SCHEMA).read(data, position, header)
    assert change_types is None
    assert batch.to_pylist() == [dict(zip(ARROW_SCHEMA.names, row, strict=True)) for row in rows]
    arrow = log_batch.build_arrow_batch(pa.RecordBatch.from_pylist(batch.to_pylist(), schema=ARROW_SCHEMA), schema_id=1)
    with pytest.raises(InvalidTableError, match="COMPACTED"):  # an Arrow body sent to a COMPACTED table
        row_log.LogBatchDecoder(row_log.COMPACTED, ROW_TYPE, ARROW_SCHEMA).read(arrow, 0, log_batch.read_header(arrow))
