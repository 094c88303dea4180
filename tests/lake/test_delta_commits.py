"""Commits of a round: atomic, carrying the tiering properties, found again by ``last_strom_commit``;
files that are never committed stay invisible and can be deleted; racing committers land once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from strom.ids import TableBucket
from strom.lake.delta import DeltaLakeFormat
from strom.lake.delta_files import FileLimits
from strom.lake.format import COMMIT_USER, OFFSETS_PROPERTY, LakeCommitConflictError
from strom.lake.formats import lake_format
from strom.records import types as t
from tests.lake.duckdb_reader import read_delta, rows_of
from tests.lake.support import TABLE_ID, int64s, table_info, write_split

PK = [("id", t.IntType(nullable=False)), ("name", t.StringType())]


def rows(ids: list[int], name: str = "n") -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int32()), "name": [f"{name}{i}" for i in ids]})


def keys(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int32())})


def foreign_append(uri: str, ids: list[int]) -> None:
    """A commit by another writer (no strom commit user)."""
    schema = read_delta(uri).schema
    data = {"id": ids, "name": ["x"] * len(ids), "__bucket": [1] * len(ids), "__offset": [0] * len(ids),
            "__timestamp": [0] * len(ids)}
    write_deltalake(uri, pa.table({f.name: pa.array(data[f.name]).cast(f.type) for f in schema}), mode="append")


def test_a_commit_carries_its_properties_and_the_commit_user(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    version = table.commit([write_split(table, 0, rows([1]), [0])], {OFFSETS_PROPERTY: "/remote/1.offsets", "x": "y"})
    [entry] = DeltaTable(table.uri).history(1)
    assert entry["version"] == version == 1
    assert entry[OFFSETS_PROPERTY] == "/remote/1.offsets" and entry["commit-user"] == COMMIT_USER and entry["x"] == "y"


def test_an_empty_commit_makes_a_new_version_with_its_properties(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    v1 = table.commit([write_split(table, 0, rows([1]), [0])], {OFFSETS_PROPERTY: "a"})
    v2 = table.commit([], {OFFSETS_PROPERTY: "b"})
    v3 = table.commit([write_split(table, 1)], {OFFSETS_PROPERTY: "c"})  # a split that wrote nothing
    assert (v1, v2, v3) == (1, 2, 3) and table.latest_snapshot_id() == 3
    found = table.last_strom_commit(v2)
    assert found is not None and found.snapshot_id == v3 and found.properties[OFFSETS_PROPERTY] == "c"
    assert rows_of(table.uri, "SELECT id FROM lake") == [(1,)]


def test_last_strom_commit_finds_a_commit_the_caller_does_not_know_and_ignores_other_writers(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    assert table.last_strom_commit(None) is None, "CREATE TABLE is no strom commit"
    v1 = table.commit([write_split(table, 0, rows([1]), [0])], {OFFSETS_PROPERTY: "/remote/a.offsets"})
    found = table.last_strom_commit(None)
    assert found is not None and found.snapshot_id == v1
    assert found.properties[OFFSETS_PROPERTY] == "/remote/a.offsets" and found.properties["commit-user"] == COMMIT_USER
    assert table.last_strom_commit(v1) is None

    v2 = table.commit([], {OFFSETS_PROPERTY: "/remote/b.offsets"})
    foreign_append(table.uri, [9])  # version 3, not strom's
    # a commit without commit info (the Delta protocol allows it; delta-rs's history() then skips it)
    (Path(table.uri) / "_delta_log" / f"{4:020d}.json").write_text(json.dumps({"txn": {"appId": "other", "version": 1}}) + "\n")
    assert table.latest_snapshot_id() == 4
    last = table.last_strom_commit(v1)
    assert last is not None and last.snapshot_id == v2 and last.properties[OFFSETS_PROPERTY] == "/remote/b.offsets"
    assert table.last_strom_commit(v2) is None

    v5 = table.commit([], {OFFSETS_PROPERTY: "/remote/c.offsets"})
    assert v5 == 5
    last = table.last_strom_commit(v2)
    assert last is not None and last.snapshot_id == 5


def test_a_commit_reports_the_version_it_landed_at_after_another_writer_committed(tmp_path: Path) -> None:
    info = table_info(tmp_path, [("id", t.IntType()), ("name", t.StringType())])  # a log table
    table = lake_format(info).table(info)
    base = table.latest_snapshot_id()
    result = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)
    foreign_append(table.uri, [2])  # version 1
    version = table.commit([result], {OFFSETS_PROPERTY: "o"})
    assert version == 2, "delta-rs moves a non-conflicting commit past the foreign one"
    found = table.last_strom_commit(None)
    assert found is not None and found.snapshot_id == 2
    assert rows_of(table.uri, "SELECT id FROM lake ORDER BY id") == [(1,), (2,)]


def test_abort_deletes_the_files_of_uncommitted_results_only(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    committed = write_split(table, 0, rows([1]), [0])
    table.commit([committed], {})
    aborted = write_split(table, 1, rows([3]), [0])
    aborted_path = Path(table.uri) / json.loads(aborted.payload)["add"][0]["path"]
    assert aborted_path.exists()
    table.abort([aborted, committed])  # the committed one by mistake: its file must survive
    assert not aborted_path.exists()
    assert (Path(table.uri) / json.loads(committed.payload)["add"][0]["path"]).exists()
    assert rows_of(table.uri, "SELECT id FROM lake") == [(1,)]


def test_a_writer_that_is_never_committed_leaves_no_visible_rows(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    table.commit([write_split(table, 0, rows([1, 2]), [0, 1])], {})
    orphan = write_split(table, 0, rows([2, 3], "u"), [2, 3], deleted_keys=keys([1, 2, 3]))
    assert (Path(table.uri) / json.loads(orphan.payload)["add"][0]["path"]).exists()
    assert rows_of(table.uri, "SELECT id, name FROM lake ORDER BY id") == [(1, "n1"), (2, "n2")]
    assert table.stats().record_count == 2


def test_a_split_closed_before_complete_deletes_what_it_wrote(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = DeltaLakeFormat({"warehouse": str(tmp_path)}, FileLimits(file_rows_max=4, row_group_rows_max=2)).table(info)
    table.commit([write_split(table, 0, rows([1]), [0])], {})
    directory = Path(table.uri) / "__bucket=0"
    before = sorted(directory.iterdir())
    writer = table.writer(TableBucket(TABLE_ID, 0), None, table.latest_snapshot_id())
    writer.append(rows(list(range(100, 110))), int64s(range(10)), int64s(np.zeros(10, np.int64)))
    assert len(sorted(directory.iterdir())) == len(before) + 3, "two full files and one open file on disk"
    writer.close()  # the task failed before complete()
    assert sorted(directory.iterdir()) == before
    assert rows_of(table.uri, "SELECT id FROM lake") == [(1,)]


def test_racing_rewrites_of_the_same_file_commit_once_and_the_loser_changes_nothing(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    table.commit([write_split(table, 0, rows([1, 2]), [0, 1])], {})
    base = table.latest_snapshot_id()
    first = write_split(table, 0, rows([1], "a"), [2], deleted_keys=keys([1]), base_snapshot_id=base)
    second = write_split(table, 0, rows([2], "b"), [3], deleted_keys=keys([2]), base_snapshot_id=base)
    assert json.loads(first.payload)["remove"] == json.loads(second.payload)["remove"]
    table.commit([first], {OFFSETS_PROPERTY: "first"})
    before = rows_of(table.uri, "SELECT id, name FROM lake ORDER BY id")
    version = table.latest_snapshot_id()
    with pytest.raises(LakeCommitConflictError, match="refused"):
        table.commit([second], {OFFSETS_PROPERTY: "second"})
    assert table.latest_snapshot_id() == version
    assert rows_of(table.uri, "SELECT id, name FROM lake ORDER BY id") == before == [(1, "a1"), (2, "n2")]


def test_two_strom_commits_from_the_same_snapshot_cannot_both_land(tmp_path: Path) -> None:
    info = table_info(tmp_path, [("id", t.IntType()), ("name", t.StringType())])  # appends only: no shared file
    table = lake_format(info).table(info)
    base = table.latest_snapshot_id()
    first = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)
    second = write_split(table, 0, rows([1]), [0], base_snapshot_id=base)  # a second job, same offsets
    table.commit([first], {OFFSETS_PROPERTY: "first"})
    with pytest.raises(LakeCommitConflictError):
        table.commit([second], {OFFSETS_PROPERTY: "second"})
    assert rows_of(table.uri, "SELECT id FROM lake") == [(1,)], "the same rows are never tiered twice"
    found = table.last_strom_commit(None)
    assert found is not None and found.properties[OFFSETS_PROPERTY] == "first"


def test_results_written_against_different_snapshots_are_not_committed_together(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    old = write_split(table, 0, rows([1]), [0])
    table.commit([], {})
    new = write_split(table, 1, rows([2]), [0])
    with pytest.raises(ValueError, match="different lake snapshots"):
        table.commit([old, new], {})
