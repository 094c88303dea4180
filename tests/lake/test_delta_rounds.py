"""Tiering rounds into Delta tables, checked against an expected state with DuckDB: log tables append;
primary-key tables hold exactly the current rows (upserts replace, deletes remove) with the offset of
each row's last change, across buckets and partitions."""

from __future__ import annotations

import decimal
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.errors import InvalidTableError
from strom.ids import TableBucket
from strom.lake.delta import DeltaLakeFormat, DeltaLakeTable
from strom.lake.delta_files import FileLimits
from strom.lake.format import OFFSETS_PROPERTY
from strom.lake.formats import lake_format
from strom.metadata.table_info import TableInfo
from strom.records import types as t
from tests.lake.duckdb_reader import rows_of
from tests.lake.support import TABLE_ID, Model, int64s, pk_round, row_tuples, table_info, write_split

LOG = [("id", t.IntType()), ("event", t.StringType())]
PK = [("id", t.IntType(nullable=False)), ("name", t.StringType()), ("score", t.BigIntType())]
SEEDS = [1, 2, 3]


def delta_table(info: TableInfo) -> DeltaLakeTable:
    table = lake_format(info).table(info)
    assert isinstance(table, DeltaLakeTable)
    return table


def test_log_tables_append_across_commits(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG)
    table = lake_format(info).table(info)
    expected = []
    next_offset = {0: 0, 1: 0}
    for round_index in range(3):
        results = []
        for bucket in (0, 1):
            ids = [round_index * 10 + bucket * 100 + i for i in range(3)]
            rows = pa.record_batch({"id": pa.array(ids, pa.int32()), "event": [f"e{i}" for i in ids]})
            offsets = list(range(next_offset[bucket], next_offset[bucket] + 3))
            next_offset[bucket] += 3
            results.append(write_split(table, bucket, rows, offsets))
            expected += [(i, f"e{i}", bucket, o) for i, o in zip(ids, offsets, strict=True)]
        version = table.commit(results, {OFFSETS_PROPERTY: f"round-{round_index}"})
        assert version == round_index + 1
        assert rows_of(table.uri, "SELECT id, event, __bucket, __offset FROM lake ORDER BY id") == sorted(expected)
    assert table.stats().record_count == 18


def test_log_tables_refuse_deletes(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG)
    table = lake_format(info).table(info)
    writer = table.writer(TableBucket(TABLE_ID, 0), None, table.latest_snapshot_id())
    with pytest.raises(InvalidTableError, match="log table"):
        writer.delete_keys(pa.table({"id": pa.array([1], pa.int32())}))
    writer.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_primary_key_rounds_keep_exactly_the_current_state(tmp_path: Path, seed: int) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = delta_table(info)
    rng = random.Random(seed)
    model = Model(["id"])

    def make_row(_: str | None, key: int, rng: random.Random) -> dict[str, Any]:
        return {"id": key, "name": f"n{key}-{rng.randrange(1000)}", "score": rng.randrange(-5, 5)}

    for round_index in range(6):
        results = pk_round(table, model, rng, [None], lambda row: row["id"] % 2, make_row, key_space=20)
        table.commit(results, {OFFSETS_PROPERTY: f"r{round_index}"})
        expected = sorted((r["id"], r["name"], r["score"], r["__bucket"], r["__offset"]) for r in model.rows.values())
        actual = rows_of(table.uri, "SELECT id, name, score, __bucket, __offset FROM lake ORDER BY id")
        assert actual == expected, f"seed {seed}, round {round_index}"
        assert table.stats().record_count == len(expected), f"seed {seed}, round {round_index}"
        version = table.latest_snapshot_id()
        assert version is not None
        for bucket in (0, 1):
            bucket_rows = pa.Table.from_batches(list(table.read_bucket(version, bucket, None)), schema=info.schema.arrow_schema)
            assert row_tuples(bucket_rows, ["id", "name", "score"]) == [e[:3] for e in expected if e[3] == bucket]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_partitioned_table_with_a_composite_key_keeps_the_current_state(tmp_path: Path, seed: int) -> None:
    columns = [
        ("region", t.StringType(nullable=False)), ("id", t.IntType(nullable=False)),
        ("sub", t.StringType(nullable=False)), ("v", t.DoubleType()),
    ]
    info = table_info(tmp_path, columns, ["region", "id", "sub"], partition_keys=["region"])
    table = delta_table(info)
    assert table.layout.primary_key == ["id", "sub"], "partition keys are not part of the key within a bucket"
    rng = random.Random(seed)
    model = Model(["region", "id", "sub"])

    def make_row(region: str | None, key: int, rng: random.Random) -> dict[str, Any]:
        return {"region": region, "id": key // 3, "sub": "abc"[key % 3], "v": rng.random()}

    for round_index in range(4):
        results = pk_round(table, model, rng, ["eu", "us"], lambda row: row["id"] % 2, make_row, key_space=12)
        table.commit(results, {OFFSETS_PROPERTY: f"r{round_index}"})
        expected = sorted((r["region"], r["id"], r["sub"], r["v"], r["__bucket"], r["__offset"]) for r in model.rows.values())
        actual = rows_of(table.uri, "SELECT region, id, sub, v, __bucket, __offset FROM lake ORDER BY ALL")
        assert actual == expected, f"seed {seed}, round {round_index}"
    version = table.latest_snapshot_id()
    assert version is not None
    for partition in ("eu", "us"):
        for bucket in (0, 1):
            bucket_rows = pa.Table.from_batches(list(table.read_bucket(version, bucket, partition)),
                                                schema=info.schema.arrow_schema)
            assert row_tuples(bucket_rows, ["region", "id", "sub", "v"]) == [
                e[:4] for e in expected if e[0] == partition and e[4] == bucket
            ], f"seed {seed}: {partition}/{bucket}"
    assert table.buckets(version) == sorted({(e[0], e[4]) for e in expected})
    for path in Path(table.uri).glob("**/*.parquet"):
        assert path.parent.parent.name.startswith("region=") and path.parent.name.startswith("__bucket=")


def test_only_files_holding_a_touched_key_are_rewritten(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)

    def rows(ids: list[int], name: str) -> pa.RecordBatch:
        return pa.record_batch({"id": pa.array(ids, pa.int32()), "name": [name] * len(ids),
                                "score": pa.array(ids, pa.int64())})

    # three files in bucket 0 (keys 0-9, 10-19, 20-29) and one in bucket 1
    first = [write_split(table, 0, rows(list(range(lo, lo + 10)), "a"), range(lo, lo + 10)) for lo in (0, 10, 20)]
    table.commit([*first, write_split(table, 1, rows([1001], "a"), [0])], {})
    keys = pa.table({"id": pa.array([12, 15, 40], pa.int32())})
    result = write_split(table, 0, rows([12], "b"), [30], deleted_keys=keys)
    payload = json.loads(result.payload)
    assert [r["path"] for r in payload["remove"]] == [json.loads(first[1].payload)["add"][0]["path"]]
    assert result.record_count == 9 and result.file_count == 1, "8 rows carried over and 1 new row, in one file"
    table.commit([result], {})
    assert rows_of(table.uri, "SELECT count(*), count(DISTINCT id) FROM lake WHERE __bucket = 0") == [(29, 29)]
    assert rows_of(table.uri, "SELECT id, name, __offset FROM lake WHERE id IN (12, 15, 13)") == [(12, "b", 30), (13, "a", 13)]


def test_a_file_whose_keys_are_all_deleted_is_removed_without_a_rewrite(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"], "score": pa.array([1, 2], pa.int64())})
    table.commit([write_split(table, 0, rows, [0, 1])], {})
    result = write_split(table, 0, deleted_keys=pa.table({"id": pa.array([2, 1], pa.int32())}))
    assert len(json.loads(result.payload)["remove"]) == 1 and result.file_count == 0
    table.commit([result], {})
    assert rows_of(table.uri, "SELECT count(*) FROM lake") == [(0,)]


def test_writers_roll_files_at_the_row_limit(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG)
    limits = FileLimits(file_rows_max=4, row_group_rows_max=2)
    table = DeltaLakeFormat({"warehouse": str(tmp_path)}, limits).table(info)
    ids = list(range(10))
    rows = pa.record_batch({"id": pa.array(ids, pa.int32()), "event": [str(i) for i in ids]})
    writer = table.writer(TableBucket(TABLE_ID, 0), None, table.latest_snapshot_id())
    for start in range(0, 10, 3):  # appends of 3 rows cut into row groups of 2, files of 4
        part = rows.slice(start, 3)
        writer.append(part, int64s(ids[start:start + 3]), int64s([0] * part.num_rows))
    result = writer.complete()
    writer.close()
    adds = json.loads(result.payload)["add"]
    assert [json.loads(a["stats"])["numRecords"] for a in adds] == [4, 4, 2] and result.file_count == 3
    assert [json.loads(a["stats"])["minValues"]["id"] for a in adds] == [0, 4, 8]
    table.commit([result], {})
    assert rows_of(table.uri, "SELECT id, __offset FROM lake ORDER BY id") == [(i, i) for i in ids]


def test_read_bucket_at_an_older_snapshot_returns_that_version(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)

    def rows(ids: list[int], name: str) -> pa.RecordBatch:
        return pa.record_batch({"id": pa.array(ids, pa.int32()), "name": [name] * len(ids),
                                "score": pa.array(ids, pa.int64())})

    v1 = table.commit([write_split(table, 0, rows([2, 4], "old"), [0, 1])], {})
    v2 = table.commit([write_split(table, 0, rows([4, 6], "new"), [2, 3],
                                   deleted_keys=pa.table({"id": pa.array([2, 4, 6], pa.int32())}))], {})
    at_v1 = pa.Table.from_batches(list(table.read_bucket(v1, 0, None)))
    assert at_v1.schema == info.schema.arrow_schema
    assert row_tuples(at_v1, ["id", "name"]) == [(2, "old"), (4, "old")]
    at_v2 = pa.Table.from_batches(list(table.read_bucket(v2, 0, None, columns=["name", "id"], with_system_columns=True)))
    assert at_v2.schema.names == ["name", "id", "__bucket", "__offset", "__timestamp"]
    assert row_tuples(at_v2, ["id", "name", "__offset"]) == [(4, "new", 2), (6, "new", 3)]
    assert list(table.read_bucket(v2, 1, None)) == []
    assert table.buckets(v2) == [(None, 0)] and table.buckets(0) == []
    assert table.read(v1).num_rows == 2 and "__offset" in table.read(v1).column_names


@pytest.mark.parametrize(
    "key_columns",
    [
        [("k", t.TimeType(3, nullable=False))],
        [("k", t.TimestampType(9, nullable=False))],
        [("k", t.DecimalType(20, 4, nullable=False))],
        [("k", t.CharType(2, nullable=False))],
        [("k", t.BinaryType(2, nullable=False))],
        [("a", t.DateType(nullable=False)), ("b", t.TimestampLtzType(3, nullable=False)),
         ("c", t.BooleanType(nullable=False)), ("d", t.DecimalType(10, 2, nullable=False)),
         ("e", t.BytesType(nullable=False)), ("f", t.TinyIntType(nullable=False))],
    ],
    ids=["time", "timestamp_ns", "decimal", "char", "binary", "composite"],
)
def test_keys_of_every_primitive_type_compare_by_value(tmp_path: Path, key_columns: list[tuple[str, t.DataType]]) -> None:
    info = table_info(tmp_path, [*key_columns, ("v", t.IntType())], [name for name, _ in key_columns])
    table = lake_format(info).table(info)
    schema = info.schema.arrow_schema
    key_schema = pa.schema([schema.field(name) for name, _ in key_columns])
    samples: dict[str, list[Any]] = {
        "time": [1_000, 2_000, 3_000], "timestamp_ns": [1_000_000_001, 2_000_000_002, 3_000_000_003],
        "decimal": [decimal.Decimal(v) for v in ("1.0001", "2.5", "-3")], "char": ["ab", "cd", "ef"],
        "binary": [b"ab", b"cd", b"ef"], "a": [0, 1, 2], "b": [5, 6, 7], "c": [True, False, True],
        "d": [decimal.Decimal(v) for v in ("0.01", "0.02", "0.03")], "e": [b"x", b"", b"y"], "f": [1, -1, 0],
    }
    kinds = {t.TimeType: "time", t.TimestampType: "timestamp_ns", t.DecimalType: "decimal", t.CharType: "char",
             t.BinaryType: "binary"}

    def key_values(name: str, kind: t.DataType) -> list[Any]:
        return samples[kinds[type(kind)]] if name == "k" else samples[name]

    columns = {name: pa.array(key_values(name, kind), schema.field(name).type) for name, kind in key_columns}
    batch = pa.record_batch({**columns, "v": pa.array([1, 2, 3], pa.int32())}, schema=schema)
    table.commit([write_split(table, 0, batch, [0, 1, 2])], {})
    touched = pa.Table.from_batches([batch.select(key_schema.names)]).slice(1, 1)  # the second row's key
    replaced = pa.record_batch({**{n: touched.column(n).combine_chunks() for n in key_schema.names},
                                "v": pa.array([20], pa.int32())}, schema=schema)
    result = write_split(table, 0, replaced, [3], deleted_keys=touched)
    version = table.commit([result], {})
    back = pa.Table.from_batches(list(table.read_bucket(version, 0, None)), schema=schema)
    assert sorted(back.column("v").to_pylist()) == [1, 3, 20]
    assert rows_of(table.uri, "SELECT count(*) FROM lake") == [(3,)]
