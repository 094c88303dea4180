"""Tables in Paimon, laid out as Fluss's Paimon tiering lays them out: ``<warehouse>/<database>.db/<table>``
with the table's columns and Fluss's system columns, primary-key tables as Paimon primary-key tables whose
buckets are strom's, log tables as append tables, partitions as Paimon partitions; one Paimon commit per
round under Fluss's commit user whose properties strom finds again; a commit applies only to the snapshot
its round was planned on. Every state is checked against an expected one through pypaimon-rust's SQL and,
independently, pypaimon 2.1.0 (Paimon's pure-Python implementation, in a virtualenv of its own)."""

from __future__ import annotations

import glob
import json
import pickle
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pypaimon_rust.datafusion import PaimonCatalog

from strom.errors import InvalidConfigError, InvalidTableError
from strom.ids import TableBucket
from strom.lake.format import COMMIT_USER, OFFSETS_PROPERTY, LakeCommitConflictError, LakeTableMismatchError
from strom.lake.formats import lake_format
from strom.lake.paimon import PaimonLakeFormat, PaimonLakeTable
from strom.metadata.table_info import TableInfo
from strom.records import keys
from strom.records import types as t
from tests.lake.paimon_reader import pypaimon_rows, sql_rows
from tests.lake.support import (
    TABLE_ID,
    Model,
    commit_concurrently,
    create_concurrently,
    pk_round,
    row_tuples,
    table_info,
    write_split,
)

LOG = [("id", t.IntType()), ("event", t.StringType())]
PK = [("id", t.IntType(nullable=False)), ("name", t.StringType()), ("score", t.BigIntType(nullable=False))]
SEEDS = [1, 2, 3]


def paimon_table(info: TableInfo) -> PaimonLakeTable:
    table = lake_format(info).table(info)
    assert isinstance(table, PaimonLakeTable)
    return table


def warehouse_of(table: PaimonLakeTable) -> str:
    return table.catalog_options["warehouse"]


def paimon_bucket(info: TableInfo, row: dict[str, Any]) -> int:
    """The bucket strom's client gives a row of a Paimon-keyed table."""
    row_type = info.schema.row_type
    indexes = [row_type.field_names.index(k) for k in info.descriptor.bucket_keys]
    encoder = keys.key_encoder(row_type, indexes, keys.PAIMON)
    return keys.bucket_function(keys.PAIMON)(encoder.encode_key([row[k] for k in info.descriptor.bucket_keys]),
                                             info.bucket_count)


def rows(ids: list[int], name: str = "n") -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int32()), "event": [f"{name}{i}" for i in ids]})


def test_a_primary_key_table_is_laid_out_as_fluss_lays_it_out(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="paimon", bucket_count=3, properties={"paimon.file.format": "parquet"})
    table = paimon_table(info)
    assert table.uri == f"file://{tmp_path}/fluss.db/orders"
    schema = table.paimon().schema()
    assert [(f.name(), f.field_type()) for f in schema.fields()] == [
        ("id", "INT NOT NULL"), ("name", "STRING"), ("score", "BIGINT NOT NULL"), ("__bucket", "INT"),
        ("__offset", "BIGINT"), ("__timestamp", "TIMESTAMP(3) WITH LOCAL TIME ZONE"),
    ]
    assert list(schema.primary_keys()) == ["id"] and list(schema.partition_keys()) == []
    options = schema.options()
    assert {k: options[k] for k in ("bucket", "bucket-key", "changelog-producer", "partition.legacy-name",
                                    "file.format", "strom.table-id")} == {
        "bucket": "3", "bucket-key": "id", "changelog-producer": "input", "partition.legacy-name": "false",
        "file.format": "parquet", "strom.table-id": str(TABLE_ID)}
    assert options["fluss.table.datalake.enabled"] == "true"
    assert not any(k.startswith("fluss.table.datalake.paimon.") for k in options), "catalog options stay out"


def test_log_tables_are_append_tables_in_paimons_dynamic_bucket_unless_they_have_a_bucket_key(tmp_path: Path) -> None:
    plain = paimon_table(table_info(tmp_path, LOG, lake="paimon", name="plain")).paimon().schema()
    assert list(plain.primary_keys()) == [] and "bucket" not in plain.options()
    keyed = paimon_table(table_info(tmp_path, LOG, lake="paimon", name="keyed", bucket_keys=["id"])).paimon().schema()
    assert (keyed.options()["bucket"], keyed.options()["bucket-key"]) == ("2", "id")


def test_create_is_idempotent_racing_creators_make_one_table_and_another_table_is_refused(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="paimon")
    assert create_concurrently(info, 4) == []
    assert paimon_table(info).latest_snapshot_id() is None
    assert sorted(Path(tmp_path, "fluss.db/orders/schema").iterdir()) == [Path(tmp_path, "fluss.db/orders/schema/schema-0")]
    with pytest.raises(LakeTableMismatchError, match="belongs to strom table id 7"):
        paimon_table(table_info(tmp_path, PK, ["id"], lake="paimon", table_id=8))
    with pytest.raises(LakeTableMismatchError, match="columns, key and partitioning"):
        paimon_table(table_info(tmp_path, LOG, lake="paimon"))


def test_types_pypaimon_rust_cannot_create_and_reserved_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidTableError, match="TIME and MAP"):
        paimon_table(table_info(tmp_path, [("id", t.IntType()), ("at", t.TimeType(3))], lake="paimon", name="a"))
    with pytest.raises(InvalidTableError, match="TIME and MAP"):
        paimon_table(table_info(tmp_path, [("m", t.MapType(t.StringType(nullable=False), t.IntType()))], lake="paimon",
                                name="b"))
    with pytest.raises(InvalidTableError, match="reserves"):
        paimon_table(table_info(tmp_path, [("__offset", t.IntType())], lake="paimon", name="c"))
    with pytest.raises(InvalidConfigError, match=r"datalake\.paimon\.warehouse"):
        PaimonLakeFormat({})


def test_log_tables_append_and_each_commit_carries_its_properties(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG, lake="paimon")
    table = paimon_table(info)
    assert table.last_strom_commit(None) is None
    expected: list[tuple[Any, ...]] = []
    snapshots = []
    for round_index in range(3):
        results = []
        for bucket in (0, 1):
            ids = [round_index * 10 + bucket * 100 + i for i in range(3)]
            offsets = [round_index * 3 + i for i in range(3)]
            results.append(write_split(table, bucket, rows(ids), offsets))
            expected += [(i, f"n{i}", bucket, o) for i, o in zip(ids, offsets, strict=True)]
        snapshots.append(table.commit(results, {OFFSETS_PROPERTY: f"round-{round_index}"}))
        found = table.last_strom_commit(None)
        assert found is not None and found.snapshot_id == snapshots[-1]
        assert found.properties == {OFFSETS_PROPERTY: f"round-{round_index}", "commit-user": COMMIT_USER}
    assert snapshots == [1, 2, 3]
    columns = ["id", "event", "__bucket", "__offset"]
    assert row_tuples(table.read(), columns) == sorted(expected)
    assert sorted(sql_rows(warehouse_of(table), f"SELECT {', '.join(columns)} FROM fluss.orders")) == sorted(expected)
    assert pypaimon_rows(warehouse_of(table), "fluss.orders", columns) == sorted([list(e) for e in expected], key=str)
    assert table.stats().record_count == 18 and table.stats().file_size > 0
    assert table.last_strom_commit(2) is not None and table.last_strom_commit(3) is None
    document = json.loads(Path(tmp_path, "fluss.db/orders/snapshot/snapshot-3").read_text())
    assert document["commitUser"] == COMMIT_USER


@pytest.mark.parametrize("seed", SEEDS)
def test_primary_key_rounds_keep_exactly_the_current_state(tmp_path: Path, seed: int) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="paimon", bucket_count=3)
    table = paimon_table(info)
    rng = random.Random(seed)
    model = Model(["id"])

    def make_row(_: str | None, key: int, rng: random.Random) -> dict[str, Any]:
        return {"id": key, "name": f"n{key}-{rng.randrange(1000)}", "score": rng.randrange(-5, 5)}

    columns = ["id", "name", "score", "__bucket", "__offset"]
    for round_index in range(5):
        results = pk_round(table, model, rng, [None], lambda row: paimon_bucket(info, row), make_row, 24, changes_max=8)
        version = table.commit(results, {OFFSETS_PROPERTY: f"r{round_index}"})
        expected = sorted((r["id"], r["name"], r["score"], r["__bucket"], r["__offset"]) for r in model.rows.values())
        assert row_tuples(table.read(), columns) == expected, f"seed {seed}, round {round_index}"
        assert sorted(sql_rows(warehouse_of(table), f"SELECT {', '.join(columns)} FROM fluss.orders")) == expected
        assert table.stats().record_count >= len(expected)
        for bucket in range(3):
            bucket_rows = pa.Table.from_batches(list(table.read_bucket(version, bucket, None)), schema=info.schema.arrow_schema)
            assert row_tuples(bucket_rows, ["id", "name", "score"]) == [e[:3] for e in expected if e[3] == bucket]
    assert pypaimon_rows(warehouse_of(table), "fluss.orders", columns) == sorted([list(e) for e in expected], key=str)
    # strom's buckets are Paimon's: every data file of a key sits in the bucket-<n> directory of its bucket
    for path in glob.glob(f"{tmp_path}/fluss.db/orders/bucket-*/data-*"):
        bucket = int(path.split("bucket-")[1].split("/")[0])
        stored = pq.read_table(path, columns=["__bucket"]).column("__bucket").to_pylist()
        assert set(stored) <= {bucket}, path


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_a_partitioned_table_keeps_the_current_state(tmp_path: Path, seed: int) -> None:
    columns = [("region", t.StringType(nullable=False)), ("id", t.BigIntType(nullable=False)), ("v", t.DoubleType())]
    info = table_info(tmp_path, columns, ["region", "id"], partition_keys=["region"], lake="paimon")
    table = paimon_table(info)
    assert list(table.paimon().schema().partition_keys()) == ["region"]
    rng = random.Random(seed)
    model = Model(["region", "id"])

    def make_row(region: str | None, key: int, rng: random.Random) -> dict[str, Any]:
        return {"region": region, "id": key, "v": rng.random()}

    for round_index in range(4):
        results = pk_round(table, model, rng, ["eu", "us"], lambda row: paimon_bucket(info, row), make_row, 12, changes_max=8)
        table.commit(results, {OFFSETS_PROPERTY: f"r{round_index}"})
        expected = sorted((r["region"], r["id"], r["v"], r["__bucket"], r["__offset"]) for r in model.rows.values())
        assert row_tuples(table.read(), ["region", "id", "v", "__bucket", "__offset"]) == expected
    version = table.latest_snapshot_id()
    assert version is not None
    for partition in ("eu", "us"):
        for bucket in (0, 1):
            bucket_rows = pa.Table.from_batches(list(table.read_bucket(version, bucket, partition)),
                                                schema=info.schema.arrow_schema)
            assert row_tuples(bucket_rows, ["region", "id", "v"]) == [
                e[:3] for e in expected if e[0] == partition and e[3] == bucket]
    assert table.buckets(version) == sorted({(e[0], e[3]) for e in expected})
    assert sorted(Path(tmp_path, "fluss.db/orders").glob("region=*")) != [], "partitions are Paimon partitions"


def test_a_commit_on_a_stale_base_is_a_conflict_and_racing_commits_land_once(tmp_path: Path) -> None:
    table = paimon_table(table_info(tmp_path, LOG, lake="paimon"))
    base = table.latest_snapshot_id()
    first = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)
    second = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)
    table.commit([first], {OFFSETS_PROPERTY: "first"})
    with pytest.raises(LakeCommitConflictError, match="is at snapshot 1"):
        table.commit([second], {OFFSETS_PROPERTY: "second"})
    assert row_tuples(table.read(), ["id"]) == [(1,)], "the same rows are never tiered twice"
    racing = [write_split(table, 1, rows([10 + i]), [i], base_snapshot_id=1) for i in range(4)]
    outcomes = commit_concurrently(table, racing)
    assert [o for o in outcomes if isinstance(o, int)] == [2] and len(outcomes) == 4, outcomes
    assert len(row_tuples(table.read(), ["id"])) == 2


def test_a_foreign_commit_is_not_a_strom_commit(tmp_path: Path) -> None:
    table = paimon_table(table_info(tmp_path, LOG, lake="paimon"))
    table.commit([write_split(table, 0, rows([1]), [0])], {OFFSETS_PROPERTY: "a"})
    builder = PaimonCatalog(table.catalog_options).get_table("fluss.orders").new_stream_write_builder()
    builder.with_commit_user("someone-else").new_commit().commit(7, [])
    assert table.latest_snapshot_id() == 2
    found = table.last_strom_commit(None)
    assert found is not None and (found.snapshot_id, found.properties[OFFSETS_PROPERTY]) == (1, "a")


def test_abort_deletes_the_files_of_uncommitted_results(tmp_path: Path) -> None:
    table = paimon_table(table_info(tmp_path, PK, ["id"], lake="paimon"))
    pk_rows = pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["a"], "score": pa.array([1], pa.int64())})
    table.commit([write_split(table, 0, pk_rows, [0])], {})
    before = set(glob.glob(f"{tmp_path}/fluss.db/orders/bucket-*/*"))
    orphan = write_split(table, 1, pk_rows, [1])
    assert set(glob.glob(f"{tmp_path}/fluss.db/orders/bucket-*/*")) > before
    table.abort([orphan])
    assert set(glob.glob(f"{tmp_path}/fluss.db/orders/bucket-*/*")) == before
    assert row_tuples(table.read(), ["id", "name"]) == [(1, "a")]


def test_deletes_of_not_null_columns_and_a_pickled_table(tmp_path: Path) -> None:
    """A delete carries only the key; Paimon still wants the NOT NULL columns filled (it ignores them)."""
    info = table_info(tmp_path, PK, ["id"], lake="paimon")
    table = paimon_table(info)
    pk_rows = pa.record_batch({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"], "score": pa.array([1, 2], pa.int64())})
    table.commit([write_split(table, 0, pk_rows, [0, 1])], {})
    copy = pickle.loads(pickle.dumps(table))
    version = copy.commit([write_split(copy, 0, deleted_keys=pa.table({"id": pa.array([2], pa.int32())}))], {})
    assert row_tuples(table.read(), ["id", "name", "score"]) == [(1, "a", 1)]
    assert [b.num_rows for b in copy.read_bucket(version, 0, None)] == [1]
    writer = table.writer(TableBucket(TABLE_ID, 0), None, version)
    with pytest.raises(InvalidTableError, match="log table"):
        paimon_table(table_info(tmp_path, LOG, lake="paimon", name="log")).writer(
            TableBucket(TABLE_ID, 0), None, None).delete_keys(pa.table({"id": pa.array([1], pa.int32())}))
    writer.close()
