"""Every Fluss type strom stores round-trips through the Delta table, DuckDB reads each one, and the
per-file statistics are true bounds (DuckDB prunes files with them, so a wrong bound loses rows)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from strom.lake.delta_files import STATS_STRING_PREFIX_LENGTH
from strom.lake.formats import lake_format
from strom.records import types as t
from tests.lake.duckdb_reader import read_delta, rows_of
from tests.lake.support import table_info, write_split

UTC = dt.UTC
COLUMNS: list[tuple[str, t.DataType]] = [
    ("id", t.IntType(nullable=False)),
    ("b", t.BooleanType()),
    ("ti", t.TinyIntType()),
    ("si", t.SmallIntType()),
    ("bi", t.BigIntType()),
    ("f", t.FloatType()),
    ("d", t.DoubleType()),
    ("c", t.CharType(3)),
    ("s", t.StringType()),
    ("dec", t.DecimalType(10, 2)),
    ("big_dec", t.DecimalType(38, 10)),
    ("day", t.DateType()),
    ("tm0", t.TimeType(0)),
    ("tm", t.TimeType(3)),
    ("tm9", t.TimeType(9)),
    ("ts", t.TimestampType(6)),
    ("ts3", t.TimestampType(3)),
    ("ts9", t.TimestampType(9)),
    ("ltz", t.TimestampLtzType(3)),
    ("ltz9", t.TimestampLtzType(9)),
    ("bin", t.BinaryType(2)),
    ("by", t.BytesType()),
    ("arr", t.ArrayType(t.IntType())),
    ("times", t.ArrayType(t.TimeType(3))),
    ("m", t.MapType(t.StringType(nullable=False), t.BigIntType())),
    ("r", t.RowType.of(("x", t.IntType()), ("y", t.StringType()), ("at", t.TimeType(6)))),
]
VALUES = {
    "id": [1, 2, 3],
    "b": [True, None, False],
    "ti": [1, -128, 127],
    "si": [300, None, -300],
    "bi": [2**62, -(2**62), None],
    "f": [1.5, None, -2.5],
    "d": [2.25, -1.0, None],
    "c": ["abc", None, "x"],
    "s": ["x", "ü" * 40, ""],
    "dec": [decimal.Decimal("12.34"), None, decimal.Decimal("-99999999.99")],
    "big_dec": [decimal.Decimal("1234567890123456789012345678.0123456789"), decimal.Decimal("0.0000000001"), None],
    "day": [dt.date(2026, 1, 2), None, dt.date(1969, 12, 31)],
    "tm0": [dt.time(23, 59, 59), None, dt.time(0)],
    "tm": [dt.time(1, 2, 3, 4000), None, dt.time(0, 0, 0, 1000)],
    "tm9": [dt.time(1, 2, 3, 4), None, dt.time(0)],
    "ts": [dt.datetime(2026, 1, 2, 3, 4, 5, 6), None, dt.datetime(1960, 1, 1, 0, 0, 0, 999_999)],
    "ts3": [dt.datetime(2026, 1, 2, 3, 4, 5, 7000), None, dt.datetime(2000, 1, 1)],
    "ts9": [dt.datetime(2026, 1, 2, 3, 4, 5, 123456), None, dt.datetime(2000, 1, 1)],
    "ltz": [dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC), None, dt.datetime(1970, 1, 1, tzinfo=UTC)],
    "ltz9": [dt.datetime(2026, 1, 2, 3, 4, 5, 999_999, tzinfo=UTC), None, dt.datetime(2000, 1, 1, tzinfo=UTC)],
    "bin": [b"ab", None, b"\x00\xff"],
    "by": [b"\x00\x01", b"", None],
    "arr": [[1, None], None, []],
    "times": [[dt.time(1, 2, 3, 4000)], None, [None]],
    "m": [[("k", 1)], None, []],
    "r": [{"x": 1, "y": "z", "at": dt.time(12)}, None, {"x": None, "y": None, "at": None}],
}


def batch_of(schema: pa.Schema) -> pa.RecordBatch:
    return pa.record_batch([pa.array(VALUES[f.name], f.type) for f in schema], schema=schema)


def test_every_supported_type_round_trips_and_duckdb_reads_it(tmp_path: Path) -> None:
    info = table_info(tmp_path, COLUMNS)
    table = lake_format(info).table(info)
    schema = info.schema.arrow_schema
    batch = batch_of(schema)
    version = table.commit([write_split(table, 0, batch, [0, 1, 2], [-1, 1_700_000_000_123, 5])], {})

    back = pa.Table.from_batches(list(table.read_bucket(version, 0, None)))
    assert back.schema == schema
    assert back.sort_by("id").to_pylist() == pa.Table.from_batches([batch]).to_pylist()

    duck = {row["id"]: row for row in read_delta(table.uri, "SELECT * FROM lake").to_pylist()}
    first = duck[1]
    assert first["tm"] == 3_723_004_000 and first["tm9"] == 3_723_000_004, "TIME is microseconds of the day"
    assert first["times"] == [3_723_004_000] and first["r"] == {"x": 1, "y": "z", "at": 43_200_000_000}
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


def test_nanoseconds_are_truncated_to_microseconds(tmp_path: Path) -> None:
    info = table_info(tmp_path, [("id", t.IntType()), ("ts", t.TimestampType(9)), ("tm", t.TimeType(9))])
    table = lake_format(info).table(info)
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
    info = table_info(tmp_path, COLUMNS)
    table = lake_format(info).table(info)
    batch = batch_of(info.schema.arrow_schema)
    results = [write_split(table, 0, batch.slice(i, 1), [i], [1_000 + i]) for i in range(3)]  # a file per row
    table.commit(results, {})

    stats = json.loads(json.loads(results[0].payload)["add"][0]["stats"], parse_float=decimal.Decimal)
    assert stats["numRecords"] == 1
    assert stats["minValues"]["ts"] == "2026-01-02T03:04:05.000" and stats["maxValues"]["ts"] == "2026-01-02T03:04:05.001"
    assert stats["minValues"]["ltz"] == stats["maxValues"]["ltz"] == "2026-01-02T03:04:05.006Z"
    assert stats["minValues"]["dec"] == decimal.Decimal("12.34"), "decimals exact, not through a float"
    assert stats["maxValues"]["big_dec"] == decimal.Decimal("1234567890123456789012345678.0123456789")
    assert stats["nullCount"]["c"] == 0 and "arr" not in stats["nullCount"]
    long_string = json.loads(json.loads(results[1].payload)["add"][0]["stats"])
    assert long_string["minValues"]["s"] == "ü" * STATS_STRING_PREFIX_LENGTH and "s" not in long_string["maxValues"]
    assert long_string["nullCount"]["s"] == 0 and long_string["nullCount"]["dec"] == 1

    actions = pa.table(DeltaTable(table.uri).get_add_actions(flatten=True))
    for name in ("id", "bi", "dec", "big_dec", "day", "ts", "ltz9", "tm", "s", "__offset", "__timestamp"):
        assert actions.column(f"min.{name}").null_count < actions.num_rows, f"delta-rs parses the bounds of {name}"

    # Every value must be found by an equality filter (a bound off by a microsecond would prune its file).
    duck = {row["id"]: row for row in read_delta(table.uri, "SELECT * FROM lake").to_pylist()}
    for name in ("ti", "si", "bi", "f", "d", "c", "s", "dec", "big_dec", "day", "tm", "tm9", "ts", "ts3", "ts9",
                 "ltz", "ltz9", "__offset", "__timestamp"):
        for key, row in duck.items():
            if row[name] is None:
                continue
            found = rows_of(table.uri, f'SELECT id FROM lake WHERE "{name}" = ?', [row[name]])
            assert found == [(key,)], f"{name} = {row[name]!r} finds row {key}"
            below = rows_of(table.uri, f'SELECT count(*) FROM lake WHERE "{name}" <= ? AND id = ?', [row[name], key])
            assert below == [(1,)], f"{name} <= {row[name]!r}"


def test_floats_with_nan_get_no_bounds(tmp_path: Path) -> None:
    info = table_info(tmp_path, [("id", t.IntType()), ("d", t.DoubleType())])
    table = lake_format(info).table(info)
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int32()), "d": [float("nan"), 1.0]})
    result = write_split(table, 0, rows, [0, 1])
    stats = json.loads(json.loads(result.payload)["add"][0]["stats"])
    assert "d" not in stats["minValues"] and "d" not in stats["maxValues"] and stats["minValues"]["id"] == 1
    table.commit([result], {})
    assert rows_of(table.uri, "SELECT id FROM lake WHERE isnan(d)") == [(1,)]
    assert rows_of(table.uri, "SELECT id FROM lake WHERE d = 1.0") == [(2,)]


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_partition_key_is_a_lake_partition_value(tmp_path: Path, value: bool) -> None:
    columns = [("flag", t.BooleanType(nullable=False)), ("id", t.IntType(nullable=False))]
    info = table_info(tmp_path, columns, ["flag", "id"], partition_keys=["flag"])
    table = lake_format(info).table(info)
    rows = pa.record_batch({"flag": [value], "id": pa.array([1], pa.int32())})
    version = table.commit([write_split(table, 1, rows, [0], partition_name=str(value))], {})
    assert rows_of(table.uri, "SELECT flag, id, __bucket FROM lake") == [(value, 1, 1)]
    back = pa.Table.from_batches(list(table.read_bucket(version, 1, str(value))))
    assert back.to_pylist() == [{"flag": value, "id": 1}]
    assert table.buckets(version) == [(str(value), 1)], "the partition name strom gives the partition"
