"""A cluster's tablet server: what it needs from the coordinator and the metadata store, and the requests the
coordinator sends it (NotifyLeaderAndIsr, StopReplica, UpdateMetadata).

The tablet server reads table definitions, bucket assignments and KV snapshot records from the shared
metadata store itself (ZooKeeper), and sends only what must go through the coordinator: committing a KV
snapshot (CommitKvSnapshot), so that retention and leases stay with the one process that runs them.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from strom.errors import (
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidCoordinatorError,
    InvalidUpdateVersionError,
    StromError,
    UnknownTableOrBucketError,
    error_for_code,
)
from strom.ids import TableBucket
from strom.kv.snapshot import CompletedKvSnapshot, snapshot_sequence_name
from strom.membership.contract import BucketStates, LeaderAndIsr
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.rpc.peers import ALL_BUCKETS, PeerConnections, ServerNode
from strom.security.internal import COORDINATOR_NAME
from strom.tablet.data_dirs import DataDirectories
from strom.tablet.replica import ReplicaManager
from strom.tablet.replication import ReplicationManager
from strom.tablet.retained_offsets import LakeOffset

log = logging.getLogger(__name__)

TableOf = Callable[[int], TableInfo | None]
ResolveTable = Callable[[int], Awaitable[TableInfo | None]]
"""A table by id, read off the event loop when the metadata cache does not hold it."""


class MetadataCache(Protocol):
    """The tablet server's catalog cache, told by the coordinator's requests what changed."""

    def forget_table(self, table_id: int) -> None: ...

    def forget_partition_id(self, partition_id: int) -> None: ...

    def forget_all(self) -> None: ...


class StopReplicas(Protocol):
    """Stop hosting a table's (or partition's) buckets (``TabletRole.stop_replicas``)."""

    def __call__(self, table_id: int, partition_id: int | None, *, delete: bool) -> Awaitable[None]: ...
"""A table by id, with its earlier schemas (the coordinator's ``table_info_by_id``)."""


class ClusterTables:
    """Which buckets this tablet server holds a replica of, from the bucket states in ZooKeeper."""

    def __init__(self, store: MetadataStore, states: BucketStates, server_id: int, table_of: TableOf) -> None:
        self._store = store
        self._states = states
        self._server_id = server_id
        self._table_of = table_of

    def resolve(self, bucket: TableBucket) -> TableInfo | None:
        """The table of an unreplicated ``bucket`` this server leads (a request came before the notice);
        a replicated one waits for its notice, which sets up its followers."""
        found = self._states.get(bucket)
        if found is None or found[0].leader != self._server_id or found[0].replicas != (self._server_id,):
            return None
        return self._table_of(bucket.table_id)

    def assigned(self, placed: list[tuple[TableInfo, int | None]]) -> list[tuple[TableInfo, list[TableBucket]]]:
        """Of ``placed`` (:func:`placed_tables`), every bucket with a replica on this server, by table."""
        found: dict[int, tuple[TableInfo, list[TableBucket]]] = {}
        for table, bucket, state in self._states_of(placed):
            if self._server_id in state.replicas:
                found.setdefault(table.table_id, (table, []))[1].append(bucket)
        return [(table, sorted(buckets, key=lambda b: (b.partition_id or 0, b.bucket)))
                for table, buckets in found.values()]

    def moved_away(self, placed: list[tuple[TableInfo, int | None]]) -> list[tuple[TableInfo, TableBucket]]:
        """Of ``placed``, the buckets whose state names replicas other than this server (a bucket without
        a state is left alone: nothing says where it lives)."""
        return [(table, bucket) for table, bucket, state in self._states_of(placed)
                if self._server_id not in state.replicas]

    def _states_of(self, placed: list[tuple[TableInfo, int | None]]) -> Iterator[tuple[TableInfo, TableBucket, LeaderAndIsr]]:
        for table, partition_id in placed:
            for bucket, state in self._states.get_many(table.buckets(partition_id)).items():
                yield table, bucket, state


def remove_moved_bucket_data(
    replicas: ReplicaManager, tables: ClusterTables, placed: list[tuple[TableInfo, int | None]]
) -> list[Path]:
    """Delete the copies of buckets that a rebalance moved off this server while it was down (their state
    names other replicas); returns what was removed."""
    removed = []
    for table, bucket in tables.moved_away(placed):
        directory = replicas.directories.existing_directory(table, bucket)
        if directory is not None and directory.exists():
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
        replicas.directories.forget(bucket)
    return removed


def remove_dropped_table_data(directories: DataDirectories, existing_table_ids: set[int]) -> list[Path]:
    """Delete the data of tables dropped while this server was down (``<db>/<table>-<id>`` directories whose
    table id no longer exists) from every online data directory; returns what was removed."""
    removed = []
    for tablets_dir in (directory.tablets for directory in directories.online):
        for database_dir in (d for d in tablets_dir.iterdir() if d.is_dir()) if tablets_dir.exists() else ():
            for table_dir in (d for d in database_dir.iterdir() if d.is_dir()):
                _, _, table_id = table_dir.name.rpartition("-")
                if table_id.isdigit() and int(table_id) not in existing_table_ids:
                    shutil.rmtree(table_dir, ignore_errors=True)
                    directories.forget_table(int(table_id))
                    removed.append(table_dir)
    return removed


class RemoteSnapshotCommitter:
    """The tablet server's side of KV snapshots in a cluster (a ``SnapshotCommitter``): ids and records are
    read from the shared store, commits go to the coordinator (CommitKvSnapshot)."""

    def __init__(
        self,
        store: MetadataStore,
        peers: PeerConnections,
        coordinator: Callable[[], ServerNode],
        coordinator_epoch: Callable[[], int],
    ) -> None:
        self._store = store
        self._peers = peers
        self._coordinator = coordinator
        self._coordinator_epoch = coordinator_epoch

    async def next_snapshot_id(self, bucket: TableBucket) -> int:
        return await off_loop(self._store.next_id, snapshot_sequence_name(bucket))

    def commit_snapshot(self, snapshot: CompletedKvSnapshot, leader_epoch: int) -> Awaitable[Any]:
        node = self._coordinator()
        request = pb.CommitKvSnapshotRequest(
            completed_snapshot=snapshot.to_json(),
            coordinator_epoch=self._coordinator_epoch(),
            bucket_leader_epoch=leader_epoch,
        )
        return self._peers.request(node.host, node.port, ApiKey.COMMIT_KV_SNAPSHOT, request, server_name=COORDINATOR_NAME)

    def _snapshots(self, bucket: TableBucket) -> dict[int, CompletedKvSnapshot]:
        return {
            record.snapshot_id: CompletedKvSnapshot.from_json(record.snapshot_json)
            for record in self._store.list_bucket_kv_snapshots(bucket.table_id, bucket.partition_id, bucket.bucket)
        }

    async def snapshot_exists(self, bucket: TableBucket, snapshot_id: int) -> bool:
        return snapshot_id in await off_loop(self._snapshots, bucket)

    async def latest_snapshot(self, bucket: TableBucket) -> CompletedKvSnapshot | None:
        return await off_loop(self.latest_snapshot_now, bucket)

    def latest_snapshot_now(self, bucket: TableBucket) -> CompletedKvSnapshot | None:
        """Blocks (a store read): for a replica restoring its KV state as it opens, itself a blocking step."""
        snapshots = self._snapshots(bucket)
        return snapshots[max(snapshots)] if snapshots else None

    async def oldest_snapshot(self, bucket: TableBucket) -> CompletedKvSnapshot | None:
        snapshots = await off_loop(self._snapshots, bucket)
        return snapshots[min(snapshots)] if snapshots else None


ISR_REFUSALS = frozenset({UnknownTableOrBucketError.code, InvalidUpdateVersionError.code, FencedLeaderEpochError.code,
                          IneligibleReplicaError.code})
"""AdjustIsr answers that say the change was not written and why is in the bucket's state: read it again."""


class CoordinatorIsrChanges:
    """A leader's ISR changes sent to the active coordinator (AdjustIsr, 1020), which checks and writes them."""

    def __init__(self, server_id: int, peers: PeerConnections, coordinator: Callable[[], ServerNode],
                 coordinator_epoch: Callable[[], int]) -> None:
        self._server_id = server_id
        self._peers = peers
        self._coordinator = coordinator
        self._coordinator_epoch = coordinator_epoch

    async def __call__(self, bucket: TableBucket, state: LeaderAndIsr, version: int, isr: tuple[int, ...]) -> int | None:
        """The new bucket epoch once written; None when refused for the bucket's state; raises otherwise."""
        request = pb.AdjustIsrRequest(serverId=self._server_id)
        entry = request.tables_req.add(table_id=bucket.table_id).buckets_req.add(
            bucket_id=bucket.bucket, leader_epoch=state.leader_epoch, coordinator_epoch=self._coordinator_epoch(),
            bucket_epoch=version)
        entry.new_isr.extend(isr)
        if bucket.partition_id is not None:
            entry.partition_id = bucket.partition_id
        node = self._coordinator()
        response = await self._peers.request(node.host, node.port, ApiKey.ADJUST_ISR, request,
                                             server_name=COORDINATOR_NAME)
        answer = response.tables_resp[0].buckets_resp[0]  # type: ignore[attr-defined]
        if not answer.HasField("error_code") or answer.error_code == 0:
            return int(answer.bucket_epoch)
        if answer.error_code in ISR_REFUSALS:
            log.info("%s: the coordinator refused the ISR %s: %s", bucket, list(isr), answer.error_message)
            return None
        raise error_for_code(answer.error_code, answer.error_message or None)


class TabletControlService:
    """The coordinator's requests to this tablet server."""

    def __init__(
        self,
        replicas: ReplicaManager,
        resolve_table: ResolveTable,
        stop_replicas: StopReplicas,
        replication: ReplicationManager,
        cache: MetadataCache,
    ) -> None:
        """``stop_replicas(table_id, partition_id, delete)`` closes scan sessions and stops the buckets.
        ``cache``: forgets a table the coordinator changed (UpdateMetadata) or dropped (StopReplica with
        delete), and everything when a new coordinator takes over."""
        self._replicas = replicas
        self._resolve_table = resolve_table
        self._stop_replicas = stop_replicas
        self._replication = replication
        self._cache = cache
        self._coordinator_epoch = -1
        """The highest coordinator epoch seen: requests of an older (deposed) coordinator are refused."""

    def _check_epoch(self, epoch: int) -> None:
        if epoch < self._coordinator_epoch:
            raise InvalidCoordinatorError(
                f"The request comes from coordinator epoch {epoch}, but epoch {self._coordinator_epoch} is active."
            )
        if epoch > self._coordinator_epoch >= 0:  # notices the deposed one sent may have been lost
            self._cache.forget_all()
        self._coordinator_epoch = epoch

    async def notify_leader_and_isr(self, request: Any, _context: object) -> Any:
        """Lead or follow each bucket as ZooKeeper's state says now (the notice says that it changed).

        The buckets the notice says this server leads and does not host yet (a new table's, or a restarted
        server's, whose changelog replays there) first open their storage on threads, all at once, while the
        event loop serves other requests (``ReplicaManager.open_new_soon``); leading them then finds it
        open."""
        self._check_epoch(request.coordinator_epoch)
        response = pb.NotifyLeaderAndIsrResponse()
        noticed: list[tuple[Any, TableBucket, TableInfo | None]] = []
        for entry in request.notify_buckets_leader_req:
            result = response.notify_buckets_leader_resp.add()
            bucket = _answered_bucket(result, entry.table_bucket)
            noticed.append((result, bucket, await self._resolve_table(bucket.table_id)))
        led: dict[int, tuple[TableInfo, list[TableBucket]]] = {}
        for (_result, bucket, table), entry in zip(noticed, request.notify_buckets_leader_req, strict=True):
            if table is not None and entry.leader == self._replication.server_id:
                led.setdefault(table.table_id, (table, []))[1].append(bucket)
        opening = [future for table, buckets in led.values()
                   if (future := self._replicas.open_new_soon(table, buckets)) is not None]
        if opening:
            await asyncio.gather(*opening)
        try:
            known = [(result, bucket, table) for result, bucket, table in noticed if table is not None]
            for result, bucket, table in noticed:
                if table is None:
                    result.error_code, result.error_message = 7, f"table {bucket.table_id} does not exist"
            outcomes = await self._replication.apply_all((table, bucket) for _result, bucket, table in known)
            for (result, _bucket, _table), failure in zip(known, outcomes, strict=True):
                if isinstance(failure, StromError):
                    result.error_code, result.error_message = failure.code, str(failure)
                elif failure is not None:
                    raise failure
        finally:
            await self._replicas.discard_new_ahead(bucket for _result, bucket, _table in noticed)
        return response

    async def stop_replica(self, request: Any, _context: object) -> Any:
        self._check_epoch(request.coordinator_epoch)
        response = pb.StopReplicaResponse()
        for entry in request.stop_replicas_req:
            result = response.stop_replicas_resp.add()
            partition_id = _answered_bucket(result, entry.table_bucket).partition_id
            if entry.table_bucket.bucket_id != ALL_BUCKETS:
                result.error_code, result.error_message = -1, "only whole tables or partitions are stopped"
                continue
            if entry.delete:  # dropped (or moved away): what the cache holds of it is read again when used
                if partition_id is None:
                    self._cache.forget_table(entry.table_bucket.table_id)
                else:
                    self._cache.forget_partition_id(partition_id)
            try:
                self._replication.forget(entry.table_bucket.table_id, partition_id)
                await self._stop_replicas(entry.table_bucket.table_id, partition_id, delete=entry.delete)
            except StromError as exc:
                result.error_code, result.error_message = exc.code, str(exc)
        return response

    def notify_kv_snapshot_offset(self, request: Any, _context: object) -> Any:
        """NotifyKvSnapshotOffset (1029): a snapshot of the bucket was committed; its replicas here keep the
        changelog from ``min_retain_offset`` on."""
        self._check_epoch(request.coordinator_epoch)
        partition_id = request.partition_id if request.HasField("partition_id") else None
        self._replicas.retained.notify_kv_snapshot(TableBucket(request.table_id, request.bucket_id, partition_id),
                                                   request.min_retain_offset)
        return pb.NotifyKvSnapshotOffsetResponse()

    def notify_lake_table_offset(self, request: Any, _context: object) -> Any:
        """NotifyLakeTableOffset (1031): a lake snapshot was committed; each bucket's log below
        ``log_end_offset`` is in the lake (an entry without it says only the snapshot id)."""
        self._check_epoch(request.coordinator_epoch)
        for entry in request.notify_buckets_req:
            partition_id = entry.partition_id if entry.HasField("partition_id") else None
            bucket = TableBucket(entry.table_id, entry.bucket_id, partition_id)
            end = entry.log_end_offset if entry.HasField("log_end_offset") else 0
            stamp = entry.max_timestamp if entry.HasField("max_timestamp") else None
            self._replicas.retained.notify_lake(bucket, LakeOffset(entry.snapshot_id, end, stamp))
        return pb.NotifyLakeTableOffsetResponse()

    async def update_metadata(self, request: Any, _context: object) -> Any:
        if request.HasField("coordinator_epoch"):
            self._check_epoch(request.coordinator_epoch)
        for metadata in request.table_metadata:
            self._cache.forget_table(metadata.table_id)  # altered: read it again
            table = await self._resolve_table(metadata.table_id)
            if table is not None:
                self._replicas.change_table(table)
        return pb.UpdateMetadataResponse()


def _answered_bucket(result: Any, table_bucket: Any) -> TableBucket:
    """The bucket a request's entry names, echoed into its answer."""
    result.table_bucket.CopyFrom(table_bucket)
    partition_id = table_bucket.partition_id if table_bucket.HasField("partition_id") else None
    return TableBucket(table_bucket.table_id, table_bucket.bucket_id, partition_id)


__all__ = [
    "ClusterTables", "RemoteSnapshotCommitter", "TabletControlService", "remove_dropped_table_data",
    "remove_moved_bucket_data",
]
