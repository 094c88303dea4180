"""Split planning rules (Fluss's): what each bucket contributes to a round."""

from __future__ import annotations

from strom.client.lake import LakeSnapshot
from strom.ids import TableBucket
from strom.tiering.splits import BucketPosition, SplitKind, TieringSplit, plan_splits, split_for

BUCKET = TableBucket(7, 0)


def position(hw: int, earliest: int = 0, snapshot: tuple[int, int] | None = None) -> BucketPosition:
    snapshot_id, log_offset = snapshot if snapshot else (None, None)
    return BucketPosition(BUCKET, None, earliest, hw, snapshot_id, log_offset)


def test_empty_bucket_has_no_split() -> None:
    assert split_for(position(0), None) is None
    assert split_for(position(0, snapshot=(1, 0)), None) is None


def test_never_tiered_bucket_with_a_snapshot_reads_the_snapshot() -> None:
    split = split_for(position(50, snapshot=(3, 40)), None)
    assert split == TieringSplit(BUCKET, None, SplitKind.SNAPSHOT, -1, 40, 3)


def test_never_tiered_bucket_without_a_snapshot_reads_its_log_from_the_start() -> None:
    assert split_for(position(50, earliest=5), None) == TieringSplit(BUCKET, None, SplitKind.LOG, 5, 50)


def test_tiered_bucket_reads_the_log_after_its_lake_offset_even_with_a_snapshot() -> None:
    assert split_for(position(50, snapshot=(3, 40)), 20) == TieringSplit(BUCKET, None, SplitKind.LOG, 20, 50)


def test_bucket_at_its_high_watermark_has_no_split() -> None:
    assert split_for(position(50), 50) is None
    assert split_for(position(50), 60) is None


def test_plan_uses_each_buckets_lake_offset() -> None:
    other = TableBucket(7, 1)
    positions = [position(10), BucketPosition(other, None, 0, 30, None, None)]
    lake = LakeSnapshot(7, 4, {BUCKET: 10, other: 12}, {})
    assert plan_splits(positions, lake) == [TieringSplit(other, None, SplitKind.LOG, 12, 30)]
    assert [s.start_offset for s in plan_splits(positions, None)] == [0, 0]


def test_split_ids_name_table_partition_and_bucket() -> None:
    split = TieringSplit(TableBucket(7, 2, 9), "2026", SplitKind.LOG, 0, 1)
    assert split.split_id == "tiering-log-split-7-p9-2"
