"""Planning one table round: which part of each bucket goes to the lake, as picklable splits.

The coordinator's lake snapshot says how far each bucket is in the lake (its tiered offset ``T``); the
tablet server's high watermark ``HW`` says how far it could go. Per bucket, as Fluss plans it:

- nothing to do when ``HW`` is 0 or ``T >= HW``;
- a primary-key bucket never tiered that has a KV snapshot: a **snapshot split** (the snapshot's rows; the
  round then records the snapshot's log offset, and the changelog after it goes next round);
- otherwise a **log split** ``[T, HW)``, or ``[earliest, HW)`` for a bucket never tiered.

Planning reads metadata only (offsets, snapshots); the splits carry everything a Spark task needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from strom.client.admin import Admin, OffsetSpec
from strom.client.lake import LakeSnapshot
from strom.ids import TableBucket
from strom.metadata.table_info import TableInfo


class SplitKind(Enum):
    SNAPSHOT = "snapshot"
    LOG = "log"


@dataclass(frozen=True, slots=True)
class TieringSplit:
    """One bucket's share of a round. A snapshot split reads KV snapshot ``snapshot_id`` and ends at
    ``stop_offset`` (the snapshot's log offset); a log split reads ``[start_offset, stop_offset)``."""

    bucket: TableBucket
    partition_name: str | None
    kind: SplitKind
    start_offset: int
    stop_offset: int
    snapshot_id: int | None = None

    @property
    def split_id(self) -> str:
        partition = f"-p{self.bucket.partition_id}" if self.bucket.partition_id is not None else ""
        return f"tiering-{self.kind.value}-split-{self.bucket.table_id}{partition}-{self.bucket.bucket}"


@dataclass(frozen=True, slots=True)
class BucketPosition:
    """What planning knows of one bucket: its partition, log range and newest KV snapshot."""

    bucket: TableBucket
    partition_name: str | None
    earliest_offset: int
    high_watermark: int
    snapshot_id: int | None
    snapshot_log_offset: int | None


def split_for(position: BucketPosition, tiered_offset: int | None) -> TieringSplit | None:
    """The split of one bucket, or None when the lake is already at the high watermark."""
    hw = position.high_watermark
    if hw <= 0 or (tiered_offset is not None and tiered_offset >= hw):
        return None
    if tiered_offset is None and position.snapshot_id is not None:
        assert position.snapshot_log_offset is not None
        return TieringSplit(
            position.bucket, position.partition_name, SplitKind.SNAPSHOT,
            -1, position.snapshot_log_offset, position.snapshot_id,
        )
    start = tiered_offset if tiered_offset is not None else position.earliest_offset
    if start >= hw:
        return None
    return TieringSplit(position.bucket, position.partition_name, SplitKind.LOG, start, hw)


async def bucket_positions(admin: Admin, table: TableInfo) -> list[BucketPosition]:
    """Offsets and (for primary-key tables) the newest KV snapshot of every bucket of every partition."""
    partitions: list[tuple[int | None, str | None]]
    if table.is_partitioned:
        partitions = [(p.partition_id, p.partition_name) for p in await admin.list_partition_infos(table.path)]
    else:
        partitions = [(None, None)]
    positions = []
    bucket_ids = list(range(table.bucket_count))
    for partition_id, name in partitions:
        latest = await admin.list_bucket_offsets(table.table_id, partition_id, bucket_ids, OffsetSpec.latest())
        earliest = await admin.list_bucket_offsets(table.table_id, partition_id, bucket_ids, OffsetSpec.earliest())
        snapshots = (
            (await admin.get_latest_kv_snapshots(table.path, name)).snapshots if table.has_primary_key else {}
        )
        for bucket_id in bucket_ids:
            snapshot = snapshots.get(bucket_id)
            positions.append(
                BucketPosition(
                    TableBucket(table.table_id, bucket_id, partition_id), name,
                    earliest[bucket_id], latest[bucket_id],
                    snapshot.snapshot_id if snapshot else None, snapshot.log_offset if snapshot else None,
                )
            )
    return positions


def plan_splits(positions: list[BucketPosition], lake: LakeSnapshot | None) -> list[TieringSplit]:
    tiered: Mapping[TableBucket, int] = lake.bucket_offsets if lake is not None else {}
    splits = [split_for(position, tiered.get(position.bucket)) for position in positions]
    return [split for split in splits if split is not None]

