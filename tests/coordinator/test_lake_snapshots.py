"""Offsets files in Fluss's layout, lake snapshot documents, and Fluss's lake snapshot retention."""

from __future__ import annotations

import json

import pytest

from strom.coordinator.lake_snapshots import (
    KEEP_ALL_SNAPSHOTS,
    LakeSnapshot,
    decode_offsets_file,
    encode_offsets_file,
    snapshots_to_discard,
)
from strom.errors import StromError
from strom.ids import TableBucket

TABLE = 7


def test_an_offsets_file_lists_offsets_by_bucket_with_holes_for_buckets_never_tiered() -> None:
    raw = encode_offsets_file(TABLE, {TableBucket(TABLE, 2): 9, TableBucket(TABLE, 0): 4})
    assert json.loads(raw) == {"version": 1, "table_id": TABLE, "bucket_offsets": [4, -1, 9]}
    assert decode_offsets_file(raw, "f") == (TABLE, {TableBucket(TABLE, 0): 4, TableBucket(TABLE, 2): 9})


def test_a_partitioned_tables_offsets_file_groups_buckets_by_partition() -> None:
    offsets = {TableBucket(TABLE, 1, 12): 3, TableBucket(TABLE, 0, 11): 5, TableBucket(TABLE, 0, 12): 0}
    raw = encode_offsets_file(TABLE, offsets)
    assert json.loads(raw) == {
        "version": 1, "table_id": TABLE,
        "partition_offsets": [{"partition_id": 11, "bucket_offsets": [5]}, {"partition_id": 12, "bucket_offsets": [0, 3]}],
    }
    assert decode_offsets_file(raw, "f") == (TABLE, offsets)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"version":2,"table_id":1,"bucket_offsets":[]}',
        b'{"version":1,"bucket_offsets":[1]}',
        b'{"version":1,"table_id":1,"bucket_offsets":["1"]}',
        b'{"version":1,"table_id":1,"partition_offsets":[{"bucket_offsets":[1]}]}',
        b'{"version":1,"table_id":1,"partition_offsets":{}}',
        b"\xff\xfe",
    ],
)
def test_anything_else_is_not_an_offsets_file(raw: bytes) -> None:
    with pytest.raises(StromError, match="somewhere is not a lake offsets file"):
        decode_offsets_file(raw, "somewhere")


def test_a_lake_snapshot_round_trips_through_its_store_record() -> None:
    snapshot = LakeSnapshot(
        TABLE, 42, "r/a.offsets", "r/b.offsets", {TableBucket(TABLE, 0): 10}, {TableBucket(TABLE, 0): 8},
        {TableBucket(TABLE, 0): 1_700_000_000_000}, {},
    )
    record = snapshot.to_record()
    assert (record.table_id, record.snapshot_id, record.readable) == (TABLE, 42, True)
    assert LakeSnapshot.from_record(record) == snapshot
    unreadable = LakeSnapshot(TABLE, 43, "r/c.offsets", None, {TableBucket(TABLE, 0, 5): 1}, None, {}, {5: "EU"})
    assert LakeSnapshot.from_record(unreadable.to_record()) == unreadable
    assert not unreadable.to_record().readable


@pytest.mark.parametrize(
    ("earliest_to_keep", "discarded"),
    [
        (None, [5, 3, 9]),               # absent: only the new snapshot stays
        (KEEP_ALL_SNAPSHOTS, []),        # -1: every snapshot stays
        (3, [5]),                        # an id: from that commit on (by commit order, not by id)
        (9, [5, 3]),
        (11, [5, 3, 9]),                 # the new snapshot itself
        (4, []),                         # unknown: everything stays
    ],
)
def test_retention_follows_earliest_snapshot_id_to_keep(earliest_to_keep: int | None, discarded: list[int]) -> None:
    assert snapshots_to_discard([5, 3, 9], 11, earliest_to_keep) == discarded
