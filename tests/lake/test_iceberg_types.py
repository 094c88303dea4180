"""Every Fluss type strom stores round-trips through the Iceberg table in the Iceberg type Fluss maps it
to, DuckDB reads each one, and the per-file statistics pyiceberg derives from the Parquet footers are
true bounds (DuckDB prunes files with them, so a wrong bound loses rows)."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa
import pytest

from strom.lake.formats import lake_format
from strom.lake.iceberg import IcebergLakeTable
from strom.metadata.table_info import TableInfo
from strom.records import types as t
from tests.lake.duckdb_reader import iceberg_rows, read_iceberg
from tests.lake.support import table_info, write_split
from tests.lake.test_delta_types import COLUMNS, batch_of

UTC = dt.UTC


def iceberg_table(info: TableInfo) -> IcebergLakeTable:
    table = lake_format(info).table(info)
    assert isinstance(table, IcebergLakeTable)
    return table


def test_columns_have_the_iceberg_types_fluss_maps_to(tmp_path: Path) -> None:
    info = table_info(tmp_path, COLUMNS, lake="iceberg")
    schema = iceberg_table(info).iceberg().schema()
    types = {f.name: str(f.field_type) for f in schema.fields}
    assert types == {
        "id": "int", "b": "boolean", "ti": "int", "si": "int", "bi": "long", "f": "float", "d": "double",
        "c": "string", "s": "string", "dec": "decimal(10, 2)", "big_dec": "decimal(38, 10)", "day": "date",
        "tm0": "time", "tm": "time", "tm9": "time", "ts": "timestamp", "ts3": "timestamp", "ts9": "timestamp",
        "ltz": "timestamptz", "ltz9": "timestamptz", "bin": "binary", "by": "binary", "arr": "list<int>",
        "times": "list<time>", "m": "map<string, long>", "r": "struct<34: x: optional int, 35: y: optional string, "
        "36: at: optional time>", "__bucket": "int", "__offset": "long", "__timestamp": "timestamptz",
    }
    assert [f.field_id for f in schema.fields] == list(range(1, len(COLUMNS) + 4)), "top-level ids first, as in Fluss"
    assert schema.find_field("id").required and not schema.find_field("b").required


def test_every_supported_type_round_trips_and_duckdb_reads_it(tmp_path: Path) -> None:
    info = table_info(tmp_path, COLUMNS, lake="iceberg")
    table = iceberg_table(info)
    schema = info.schema.arrow_schema
    batch = batch_of(schema)
    version = table.commit([write_split(table, 0, batch, [0, 1, 2], [-1, 1_700_000_000_123, 5])], {})

    back = pa.Table.from_batches(list(table.read_bucket(version, 0, None)))
    assert back.schema == schema
    assert back.sort_by("id").to_pylist() == pa.Table.from_batches([batch]).to_pylist()

    duck = {row["id"]: row for row in read_iceberg(table.iceberg().metadata_location).to_pylist()}
    first = duck[1]
    assert first["tm"] == dt.time(1, 2, 3, 4000) and first["tm9"] == dt.time(1, 2, 3, 4), "TIME is a time (microseconds)"
    assert first["times"] == [dt.time(1, 2, 3, 4000)] and first["r"] == {"x": 1, "y": "z", "at": dt.time(12)}
    assert first["dec"] == decimal.Decimal("12.34")
    assert first["big_dec"] == decimal.Decimal("1234567890123456789012345678.0123456789")
    assert first["ts"] == dt.datetime(2026, 1, 2, 3, 4, 5, 6) and first["ts9"] == dt.datetime(2026, 1, 2, 3, 4, 5, 123456)
    assert first["ltz"].astimezone(UTC) == dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
    assert first["c"] == "abc" and first["bin"] == b"ab" and first["m"] in ({"k": 1}, [("k", 1)])
    assert first["ti"] == 1 and first["bi"] == 2**62 and first["day"] == dt.date(2026, 1, 2)
    assert duck[3]["s"] == "" and duck[2]["s"] == "ü" * 40 and duck[3]["ts"] == dt.datetime(1960, 1, 1, 0, 0, 0, 999_999)
    assert first["__timestamp"].astimezone(UTC) == dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    assert duck[2]["__timestamp"].astimezone(UTC) == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert [duck[i]["__offset"] for i in (1, 2, 3)] == [0, 1, 2] and {duck[i]["__bucket"] for i in (1, 2, 3)} == {0}
    assert table.read().num_rows == 3


def test_nanoseconds_are_truncated_to_microseconds(tmp_path: Path) -> None:
    info = table_info(tmp_path, [("id", t.IntType()), ("ts", t.TimestampType(9)), ("tm", t.TimeType(9))], lake="iceberg")
    table = iceberg_table(info)
    rows = pa.record_batch({
        "id": pa.array([1], pa.int32()),
        "ts": pa.array([1_000_000_001_999], pa.timestamp("ns")),
        "tm": pa.array([3_000_000_001_999], pa.time64("ns")),
    })
    version = table.commit([write_split(table, 0, rows, [0])], {})
    back = pa.Table.from_batches(list(table.read_bucket(version, 0, None)))
    assert back.column("ts").cast(pa.int64()).to_pylist() == [1_000_000_001_000]
    assert back.column("tm").cast(pa.int64()).to_pylist() == [3_000_000_001_000]


def test_file_statistics_are_true_bounds_and_duckdb_filters_on_them_find_every_row(tmp_path: Path) -> None:
    info = table_info(tmp_path, COLUMNS, lake="iceberg")
    table = iceberg_table(info)
    batch = batch_of(info.schema.arrow_schema)
    table.commit([write_split(table, 0, batch.slice(i, 1), [i], [1_000 + i]) for i in range(3)], {})  # a file per row
    files = [task.file for task in table.iceberg().scan().plan_files()]
    assert len(files) == 3 and all(f.record_count == 1 for f in files)
    ids = {f.name: f.field_id for f in table.iceberg().schema().fields}
    assert all(ids["id"] in f.lower_bounds and ids["__offset"] in f.upper_bounds for f in files)

    location = table.iceberg().metadata_location
    duck = {row["id"]: row for row in read_iceberg(location).to_pylist()}
    for name in ("ti", "si", "bi", "f", "d", "c", "s", "dec", "big_dec", "day", "tm", "tm9", "ts", "ts3", "ts9",
                 "ltz", "ltz9", "__offset", "__timestamp"):
        for key, row in duck.items():
            if row[name] is None:
                continue
            found = iceberg_rows(location, f'SELECT id FROM lake WHERE "{name}" = ?', [row[name]])
            assert found == [(key,)], f"{name} = {row[name]!r} finds row {key}"
            below = iceberg_rows(location, f'SELECT count(*) FROM lake WHERE "{name}" <= ? AND id = ?', [row[name], key])
            assert below == [(1,)], f"{name} <= {row[name]!r}"


def test_floats_with_nan_are_found(tmp_path: Path) -> None:
    info = table_info(tmp_path, [("id", t.IntType()), ("d", t.DoubleType())], lake="iceberg")
    table = iceberg_table(info)
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int32()), "d": [float("nan"), 1.0]})
    table.commit([write_split(table, 0, rows, [0, 1])], {})
    location = table.iceberg().metadata_location
    assert iceberg_rows(location, "SELECT id FROM lake WHERE isnan(d)") == [(1,)]
    assert iceberg_rows(location, "SELECT id FROM lake WHERE d = 1.0") == [(2,)]


@pytest.mark.parametrize(
    ("kind", "partition_name", "value"),
    [
        (t.BooleanType(nullable=False), "True", True),
        (t.IntType(nullable=False), "-3", -3),
        (t.DateType(nullable=False), "2026-01-02", dt.date(2026, 1, 2)),
        (t.StringType(nullable=False), "eu-west", "eu-west"),
    ],
    ids=["boolean", "int", "date", "string"],
)
def test_partition_keys_are_identity_partitions_with_typed_values(
    tmp_path: Path, kind: t.DataType, partition_name: str, value: object
) -> None:
    columns = [("p", kind), ("id", t.IntType(nullable=False))]
    info = table_info(tmp_path, columns, ["p", "id"], partition_keys=["p"], lake="iceberg")
    table = iceberg_table(info)
    rows = pa.record_batch({"p": pa.array([value], info.schema.arrow_schema.field("p").type), "id": pa.array([1], pa.int32())})
    version = table.commit([write_split(table, 1, rows, [0], partition_name=partition_name)], {})
    location = table.iceberg().metadata_location
    assert iceberg_rows(location, "SELECT p, id, __bucket FROM lake") == [(value, 1, 1)]
    assert iceberg_rows(location, "SELECT id FROM lake WHERE p = ?", [value]) == [(1,)]
    back = pa.Table.from_batches(list(table.read_bucket(version, 1, partition_name)))
    assert back.to_pylist() == [{"p": value, "id": 1}]
    assert table.buckets(version) == [(partition_name, 1)], "the partition name strom gives the partition"
