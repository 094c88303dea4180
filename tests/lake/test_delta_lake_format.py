"""The Delta lake format on real Delta tables, read back by DuckDB: layout and types, appends, the
copy-on-write of primary-key tables, atomic commits with their properties, aborts and races."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from strom.errors import InvalidConfigError, InvalidTableError
from strom.ids import TableBucket
from strom.lake.delta import LakeCommitConflictError
from strom.lake.format import COMMIT_USER, OFFSETS_PROPERTY, LakeTable, lake_format
from strom.metadata.store import TableRecord
from strom.metadata.table_info import TableInfo
from strom.records import types as t
from strom.records.schema import Schema, TableDescriptor
from tests.lake.duckdb_reader import read_delta

TABLE_ID = 7


def table_info(warehouse: Path, columns: list[tuple[str, t.DataType]], primary_key: list[str] | None = None,
               partition_keys: tuple[str, ...] = (), table_id: int = TABLE_ID, name: str = "orders") -> TableInfo:
    descriptor = TableDescriptor(
        Schema.of(columns, primary_key), partition_keys=partition_keys, bucket_count=2,
        properties={"table.datalake.enabled": "true", "table.datalake.format": "delta",
                    "table.datalake.delta.warehouse": str(warehouse)},
    )
    return TableInfo.from_record(TableRecord(table_id, "fluss", name, descriptor.to_json(), 1, 0, 0))


PK = [("id", t.IntType(nullable=False)), ("name", t.StringType()), ("score", t.BigIntType())]


def rows(ids: list[int], name: str = "n") -> pa.RecordBatch:
    return pa.record_batch({
        "id": pa.array(ids, pa.int32()),
        "name": [f"{name}{i}" for i in ids],
        "score": pa.array([i * 10 for i in ids], pa.int64()),
    })


def offsets(start: int, count: int) -> pa.Array:
    return pa.array(np.arange(start, start + count, dtype=np.int64))


def write(table: LakeTable, bucket: int, batch: pa.RecordBatch, first_offset: int, deleted: list[int] = (),
          touched: bool = False) -> Any:
    writer = table.writer(TableBucket(TABLE_ID, bucket), None, table.latest_snapshot_id())
    try:
        if touched or deleted:
            keys = [*batch.column("id").to_pylist(), *deleted]
            writer.delete_keys(pa.table({"id": pa.array(keys, pa.int32())}))
        writer.append(batch, offsets(first_offset, batch.num_rows), pa.array(np.full(batch.num_rows, 1_000, np.int64)))
        return writer.complete()
    finally:
        writer.close()


def duck(table: LakeTable, query: str = "SELECT id, name, score, __bucket, __offset FROM lake ORDER BY id") -> list[tuple[Any, ...]]:
    result = read_delta(table.uri, query)
    return list(zip(*(result.column(i).to_pylist() for i in range(result.num_columns)), strict=True))


def test_create_is_idempotent_and_guards_against_a_recreated_table(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    first = lake_format(info).table(info)
    again = lake_format(info).table(info)
    assert first.uri == again.uri == f"{tmp_path}/fluss/orders"
    assert first.latest_snapshot_id() == 0
    recreated = table_info(tmp_path, PK, ["id"], table_id=TABLE_ID + 1)
    with pytest.raises(InvalidTableError, match="dropped and re-created"):
        lake_format(recreated).table(recreated)


def test_unknown_format_or_missing_warehouse_is_a_config_error(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    bad = TableInfo.from_record(TableRecord(1, "fluss", "x", info.table_json.replace(b'"delta"', b'"hudi"'), 1, 0, 0))
    with pytest.raises(InvalidConfigError, match="hudi"):
        lake_format(bad)
    document = json.loads(info.table_json)
    del document["properties"]["table.datalake.delta.warehouse"]
    missing = TableInfo.from_record(TableRecord(1, "fluss", "x", json.dumps(document).encode(), 1, 0, 0))
    with pytest.raises(InvalidConfigError, match="warehouse"):
        lake_format(missing)


def test_primary_key_rounds_keep_the_current_state(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    first = [write(table, 0, rows([1, 2, 3]), 0), write(table, 1, rows([10, 11]), 0)]
    v1 = table.commit(first, {OFFSETS_PROPERTY: "o1"})
    assert duck(table) == [(1, "n1", 10, 0, 0), (2, "n2", 20, 0, 1), (3, "n3", 30, 0, 2),
                           (10, "n10", 100, 1, 0), (11, "n11", 110, 1, 1)]
    # bucket 0: 2 is updated, 3 deleted, 4 new; bucket 1 untouched: its file stays
    second = write(table, 0, rows([2, 4], "u"), 3, deleted=[3])
    assert len(json.loads(second.payload)["remove"]) == 1
    v2 = table.commit([second], {OFFSETS_PROPERTY: "o2"})
    assert v2 == v1 + 1
    assert duck(table) == [(1, "n1", 10, 0, 0), (2, "u2", 20, 0, 3), (4, "u4", 40, 0, 4),
                           (10, "n10", 100, 1, 0), (11, "n11", 110, 1, 1)]
    old = sorted(batch.to_pylist()[0]["id"] for batch in table.read_bucket(v1, 0, None))
    assert old == [1], "read_bucket yields batches; the first of snapshot 1 starts at id 1"
    at_v1 = pa.Table.from_batches(list(table.read_bucket(v1, 0, None)))
    assert sorted(at_v1.column("id").to_pylist()) == [1, 2, 3]
    assert at_v1.schema == info.schema.arrow_schema
    stats = table.stats()
    assert stats.record_count == 5 and stats.file_size > 0


def test_partitioned_tables_lay_out_by_partition_then_bucket(tmp_path: Path) -> None:
    columns = [("id", t.IntType(nullable=False)), ("day", t.StringType(nullable=False)), ("v", t.DoubleType())]
    info = table_info(tmp_path, columns, ["id", "day"], partition_keys=("day",))
    table = lake_format(info).table(info)
    results = []
    for day in ("d1", "d2"):
        writer = table.writer(TableBucket(TABLE_ID, 1, 5), day, table.latest_snapshot_id())
        batch = pa.record_batch({"id": pa.array([1, 2], pa.int32()), "day": [day, day], "v": [0.5, 1.5]})
        writer.append(batch, offsets(0, 2), pa.array([5, 5], pa.int64()))
        results.append(writer.complete())
        writer.close()
    table.commit(results, {OFFSETS_PROPERTY: "o"})
    assert duck(table, "SELECT day, id, __bucket FROM lake ORDER BY day, id") == [
        ("d1", 1, 1), ("d1", 2, 1), ("d2", 1, 1), ("d2", 2, 1)
    ]
    assert (Path(table.uri) / "day=d1" / "__bucket=1").is_dir()
    writer = table.writer(TableBucket(TABLE_ID, 1, 5), "d2", table.latest_snapshot_id())
    writer.delete_keys(pa.table({"id": pa.array([1], pa.int32())}))
    result = writer.complete()
    writer.close()
    table.commit([result], {OFFSETS_PROPERTY: "o2"})
    assert duck(table, "SELECT day, id FROM lake ORDER BY day, id") == [("d1", 1), ("d1", 2), ("d2", 2)]


def test_every_supported_type_round_trips_and_duckdb_reads_it(tmp_path: Path) -> None:
    columns = [
        ("id", t.IntType(nullable=False)), ("b", t.BooleanType()), ("ti", t.TinyIntType()), ("si", t.SmallIntType()),
        ("f", t.FloatType()), ("d", t.DoubleType()), ("c", t.CharType(3)), ("s", t.StringType()),
        ("dec", t.DecimalType(10, 2)), ("day", t.DateType()), ("tm", t.TimeType(3)), ("ts", t.TimestampType(6)),
        ("ltz", t.TimestampLtzType(3)), ("bin", t.BinaryType(2)), ("by", t.BytesType()),
        ("arr", t.ArrayType(t.IntType())), ("m", t.MapType(t.StringType(nullable=False), t.BigIntType())),
        ("r", t.RowType([t.DataField("x", t.IntType()), t.DataField("y", t.StringType())])),
    ]
    info = table_info(tmp_path, columns)
    table = lake_format(info).table(info)
    schema = info.schema.arrow_schema
    values = {
        "id": [1, 2], "b": [True, None], "ti": [1, -1], "si": [300, None], "f": [1.5, None], "d": [2.25, -1.0],
        "c": ["abc", None], "s": ["x", "ü"], "dec": [decimal.Decimal("12.34"), None],
        "day": [dt.date(2026, 1, 2), None], "tm": [dt.time(1, 2, 3, 4000), None],
        "ts": [dt.datetime(2026, 1, 2, 3, 4, 5, 6), None],
        "ltz": [dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.UTC), None], "bin": [b"ab", None],
        "by": [b"\x00\x01", b""], "arr": [[1, None], None], "m": [[("k", 1)], None], "r": [{"x": 1, "y": "z"}, None],
    }
    batch = pa.record_batch([pa.array(values[f.name], f.type) for f in schema], schema=schema)
    writer = table.writer(TableBucket(TABLE_ID, 0), None, table.latest_snapshot_id())
    writer.append(batch, offsets(0, 2), pa.array([-1, 1_700_000_000_123], pa.int64()))
    version = table.commit([writer.complete()], {})
    writer.close()
    back = pa.Table.from_batches(list(table.read_bucket(version, 0, None)))
    assert back.sort_by("id").to_pylist() == pa.Table.from_batches([batch]).to_pylist()
    duck_rows = read_delta(table.uri, "SELECT * FROM lake ORDER BY id").to_pylist()
    assert duck_rows[0]["tm"] == 3_723_004_000, "TIME is microseconds of the day"
    assert duck_rows[0]["dec"] == decimal.Decimal("12.34") and duck_rows[0]["r"] == {"x": 1, "y": "z"}
    assert duck_rows[1]["__timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)
    assert duck_rows[0]["__offset"] == 0 and duck_rows[1]["__bucket"] == 0


def test_commits_carry_properties_and_the_last_strom_commit_is_found(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    v1 = table.commit([write(table, 0, rows([1]), 0)], {OFFSETS_PROPERTY: "/remote/a.offsets"})
    found = table.last_strom_commit(None)
    assert found is not None and found.snapshot_id == v1
    assert found.properties[OFFSETS_PROPERTY] == "/remote/a.offsets" and found.properties["commit-user"] == COMMIT_USER
    assert table.last_strom_commit(v1) is None
    empty = table.commit([], {OFFSETS_PROPERTY: "/remote/b.offsets"})
    assert empty == v1 + 1 and duck(table, "SELECT count(*) FROM lake") == [(1,)]
    foreign = pa.table({"id": pa.array([9], pa.int32()), "name": ["x"], "score": pa.array([1], pa.int64()),
                        "__bucket": pa.array([0], pa.int32()), "__offset": pa.array([0], pa.int64()),
                        "__timestamp": pa.array([0], pa.timestamp("us", "UTC"))})
    write_deltalake(table.uri, foreign.cast(read_delta(table.uri).schema), mode="append")
    last = table.last_strom_commit(v1)
    assert last is not None and last.snapshot_id == empty, "commits by other writers are not strom's"


def test_uncommitted_and_aborted_files_never_show(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    table.commit([write(table, 0, rows([1]), 0)], {})
    orphan = write(table, 0, rows([2]), 1)
    aborted = write(table, 1, rows([3]), 0)
    table.abort([aborted])
    assert duck(table, "SELECT id FROM lake") == [(1,)]
    aborted_path = json.loads(aborted.payload)["add"][0]["path"]
    orphan_path = json.loads(orphan.payload)["add"][0]["path"]
    assert not (Path(table.uri) / aborted_path).exists()
    assert (Path(table.uri) / orphan_path).exists(), "never committed: present on disk, invisible to readers"

    files_before = sorted((Path(table.uri) / "__bucket=0").iterdir())
    failed = table.writer(TableBucket(TABLE_ID, 0), None, table.latest_snapshot_id())
    failed.append(rows(list(range(100, 110))), offsets(0, 10), pa.array(np.zeros(10, np.int64)))
    failed._flush()  # a file on disk, as a large split writes before it completes
    assert len(sorted((Path(table.uri) / "__bucket=0").iterdir())) == len(files_before) + 1
    failed.close()  # the split failed before complete(): what it wrote is removed
    assert sorted((Path(table.uri) / "__bucket=0").iterdir()) == files_before


def test_racing_rewrites_of_the_same_files_commit_once(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    table.commit([write(table, 0, rows([1, 2]), 0)], {})
    first = write(table, 0, rows([1], "a"), 2, touched=True)
    second = write(table, 0, rows([2], "b"), 3, touched=True)
    table.commit([first], {OFFSETS_PROPERTY: "first"})
    before = duck(table)
    with pytest.raises(LakeCommitConflictError, match="refused"):
        table.commit([second], {OFFSETS_PROPERTY: "second"})
    assert duck(table) == before


def test_log_tables_only_append(tmp_path: Path) -> None:
    info = table_info(tmp_path, [("id", t.IntType()), ("e", t.StringType())])
    table = lake_format(info).table(info)
    writer = table.writer(TableBucket(TABLE_ID, 0), None, table.latest_snapshot_id())
    with pytest.raises(InvalidTableError, match="log table"):
        writer.delete_keys(pa.table({"id": [1]}))
    writer.close()
