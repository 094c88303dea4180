"""Batch statistics and the AlignedRow they carry their bounds in, checked against Fluss's layouts written
out byte by byte here, then as a property over random batches of every supported type."""

from __future__ import annotations

import datetime
import decimal
import random
import struct

import pyarrow as pa
import pytest

from strom.records import aligned_row, batch_statistics, log_batch
from strom.records import types as t


def _slot(row: bytes, arity: int, index: int) -> bytes:
    start = aligned_row.null_bits_size(arity) + 8 * index
    return row[start : start + 8]


def test_an_aligned_row_lays_out_each_kind_of_value_as_fluss_does() -> None:
    field_types = [t.IntType(), t.StringType(), t.StringType(), t.DecimalType(10, 2), t.DecimalType(30, 4), t.TimestampType(3),
                   t.TimestampType(6), t.BooleanType(), t.DoubleType(), t.BigIntType()]
    values = [5, "abc", "a longer string", 12345, -(10**20), (1_700_000_000_123, 0), (1_700_000_000_123, 456_000),
              True, 2.5, None]
    row = aligned_row.encode(field_types, values)
    arity = len(field_types)
    bits = aligned_row.null_bits_size(arity)
    assert bits == 8 and len(row) >= bits + 8 * arity
    assert row[0] == 0 and row[1] == 0b0000_0000 and row[2] & 0b0000_0010  # field 9 null: bit 17
    assert _slot(row, arity, 0) == struct.pack("<i", 5) + bytes(4)
    assert _slot(row, arity, 1) == b"abc" + bytes(4) + bytes([0x80 | 3])  # inline: bytes, then 0x80 | length
    length, offset = struct.unpack("<II", _slot(row, arity, 2))  # offset << 32 | length, little-endian
    assert (offset % 8, length) == (0, 15) and row[offset : offset + 15] == b"a longer string"
    assert row[offset + 15 : offset + 16] == b"\x00"  # padded to a word
    assert _slot(row, arity, 3) == struct.pack("<q", 12345)  # a compact decimal: its unscaled long
    low, high = struct.unpack("<II", _slot(row, arity, 4))
    expected = (-(10**20)).to_bytes(9, "big", signed=True)  # minimal big-endian two's complement
    assert low == len(expected) and row[high : high + len(expected)] == expected
    assert _slot(row, arity, 5) == struct.pack("<q", 1_700_000_000_123)  # a compact timestamp: millis
    nanos, at = struct.unpack("<II", _slot(row, arity, 6))
    assert nanos == 456_000 and row[at : at + 8] == struct.pack("<q", 1_700_000_000_123)
    assert _slot(row, arity, 7) == b"\x01" + bytes(7)
    assert _slot(row, arity, 8) == struct.pack("<d", 2.5)
    assert _slot(row, arity, 9) == bytes(8)  # a null's slot is zero
    assert aligned_row.decode(field_types, row) == values


def test_the_statistics_bytes_follow_fluss_field_list() -> None:
    row_type = t.RowType([t.DataField("id", t.IntType()), t.DataField("name", t.StringType()), t.DataField("score", t.BigIntType())])
    batch = pa.RecordBatch.from_pydict({"id": [3, 1, 2], "name": ["c", "a", None], "score": [30, 10, 20]},
                                       schema=pa.schema([("id", pa.int32()), ("name", pa.string()), ("score", pa.int64())]))
    data = batch_statistics.collect(batch, row_type, [0, 1, 2])
    assert data[0] == 1 and struct.unpack_from("<h", data, 1)[0] == 3  # version, column count
    assert struct.unpack_from("<3h", data, 3) == (0, 1, 2)
    assert struct.unpack_from("<3i", data, 9) == (0, 1, 0)  # null counts
    (min_size,) = struct.unpack_from("<i", data, 21)
    min_row = data[25 : 25 + min_size]
    (max_size,) = struct.unpack_from("<i", data, 25 + min_size)
    max_row = data[29 + min_size : 29 + min_size + max_size]
    assert len(data) == 29 + min_size + max_size
    assert struct.unpack_from("<i", min_row, 8)[0] == 1 and struct.unpack_from("<i", max_row, 8)[0] == 3
    parsed = batch_statistics.parse(data, row_type)
    assert parsed == batch_statistics.BatchStatistics((0, 1, 2), (0, 1, 0), (1, "a", 10), (3, "c", 30))


def test_a_column_of_nulls_has_null_bounds_and_an_empty_batch_no_statistics() -> None:
    row_type = t.RowType([t.DataField("v", t.IntType())])
    schema = pa.schema([("v", pa.int32())])
    data = batch_statistics.collect(pa.RecordBatch.from_pydict({"v": [None, None]}, schema=schema), row_type, [0])
    assert batch_statistics.parse(data, row_type) == batch_statistics.BatchStatistics((0,), (2,), (None,), (None,))
    assert batch_statistics.collect(pa.RecordBatch.from_pydict({"v": []}, schema=schema), row_type, [0]) == b""
    assert batch_statistics.collect(pa.RecordBatch.from_pydict({"v": [1]}, schema=schema), row_type, []) == b""


def test_which_columns_the_option_names() -> None:
    row_type = t.RowType([t.DataField("id", t.IntType()), t.DataField("blob", t.CharType(3)), t.DataField("at", t.TimestampType(6))])
    assert batch_statistics.statistics_columns(row_type, None) == []
    assert batch_statistics.statistics_columns(row_type, "*") == [0, 1, 2]
    assert batch_statistics.statistics_columns(row_type, " at , id") == [2, 0]  # the option's order


@pytest.mark.parametrize("data", [b"", b"\x02\x01\x00", b"\x01\x05\x00", b"\x01\x01\x00\x00\x00"])
def test_statistics_that_do_not_parse_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        batch_statistics.parse(data, t.RowType([t.DataField("v", t.IntType())]))


_UTC = datetime.UTC
_GENERATORS = {
    "bool": (t.BooleanType(), pa.bool_(), lambda r: r.random() < 0.5),
    "i8": (t.TinyIntType(), pa.int8(), lambda r: r.randint(-128, 127)),
    "i16": (t.SmallIntType(), pa.int16(), lambda r: r.randint(-(2**15), 2**15 - 1)),
    "i32": (t.IntType(), pa.int32(), lambda r: r.randint(-(2**31), 2**31 - 1)),
    "i64": (t.BigIntType(), pa.int64(), lambda r: r.randint(-(2**63), 2**63 - 1)),
    "f32": (t.FloatType(), pa.float32(), lambda r: struct.unpack("<f", struct.pack("<f", r.uniform(-1e6, 1e6)))[0]),
    "f64": (t.DoubleType(), pa.float64(), lambda r: r.uniform(-1e12, 1e12)),
    "str": (t.StringType(), pa.string(), lambda r: "".join(r.choice("aé z\u4e2d") for _ in range(r.randint(0, 12)))),
    "dec": (t.DecimalType(10, 2), pa.decimal128(10, 2), lambda r: decimal.Decimal(r.randint(-10**9, 10**9)).scaleb(-2)),
    "wide": (t.DecimalType(30, 3), pa.decimal128(30, 3), lambda r: decimal.Decimal(r.randint(-10**29, 10**29)).scaleb(-3)),
    "date": (t.DateType(), pa.date32(), lambda r: datetime.date(1970, 1, 1) + datetime.timedelta(days=r.randint(-9999, 30000))),
    "time": (t.TimeType(3), pa.time32("ms"), lambda r: (datetime.datetime(2000, 1, 1) + datetime.timedelta(
        milliseconds=r.randint(0, 86_399_999))).time()),
    "ts3": (t.TimestampType(3), pa.timestamp("ms"), lambda r: r.randint(-(10**12), 10**13)),
    "ts9": (t.TimestampType(9), pa.timestamp("ns"), lambda r: r.randint(-(10**17), 10**18)),
    "ltz6": (t.TimestampLtzType(6), pa.timestamp("us", tz="UTC"), lambda r: r.randint(-(10**15), 10**16)),
}


def _internal(kind: str, value: object) -> object:
    """What the statistics hold for ``value``, computed the plain way."""
    if value is None:
        return None
    if kind in ("dec", "wide"):
        return int(value.scaleb(2 if kind == "dec" else 3))  # type: ignore[attr-defined]
    if kind == "date":
        return (value - datetime.date(1970, 1, 1)).days  # type: ignore[operator]
    if kind == "time":
        t = value
        return ((t.hour * 60 + t.minute) * 60 + t.second) * 1000 + t.microsecond // 1000  # type: ignore[attr-defined]
    if kind in ("ts3", "ts9", "ltz6"):
        per_milli = {"ts3": 1, "ts9": 1_000_000, "ltz6": 1000}[kind]
        millis, rest = divmod(value, per_milli)  # type: ignore[call-overload]
        return millis, rest * (1_000_000 // per_milli)
    return value


@pytest.mark.parametrize("seed", range(30))
def test_the_statistics_of_random_batches_are_their_columns_bounds(seed: int) -> None:
    rng = random.Random(seed)
    kinds = rng.sample(sorted(_GENERATORS), rng.randint(1, len(_GENERATORS)))
    rows = rng.randint(1, 40)
    columns = {}
    for kind in kinds:
        _fluss, _arrow, make = _GENERATORS[kind]
        null_share = rng.choice([0.0, 0.3, 1.0])
        columns[kind] = [None if rng.random() < null_share else make(rng) for _ in range(rows)]
    row_type = t.RowType([t.DataField(kind, _GENERATORS[kind][0]) for kind in kinds])
    schema = pa.schema([(kind, _GENERATORS[kind][1]) for kind in kinds])
    batch = pa.RecordBatch.from_pydict(columns, schema=schema)
    chosen = rng.sample(range(len(kinds)), rng.randint(1, len(kinds)))
    parsed = batch_statistics.parse(batch_statistics.collect(batch, row_type, chosen), row_type)
    assert parsed.column_indexes == tuple(chosen)
    for position, index in enumerate(chosen):
        kind = kinds[index]
        present = [_internal(kind, v) for v in columns[kind] if v is not None]
        assert parsed.null_counts[position] == rows - len(present), kind
        assert parsed.mins[position] == (min(present) if present else None), kind
        assert parsed.maxes[position] == (max(present) if present else None), kind


def test_a_batch_with_statistics_is_v1_and_its_records_read_as_before() -> None:
    row_type = t.RowType([t.DataField("v", t.IntType())])
    batch = pa.RecordBatch.from_pydict({"v": [4, 9]}, schema=pa.schema([("v", pa.int32())]))
    statistics = batch_statistics.collect(batch, row_type, [0])
    data = log_batch.build_arrow_batch(batch, schema_id=1, statistics=statistics)
    [(position, header)] = list(log_batch.iter_batches(data))
    assert header.magic == log_batch.MAGIC_V1
    assert data[header.header_size : header.records_offset] == statistics
    assert log_batch.read_arrow(data, position, header, batch.schema)[1].equals(batch)
    assert log_batch.read_header(log_batch.build_arrow_batch(batch, schema_id=1)).magic == log_batch.MAGIC_V0
