"""How the coordinator role tells tablet servers what to host.

In the single-process server the tablet server implements this interface directly; a multi-process
cluster would implement it with Fluss's NotifyLeaderAndIsr / StopReplica RPCs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from strom.ids import TableBucket
from strom.metadata.table_info import TableInfo


class TabletServerGateway(Protocol):
    def become_leader(self, table: TableInfo, buckets: Sequence[TableBucket]) -> None:
        """Host ``buckets`` of ``table`` as leader (storage opens lazily on first use)."""

    async def change_table(self, table: TableInfo) -> None:
        """``table`` changed (columns added, options altered): serve its hosted buckets with it from now on.
        Returns once the live tablet servers took it (or a bounded wait passed), so a writer told of the
        change finds it there."""

    async def stop_replicas(self, table_id: int, partition_id: int | None, *, delete: bool) -> None:
        """Stop hosting a table's buckets (all partitions when ``partition_id`` is None); ``delete`` removes
        their data. Closes their scan sessions and wakes their long-polls."""

    def notify_kv_snapshot_offset(self, table: TableInfo, bucket: TableBucket, min_retain_offset: int) -> None:
        """A snapshot of ``bucket`` was committed: its replicas keep the changelog from ``min_retain_offset``
        on (Fluss's NotifyKvSnapshotOffset; sent without waiting, a lost notice only keeps more)."""

    def notify_lake_table_offsets(self, table: TableInfo, snapshot_id: int, log_end_offsets: Mapping[TableBucket, int],
                                  max_timestamps: Mapping[TableBucket, int]) -> None:
        """A lake snapshot of ``table`` was committed: its buckets' logs are in the lake below these offsets
        (Fluss's NotifyLakeTableOffset, to every replica; sent without waiting)."""

    async def high_watermarks(self, table: TableInfo, buckets: Sequence[TableBucket]) -> dict[TableBucket, int]:
        """Each bucket's high watermark, from its leader: how far its log is acknowledged.

        Raises:
            StromError: a leader could not say (a retriable error while leadership moves).
        """
