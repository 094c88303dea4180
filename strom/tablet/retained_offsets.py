"""What the coordinator tells a tablet server its buckets must keep: Fluss's NotifyKvSnapshotOffset (1029)
and NotifyLakeTableOffset (1031).

- **KV snapshots**: after a snapshot commit, the offset below which no restore of the bucket needs its
  changelog (strom sends the oldest retained snapshot's log offset: any retained snapshot may be restored
  and replayed from). Until a bucket is told, its retention reads the snapshot records itself.
- **The lake**: after a lake commit, how far each bucket's log is in the lake table. A lake-enabled table's
  records are deleted by ``table.log.ttl`` — locally and from remote storage — only once the lake holds
  them (Fluss's rule for remote segments, strom's for local ones too); a bucket not told yet keeps all.

Both only rise: a notice older than what a bucket knows changes nothing. They live in memory; after a
restart the next commit tells again, and meanwhile retention keeps more, never less.
"""

from __future__ import annotations

from dataclasses import dataclass

from strom.ids import TableBucket


@dataclass(frozen=True, slots=True)
class LakeOffset:
    """A bucket's place in the table's latest lake snapshot."""

    snapshot_id: int
    log_end_offset: int
    """Records below this offset are in the lake."""
    max_timestamp: int | None = None
    """The newest record timestamp the lake holds of the bucket (None: not reported)."""


class RetainedOffsets:
    """Per bucket, the latest offsets the coordinator notified. Owned by the event loop."""

    def __init__(self) -> None:
        self._kv_min_retain: dict[TableBucket, int] = {}
        self._lake: dict[TableBucket, LakeOffset] = {}

    def notify_kv_snapshot(self, bucket: TableBucket, min_retain_offset: int) -> None:
        if min_retain_offset > self._kv_min_retain.get(bucket, -1):
            self._kv_min_retain[bucket] = min_retain_offset

    def kv_min_retain(self, bucket: TableBucket) -> int | None:
        """The changelog offset the bucket's restores need from (None: not told since start)."""
        return self._kv_min_retain.get(bucket)

    def notify_lake(self, bucket: TableBucket, offset: LakeOffset) -> None:
        known = self._lake.get(bucket)
        if known is not None:
            stamps = [t for t in (known.max_timestamp, offset.max_timestamp) if t is not None]
            offset = LakeOffset(max(known.snapshot_id, offset.snapshot_id),
                                max(known.log_end_offset, offset.log_end_offset), max(stamps) if stamps else None)
        self._lake[bucket] = offset

    def lake(self, bucket: TableBucket) -> LakeOffset | None:
        return self._lake.get(bucket)

    def lake_end_offset(self, bucket: TableBucket) -> int:
        """Records of ``bucket`` below this offset are in the lake (0: none known to be)."""
        known = self._lake.get(bucket)
        return 0 if known is None else known.log_end_offset

    def forget(self, table_id: int, partition_id: int | None = None) -> None:
        """A table (or partition) was dropped or stopped here."""
        for offsets in (self._kv_min_retain, self._lake):
            for bucket in [b for b in offsets if b.table_id == table_id
                           and (partition_id is None or b.partition_id == partition_id)]:
                del offsets[bucket]


__all__ = ["LakeOffset", "RetainedOffsets"]
