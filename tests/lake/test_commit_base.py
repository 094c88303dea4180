"""Both lake formats commit a round against the round's base snapshot, an empty round (no files, only moved
offsets) too: when another strom commit landed since the base, the commit conflicts instead of landing on
top of it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from strom.lake.format import OFFSETS_PROPERTY, LakeCommitConflictError
from strom.lake.formats import lake_format
from strom.records import types as t
from tests.lake.support import table_info, write_split


def rows(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int32()), "name": [f"n{i}" for i in ids]})


@pytest.mark.parametrize("lake", ["delta", "iceberg"])
def test_an_empty_round_commits_against_its_base_not_the_current_snapshot(tmp_path: Path, lake: str) -> None:
    info = table_info(tmp_path, [("id", t.IntType()), ("name", t.StringType())], lake=lake)
    table = lake_format(info).table(info)
    table.commit([write_split(table, 0, rows([1]), [0])], {OFFSETS_PROPERTY: "first"})
    base = table.latest_snapshot_id()
    table.commit([write_split(table, 0, rows([2]), [1], base_snapshot_id=base)], {OFFSETS_PROPERTY: "other job"})
    moved = table.latest_snapshot_id()
    with pytest.raises(LakeCommitConflictError):
        table.commit([], {OFFSETS_PROPERTY: "empty round"}, base)
    assert table.latest_snapshot_id() == moved
    found = table.last_strom_commit(None)
    assert found is not None and found.properties[OFFSETS_PROPERTY] == "other job"
    empty = table.commit([], {OFFSETS_PROPERTY: "empty round"}, moved)  # from the right base it lands
    found = table.last_strom_commit(moved)
    assert found is not None and found.snapshot_id == empty and found.properties[OFFSETS_PROPERTY] == "empty round"
