"""Driver-side planning: which buckets a read covers, up to which offsets, from which snapshots.

A batch read fixes everything at planning: one partition per bucket (per partition of a partitioned
table), each with its end offset (the high watermark when planned). For a primary-key table read with
the ``snapshot`` strategy the planner first picks each bucket's latest KV snapshot and pins it under a
lease, and only then lists the end offsets, so every snapshot's log offset is at or below its end offset
and the merge of snapshot and changelog yields the state at that end offset.

Between listing a snapshot and leasing it, retention may delete it (a newer one committed meanwhile).
The lease answers such buckets as unavailable; the planner picks again for them, a bounded number of
times.

A lake-enabled table that has been tiered is read as a **union**: each tiered bucket from the lake snapshot
the coordinator reports (read in the tasks), plus what strom holds after the lake's offset — for a log
table the log range ``[lake offset, high watermark)``, for a primary-key table the changelog over the same
range merged into the lake rows by key (the log wins). Buckets not tiered yet are read from strom alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql.datasource import InputPartition

from strom.client import Connection, OffsetSpec
from strom.client.admin import Admin
from strom.client.lake import LakeSnapshot
from strom.client.snapshots import KvSnapshotInfo
from strom.client.table import TableLayout
from strom.errors import InvalidTimestampError, LakeSnapshotNotExistError
from strom.ids import TableBucket
from strom.lake.formats import lake_format
from strom.spark.errors import FlussConnectorError
from strom.spark.options import READ_SOURCE, ConnectorOption, ReadOptions, ReadSource, ReadStrategy
from strom.spark.partitions import (
    KeyLookupPartition,
    KvStatePartition,
    LakeBucketPartition,
    LogRangePartition,
    LogTailPartition,
    ServerScanPartition,
    split_log_range,
)
from strom.spark.pushdown import PushedFilters, key_chunks
from strom.table_properties import DATALAKE_ENABLED

LEASE_ATTEMPTS_MAX = 3
"""Rounds of pick-and-lease; each lost round means a snapshot was deleted within one RPC round trip."""

Choice = dict[TableBucket, KvSnapshotInfo | None]
Rechoose = Callable[[Collection[TableBucket]], Awaitable[Choice]]


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """One partition of a partitioned table (id and name), or the whole of an unpartitioned one."""

    partition_id: int | None
    partition_name: str | None


async def table_partitions(admin: Admin, layout: TableLayout, pushed: PushedFilters | None = None) -> list[PartitionRef]:
    """The table's partitions (those ``pushed``'s partition filters keep, when given)."""
    if not layout.partition_keys:
        return [PartitionRef(None, None)]
    infos = await admin.list_partition_infos(layout.info.path)
    if pushed is not None:
        infos = [info for info in infos if pushed.keeps_partition(info.spec)]
    return [PartitionRef(info.partition_id, info.partition_name) for info in sorted(infos, key=lambda i: i.partition_id)]


async def table_buckets(admin: Admin, layout: TableLayout) -> list[TableBucket]:
    """Every bucket of the table, partition by partition."""
    partitions = await table_partitions(admin, layout)
    return [bucket for partition in partitions for bucket in layout.info.buckets(partition.partition_id)]


async def bucket_offsets(admin: Admin, layout: TableLayout, buckets: Collection[TableBucket], spec: OffsetSpec) -> dict[TableBucket, int]:
    """``spec`` offsets (latest = high watermark) of ``buckets``, one request per partition and leader."""
    by_partition: dict[int | None, list[int]] = {}
    for bucket in buckets:
        by_partition.setdefault(bucket.partition_id, []).append(bucket.bucket)
    offsets: dict[TableBucket, int] = {}
    table_id = layout.info.table_id
    for partition_id, bucket_ids in by_partition.items():
        listed = await admin.list_bucket_offsets(table_id, partition_id, sorted(bucket_ids), spec)
        offsets.update({TableBucket(table_id, b, partition_id): offset for b, offset in listed.items()})
    return offsets


def format_ms(timestamp_ms: int) -> str:
    return datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


async def offsets_at_time(
    admin: Admin, layout: TableLayout, buckets: Collection[TableBucket], timestamp_ms: int, option: ConnectorOption
) -> dict[TableBucket, int]:
    """Per bucket the first offset committed at or after ``timestamp_ms`` (the high watermark if none).

    Raises:
        FlussConnectorError: ``timestamp_ms`` lies ahead of the server's clock (InvalidTimestamp), naming
            ``option``.
    """
    try:
        return await bucket_offsets(admin, layout, buckets, OffsetSpec.timestamp(timestamp_ms))
    except InvalidTimestampError as exc:
        raise FlussConnectorError(
            f"option '{option.key}' is {timestamp_ms} ({format_ms(timestamp_ms)}), later than the server's current "
            f"time: a read can only start at a time that has passed ({exc})"
        ) from None


async def time_range_partitions(
    admin: Admin, layout: TableLayout, buckets: Collection[TableBucket], options: ReadOptions
) -> list[InputPartition]:
    """Log ranges holding the records committed in ``options.time_range`` (a primary-key table's changelog).

    The server resolves each bound to the first offset committed at or after it; the tasks also check each
    log batch's commit time, so the window is exact. An end still in the future reads up to the high
    watermark at planning.
    """
    window = options.time_range
    assert window is not None
    starts = await offsets_at_time(admin, layout, buckets, window.start_ms, window.start_option)
    ends: dict[TableBucket, int] | None = None
    if window.end_ms is not None:
        try:
            ends = await bucket_offsets(admin, layout, buckets, OffsetSpec.timestamp(window.end_ms))
        except InvalidTimestampError:
            ends = None  # the end has not come yet: everything committed so far
    if ends is None:
        ends = await bucket_offsets(admin, layout, buckets, OffsetSpec.latest())
    ranges = [
        LogRangePartition(bucket, starts[bucket], ends[bucket], window.start_ms, window.end_ms)
        for bucket in sorted(buckets) if starts[bucket] < ends[bucket]
    ]
    return split_ranges(ranges, options)


def split_ranges(ranges: Collection[LogRangePartition], options: ReadOptions) -> list[InputPartition]:
    """Every range split per ``scan.maxRecordsPerPartition`` (unchanged when it is unset)."""
    return [piece for partition in ranges for piece in split_log_range(partition, options.max_records_per_partition)]


async def snapshot_only_partitions(
    admin: Admin, layout: TableLayout, options: ReadOptions, partitions: Collection[PartitionRef], buckets: Collection[TableBucket]
) -> list[InputPartition]:
    """``read.optimized``: each bucket's latest KV snapshot alone, leased; buckets without one read nothing."""
    by_id = {partition.partition_id: partition for partition in partitions}
    wanted = set(buckets)

    async def rechoose(lost: Collection[TableBucket]) -> Choice:
        fresh = await latest_snapshots(admin, layout, [by_id[pid] for pid in {b.partition_id for b in lost}])
        return {bucket: fresh[bucket] for bucket in lost}

    latest = await latest_snapshots(admin, layout, [by_id[pid] for pid in {b.partition_id for b in buckets}])
    chosen = await lease_snapshots(admin, options, {b: s for b, s in latest.items() if b in wanted}, rechoose)
    return [
        KvStatePartition(bucket, snapshot.snapshot_id, snapshot.log_offset, snapshot.log_offset, options.lease_id,
                         options.lease_duration_ms)
        for bucket, snapshot in sorted(chosen.items(), key=lambda item: item[0]) if snapshot is not None
    ]


async def latest_snapshots(admin: Admin, layout: TableLayout, partitions: Collection[PartitionRef]) -> Choice:
    chosen: Choice = {}
    for partition in partitions:
        listed = await admin.get_latest_kv_snapshots(layout.info.path, partition.partition_name)
        for bucket in layout.info.buckets(partition.partition_id):
            chosen[bucket] = listed.snapshots.get(bucket.bucket)
    return chosen


async def snapshots_at_or_below(admin: Admin, layout: TableLayout, ends: dict[TableBucket, int]) -> Choice:
    """Per bucket the newest retained snapshot whose log offset is at most the bucket's end offset."""
    names = {p.partition_id: p for p in await table_partitions(admin, layout)}
    wanted_partitions = {bucket.partition_id for bucket in ends}
    missing = [pid for pid in wanted_partitions if pid not in names]
    if missing:
        raise FlussConnectorError(f"partitions {missing} of table '{layout.info.path}' were dropped")
    latest = await latest_snapshots(admin, layout, [names[pid] for pid in wanted_partitions])
    chosen: Choice = {}
    retained: dict[int | None, list[tuple[int, int, int]]] = {}
    for bucket, end in ends.items():
        snapshot = latest.get(bucket)
        if snapshot is None or snapshot.log_offset <= end:
            chosen[bucket] = snapshot
            continue
        if bucket.partition_id not in retained:
            retained[bucket.partition_id] = await admin.list_kv_snapshots(layout.info.table_id, bucket.partition_id)
        older = [
            KvSnapshotInfo(snapshot_id, log_offset)
            for bucket_id, snapshot_id, log_offset in retained[bucket.partition_id]
            if bucket_id == bucket.bucket and log_offset <= end
        ]
        chosen[bucket] = max(older, key=lambda s: s.snapshot_id) if older else None
    return chosen


async def lease_snapshots(admin: Admin, options: ReadOptions, chosen: Choice, rechoose: Rechoose) -> Choice:
    """Pin every chosen snapshot under ``options.lease_id``; re-pick buckets whose snapshot is gone.

    Raises:
        FlussConnectorError: snapshots kept vanishing for ``LEASE_ATTEMPTS_MAX`` rounds.
    """
    lease = admin.create_kv_snapshot_lease(options.lease_id, options.lease_duration_ms)
    chosen = dict(chosen)
    pending = {bucket: snapshot.snapshot_id for bucket, snapshot in chosen.items() if snapshot is not None}
    for _attempt in range(LEASE_ATTEMPTS_MAX):
        if not pending:
            return chosen
        result = await lease.acquire_snapshots(pending)
        lost = set(result.unavailable_snapshots)
        if not lost:
            return chosen
        chosen.update(await rechoose(lost))
        pending = {bucket: s.snapshot_id for bucket in lost if (s := chosen[bucket]) is not None}
    raise FlussConnectorError(
        f"KV snapshots of {len(pending)} bucket(s) were deleted before lease '{options.lease_id}' could pin them, "
        f"{LEASE_ATTEMPTS_MAX} times in a row; retry the read"
    )


async def state_partitions(
    admin: Admin, layout: TableLayout, options: ReadOptions, chosen: Choice, ends: dict[TableBucket, int]
) -> list[KvStatePartition]:
    """One partition per bucket with data: its (leased) snapshot, or its changelog from the log start."""
    without_snapshot = [bucket for bucket, snapshot in chosen.items() if snapshot is None]
    starts = await bucket_offsets(admin, layout, without_snapshot, OffsetSpec.earliest()) if without_snapshot else {}
    partitions = []
    for bucket in sorted(chosen):
        snapshot = chosen[bucket]
        end = ends[bucket]
        if snapshot is None:
            start = starts[bucket]
            if start > 0:
                raise FlussConnectorError(
                    f"{bucket} of table '{layout.info.path}' has no KV snapshot at or below offset {end} and its "
                    f"changelog starts at {start}: its state cannot be rebuilt"
                )
            if start < end:
                partitions.append(KvStatePartition(bucket, None, start, end, None, options.lease_duration_ms))
            continue
        end = max(end, snapshot.log_offset)
        partitions.append(
            KvStatePartition(
                bucket, snapshot.snapshot_id, snapshot.log_offset, end, options.lease_id, options.lease_duration_ms
            )
        )
    return partitions


async def whole_log_partitions(
    admin: Admin, layout: TableLayout, buckets: Collection[TableBucket], options: ReadOptions
) -> list[InputPartition]:
    """Every bucket's log ``[log start, high watermark)``, split per ``scan.maxRecordsPerPartition``."""
    starts = await bucket_offsets(admin, layout, buckets, OffsetSpec.earliest())
    ends = await bucket_offsets(admin, layout, buckets, OffsetSpec.latest())
    return split_ranges([LogRangePartition(b, starts[b], ends[b]) for b in buckets if starts[b] < ends[b]], options)


async def log_table_partitions(
    admin: Admin, layout: TableLayout, buckets: Collection[TableBucket], options: ReadOptions
) -> list[InputPartition]:
    """A log table's buckets read to their end when the tasks run: the ranges planned now (split per
    ``scan.maxRecordsPerPartition``), the last of each bucket left open, and an open one for each bucket
    empty now, so that running the DataFrame again reads what was appended since."""
    starts = await bucket_offsets(admin, layout, buckets, OffsetSpec.earliest())
    ends = await bucket_offsets(admin, layout, buckets, OffsetSpec.latest())
    planned: list[InputPartition] = []
    for bucket in buckets:
        if starts[bucket] >= ends[bucket]:
            planned.append(LogTailPartition(bucket, ends[bucket]))
            continue
        *closed, last = split_log_range(LogRangePartition(bucket, starts[bucket], ends[bucket]),
                                        options.max_records_per_partition)
        planned += [*closed, LogTailPartition(bucket, last.start_offset)]
    return planned


async def plan_batch(
    connection: Connection, layout: TableLayout, options: ReadOptions, pushed: PushedFilters | None = None,
    changes_only: bool = False,
) -> list[InputPartition]:
    """The partitions of a batch read (see the module docstring): key lookups when ``pushed`` has keys,
    else the buckets of the partitions ``pushed``'s partition filters keep. ``changes_only`` (a ``$binlog``
    read) reads the changelog, never a state: the time range if one is set, else the whole log."""
    if pushed is not None and pushed.lookup_keys is not None:
        return [KeyLookupPartition(chunk) for chunk in key_chunks(pushed.lookup_keys)]
    admin = connection.get_admin()
    partitions = await table_partitions(admin, layout, pushed)
    buckets = [bucket for partition in partitions for bucket in layout.info.buckets(partition.partition_id)]
    if options.time_range is not None:  # strom's log alone, as in Fluss: the lake keeps no commit times
        return await time_range_partitions(admin, layout, buckets, options)
    if changes_only:
        return await whole_log_partitions(admin, layout, buckets, options)
    if options.read_optimized and layout.primary_key:
        return await snapshot_only_partitions(admin, layout, options, partitions, buckets)
    lake = await lake_snapshot_to_read(admin, layout, options)
    planned: list[InputPartition] = []
    if lake is not None:
        if options.source is ReadSource.LAKE:
            return lake_partitions(lake, layout, {})
        ends = await bucket_offsets(admin, layout, buckets, OffsetSpec.latest())
        current = {partition.partition_id for partition in partitions}
        planned = lake_partitions(lake, layout, ends, current)
        if layout.partition_keys:
            existing = partitions if pushed is None else await table_partitions(admin, layout)
            names = {partition.partition_name for partition in existing}
            dropped = await asyncio.to_thread(dropped_partitions, lake, layout, names)
            planned += [p for p in dropped if pushed is None or pushed.keeps_partition(partition_spec(layout, p), unknown=True)]
        if layout.primary_key:  # tiered buckets are read from the lake merged with their changelog
            buckets = [bucket for bucket in buckets if bucket not in lake.bucket_offsets]
    if not layout.primary_key:
        if lake is None:
            return planned + await log_table_partitions(admin, layout, buckets, options)
        starts = await bucket_offsets(admin, layout, buckets, OffsetSpec.earliest())
        starts.update({b: offset for b, offset in lake.bucket_offsets.items() if b in starts})  # tiered up to there
        ends = await bucket_offsets(admin, layout, buckets, OffsetSpec.latest())
        ranges = [LogRangePartition(b, starts[b], ends[b]) for b in buckets if starts[b] < ends[b]]
        return planned + split_ranges(ranges, options)
    if not buckets:
        return planned
    if options.strategy is ReadStrategy.SERVER_SCAN:
        return planned + [ServerScanPartition(bucket) for bucket in buckets]
    wanted = set(buckets)
    by_id = {partition.partition_id: partition for partition in partitions}

    async def rechoose(lost: Collection[TableBucket]) -> Choice:
        fresh = await latest_snapshots(admin, layout, [by_id[pid] for pid in {b.partition_id for b in lost}])
        return {bucket: fresh[bucket] for bucket in lost}

    latest = await latest_snapshots(admin, layout, [by_id[pid] for pid in {b.partition_id for b in buckets}])
    chosen = await lease_snapshots(admin, options, {b: s for b, s in latest.items() if b in wanted}, rechoose)
    ends = await bucket_offsets(admin, layout, buckets, OffsetSpec.latest())
    return planned + list(await state_partitions(admin, layout, options, chosen, ends))


async def lake_snapshot_to_read(admin: Admin, layout: TableLayout, options: ReadOptions) -> LakeSnapshot | None:
    """The lake snapshot a batch read starts from: None for tables without a lake (or ``read.source=strom``)
    and for lake tables not tiered yet, which strom alone serves."""
    lake_enabled = layout.info.options.datalake_enabled
    if options.source is ReadSource.STROM or not lake_enabled:
        if options.source is ReadSource.LAKE:
            raise FlussConnectorError(
                f"option '{READ_SOURCE.key}'=lake: table '{layout.info.path}' has no lake ({DATALAKE_ENABLED} is not true)"
            )
        return None
    try:
        return await admin.get_lake_snapshot(layout.info.path)
    except LakeSnapshotNotExistError:
        if options.source is ReadSource.LAKE:
            raise FlussConnectorError(
                f"option '{READ_SOURCE.key}'=lake: table '{layout.info.path}' has not been tiered to its lake yet"
            ) from None
        return None


def lake_partitions(
    lake: LakeSnapshot, layout: TableLayout, ends: dict[TableBucket, int], current: set[int | None] | None = None
) -> list[InputPartition]:
    """One partition per tiered bucket (of the ``current`` strom partitions, when given). With ``ends`` (a
    union read), a primary-key bucket also reads its changelog from its lake offset up to its end offset."""
    planned: list[InputPartition] = []
    for bucket, offset in sorted(lake.bucket_offsets.items(), key=lambda item: (item[0].partition_id or -1, item[0].bucket)):
        if current is not None and bucket.partition_id not in current:
            continue  # its strom partition was dropped: dropped_partitions reads it by name
        name = lake.partition_names.get(bucket.partition_id) if bucket.partition_id is not None else None
        end = ends.get(bucket, offset) if layout.primary_key else offset
        planned.append(LakeBucketPartition(bucket, name, lake.snapshot_id, offset, max(offset, end)))
    return planned


def partition_spec(layout: TableLayout, partition: InputPartition) -> dict[str, str]:
    """A lake partition's partition-key values, from its name (values joined by ``$`` in key order)."""
    name = getattr(partition, "partition_name", None) or ""
    values = name.split("$")
    if len(values) != len(layout.partition_keys):
        return {}
    return dict(zip(layout.partition_keys, values, strict=True))


def dropped_partitions(lake: LakeSnapshot, layout: TableLayout, current_names: set[str | None]) -> list[InputPartition]:
    """Lake-only partitions for partitions dropped from strom after they were tiered: found by name in
    the lake table itself (the coordinator no longer knows their names), given negative partition ids as
    Fluss's planners do."""
    found = lake_format(layout.info).table(layout.info).buckets(lake.snapshot_id)
    gone = sorted({name for name, _bucket in found if name not in current_names}, key=str)
    fake_ids = {name: -(index + 1) for index, name in enumerate(gone)}
    return [
        LakeBucketPartition(TableBucket(layout.info.table_id, bucket, fake_ids[name]), name, lake.snapshot_id)
        for name, bucket in found if name in fake_ids
    ]


async def plan_states_at(
    connection: Connection, layout: TableLayout, options: ReadOptions, ends: dict[TableBucket, int]
) -> list[KvStatePartition]:
    """Partitions reading each bucket's state at exactly ``ends[bucket]`` (streaming ``full`` mode)."""
    admin = connection.get_admin()

    async def rechoose(lost: Collection[TableBucket]) -> Choice:
        return await snapshots_at_or_below(admin, layout, {bucket: ends[bucket] for bucket in lost})

    chosen = await lease_snapshots(admin, options, await snapshots_at_or_below(admin, layout, ends), rechoose)
    return await state_partitions(admin, layout, options, chosen, ends)
