"""Coordinator RPCs for KV snapshots and their leases, and the commit path tablet servers use.

Validation follows Fluss: lease calls on a log table fail with NON_PRIMARY_KEY_TABLE (20); an unknown
table id in an acquire is UNKNOWN_TABLE_OR_BUCKET (21); releasing or dropping unknown things succeeds
(a release naming a table that was dropped is a no-op, since dropping it already removed its pins).
Every change that drops a pin triggers retention on the affected buckets right away.

A lease belongs to the principal that created it: acquiring (renewing), releasing or dropping another
principal's lease is refused with AuthorizationError (48) unless the caller is a super user
(``super.users``) or one of the cluster's servers. Fluss lets anyone touch any lease id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from strom.clock import Clock
from strom.coordinator.gateway import TabletServerGateway
from strom.coordinator.kv_snapshot_leases import KvSnapshotLeaseManager, LeaseChange
from strom.coordinator.kv_snapshot_store import KvSnapshotStore
from strom.coordinator.placement import fence_leader_epoch
from strom.coordinator.service import CoordinatorService
from strom.errors import (
    AuthorizationError,
    CorruptMessageError,
    KvSnapshotNotExistError,
    NonPrimaryKeyTableError,
    PartitionNotExistError,
    TableNotPartitionedError,
    UnknownTableOrBucketError,
)
from strom.ids import TableBucket, TablePath
from strom.kv.snapshot import CompletedKvSnapshot, table_remote_dir
from strom.metadata.table_info import TableInfo
from strom.rpc.auth import ANONYMOUS, Principal
from strom.rpc.messages import add_snapshot_pins, ext, pb, read_snapshot_pins
from strom.rpc.server import RequestContext
from strom.security.authorizer import is_super_user, parse_super_users

log = logging.getLogger(__name__)


class KvSnapshotService:
    """Owned by the event loop; ``start()`` launches the lease expiry loop, ``stop()`` ends it."""

    def __init__(
        self,
        catalog: CoordinatorService,
        snapshots: KvSnapshotStore,
        leases: KvSnapshotLeaseManager,
        clock: Clock,
        expiration_check_interval_ms: int,
        super_users: str | None = None,
        tablets: TabletServerGateway | None = None,
    ) -> None:
        """``super_users``: ``super.users``, who may touch any lease; ``tablets``: told after each commit
        from which offset the bucket's changelog must stay (NotifyKvSnapshotOffset)."""
        self._tablets = tablets
        self._super_users = parse_super_users(super_users)
        self._catalog = catalog
        self._snapshots = snapshots
        self._leases = leases
        self._clock = clock
        self._expiration_check_interval_ms = expiration_check_interval_ms
        self._expiry_task: asyncio.Task[None] | None = None
        self._changing = asyncio.Lock()
        """A commit, or a lease change, with the retention it causes, as one step: a lease taken while a
        commit runs sees the snapshots its retention left, as it did when a commit never yielded."""

    def start(self) -> None:
        self._expiry_task = asyncio.ensure_future(self._expire_periodically())

    async def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            await asyncio.gather(self._expiry_task, return_exceptions=True)
        await self._snapshots.wait_for_cleanups()

    async def _expire_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._expiration_check_interval_ms / 1000)
            try:
                await self.expire_leases()
            except Exception:
                log.exception("lease expiry check failed")

    async def expire_leases(self) -> None:
        async with self._changing:
            await self._after_change(await self._leases.expire())

    async def _after_change(self, change: LeaseChange) -> None:
        if change.released_all:
            buckets = list(self._snapshots.buckets())
        elif change.released:
            buckets = list(dict.fromkeys(bucket for bucket, _snapshot_id in change.released))
        else:
            return
        await self._snapshots.apply_retention(buckets)
        self._notify_retained(buckets)  # a released snapshot may have been the oldest: less log to keep

    def _notify_retained(self, buckets: Iterable[TableBucket]) -> None:
        """Tell the buckets' replicas from which offset their changelog must stay: the oldest retained
        snapshot's (NotifyKvSnapshotOffset)."""
        if self._tablets is None:
            return
        for bucket in buckets:
            oldest = self._snapshots.oldest(bucket)
            table = self._catalog.table_info_by_id(bucket.table_id)
            if oldest is not None and table is not None:
                self._tablets.notify_kv_snapshot_offset(table, bucket, oldest.log_offset)

    # ---- the tablet servers' side ----
    async def next_snapshot_id(self, bucket: TableBucket) -> int:
        return await self._snapshots.next_snapshot_id(bucket)

    async def commit_snapshot(self, snapshot: CompletedKvSnapshot, leader_epoch: int = 0) -> None:
        """Record a snapshot a tablet server uploaded. Raises UnknownTableOrBucketError if its table or
        partition was dropped while it was uploading (the uploader then removes its files). In one process
        the replica that took it is the bucket's only leader, so ``leader_epoch`` needs no check here; a
        cluster's coordinator checks it (:meth:`commit_kv_snapshot`)."""
        bucket = snapshot.bucket
        if self._catalog.table_info_by_id(bucket.table_id) is None:
            raise UnknownTableOrBucketError(f"table {bucket.table_id} no longer exists")
        if bucket.partition_id is not None:
            partition = self._catalog.partition_by_id(bucket.partition_id)
            if partition is None or partition.table_id != bucket.table_id:
                raise UnknownTableOrBucketError(f"partition {bucket.partition_id} of table {bucket.table_id} no longer exists")
        async with self._changing:
            await self._snapshots.add(snapshot)
            self._notify_retained([bucket])

    async def commit_kv_snapshot(self, request: Any, leader_epoch_of: Callable[[TableBucket], int | None]) -> Any:
        """CommitKvSnapshot (1022) from a cluster's tablet server: the snapshot it uploaded, as the
        ``_METADATA`` document strom writes. ``leader_epoch_of`` gives a bucket's current leader epoch (None:
        no such bucket). A snapshot taken under an older epoch is refused with FencedLeaderEpochError, as
        Fluss's coordinator does: its replica was deposed, and what it held may include writes the new
        leader never had."""
        try:
            snapshot = CompletedKvSnapshot.from_json(request.completed_snapshot)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptMessageError(f"CommitKvSnapshot carries no valid snapshot document: {exc}") from exc
        fence_leader_epoch(snapshot.bucket, leader_epoch_of, request.bucket_leader_epoch,
                           f"snapshot {snapshot.snapshot_id} of {snapshot.bucket}")
        await self.commit_snapshot(snapshot, request.bucket_leader_epoch)
        return pb.CommitKvSnapshotResponse()

    async def snapshot_exists(self, bucket: TableBucket, snapshot_id: int) -> bool:
        return self._snapshots.exists(bucket, snapshot_id)

    async def latest_snapshot(self, bucket: TableBucket) -> CompletedKvSnapshot | None:
        return self._snapshots.latest(bucket)

    async def oldest_snapshot(self, bucket: TableBucket) -> CompletedKvSnapshot | None:
        return self._snapshots.oldest(bucket)

    async def on_table_dropped(self, table: TableInfo, partition_id: int | None = None) -> None:
        """Drop the pins and the snapshots of a dropped table (or partition), and its whole remote
        snapshot directory: that also takes shared files an upload in flight sent before the drop."""
        async with self._changing:
            await self._leases.drop_table(table.table_id, partition_id)
        self._snapshots.drop_table(
            table.table_id, partition_id, table_remote_dir(table.path, table.table_id, partition_id)
        )

    # ---- RPCs ----
    def _pk_table(self, table_id: int) -> TableInfo:
        table = self._catalog.table_info_by_id(table_id)
        if table is None:
            raise UnknownTableOrBucketError.unknown_table_id(table_id)
        if not table.has_primary_key:
            raise NonPrimaryKeyTableError(f"Table '{table.path}' is not a primary key table.")
        return table

    def _partition_of(self, table: TableInfo, partition_name: str | None) -> int | None:
        if partition_name is None:
            if table.is_partitioned:
                raise PartitionNotExistError(
                    f"Table '{table.path}' is partitioned: name the partition to read its snapshots."
                )
            return None
        if not table.is_partitioned:
            raise TableNotPartitionedError(f"Table '{table.path}' is not a partitioned table.")
        return self._catalog.partition(table, partition_name).partition_id

    def get_latest_kv_snapshots(self, request: Any, _context: object) -> Any:
        table = self._catalog.table_info(TablePath(request.table_path.database_name, request.table_path.table_name))
        if not table.has_primary_key:
            raise NonPrimaryKeyTableError(f"Table '{table.path}' is not a primary key table.")
        partition_id = self._partition_of(table, request.partition_name if request.HasField("partition_name") else None)
        response = pb.GetLatestKvSnapshotsResponse(table_id=table.table_id)
        if partition_id is not None:
            response.partition_id = partition_id
        for bucket in table.buckets(partition_id):
            entry = response.latest_snapshots.add(bucket_id=bucket.bucket)
            latest = self._snapshots.latest(bucket)
            if latest is not None:
                entry.snapshot_id = latest.snapshot_id
                entry.log_offset = latest.log_offset
        return response

    def get_kv_snapshot_metadata(self, request: Any, _context: object) -> Any:
        partition_id = request.partition_id if request.HasField("partition_id") else None
        bucket = TableBucket(request.table_id, request.bucket_id, partition_id)
        if self._catalog.table_info_by_id(request.table_id) is None:
            raise UnknownTableOrBucketError.unknown_table_id(request.table_id)
        try:
            snapshot = self._snapshots.get(bucket, request.snapshot_id)
        except KvSnapshotNotExistError:
            raise
        except Exception as exc:
            raise KvSnapshotNotExistError(f"Snapshot {request.snapshot_id} of {bucket}: {exc}") from exc
        response = pb.GetKvSnapshotMetadataResponse(log_offset=snapshot.log_offset)
        for file in snapshot.files:
            response.snapshot_files.add(remote_path=file.remote_path, local_file_name=file.local_file_name)
        return response

    def list_kv_snapshots(self, request: Any, _context: object) -> Any:
        partition_id = request.partition_id if request.HasField("partition_id") else None
        table = self._pk_table(request.table_id)
        response = pb.ListKvSnapshotsResponse(table_id=table.table_id)
        if partition_id is not None:
            response.partition_id = partition_id
        for snapshot in self._snapshots.snapshots(table.table_id, partition_id):
            response.active_snapshots.add(
                bucket_id=snapshot.bucket.bucket, snapshot_id=snapshot.snapshot_id, log_offset=snapshot.log_offset
            )
        return response

    def _caller(self, lease_id: str, context: RequestContext | None) -> str:
        """The caller's principal; raises AuthorizationError if the lease is another principal's."""
        principal = self._principal(context)
        if self._foreign(lease_id, principal):
            raise AuthorizationError(f"lease {lease_id!r} cannot be taken by {principal}: choose another lease id")
        return str(principal)

    @staticmethod
    def _principal(context: RequestContext | None) -> Principal:
        return (context.principal if context is not None else None) or ANONYMOUS

    def _foreign(self, lease_id: str, principal: Principal) -> bool:
        """Whether ``lease_id`` is another principal's lease (a super user's may be anyone's)."""
        return self._leases.is_anothers(lease_id, str(principal)) and not is_super_user(principal, self._super_users)

    async def acquire_kv_snapshot_lease(self, request: Any, context: RequestContext | None) -> Any:
        owner = self._caller(request.lease_id, context)
        for table_request in request.snapshots_to_lease:
            self._pk_table(table_request.table_id)
        pins = read_snapshot_pins(request.snapshots_to_lease)
        async with self._changing:
            change = await self._leases.acquire(
                request.lease_id, request.lease_duration_ms, pins, snapshot_exists=self._snapshots.exists,
                owner=owner,
            )
            await self._after_change(change)
        response = pb.AcquireKvSnapshotLeaseResponse()
        add_snapshot_pins(response.unavailable_snapshots, change.unavailable)
        return response

    async def release_kv_snapshot_lease(self, request: Any, context: RequestContext | None) -> Any:
        if self._foreign(request.lease_id, self._principal(context)):
            return pb.ReleaseKvSnapshotLeaseResponse()  # as for a lease that does not exist: nothing to release
        buckets = []
        for entry in request.buckets_to_release:
            table = self._catalog.table_info_by_id(entry.table_id)
            if table is not None and not table.has_primary_key:
                raise NonPrimaryKeyTableError(f"Table '{table.path}' is not a primary key table.")
            partition_id = entry.partition_id if entry.HasField("partition_id") else None
            buckets.append(TableBucket(entry.table_id, entry.bucket_id, partition_id))
        async with self._changing:
            await self._after_change(await self._leases.release(request.lease_id, buckets))
        return pb.ReleaseKvSnapshotLeaseResponse()

    async def drop_kv_snapshot_lease(self, request: Any, context: RequestContext | None) -> Any:
        if self._foreign(request.lease_id, self._principal(context)):
            return pb.DropKvSnapshotLeaseResponse()  # as for a lease that does not exist: nothing to drop
        async with self._changing:
            await self._after_change(await self._leases.drop(request.lease_id))
        return pb.DropKvSnapshotLeaseResponse()

    def list_kv_snapshot_leases(self, request: Any, _context: object) -> Any:
        """strom extension: every lease (or one) with its expiry and pins."""
        response = ext.ListKvSnapshotLeasesResponse()
        leases = self._leases.leases()
        if request.HasField("lease_id"):
            leases = [lease for lease in leases if lease.lease_id == request.lease_id]
        for lease in leases:
            summary = response.leases.add(lease_id=lease.lease_id, expiration_time=lease.expiration_ms)
            for bucket, snapshot_id in sorted(lease.pins.items()):
                entry = summary.snapshots.add(table_id=bucket.table_id, bucket_id=bucket.bucket, snapshot_id=snapshot_id)
                if bucket.partition_id is not None:
                    entry.partition_id = bucket.partition_id
        return response
