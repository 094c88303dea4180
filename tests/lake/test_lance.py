"""Log tables in Lance, laid out as Fluss's Lance tiering lays them out: a dataset at
``<warehouse>/<database>/<table>.lance`` with the table's columns (and the system columns), one Lance
append per round whose transaction properties carry ``commit-user`` and ``fluss-offsets``, found again by
``last_strom_commit``; a commit applies only to the version its round was planned on; fragments never
committed are invisible and deleted by abort or close; DuckDB's lance extension reads what pylance
wrote."""

from __future__ import annotations

import datetime as dt
import decimal
import pickle
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from strom.errors import InvalidConfigError, InvalidTableError
from strom.ids import TableBucket
from strom.lake.delta_files import FileLimits
from strom.lake.format import COMMIT_USER, OFFSETS_PROPERTY, LakeCommitConflictError, LakeTableMismatchError
from strom.lake.formats import lake_format
from strom.lake.lance import LanceLakeFormat, LanceLakeTable
from strom.metadata.table_info import TableInfo
from strom.records import types as t
from tests.lake.duckdb_reader import lance_rows, read_lance
from tests.lake.support import (
    TABLE_ID,
    commit_concurrently,
    create_concurrently,
    int64s,
    table_info,
    write_split,
)
from tests.lake.test_delta_types import COLUMNS, batch_of

LOG = [("id", t.IntType()), ("name", t.StringType())]
UTC = dt.UTC


def rows(ids: list[int], name: str = "n") -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int32()), "name": [f"{name}{i}" for i in ids]})


def lance_table(info: TableInfo) -> LanceLakeTable:
    table = lake_format(info).table(info)
    assert isinstance(table, LanceLakeTable)
    return table


def duck(table: LanceLakeTable, query: str) -> list[tuple[object, ...]]:
    return lance_rows(table.uri, query)


def data_files(table: LanceLakeTable) -> set[str]:
    return {path.name for path in (Path(table.uri) / "data").iterdir()}


def test_a_log_table_is_a_dataset_where_fluss_puts_it_with_the_system_columns_last(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG, lake="lance")
    table = lance_table(info)
    assert table.uri == f"{tmp_path}/fluss/orders.lance"
    dataset = lance.dataset(table.uri)
    assert [(f.name, str(f.type), f.nullable) for f in dataset.schema] == [
        ("id", "int32", True), ("name", "string", True), ("__bucket", "int32", False), ("__offset", "int64", False),
        ("__timestamp", "timestamp[us, tz=UTC]", False),
    ]
    assert dataset.schema.metadata == {b"strom.table-id": str(TABLE_ID).encode()}
    assert table.latest_snapshot_id() == 1 and table.read().num_rows == 0
    assert duck(table, "SELECT count(*) FROM lake") == [(0,)]


def test_primary_key_tables_and_dotted_columns_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidTableError, match="log tables only"):
        lance_table(table_info(tmp_path, LOG, ["id"], lake="lance"))
    with pytest.raises(InvalidTableError, match="period"):
        lance_table(table_info(tmp_path, [("a.b", t.IntType())], lake="lance", name="dotted"))
    assert not (tmp_path / "fluss" / "orders.lance").exists() and not (tmp_path / "fluss" / "dotted.lance").exists()


def test_create_is_idempotent_and_racing_creators_make_one_dataset(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG, lake="lance")
    errors = create_concurrently(info, 4)
    assert errors == []
    assert [v["version"] for v in lance.dataset(lance_table(info).uri).versions()] == [1]


def test_a_recreated_table_or_another_schema_is_refused(tmp_path: Path) -> None:
    lance_table(table_info(tmp_path, LOG, lake="lance"))
    with pytest.raises(LakeTableMismatchError, match="belongs to strom table id 7"):
        lance_table(table_info(tmp_path, LOG, lake="lance", table_id=8))
    with pytest.raises(LakeTableMismatchError, match="has columns"):
        lance_table(table_info(tmp_path, [("id", t.BigIntType()), ("name", t.StringType())], lake="lance"))


def test_a_commit_is_one_append_whose_transaction_carries_the_properties_and_the_commit_user(tmp_path: Path) -> None:
    table = lance_table(table_info(tmp_path, LOG, lake="lance"))
    results = [write_split(table, 0, rows([1, 2]), [0, 1]), write_split(table, 1, rows([3]), [0])]
    version = table.commit(results, {OFFSETS_PROPERTY: "/remote/offsets-1"})
    assert version == 2 == table.latest_snapshot_id()
    transaction = lance.dataset(table.uri).read_transaction(version)
    assert type(transaction.operation).__name__ == "Append" and len(transaction.operation.fragments) == 2
    assert transaction.transaction_properties == {OFFSETS_PROPERTY: "/remote/offsets-1", "commit-user": COMMIT_USER}
    assert duck(table, "SELECT id, name, __bucket, __offset FROM lake ORDER BY id") == [
        (1, "n1", 0, 0), (2, "n2", 0, 1), (3, "n3", 1, 0)]
    assert table.stats().record_count == 3 and table.stats().file_size == sum(r.file_size for r in results) > 0
    assert table.stats(1).record_count == 0
    assert results[0].record_count == 2 and results[0].file_count == 1


def test_an_empty_commit_is_a_version_with_its_properties(tmp_path: Path) -> None:
    table = lance_table(table_info(tmp_path, LOG, lake="lance"))
    version = table.commit([], {OFFSETS_PROPERTY: "empty"})
    found = table.last_strom_commit(None)
    assert found is not None and (found.snapshot_id, found.properties[OFFSETS_PROPERTY]) == (version, "empty")


def test_last_strom_commit_finds_a_commit_the_caller_does_not_know_and_ignores_other_writers(tmp_path: Path) -> None:
    table = lance_table(table_info(tmp_path, LOG, lake="lance"))
    assert table.last_strom_commit(None) is None, "creating the dataset is not a tiering commit"
    first = table.commit([write_split(table, 0, rows([1]), [0])], {OFFSETS_PROPERTY: "a"})
    foreign = table.read().slice(0, 1)
    lance.write_dataset(foreign, table.uri, mode="append")  # another writer, no commit user
    found = table.last_strom_commit(None)
    assert found is not None and (found.snapshot_id, found.properties[OFFSETS_PROPERTY]) == (first, "a")
    assert table.last_strom_commit(first) is None, "the caller knows it already"
    second = table.commit([write_split(table, 0, rows([2]), [1])], {OFFSETS_PROPERTY: "b"})
    found = table.last_strom_commit(first)
    assert found is not None and (found.snapshot_id, found.properties[OFFSETS_PROPERTY]) == (second, "b")


def test_a_commit_after_another_commit_landed_is_a_conflict_and_shows_nothing(tmp_path: Path) -> None:
    table = lance_table(table_info(tmp_path, LOG, lake="lance"))
    base = table.latest_snapshot_id()
    first = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)
    second = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)  # a second job, same offsets
    table.commit([first], {OFFSETS_PROPERTY: "first"})
    with pytest.raises(LakeCommitConflictError, match="is at version 2"):
        table.commit([second], {OFFSETS_PROPERTY: "second"})
    assert duck(table, "SELECT id FROM lake") == [(1,)], "the same rows are never tiered twice"
    found = table.last_strom_commit(None)
    assert found is not None and found.properties[OFFSETS_PROPERTY] == "first"


def test_committers_racing_from_the_same_version_land_once(tmp_path: Path) -> None:
    table = lance_table(table_info(tmp_path, LOG, lake="lance"))
    base = table.latest_snapshot_id()
    results = [write_split(table, 0, rows([i]), [0], base_snapshot_id=base) for i in range(4)]
    outcomes = commit_concurrently(table, results)
    landed = [o for o in outcomes if isinstance(o, int)]
    assert len(landed) == 1 and len(outcomes) == 4, outcomes
    assert duck(table, "SELECT count(*) FROM lake") == [(1,)]
    assert table.latest_snapshot_id() == landed[0] == base + 1


def test_results_written_against_different_versions_are_not_committed_together(tmp_path: Path) -> None:
    table = lance_table(table_info(tmp_path, LOG, lake="lance"))
    old = write_split(table, 0, rows([1]), [0])
    table.commit([], {})
    new = write_split(table, 1, rows([2]), [0])
    with pytest.raises(ValueError, match="different lake snapshots"):
        table.commit([old, new], {})


def test_abort_deletes_the_fragments_of_uncommitted_results_only(tmp_path: Path) -> None:
    table = lance_table(table_info(tmp_path, LOG, lake="lance"))
    committed = write_split(table, 0, rows([1]), [0])
    table.commit([committed], {})
    kept = data_files(table)
    aborted = write_split(table, 1, rows([3]), [0])
    assert len(data_files(table)) == len(kept) + 1
    table.abort([aborted, committed])  # the committed one by mistake: its file must survive
    assert data_files(table) == kept
    assert duck(table, "SELECT id FROM lake") == [(1,)]


def test_a_split_closed_before_complete_deletes_what_it_wrote(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG, lake="lance")
    table = LanceLakeFormat({"warehouse": str(tmp_path)}, FileLimits(file_rows_max=4, row_group_rows_max=2)).table(info)
    table.commit([write_split(table, 0, rows([1]), [0])], {})
    before = data_files(table)
    writer = table.writer(TableBucket(TABLE_ID, 0), None, table.latest_snapshot_id())
    writer.append(rows(list(range(100, 110))), int64s(range(10)), int64s(np.zeros(10, np.int64)))
    assert len(data_files(table)) == len(before) + 3, "files of at most 4 rows are on disk already"
    writer.close()  # the task failed before complete()
    assert data_files(table) == before
    assert duck(table, "SELECT id FROM lake") == [(1,)]


def test_read_bucket_and_buckets_find_one_partitions_bucket(tmp_path: Path) -> None:
    columns = [("id", t.IntType()), ("day", t.DateType()), ("ok", t.BooleanType()), ("name", t.StringType())]
    info = table_info(tmp_path, columns, partition_keys=["day", "ok"], lake="lance")
    table = lance_table(info)

    def batch(ids: list[int], day: dt.date, ok: bool) -> pa.RecordBatch:
        return pa.record_batch({"id": pa.array(ids, pa.int32()), "day": pa.array([day] * len(ids), pa.date32()),
                                "ok": [ok] * len(ids), "name": [f"n{i}" for i in ids]})

    d1, d2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)
    version = table.commit([
        write_split(table, 0, batch([1, 2], d1, True), [0, 1], partition_name="2026-01-01$True"),
        write_split(table, 1, batch([3], d1, True), [0], partition_name="2026-01-01$True"),
        write_split(table, 0, batch([4], d2, False), [0], partition_name="2026-01-02$False"),
    ], {})
    assert table.buckets(version) == [("2026-01-01$True", 0), ("2026-01-01$True", 1), ("2026-01-02$False", 0)]
    got = pa.Table.from_batches(list(table.read_bucket(version, 0, "2026-01-01$True", ["id", "name"],
                                                       with_system_columns=True)))
    assert got.column_names == ["id", "name", "__bucket", "__offset", "__timestamp"]
    assert sorted(got.column("id").to_pylist()) == [1, 2] and set(got.column("__bucket").to_pylist()) == {0}
    assert [b.num_rows for b in table.read_bucket(version, 0, "2026-01-02$False")] == [1]
    assert list(table.read_bucket(1, 0, "2026-01-01$True")) == [], "the version before the commit has no rows"


def test_every_type_round_trips_and_duckdb_reads_it(tmp_path: Path) -> None:
    info = table_info(tmp_path, COLUMNS, lake="lance")
    table = lance_table(info)
    schema = info.schema.arrow_schema
    batch = batch_of(schema)
    version = table.commit([write_split(table, 0, batch, [0, 1, 2], [-1, 1_700_000_000_123, 5])], {})

    back = pa.Table.from_batches(list(table.read_bucket(version, 0, None)))
    assert back.schema == schema
    assert back.sort_by("id").to_pylist() == pa.Table.from_batches([batch]).to_pylist()

    duck_rows = {row["id"]: row for row in read_lance(table.uri).to_pylist()}
    first = duck_rows[1]
    assert first["tm"] == dt.time(1, 2, 3, 4000) and first["tm9"] == dt.time(1, 2, 3, 4), "TIME is a time (microseconds)"
    assert first["dec"] == decimal.Decimal("12.34")
    assert first["big_dec"] == decimal.Decimal("1234567890123456789012345678.0123456789")
    assert first["ts"] == dt.datetime(2026, 1, 2, 3, 4, 5, 6) and first["ts9"] == dt.datetime(2026, 1, 2, 3, 4, 5, 123456)
    assert first["ltz"].astimezone(UTC) == dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
    assert first["c"] == "abc" and first["bin"] == b"ab" and first["m"] in ({"k": 1}, [("k", 1)])
    assert first["r"] == {"x": 1, "y": "z", "at": dt.time(12)} and first["arr"] == batch.column("arr")[0].as_py()
    assert duck_rows[3]["s"] == "" and duck_rows[2]["s"] == "ü" * 40
    assert duck_rows[2]["__timestamp"].astimezone(UTC) == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert [duck_rows[i]["__offset"] for i in (1, 2, 3)] == [0, 1, 2]


def test_a_lake_table_pickles_and_reads_after_unpickling(tmp_path: Path) -> None:
    table = lance_table(table_info(tmp_path, LOG, lake="lance"))
    version = table.commit([write_split(table, 0, rows([5]), [0])], {})
    copy = pickle.loads(pickle.dumps(table))
    assert [b.to_pylist() for b in copy.read_bucket(version, 0, None)] == [[{"id": 5, "name": "n5"}]]


def test_auto_expire_cleans_up_under_lances_own_retention_which_keeps_young_versions(tmp_path: Path) -> None:
    """``table.datalake.auto-expire-snapshot`` runs Lance's cleanup after each commit, with Lance's own
    default retention (versions older than two weeks): the versions of a fresh table all stay readable."""
    info = table_info(tmp_path, LOG, lake="lance", properties={"table.datalake.auto-expire-snapshot": "true"})
    table = lance_table(info)
    for i in range(3):
        table.commit([write_split(table, 0, rows([i]), [i])], {OFFSETS_PROPERTY: str(i)})
    assert [v["version"] for v in lance.dataset(table.uri).versions()] == [1, 2, 3, 4]
    assert [pa.Table.from_batches(list(table.read_bucket(v, 0, None))).num_rows for v in (2, 3, 4)] == [1, 2, 3]
    assert duck(table, "SELECT id FROM lake ORDER BY id") == [(0,), (1,), (2,)]
    found = table.last_strom_commit(None)
    assert found is not None and found.properties[OFFSETS_PROPERTY] == "2"


def test_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidConfigError, match=r"datalake\.lance\.warehouse"):
        LanceLakeFormat({})
    with pytest.raises(InvalidConfigError, match="max_row_per_file must be an integer"):
        LanceLakeFormat({"warehouse": str(tmp_path), "max_row_per_file": "many"})
    monkeypatch.chdir(tmp_path)
    lake = LanceLakeFormat({"warehouse": "lake", "max_row_per_file": "2", "aws_region": "x", "batch_size": "9"})
    assert lake.warehouse == str(tmp_path / "lake") and lake.file_sizes == {"max_rows_per_file": 2}
    assert lake.storage_options == {"aws_region": "x"}, "Fluss's read options are not storage options"
    table = LanceLakeFormat({"warehouse": "lake", "max_row_per_file": "2"}).table(table_info("lake", LOG, lake="lance"))
    result = write_split(table, 0, rows([1, 2, 3, 4, 5]), range(5))
    assert result.file_count == 3, "Fluss's max_row_per_file cuts the files"
