"""Commits of a round into Iceberg: one snapshot carrying the tiering properties in its summary (Fluss's
``commit-user`` and ``fluss-offsets``), found again by ``last_strom_commit``; a table that moved past the
round's base snapshot refuses the commit; files that are never committed stay invisible and are deleted
by abort; snapshots expire when the table asks for it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.table.snapshots import Operation

from strom.ids import TableBucket
from strom.lake.delta_files import FileLimits
from strom.lake.format import COMMIT_USER, OFFSETS_PROPERTY, LakeCommitConflictError
from strom.lake.formats import lake_format
from strom.lake.iceberg import IcebergLakeFormat, IcebergLakeTable
from strom.metadata.table_info import TableInfo
from strom.records import types as t
from tests.lake.duckdb_reader import iceberg_rows
from tests.lake.support import TABLE_ID, commit_concurrently, int64s, table_info, write_split

PK = [("id", t.IntType(nullable=False)), ("name", t.StringType())]
LOG = [("id", t.IntType()), ("name", t.StringType())]


def rows(ids: list[int], name: str = "n") -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int32()), "name": [f"{name}{i}" for i in ids]})


def keys(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int32())})


def iceberg_table(info: TableInfo) -> IcebergLakeTable:
    table = lake_format(info).table(info)
    assert isinstance(table, IcebergLakeTable)
    return table


def duck(table: IcebergLakeTable, query: str) -> list[tuple[object, ...]]:
    return iceberg_rows(table.iceberg().metadata_location, query)


def foreign_append(table: IcebergLakeTable, ids: list[int]) -> None:
    """A commit by another writer (pyiceberg's own append; no strom commit user)."""
    ice = table.iceberg()
    schema = ice.schema().as_arrow()
    data = {"id": ids, "name": ["x"] * len(ids), "__bucket": [1] * len(ids), "__offset": [0] * len(ids),
            "__timestamp": [0] * len(ids)}
    ice.append(pa.table({f.name: pa.array(data[f.name]).cast(f.type) for f in schema}, schema=schema))


def test_a_commit_is_one_snapshot_whose_summary_carries_the_properties_and_the_commit_user(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = iceberg_table(info)
    snapshot_id = table.commit([write_split(table, 0, rows([1]), [0]), write_split(table, 1, rows([2]), [0])],
                               {OFFSETS_PROPERTY: "/remote/1.offsets", "x": "y"})
    ice = table.iceberg()
    [snapshot] = ice.snapshots()
    assert snapshot.snapshot_id == snapshot_id == table.latest_snapshot_id()
    assert snapshot.summary is not None and snapshot.summary.operation == Operation.APPEND
    assert snapshot.summary["fluss-offsets"] == "/remote/1.offsets" and snapshot.summary["commit-user"] == COMMIT_USER
    assert snapshot.summary["x"] == "y" and snapshot.summary["total-records"] == "2"
    files = {task.file.file_path: task.file for task in ice.scan().plan_files()}
    assert sorted(f.partition[0] for f in files.values()) == [0, 1], "the partition value is the strom bucket"
    assert all(f.record_count == 1 and f.lower_bounds and f.null_value_counts for f in files.values()), "statistics"
    assert duck(table, "SELECT id, __bucket FROM lake ORDER BY id") == [(1, 0), (2, 1)]


def test_a_copy_on_write_commit_is_an_overwrite_of_the_buckets_files(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = iceberg_table(info)
    table.commit([write_split(table, 0, rows([2, 4]), [0, 1]), write_split(table, 1, rows([1]), [0])], {})
    before = {task.file.file_path for task in table.iceberg().scan().plan_files()}
    result = write_split(table, 0, rows([4], "u"), [2], deleted_keys=keys([4]))
    removed = json.loads(result.payload)["remove"]
    assert len(removed) == 1 and removed[0] in before
    table.commit([result], {OFFSETS_PROPERTY: "2"})
    snapshot = table.iceberg().current_snapshot()
    assert snapshot is not None and snapshot.summary is not None and snapshot.summary.operation == Operation.OVERWRITE
    assert snapshot.summary["deleted-data-files"] == "1" and snapshot.summary["added-data-files"] == "1"
    after = {task.file.file_path for task in table.iceberg().scan().plan_files()}
    assert removed[0] not in after and len(after) == 2
    assert duck(table, "SELECT id, name, __offset FROM lake ORDER BY id") == [(1, "n1", 0), (2, "n2", 0), (4, "u4", 2)]


def test_an_empty_commit_makes_a_snapshot_with_its_properties(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = iceberg_table(info)
    s1 = table.commit([write_split(table, 0, rows([1]), [0])], {OFFSETS_PROPERTY: "a"})
    s2 = table.commit([], {OFFSETS_PROPERTY: "b"})
    s3 = table.commit([write_split(table, 1)], {OFFSETS_PROPERTY: "c"})  # a split that wrote nothing
    assert len({s1, s2, s3}) == 3 and table.latest_snapshot_id() == s3
    found = table.last_strom_commit(s2)
    assert found is not None and found.snapshot_id == s3 and found.properties[OFFSETS_PROPERTY] == "c"
    assert duck(table, "SELECT id FROM lake") == [(1,)]
    assert table.stats().record_count == 1


def test_last_strom_commit_finds_a_commit_the_caller_does_not_know_and_ignores_other_writers(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG, lake="iceberg")  # pyiceberg's own append cannot compute bucket[N] (no pyiceberg-core)
    table = iceberg_table(info)
    assert table.last_strom_commit(None) is None, "an empty table has no strom commit"
    s1 = table.commit([write_split(table, 0, rows([1]), [0])], {OFFSETS_PROPERTY: "/remote/a.offsets"})
    found = table.last_strom_commit(None)
    assert found is not None and found.snapshot_id == s1
    assert found.properties[OFFSETS_PROPERTY] == "/remote/a.offsets" and found.properties["commit-user"] == COMMIT_USER
    assert table.last_strom_commit(s1) is None

    s2 = table.commit([], {OFFSETS_PROPERTY: "/remote/b.offsets"})
    foreign_append(table, [9])
    last = table.last_strom_commit(s1)
    assert last is not None and last.snapshot_id == s2 and last.properties[OFFSETS_PROPERTY] == "/remote/b.offsets"
    assert table.last_strom_commit(s2) is None, "the foreign snapshot after s2 is not strom's"
    s4 = table.commit([], {OFFSETS_PROPERTY: "/remote/c.offsets"})
    last = table.last_strom_commit(s2)
    assert last is not None and last.snapshot_id == s4


def test_a_commit_after_another_writer_committed_is_a_conflict(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG, lake="iceberg")
    table = iceberg_table(info)
    base = table.commit([write_split(table, 0, rows([1]), [0])], {})
    result = write_split(table, 0, rows([2]), [1], base_snapshot_id=base)
    foreign_append(table, [3])
    moved = table.latest_snapshot_id()
    with pytest.raises(LakeCommitConflictError, match="refused"):
        table.commit([result], {OFFSETS_PROPERTY: "o"})
    assert table.latest_snapshot_id() == moved
    assert duck(table, "SELECT id FROM lake ORDER BY id") == [(1,), (3,)]
    table.abort([result])
    assert not Path(json.loads(result.payload)["add"][0]["path"]).exists()


def test_two_strom_commits_from_the_same_snapshot_cannot_both_land(tmp_path: Path) -> None:
    info = table_info(tmp_path, LOG, lake="iceberg")
    table = iceberg_table(info)
    base = table.latest_snapshot_id()
    first = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)
    second = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)  # a second job, same offsets
    table.commit([first], {OFFSETS_PROPERTY: "first"})
    with pytest.raises(LakeCommitConflictError):
        table.commit([second], {OFFSETS_PROPERTY: "second"})
    assert duck(table, "SELECT id FROM lake") == [(1,)], "the same rows are never tiered twice"
    found = table.last_strom_commit(None)
    assert found is not None and found.properties[OFFSETS_PROPERTY] == "first"


def test_committers_racing_from_the_same_snapshot_land_once(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = iceberg_table(info)
    base = table.commit([write_split(table, 0, rows([1, 2]), [0, 1])], {})
    results = [write_split(table, 0, rows([1], f"r{i}"), [2], deleted_keys=keys([1]), base_snapshot_id=base)
               for i in range(4)]
    outcomes = commit_concurrently(table, results)
    landed = [o for o in outcomes if isinstance(o, int)]
    assert len(landed) == 1 and len(outcomes) == 4, outcomes
    assert duck(table, "SELECT count(*), count(DISTINCT id) FROM lake") == [(2, 2)]
    assert table.latest_snapshot_id() == landed[0]


def test_results_written_against_different_snapshots_are_not_committed_together(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = iceberg_table(info)
    old = write_split(table, 0, rows([1]), [0])
    table.commit([], {})
    new = write_split(table, 1, rows([2]), [0])
    with pytest.raises(ValueError, match="different lake snapshots"):
        table.commit([old, new], {})


def test_abort_deletes_the_files_of_uncommitted_results_only(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = iceberg_table(info)
    committed = write_split(table, 0, rows([1]), [0])
    table.commit([committed], {})
    aborted = write_split(table, 1, rows([3]), [0])
    aborted_path = Path(json.loads(aborted.payload)["add"][0]["path"])
    assert aborted_path.exists()
    table.abort([aborted, committed])  # the committed one by mistake: its file must survive
    assert not aborted_path.exists()
    assert Path(json.loads(committed.payload)["add"][0]["path"]).exists()
    assert duck(table, "SELECT id FROM lake") == [(1,)]


def test_a_writer_that_is_never_committed_leaves_no_visible_rows(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = iceberg_table(info)
    table.commit([write_split(table, 0, rows([1, 2]), [0, 1])], {})
    orphan = write_split(table, 0, rows([2, 3], "u"), [2, 3], deleted_keys=keys([1, 2, 3]))
    assert Path(json.loads(orphan.payload)["add"][0]["path"]).exists()
    assert duck(table, "SELECT id, name FROM lake ORDER BY id") == [(1, "n1"), (2, "n2")]
    assert table.stats().record_count == 2


def test_a_split_closed_before_complete_deletes_what_it_wrote(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = IcebergLakeFormat({"warehouse": str(tmp_path)}, FileLimits(file_rows_max=4, row_group_rows_max=2)).table(info)
    table.commit([write_split(table, 0, rows([1]), [0])], {})
    directory = Path(table.uri) / "data" / "id_bucket=0"
    before = sorted(directory.iterdir())
    writer = table.writer(TableBucket(TABLE_ID, 0), None, table.latest_snapshot_id())
    writer.append(rows(list(range(100, 110))), int64s(range(10)), int64s(np.zeros(10, np.int64)))
    assert len(sorted(directory.iterdir())) == len(before) + 3, "two full files and one open file on disk"
    writer.close()  # the task failed before complete()
    assert sorted(directory.iterdir()) == before
    assert duck(table, "SELECT id FROM lake") == [(1,)]


def test_old_snapshots_expire_after_a_commit_when_the_table_asks_for_it(tmp_path: Path) -> None:
    expiring = {"table.datalake.auto-expire-snapshot": "true", "iceberg.history.expire.max-snapshot-age-ms": "0",
                "iceberg.history.expire.min-snapshots-to-keep": "2"}
    info = table_info(tmp_path, PK, ["id"], lake="iceberg", properties=expiring)
    table = iceberg_table(info)
    ids = [table.commit([write_split(table, 0, rows([i]), [i])], {OFFSETS_PROPERTY: str(i)}) for i in range(4)]
    assert [s.snapshot_id for s in table.iceberg().snapshots()] == ids[-2:], "the newest two are kept"
    assert duck(table, "SELECT id FROM lake ORDER BY id") == [(0,), (1,), (2,), (3,)]
    found = table.last_strom_commit(None)
    assert found is not None and found.properties[OFFSETS_PROPERTY] == "3"

    kept = table_info(tmp_path, PK, ["id"], lake="iceberg", name="kept")
    plain = iceberg_table(kept)
    for _ in range(3):
        plain.commit([], {})
    assert len(plain.iceberg().snapshots()) == 3, "auto-expire-snapshot is off by default"
    assert plain.expire_snapshots() == [], "Iceberg's default retention keeps 5 days"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=6)
    assert len(plain.expire_snapshots(now=later)) == 2
    assert len(plain.iceberg().snapshots()) == 1
