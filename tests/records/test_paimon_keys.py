"""Keys of tables whose lake format is Paimon: strom encodes them as a Paimon ``BinaryRow`` and buckets
them with Fluss's Paimon bucket function, and each key lands in the bucket Paimon itself puts the row in.
The independent side is pypaimon-rust (Apache Paimon's Rust core): it writes the same rows into a Paimon
primary-key table with N buckets, choosing each row's bucket itself, and the test reads which
``bucket-<n>`` directory each key's data file is in."""

from __future__ import annotations

import datetime as dt
import decimal
import glob
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pypaimon_rust.datafusion import PaimonCatalog, SQLContext

from strom.errors import InvalidTableError
from strom.records import keys, row_arrow
from strom.records import types as t
from strom.records.paimon_key import PaimonKeyEncoder, header_size

BUCKETS = 7

KEY_TYPES: dict[str, tuple[t.DataType, pa.DataType, list[Any]]] = {
    "INT": (t.IntType(), pa.int32(), list(range(-50, 50))),
    "BIGINT": (t.BigIntType(), pa.int64(), [2**40 + i for i in range(60)] + [-5, -(2**63)]),
    "STRING": (t.StringType(), pa.string(), ["", "a", "abcdefg", "abcdefgh", "ü" * 9] + [f"key-{i}" for i in range(60)]),
    "DECIMAL(10,2)": (t.DecimalType(10, 2), pa.decimal128(10, 2), [decimal.Decimal(f"{i}.25") for i in range(-20, 40)]),
    "DECIMAL(38,10)": (t.DecimalType(38, 10), pa.decimal128(38, 10),
                       [decimal.Decimal(f"{i}123456789012345.0123456789") for i in range(1, 40)] + [decimal.Decimal("-1.5")]),
    "DATE": (t.DateType(), pa.date32(), [dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in range(60)]),
    "TIMESTAMP(3)": (t.TimestampType(3), pa.timestamp("ms"),
                     [dt.datetime(2024, 1, 1, 0, 0, i % 60, 123000) + dt.timedelta(hours=i) for i in range(60)]),
    "TIMESTAMP(6)": (t.TimestampType(6), pa.timestamp("us"), [dt.datetime(2024, 1, 1, 0, 0, 0, 1000 * i + 7) for i in range(60)]),
    "BOOLEAN": (t.BooleanType(), pa.bool_(), [True, False]),
    "TINYINT": (t.TinyIntType(), pa.int8(), list(range(-30, 30))),
    "SMALLINT": (t.SmallIntType(), pa.int16(), list(range(-300, 300, 11))),
    "DOUBLE": (t.DoubleType(), pa.float64(), [i * 0.37 for i in range(-20, 40)]),
    "BYTES": (t.BytesType(), pa.binary(), [bytes([i]) * (i % 12) for i in range(1, 60)]),
}


def _paimon_buckets(warehouse: Path, ddl_columns: str, batch: pa.RecordBatch, key_columns: list[str]) -> dict[Any, int]:
    """Key (a tuple of the key columns' values) -> the bucket pypaimon-rust wrote its row into."""
    context = SQLContext()
    context.register_catalog("p", {"warehouse": f"file://{warehouse}"}, default_database="")
    context.set_current_catalog("p")
    context.sql("CREATE DATABASE IF NOT EXISTS d")
    context.sql(f"CREATE TABLE d.t ({ddl_columns}, PRIMARY KEY ({', '.join(key_columns)})) WITH ('bucket'='{BUCKETS}')")
    table = PaimonCatalog({"warehouse": f"file://{warehouse}"}).get_table("d.t")
    builder = table.new_batch_write_builder()
    writer = builder.new_write()
    writer.write_arrow(batch)
    builder.new_commit().commit(writer.prepare_commit())
    seen: dict[Any, int] = {}
    for path in glob.glob(f"{warehouse}/d.db/t/bucket-*/*.parquet"):
        bucket = int(path.split("bucket-")[1].split("/")[0])
        stored = pq.read_table(path, columns=key_columns)
        for key in zip(*(stored.column(c).to_pylist() for c in key_columns), strict=True):
            seen[key] = bucket
    return seen


def _strom_buckets(batch: pa.RecordBatch, row_type: t.RowType, key_indexes: list[int]) -> dict[Any, int]:
    encoder = keys.key_encoder(row_type, key_indexes, keys.PAIMON)
    bucket_of = keys.bucket_function(keys.PAIMON)
    python = batch.to_pylist()
    names = row_type.field_names
    return {tuple(python[i][names[k]] for k in key_indexes): bucket_of(encoder.encode(values), BUCKETS)
            for i, values in enumerate(row_arrow.record_batch_to_values(batch, row_type))}


@pytest.mark.parametrize("sql_type", list(KEY_TYPES))
def test_every_key_lands_in_the_bucket_paimon_puts_it_in(tmp_path: Path, sql_type: str) -> None:
    strom_type, arrow_type, values = KEY_TYPES[sql_type]
    schema = pa.schema([pa.field("k", arrow_type, nullable=False), pa.field("v", pa.int32())])
    batch = pa.record_batch([pa.array(values, arrow_type), pa.array(range(len(values)), pa.int32())], schema=schema)
    paimon = _paimon_buckets(tmp_path, f"k {sql_type} NOT NULL, v INT", batch, ["k"])
    strom = _strom_buckets(batch, t.RowType.of(("k", strom_type.copy(False)), ("v", t.IntType())), [0])
    assert len(paimon) == len(set(values)) and strom == paimon
    assert len(set(strom.values())) > 1 or len(values) < 3, "the keys spread over the buckets"


def test_a_composite_key_lands_where_paimon_puts_it(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string(), nullable=False),
                        pa.field("v", pa.int32())])
    batch = pa.record_batch([pa.array([i * 7919 for i in range(80)], pa.int64()),
                             pa.array([f"name-{i % 13}" * (i % 3 + 1) for i in range(80)]),
                             pa.array(range(80), pa.int32())], schema=schema)
    paimon = _paimon_buckets(tmp_path, "a BIGINT NOT NULL, b STRING NOT NULL, v INT", batch, ["a", "b"])
    row_type = t.RowType.of(("a", t.BigIntType(nullable=False)), ("b", t.StringType(nullable=False)), ("v", t.IntType()))
    assert _strom_buckets(batch, row_type, [0, 1]) == paimon


def test_binary_row_layout() -> None:
    """The bytes themselves, for the layout's corners: header width, inline and variable-length strings,
    nulls and a wide decimal."""
    assert [header_size(n) for n in (1, 56, 57, 120, 121)] == [8, 8, 16, 16, 24]
    row_type = t.RowType.of(("s", t.StringType()), ("l", t.StringType()), ("n", t.IntType()),
                            ("d", t.DecimalType(20, 0)))
    encoded = PaimonKeyEncoder(row_type, [0, 1, 2, 3]).encode(["abc", "abcdefgh", None, decimal.Decimal(-1)])
    header, slots, variable = encoded[:8], encoded[8:40], encoded[40:]
    assert header == bytes([0, 1 << 2, 0, 0, 0, 0, 0, 0]), "row kind INSERT, field 2's null bit"
    assert slots[:8] == b"abc\x00\x00\x00\x00\x83", "up to 7 bytes inline, 0x80 | length last"
    assert slots[8:16] == (40 << 32 | 8).to_bytes(8, "little") and variable[:8] == b"abcdefgh"
    assert slots[16:24] == bytes(8), "a null field's slot is zero"
    assert slots[24:32] == (48 << 32 | 1).to_bytes(8, "little") and variable[8:24] == b"\xff" + bytes(15)
    assert len(encoded) % 8 == 0


def test_types_paimon_cannot_key_by_are_refused() -> None:
    row_type = t.RowType.of(("a", t.ArrayType(t.IntType())), ("v", t.IntType()))
    with pytest.raises(InvalidTableError, match="lake format is Paimon"):
        keys.key_encoder(row_type, [0], keys.PAIMON)
    assert keys.key_lake_format({"table.datalake.format": "paimon"}) == keys.PAIMON
    assert keys.key_lake_format({"table.datalake.format": "lance"}) is None, "Lance keys are Fluss's"
