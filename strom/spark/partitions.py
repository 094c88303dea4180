"""The units of work the driver plans and the executors read: one per bucket (of one partition).

They travel from the driver to the executors pickled, so they hold only plain values: everything a task
needs beyond them (the table's schema, the leaders) it fetches from the cluster itself.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from strom.ids import TableBucket

NO_SNAPSHOT: int | None = None


@dataclass(frozen=True)
class LogRangePartition(InputPartition):
    """Records ``[start_offset, end_offset)`` of one bucket's log (a log table, or a changelog); with a time
    window, only those whose log batch was committed in ``[time_start_ms, time_end_ms)``."""

    bucket: TableBucket
    start_offset: int
    end_offset: int
    time_start_ms: int | None = None
    time_end_ms: int | None = None

    def __post_init__(self) -> None:
        assert 0 <= self.start_offset < self.end_offset, (self.start_offset, self.end_offset)

    def in_window(self, commit_timestamp_ms: int) -> bool:
        if self.time_start_ms is not None and commit_timestamp_ms < self.time_start_ms:
            return False
        return self.time_end_ms is None or commit_timestamp_ms < self.time_end_ms


@dataclass(frozen=True)
class LogTailPartition(InputPartition):
    """A log table bucket's records from ``start_offset`` to its high watermark **when the task runs**: a
    DataFrame or view run again (Spark 4.3 keeps the planned partitions with the relation) reads what was
    appended since, as a new ``load()`` would."""

    bucket: TableBucket
    start_offset: int


def split_log_range(partition: LogRangePartition, records_max: int | None) -> list[LogRangePartition]:
    """``partition`` as consecutive offset ranges of at most ``records_max`` records, evenly sized
    (one range when ``records_max`` is None or the range is short enough)."""
    size = partition.end_offset - partition.start_offset
    if records_max is None or size <= records_max:
        return [partition]
    count = -(-size // records_max)
    step = -(-size // count)
    bounds = [partition.start_offset + step * index for index in range(count)] + [partition.end_offset]
    ranges = [
        LogRangePartition(partition.bucket, start, end, partition.time_start_ms, partition.time_end_ms)
        for start, end in itertools.pairwise(bounds)
        if start < end
    ]
    assert ranges[0].start_offset == partition.start_offset and ranges[-1].end_offset == partition.end_offset
    assert all(r.end_offset - r.start_offset <= records_max for r in ranges)
    return ranges


@dataclass(frozen=True)
class KvStatePartition(InputPartition):
    """A primary-key bucket's state at ``log_end_offset``: a KV snapshot merged with the changelog after it.

    Without a snapshot, ``log_start_offset`` is where the bucket's changelog starts. ``lease_id`` names the
    lease pinning ``snapshot_id``; the task releases the bucket from it once the snapshot has been read.
    """

    bucket: TableBucket
    snapshot_id: int | None
    log_start_offset: int
    log_end_offset: int
    lease_id: str | None
    lease_duration_ms: int

    def __post_init__(self) -> None:
        assert 0 <= self.log_start_offset <= self.log_end_offset, (self.log_start_offset, self.log_end_offset)
        assert (self.snapshot_id is None) == (self.lease_id is None), "a snapshot is read only under a lease"


@dataclass(frozen=True)
class LakeBucketPartition(InputPartition):
    """One bucket's rows in lake snapshot ``lake_snapshot_id``; for a primary-key table merged with the
    bucket's changelog ``[log_start_offset, log_end_offset)`` (the log wins; an empty range reads the lake
    alone). For a log table the log range is planned as its own LogRangePartition."""

    bucket: TableBucket
    partition_name: str | None
    lake_snapshot_id: int
    log_start_offset: int = 0
    log_end_offset: int = 0

    def __post_init__(self) -> None:
        assert 0 <= self.log_start_offset <= self.log_end_offset, (self.log_start_offset, self.log_end_offset)


@dataclass(frozen=True)
class ServerScanPartition(InputPartition):
    """A primary-key bucket's rows as its leader holds them when the task runs (ScanKv)."""

    bucket: TableBucket


@dataclass(frozen=True)
class KeyLookupPartition(InputPartition):
    """Rows of the given primary keys (values in the table's primary-key order) as the leaders hold them
    when the task runs: point lookups planned from ``=`` / ``IN`` filters instead of a scan."""

    keys: tuple[tuple[Any, ...], ...]


def bucket_key(bucket: TableBucket) -> str:
    """A bucket's name in streaming offsets: ``b3``, or ``p12-b3`` in partition 12."""
    if bucket.partition_id is None:
        return f"b{bucket.bucket}"
    return f"p{bucket.partition_id}-b{bucket.bucket}"


def parse_bucket_key(table_id: int, key: str) -> TableBucket:
    partition, _, bucket = key.rpartition("-")
    if not bucket.startswith("b") or (partition and not partition.startswith("p")):
        raise ValueError(f"not a bucket key: {key!r}")
    return TableBucket(table_id, int(bucket[1:]), int(partition[1:]) if partition else None)
