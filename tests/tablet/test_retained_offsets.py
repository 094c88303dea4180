"""What the coordinator tells a tablet server to keep (NotifyKvSnapshotOffset, NotifyLakeTableOffset): the
offsets only rise, a dropped table's are forgotten, and a deposed coordinator's notices are refused."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from strom.errors import InvalidCoordinatorError
from strom.ids import TableBucket
from strom.rpc.messages import pb
from strom.tablet.cluster_tablet import TabletControlService
from strom.tablet.retained_offsets import LakeOffset, RetainedOffsets

BUCKET = TableBucket(7, 0)
OTHER = TableBucket(7, 1, partition_id=3)


def test_offsets_only_rise() -> None:
    retained = RetainedOffsets()
    assert retained.kv_min_retain(BUCKET) is None and retained.lake_end_offset(BUCKET) == 0
    retained.notify_kv_snapshot(BUCKET, 50)
    retained.notify_kv_snapshot(BUCKET, 40)  # a late notice of an older commit
    assert retained.kv_min_retain(BUCKET) == 50
    retained.notify_lake(BUCKET, LakeOffset(2, 100, 1_000))
    retained.notify_lake(BUCKET, LakeOffset(1, 80, None))
    assert retained.lake(BUCKET) == LakeOffset(2, 100, 1_000)
    retained.notify_lake(BUCKET, LakeOffset(3, 100, 2_000))
    assert retained.lake(BUCKET) == LakeOffset(3, 100, 2_000)


def test_a_dropped_table_or_partition_is_forgotten() -> None:
    retained = RetainedOffsets()
    for bucket in (BUCKET, OTHER, TableBucket(8, 0)):
        retained.notify_kv_snapshot(bucket, 5)
        retained.notify_lake(bucket, LakeOffset(1, 5))
    retained.forget(7, partition_id=3)
    assert retained.kv_min_retain(OTHER) is None and retained.kv_min_retain(BUCKET) == 5
    retained.forget(7)
    assert retained.lake(BUCKET) is None and retained.lake_end_offset(TableBucket(8, 0)) == 5


def _control() -> tuple[TabletControlService, RetainedOffsets]:
    retained = RetainedOffsets()
    cache: Any = SimpleNamespace(forget_all=lambda: None)
    control = TabletControlService(SimpleNamespace(retained=retained), None, None, None, cache)  # type: ignore[arg-type]
    return control, retained


def test_the_notices_reach_the_buckets_and_a_deposed_coordinators_are_refused() -> None:
    control, retained = _control()
    control.notify_kv_snapshot_offset(pb.NotifyKvSnapshotOffsetRequest(
        table_id=7, bucket_id=1, partition_id=3, coordinator_epoch=2, min_retain_offset=30), None)
    lake = pb.NotifyLakeTableOffsetRequest(coordinator_epoch=2)
    lake.notify_buckets_req.add(table_id=7, bucket_id=0, snapshot_id=4, log_end_offset=90, max_timestamp=123)
    lake.notify_buckets_req.add(table_id=7, bucket_id=1, partition_id=3, snapshot_id=4)  # no end offset: 0
    control.notify_lake_table_offset(lake, None)
    assert retained.kv_min_retain(OTHER) == 30
    assert retained.lake(BUCKET) == LakeOffset(4, 90, 123)
    assert retained.lake(OTHER) == LakeOffset(4, 0, None)
    stale = pb.NotifyKvSnapshotOffsetRequest(table_id=7, bucket_id=0, coordinator_epoch=1, min_retain_offset=99)
    with pytest.raises(InvalidCoordinatorError):
        control.notify_kv_snapshot_offset(stale, None)
    assert retained.kv_min_retain(BUCKET) is None
