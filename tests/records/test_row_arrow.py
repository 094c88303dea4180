"""Encoded rows <-> Arrow record batches, with the client's exact Arrow types."""

from __future__ import annotations

import random
from decimal import Decimal

import pyarrow as pa
import pytest

from strom.records.compacted import CompactedRowDecoder, CompactedRowEncoder
from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
from strom.records.row_arrow import (
    record_batch_to_rows,
    record_batch_to_values,
    rows_to_record_batch,
    values_to_record_batch,
)
from strom.records.types import (
    ArrayType,
    BigIntType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    IntType,
    MapType,
    RowType,
    StringType,
    TimestampLtzType,
    TimestampType,
    TimeType,
    to_arrow_schema,
)
from tests.records.row_values import random_row, random_row_type

MIXED = RowType.of(
    ("id", BigIntType(nullable=False)),
    ("name", StringType()),
    ("price", DecimalType(20, 4)),
    ("day", DateType()),
    ("at", TimestampType(6)),
    ("seen", TimestampLtzType(9)),
    ("clock", TimeType(3)),
    ("tags", ArrayType(StringType())),
    ("attrs", MapType(StringType(), RowType.of(("n", IntType()), ("w", DoubleType())))),
    ("digest", BinaryType(4)),
)


def test_rows_decode_into_a_batch_with_the_client_schema_and_values():
    encoder = CompactedRowEncoder(MIXED)
    rows = [
        encoder.encode(
            [1, "a", Decimal("12.3400"), 19000, -1, 1_700_000_000_123_456_789, 61_000, ["x", None],
             [("k", {"n": 1, "w": 0.5})], b"\x00\x01\x02\x03"]
        ),
        encoder.encode([2, None, None, None, None, None, None, None, None, None]),
    ]  # fmt: skip
    batch = rows_to_record_batch(rows, MIXED)
    assert batch.schema == to_arrow_schema(MIXED)
    assert batch.num_rows == 2
    assert batch.column("at")[0].value == -1  # one microsecond before the epoch
    assert batch.column("seen").type == pa.timestamp("ns", tz="UTC")
    assert batch.column("seen")[0].value == 1_700_000_000_123_456_789
    assert batch.column("clock").to_pylist()[0].isoformat() == "00:01:01"
    assert batch.column("attrs").to_pylist()[0] == [("k", {"n": 1, "w": 0.5})]
    assert batch.column("price").to_pylist() == [Decimal("12.3400"), None]
    assert record_batch_to_rows(batch, encoder) == rows


def test_empty_input_gives_an_empty_batch_with_the_schema():
    batch = rows_to_record_batch([], MIXED)
    assert batch.num_rows == 0 and batch.schema == to_arrow_schema(MIXED)
    assert record_batch_to_values(batch) == []


def test_short_binary_values_are_zero_padded_for_fixed_size_columns():
    rt = RowType.of(("b", BinaryType(4)), ("l", ArrayType(BinaryType(2))))
    rows = [CompactedRowEncoder(rt).encode([b"\x01", [b"\x02", None]])]
    batch = rows_to_record_batch(rows, rt)
    assert batch.to_pylist() == [{"b": b"\x01\x00\x00\x00", "l": [b"\x02\x00", None]}]


def test_dataframe_columns_are_cast_to_the_table_types_before_encoding():
    rt = RowType.of(("s", StringType()), ("d", DateType()), ("t", TimestampType(6)))
    batch = pa.record_batch(
        [
            pa.array(["x"], pa.large_string()),
            pa.array([86_400_000], pa.date64()),
            pa.array([5], pa.timestamp("ms")),
        ],
        names=["s", "d", "t"],
    )
    assert record_batch_to_values(batch, rt) == [("x", 1, 5000)]
    rows = record_batch_to_rows(batch, CompactedRowEncoder(rt))
    assert CompactedRowDecoder(rt).decode(rows[0]) == ("x", 1, 5000)


@pytest.mark.parametrize("seed", range(150))
def test_random_rows_round_trip_through_arrow(seed):
    rng = random.Random(seed)
    row_type = random_row_type(rng)
    encoder, decoder = CompactedRowEncoder(row_type), CompactedRowDecoder(row_type)
    values = [random_row(rng, row_type) for _ in range(rng.randint(0, 6))]
    rows = [encoder.encode(v) for v in values]
    batch = rows_to_record_batch(rows, decoder)
    assert batch.schema == to_arrow_schema(row_type), f"seed={seed}"
    assert record_batch_to_values(batch) == values, f"seed={seed} type={row_type}"
    assert record_batch_to_rows(batch, encoder) == rows, f"seed={seed}"
    # IPC round trip with only the RecordBatch message, as the log format carries it
    restored = pa.ipc.read_record_batch(batch.serialize(), to_arrow_schema(row_type))
    assert restored.equals(batch), f"seed={seed}"


@pytest.mark.parametrize("seed", range(50))
def test_indexed_rows_convert_like_compacted_rows(seed):
    rng = random.Random(seed)
    row_type = random_row_type(rng)
    values = [random_row(rng, row_type) for _ in range(3)]
    rows = [IndexedRowEncoder(row_type).encode(v) for v in values]
    batch = rows_to_record_batch(rows, IndexedRowDecoder(row_type))
    assert batch.equals(values_to_record_batch(values, row_type)), f"seed={seed}"
