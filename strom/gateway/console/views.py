"""What each console page shows, gathered from the cluster over strom's client (the same RPCs any client
may send, so the user's ACLs decide what a page can show).

Each function answers plain dataclasses; the templates only lay them out. A part of a page the user may not
see, or a server that does not answer it, becomes a note on that part instead of failing the page.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from strom.client import Connection, OffsetSpec
from strom.client.admin import BucketLeadership, ServerNode
from strom.client.lake import TIERING_LEASE_SUFFIX
from strom.client.stats import BucketStats
from strom.errors import StromError
from strom.ids import TableBucket, TablePath
from strom.metadata.cluster_health import ClusterHealth
from strom.metadata.table_info import TableInfo

T = TypeVar("T")
MAX_PARTITIONS_SHOWN = 50
"""A table page lists every partition but shows buckets of this many (the newest) unless one is chosen."""


async def guarded(notes: list[str], what: str, call: Awaitable[T], default: T) -> T:
    """What ``call`` answers, or ``default`` with a note saying why (an ACL refusal, an older server)."""
    try:
        return await call
    except StromError as exc:
        notes.append(f"{what}: {type(exc).__name__}: {exc}")
        return default


# ---- tables everywhere ----

@dataclass(slots=True)
class TableEntry:
    info: TableInfo
    partitions: list[tuple[int, str]]
    leaderships: list[BucketLeadership]

    def physical_tables(self) -> list[tuple[int | None, str | None]]:
        """(partition id, name) of each partition, or (None, None) for a table without partitions."""
        return list(self.partitions) if self.info.is_partitioned else [(None, None)]


async def all_tables(connection: Connection, notes: list[str]) -> list[TableEntry]:
    """Every table the user may describe, with its partitions and each bucket's leadership."""
    admin = connection.get_admin()
    databases = await guarded(notes, "databases", admin.list_databases(), [])
    names = await asyncio.gather(*(guarded(notes, f"tables of {db}", admin.list_tables(db), [])
                                   for db in databases))
    paths = [TablePath(db, name) for db, tables in zip(databases, names, strict=True) for name in tables]
    entries = await asyncio.gather(*(_table_entry(connection, path, notes) for path in paths))
    return [entry for entry in entries if entry is not None]


async def _table_entry(connection: Connection, path: TablePath, notes: list[str]) -> TableEntry | None:
    admin = connection.get_admin()
    try:
        info = await admin.get_table_info(path)
        if not info.is_partitioned:
            return TableEntry(info, [], await admin.get_bucket_leaderships(path))
        partitions = [(p.partition_id, p.partition_name) for p in await admin.list_partition_infos(path)]
        leaderships = await asyncio.gather(*(admin.get_bucket_leaderships(path, name) for _, name in partitions))
        return TableEntry(info, partitions, [lead for found in leaderships for lead in found])
    except StromError as exc:  # dropped meanwhile, or not to be described by this user
        notes.append(f"{path}: {type(exc).__name__}: {exc}")
        return None


# ---- the cluster overview ----

@dataclass(slots=True)
class ServerRow:
    server_id: int
    node: ServerNode | None
    """None for a server that holds replicas but is not registered: it is down."""
    leaders: int = 0
    replicas: int = 0
    out_of_sync: int = 0
    """Replicas on this server that are not in their bucket's ISR."""


@dataclass(slots=True)
class BucketProblem:
    table: TablePath
    partition: str | None
    bucket: int
    leader: int | None
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(slots=True)
class Overview:
    health: ClusterHealth | None
    coordinator: ServerNode | None
    servers: list[ServerRow]
    databases: int
    tables: int
    partitions: int
    buckets: int
    under_replicated: list[BucketProblem]
    leaderless: list[BucketProblem]
    notes: list[str] = field(default_factory=list)


async def overview(connection: Connection) -> Overview:
    notes: list[str] = []
    admin = connection.get_admin()
    nodes = await admin.get_server_nodes(include_tags=True)
    health = await guarded(notes, "cluster health", admin.get_cluster_health(), None)
    tables = await all_tables(connection, notes)
    rows = {n.id: ServerRow(n.id, n) for n in nodes if n.server_type == "TabletServer"}
    under, leaderless = [], []
    for entry in tables:
        names = dict(entry.partitions)
        for lead in entry.leaderships:
            for replica in lead.replicas:
                row = rows.setdefault(replica, ServerRow(replica, None))
                row.replicas += 1
                row.out_of_sync += replica not in lead.isr and bool(lead.isr)
            if lead.leader in rows:
                rows[lead.leader].leaders += 1
            problem = BucketProblem(entry.info.path, names.get(lead.bucket.partition_id) if lead.bucket.partition_id
                                    is not None else None, lead.bucket.bucket, lead.leader, lead.replicas, lead.isr)
            if lead.leader is None:
                leaderless.append(problem)
            elif lead.isr and len(lead.isr) < len(lead.replicas):
                under.append(problem)
    coordinator = next((n for n in nodes if n.server_type == "CoordinatorServer"), None)
    return Overview(
        health, coordinator, [rows[k] for k in sorted(rows)], len({e.info.path.database_name for e in tables}),
        len(tables), sum(len(e.partitions) for e in tables), sum(len(e.leaderships) for e in tables),
        under, leaderless, notes,
    )


# ---- one table ----

@dataclass(slots=True)
class BucketRow:
    lead: BucketLeadership
    partition: str | None
    earliest: int | None
    high_watermark: int | None
    stats: BucketStats | None
    snapshot: tuple[int, int] | None
    """The latest KV snapshot's id and log offset."""


@dataclass(slots=True)
class TablePage:
    info: TableInfo
    partitions: list[tuple[int, str]]
    shown_partitions: list[str]
    buckets: list[BucketRow]
    notes: list[str] = field(default_factory=list)


async def table_page(connection: Connection, path: TablePath, partition: str | None = None) -> TablePage:
    notes: list[str] = []
    admin = connection.get_admin()
    info = await admin.get_table_info(path)
    partitions: list[tuple[int, str]] = []
    shown: list[str | None] = [None]
    if info.is_partitioned:
        partitions = [(p.partition_id, p.partition_name) for p in await admin.list_partition_infos(path)]
        names = [name for _, name in partitions]
        if partition is not None:
            if partition not in names:
                raise KeyError(f"table {path} has no partition {partition!r}")
            shown = [partition]
        else:
            shown = list(names[-MAX_PARTITIONS_SHOWN:])
    rows = [row for found in await asyncio.gather(*(_bucket_rows(connection, info, name, notes) for name in shown))
            for row in found]
    return TablePage(info, partitions, [name for name in shown if name is not None], rows, notes)


async def _bucket_rows(connection: Connection, info: TableInfo, partition: str | None,
                       notes: list[str]) -> list[BucketRow]:
    admin = connection.get_admin()
    where = f"{info.path}" + (f" partition {partition}" if partition else "")
    leaderships = await admin.get_bucket_leaderships(info.path, partition)
    bucket_ids = [lead.bucket.bucket for lead in leaderships]
    earliest, latest = await asyncio.gather(
        guarded(notes, f"{where} earliest offsets",
                admin.list_offsets(info.path, bucket_ids, OffsetSpec.earliest(), partition), {}),
        guarded(notes, f"{where} high watermarks",
                admin.list_offsets(info.path, bucket_ids, OffsetSpec.latest(), partition), {}),
    )
    stats: dict[TableBucket, BucketStats] = await guarded(
        notes, f"{where} sizes", admin.get_bucket_stats([lead.bucket for lead in leaderships]), {})
    snapshots: dict[int, Any] = {}
    if info.has_primary_key:
        found = await guarded(notes, f"{where} KV snapshots",
                              admin.get_latest_kv_snapshots(info.path, partition), None)
        snapshots = found.snapshots if found is not None else {}
    rows = []
    for lead in leaderships:
        snap = snapshots.get(lead.bucket.bucket)
        rows.append(BucketRow(lead, partition, earliest.get(lead.bucket.bucket), latest.get(lead.bucket.bucket),
                              stats.get(lead.bucket), None if snap is None else (snap.snapshot_id, snap.log_offset)))
    return rows


# ---- lake tiering ----

@dataclass(slots=True)
class TieringRow:
    status: Any
    """:class:`~strom.client.lake.LakeTieringStatus`."""
    offset_lag: int | None
    """Records in the log not yet in the lake, over every bucket."""
    time_lag_ms: int | None
    """Since the last finished round."""
    data_lag_ms: int | None
    """Since the newest record the lake holds was written."""


@dataclass(slots=True)
class TieringPage:
    rows: list[TieringRow]
    leases: list[Any]
    notes: list[str] = field(default_factory=list)


async def tiering_page(connection: Connection) -> TieringPage:
    notes: list[str] = []
    admin = connection.get_admin()
    statuses = await guarded(notes, "lake tiering", admin.describe_lake_tiering(), [])
    leases = await guarded(notes, "KV snapshot leases", admin.list_kv_snapshot_leases(), [])
    now = int(time.time() * 1000)
    rows = await asyncio.gather(*(_tiering_row(connection, status, now, notes) for status in statuses))
    return TieringPage(list(rows), [lease for lease in leases if lease.lease_id.endswith(TIERING_LEASE_SUFFIX)], notes)


async def _tiering_row(connection: Connection, status: Any, now: int, notes: list[str]) -> TieringRow:
    admin = connection.get_admin()
    lag: int | None = None
    try:
        info = await admin.get_table_info(status.table_path)
        partitions: list[tuple[int | None, str | None]] = [(None, None)]
        if info.is_partitioned:
            partitions = [(p.partition_id, p.partition_name) for p in await admin.list_partition_infos(info.path)]
        lag = 0
        for partition_id, name in partitions:
            latest = await admin.list_offsets(info.path, list(range(info.bucket_count)), OffsetSpec.latest(), name)
            for bucket, end in latest.items():
                tiered = status.bucket_offsets.get(TableBucket(info.table_id, bucket, partition_id), 0)
                lag += max(0, end - tiered)
    except StromError as exc:
        notes.append(f"{status.table_path} offsets: {type(exc).__name__}: {exc}")
    time_lag = now - status.last_tiered_time if status.last_tiered_time else None
    data_lag = now - status.newest_timestamp if status.newest_timestamp else None
    return TieringRow(status, lag, time_lag, data_lag)


# ---- KV snapshots and leases ----

@dataclass(slots=True)
class SnapshotRow:
    table: TablePath
    partition: str | None
    bucket: int
    latest: tuple[int, int] | None
    retained: int
    leased_by: list[str]


@dataclass(slots=True)
class SnapshotsPage:
    rows: list[SnapshotRow]
    leases: list[Any]
    paths: dict[int, TablePath]
    notes: list[str] = field(default_factory=list)


async def snapshots_page(connection: Connection) -> SnapshotsPage:
    notes: list[str] = []
    admin = connection.get_admin()
    tables = [entry for entry in await all_tables(connection, notes) if entry.info.has_primary_key]
    leases = await guarded(notes, "KV snapshot leases", admin.list_kv_snapshot_leases(), [])
    pinned: dict[TableBucket, list[str]] = {}
    for lease in leases:
        for bucket, snapshot_id in lease.snapshots.items():
            pinned.setdefault(bucket, []).append(f"{lease.lease_id} (snapshot {snapshot_id})")
    rows: list[SnapshotRow] = []
    for entry in tables:
        for partition_id, name in entry.physical_tables():
            latest = await guarded(notes, f"{entry.info.path} snapshots",
                                   admin.get_latest_kv_snapshots(entry.info.path, name), None)
            retained = await guarded(notes, f"{entry.info.path} retained snapshots",
                                     admin.list_kv_snapshots(entry.info.table_id, partition_id), [])
            per_bucket: dict[int, int] = {}
            for bucket_id, _snapshot, _offset in retained:
                per_bucket[bucket_id] = per_bucket.get(bucket_id, 0) + 1
            for bucket_id in range(entry.info.bucket_count):
                snap = latest.snapshots.get(bucket_id) if latest is not None else None
                bucket = TableBucket(entry.info.table_id, bucket_id, partition_id)
                rows.append(SnapshotRow(entry.info.path, name, bucket_id,
                                        None if snap is None else (snap.snapshot_id, snap.log_offset),
                                        per_bucket.get(bucket_id, 0), pinned.get(bucket, [])))
    return SnapshotsPage(rows, leases, {e.info.table_id: e.info.path for e in tables}, notes)


# ---- remote log ----

@dataclass(slots=True)
class RemoteLogRow:
    table: TablePath
    partition: str | None
    bucket: int
    local_start: int | None
    high_watermark: int | None
    remote_end: int | None
    location: str | None

    @property
    def lag(self) -> int | None:
        if self.high_watermark is None:
            return None
        return max(0, self.high_watermark - (self.remote_end or 0)) if self.remote_end is not None else None


@dataclass(slots=True)
class RemoteLogPage:
    rows: list[RemoteLogRow]
    notes: list[str] = field(default_factory=list)


async def remote_log_page(connection: Connection) -> RemoteLogPage:
    notes: list[str] = []
    admin = connection.get_admin()
    rows: list[RemoteLogRow] = []
    for entry in await all_tables(connection, notes):
        info = entry.info
        for partition_id, name in entry.physical_tables():
            manifests = await guarded(notes, f"{info.path} remote log",
                                      admin.list_remote_log_manifests(info.table_id, partition_id), [])
            if not manifests:
                continue
            buckets = list(range(info.bucket_count))
            earliest = await guarded(notes, f"{info.path} offsets",
                                     admin.list_offsets(info.path, buckets, OffsetSpec.earliest(), name), {})
            latest = await guarded(notes, f"{info.path} offsets",
                                   admin.list_offsets(info.path, buckets, OffsetSpec.latest(), name), {})
            remote = {bucket: (location, end) for bucket, location, end in manifests}
            for bucket in buckets:
                location, end = remote.get(bucket, (None, None))
                rows.append(RemoteLogRow(info.path, name, bucket, earliest.get(bucket), latest.get(bucket), end,
                                         location))
    return RemoteLogPage(rows, notes)


# ---- rebalance and ACLs ----

async def rebalance_page(connection: Connection) -> tuple[Any, list[ServerNode], list[str]]:
    notes: list[str] = []
    admin = connection.get_admin()
    progress = await guarded(notes, "rebalance", admin.list_rebalance_progress(), None)
    nodes = await admin.get_server_nodes(include_tags=True)
    return progress, nodes, notes


async def configs_page(connection: Connection) -> tuple[list[Any], list[str]]:
    """The cluster's settings as DescribeClusterConfigs answers them (secrets left out by the server)."""
    notes: list[str] = []
    entries = await guarded(notes, "cluster configuration", connection.get_admin().describe_cluster_configs(), [])
    return sorted(entries, key=lambda entry: entry.key), notes


async def acls_page(connection: Connection) -> tuple[list[Any], list[str]]:
    notes: list[str] = []
    bindings = await guarded(notes, "ACLs", connection.get_admin().list_acls(), [])
    return sorted(bindings, key=lambda b: (str(b.principal), b.resource, b.operation)), notes


__all__ = [
    "BucketRow", "Overview", "RemoteLogPage", "SnapshotsPage", "TablePage", "TieringPage", "acls_page",
    "all_tables", "configs_page", "overview", "rebalance_page", "remote_log_page", "snapshots_page", "table_page", "tiering_page",
]
