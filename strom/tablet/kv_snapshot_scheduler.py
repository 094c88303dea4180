"""Periodic KV snapshots on the tablet server, and log retention bounded by them.

Every ``kv.snapshot.interval`` each open primary-key bucket with writes since its last snapshot is
checkpointed (on the event loop, between writes), uploaded (in a worker thread) and committed to the
coordinator. At most one snapshot per bucket is in flight. A failed upload or commit removes what it
uploaded and is retried at the next interval.

Log retention deletes whole segments older than ``table.log.ttl``; for a primary-key bucket only segments
below the log offset of its oldest stored snapshot. Restoring the bucket needs the changelog after the
latest snapshot, and a reader of any older snapshot still stored — one a lease keeps, above all — needs the
changelog after that one to catch up (Fluss leaves this gap open: its leases do not protect the log).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from strom.clock import Clock
from strom.ids import TableBucket
from strom.kv.snapshot import (
    CompletedKvSnapshot,
    SnapshotFile,
    bucket_remote_dir,
    discard_upload,
    upload_checkpoint,
)
from strom.remote.storage import RemoteStorage
from strom.tablet.replica import Replica, ReplicaManager

log = logging.getLogger(__name__)


class SnapshotCommitter(Protocol):
    """The coordinator side a tablet server talks to about snapshots."""

    async def next_snapshot_id(self, bucket: TableBucket) -> int: ...

    def commit_snapshot(self, snapshot: CompletedKvSnapshot, leader_epoch: int) -> Awaitable[Any]:
        """Record the snapshot, taken while its replica led the bucket under ``leader_epoch``."""

    async def snapshot_exists(self, bucket: TableBucket, snapshot_id: int) -> bool: ...

    async def latest_snapshot(self, bucket: TableBucket) -> CompletedKvSnapshot | None: ...

    async def oldest_snapshot(self, bucket: TableBucket) -> CompletedKvSnapshot | None: ...


async def commit_uploaded(
    committer: SnapshotCommitter,
    remote: RemoteStorage,
    completed: CompletedKvSnapshot,
    reused_shared: tuple[SnapshotFile, ...],
    leader_epoch: int = 0,
) -> None:
    """Commit an uploaded snapshot taken under ``leader_epoch``. A commit that failed after the record was
    stored (the snapshot is then its bucket's latest) keeps its files; one that was rejected (its table or
    partition dropped meanwhile, its replica no longer the leader, a metadata error) leaves nothing behind,
    the shared SSTs it sent included. Re-raises the failure."""
    try:
        await committer.commit_snapshot(completed, leader_epoch)
    except BaseException:
        if not await committer.snapshot_exists(completed.bucket, completed.snapshot_id):
            await asyncio.to_thread(discard_upload, remote, completed, reused_shared)
        raise


@dataclass(slots=True)
class _BucketState:
    last_log_offset: int = -1
    shared_files: tuple[SnapshotFile, ...] = ()
    next_due_ms: int = 0
    in_flight: bool = False
    initialised: bool = False
    errors: int = field(default=0)


class KvSnapshotScheduler:
    """Owned by the event loop."""

    def __init__(
        self,
        replicas: ReplicaManager,
        committer: SnapshotCommitter,
        remote: RemoteStorage,
        *,
        interval_ms: int,
        retention_check_interval_ms: int,
        local_dir: Path,
        clock: Clock,
        default_log_ttl: timedelta,
    ) -> None:
        self._replicas = replicas
        self._committer = committer
        self._remote = remote
        self._interval_ms = interval_ms
        self._retention_check_interval_ms = retention_check_interval_ms
        self._local_dir = local_dir
        self._clock = clock
        self._default_log_ttl = default_log_ttl
        self._states: dict[TableBucket, _BucketState] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[CompletedKvSnapshot | None]] = set()

    def start(self) -> None:
        self._clear_staging()
        self._tasks.append(asyncio.ensure_future(self._snapshot_loop()))
        self._tasks.append(asyncio.ensure_future(self._retention_loop()))

    @property
    def interval_ms(self) -> int:
        return self._interval_ms

    def set_interval_ms(self, interval_ms: int) -> None:
        """A new ``kv.snapshot.interval`` (AlterClusterConfigs): each bucket is next due one new interval
        after its last snapshot was started (at once if that has passed); <= 0 stops taking snapshots."""
        if interval_ms == self._interval_ms:
            return
        previous, self._interval_ms = self._interval_ms, interval_ms
        for state in self._states.values():
            if state.next_due_ms and previous > 0:
                state.next_due_ms += interval_ms - previous
        log.info("kv.snapshot.interval is now %d ms", interval_ms)

    def _clear_staging(self) -> None:
        """Remove checkpoints a killed process left behind (hard links that pin deleted SSTs' disk space)."""
        if not self._local_dir.is_dir():
            return
        for leftover in self._local_dir.iterdir():
            log.info("removing leftover snapshot staging %s", leftover.name)
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._in_flight, return_exceptions=True)

    # ---- snapshots ----
    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s())
            if self._interval_ms <= 0:
                continue
            now = self._clock.now_ms()
            for replica in self._replicas.hosted():
                if not (replica.is_kv and replica.is_open and replica.is_leader and not replica.stopped):
                    continue
                if replica.opening_on_thread:
                    continue  # a new leader's replay, say: snapshotted once it is open, not waited for here
                state = await self._state(replica.bucket)
                if state.in_flight or now < state.next_due_ms:
                    continue
                state.next_due_ms = now + self._interval_ms
                task = asyncio.ensure_future(self.snapshot(replica))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)

    def _tick_s(self) -> float:
        """A quarter of the interval, within [50 ms, 5 s] (5 s while snapshots are off: how soon an
        interval set at run time is noticed)."""
        return max(0.05, min(self._interval_ms / 1000 / 4, 5.0)) if self._interval_ms > 0 else 5.0

    async def _state(self, bucket: TableBucket) -> _BucketState:
        state = self._states.get(bucket)
        if state is None:
            state = self._states[bucket] = _BucketState()
        if not state.initialised:
            latest = await self._committer.latest_snapshot(bucket)
            if latest is not None:
                state.last_log_offset = latest.log_offset
                state.shared_files = tuple(f for f in latest.files if f.shared)
            state.initialised = True
        return state

    async def snapshot(self, replica: Replica) -> CompletedKvSnapshot | None:
        """Take, upload and commit one snapshot of ``replica`` if it changed; None if nothing to do."""
        state = await self._state(replica.bucket)
        if state.in_flight or replica.opening_on_thread:
            return None
        kv = replica.kv
        if kv.failed is not None:
            return None  # RocksDB refuses writes (a flush is one); the replica reopens it first
        if kv.applied_offset <= state.last_log_offset or (kv.applied_offset == 0 and state.last_log_offset < 0):
            return None
        try:
            snapshot_id = await self._committer.next_snapshot_id(replica.bucket)
        except Exception as exc:  # the metadata store cannot hand out an id (a full disk): try next time
            state.errors += 1
            log.warning("snapshot of %s cannot start (attempt %d): %s", replica.bucket, state.errors, exc)
            return None
        state.in_flight = True
        local = self._local_dir / f"{replica.bucket.table_id}-{replica.bucket.partition_id}-{replica.bucket.bucket}-{snapshot_id}"
        remote_dir = bucket_remote_dir(replica.table.path, replica.bucket)
        leader_epoch = replica.leader_epoch  # the epoch its content was written under
        try:
            checkpoint = await kv.create_checkpoint_settled(local)
            completed = await asyncio.to_thread(
                upload_checkpoint,
                checkpoint,
                instance_id=kv.instance_id,
                remote=self._remote,
                remote_dir=remote_dir,
                bucket=replica.bucket,
                snapshot_id=snapshot_id,
                reusable_shared=state.shared_files,
                created_ms=self._clock.now_ms(),
            )
            await commit_uploaded(self._committer, self._remote, completed, state.shared_files, leader_epoch)
            state.last_log_offset = completed.log_offset
            state.shared_files = tuple(f for f in completed.files if f.shared)
            state.errors = 0
            log.info("snapshot %d of %s at offset %d (%d rows, %d new bytes)", snapshot_id, replica.bucket,
                     completed.log_offset, completed.row_count, completed.incremental_size_bytes)
            return completed
        except Exception as exc:
            state.errors += 1
            log.warning("snapshot %d of %s failed (attempt %d): %s", snapshot_id, replica.bucket, state.errors, exc)
            return None
        finally:
            state.in_flight = False
            await asyncio.to_thread(shutil.rmtree, local, True)

    # ---- log retention ----
    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self._retention_check_interval_ms / 1000)
            try:
                await self.apply_log_retention()
            except Exception:
                log.exception("log retention failed")

    async def apply_log_retention(self) -> int:
        """Delete expired log segments of every open bucket; returns the bytes freed. A primary-key bucket
        keeps its changelog from its oldest retained snapshot on, a lake-enabled table's bucket what the lake
        does not hold yet (strom/tablet/retained_offsets.py)."""
        now = self._clock.now_ms()
        freed = 0
        for replica in self._replicas.hosted():
            if not replica.is_open or replica.stopped:
                continue
            override_ms = replica.table.options.log_ttl_ms
            ttl_ms = override_ms if override_ms is not None else int(self._default_log_ttl.total_seconds() * 1000)
            if ttl_ms <= 0:
                continue
            below: int | None = None
            retained = self._replicas.retained
            if replica.is_kv:
                below = retained.kv_min_retain(replica.bucket)
                if below is None:  # not told since start: read the snapshot records
                    oldest = await self._committer.oldest_snapshot(replica.bucket)
                    if oldest is None:
                        continue  # without a snapshot the whole changelog is needed to rebuild the bucket
                    if replica.stopped or not replica.is_open:
                        continue  # stopped while the snapshot was read
                    below = oldest.log_offset
            if replica.table.options.datalake_enabled:
                in_lake = retained.lake_end_offset(replica.bucket)
                below = in_lake if below is None else min(below, in_lake)
            freed += replica.log.delete_segments(older_than_ms=now - ttl_ms, below_offset=below)
        return freed
