"""The coordinator's record of completed KV snapshots, and their retention.

Each bucket keeps its ``kv.snapshot.num-retained`` newest snapshots plus every older one a lease pins.
Retention runs when a bucket commits a snapshot *and* whenever a pin goes away (release, drop, expiry,
table drop), so a released snapshot's files are freed at once even if its bucket never writes again —
Fluss only cleans on the next commit. A file is deleted only when no remaining snapshot of the bucket
references it (SSTs are shared between a bucket's snapshots).

Metadata changes happen on the event loop; file deletions run in worker threads (they are idempotent,
and a failed one is retried at the next cleanup of that bucket).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from strom.errors import KvSnapshotNotExistError
from strom.ids import TableBucket
from strom.kv.snapshot import KV_ROOT, CompletedKvSnapshot, snapshot_sequence_name
from strom.metadata.off_loop import off_loop
from strom.metadata.store import KvSnapshotRecord, MetadataStore
from strom.remote.storage import RemoteStorage

log = logging.getLogger(__name__)

IsLeased = Callable[[TableBucket, int], bool]
"""Whether a lease pins ``(bucket, snapshot id)``: such snapshots are kept outside the window."""


@dataclass(slots=True)
class _BucketSnapshots:
    snapshots: dict[int, CompletedKvSnapshot]
    orphaned_files: set[str]
    """Files of deleted snapshots whose deletion has not succeeded yet."""


class KvSnapshotStore:
    """All buckets' completed snapshots. Owned by the event loop."""

    def __init__(self, store: MetadataStore, remote: RemoteStorage, num_retained: int, is_leased: IsLeased) -> None:
        if num_retained <= 0:
            raise ValueError(f"kv.snapshot.num-retained must be positive, got {num_retained}")
        self._store = store
        self._remote = remote
        self._num_retained = num_retained
        self._is_leased = is_leased
        self._buckets: dict[TableBucket, _BucketSnapshots] = {}
        self._cleanups: set[asyncio.Task[None]] = set()
        self._retention = asyncio.Lock()
        for record in store.list_kv_snapshots():
            snapshot = CompletedKvSnapshot.from_json(record.snapshot_json)
            self._bucket(snapshot.bucket).snapshots[snapshot.snapshot_id] = snapshot

    def _bucket(self, bucket: TableBucket) -> _BucketSnapshots:
        entry = self._buckets.get(bucket)
        if entry is None:
            entry = self._buckets[bucket] = _BucketSnapshots({}, set())
        return entry

    # ---- queries ----
    def exists(self, bucket: TableBucket, snapshot_id: int) -> bool:
        entry = self._buckets.get(bucket)
        return entry is not None and snapshot_id in entry.snapshots

    def buckets(self) -> list[TableBucket]:
        return list(self._buckets)

    def latest(self, bucket: TableBucket) -> CompletedKvSnapshot | None:
        entry = self._buckets.get(bucket)
        if entry is None or not entry.snapshots:
            return None
        return entry.snapshots[max(entry.snapshots)]

    def oldest(self, bucket: TableBucket) -> CompletedKvSnapshot | None:
        """The oldest snapshot still stored: inside the retention window, or kept by a lease."""
        entry = self._buckets.get(bucket)
        if entry is None or not entry.snapshots:
            return None
        return entry.snapshots[min(entry.snapshots)]

    def get(self, bucket: TableBucket, snapshot_id: int) -> CompletedKvSnapshot:
        entry = self._buckets.get(bucket)
        if entry is None or snapshot_id not in entry.snapshots:
            raise KvSnapshotNotExistError(f"Snapshot {snapshot_id} of {bucket} does not exist.")
        return entry.snapshots[snapshot_id]

    def snapshots(self, table_id: int, partition_id: int | None = None) -> list[CompletedKvSnapshot]:
        """Every stored snapshot of a table (or one partition), by bucket then id."""
        found = [
            snapshot
            for bucket, entry in self._buckets.items()
            if bucket.table_id == table_id and (partition_id is None or bucket.partition_id == partition_id)
            for snapshot in entry.snapshots.values()
        ]
        return sorted(found, key=lambda s: (s.bucket.partition_id or -1, s.bucket.bucket, s.snapshot_id))

    # ---- writes ----
    async def next_snapshot_id(self, bucket: TableBucket) -> int:
        return await off_loop(self._store.next_id, snapshot_sequence_name(bucket))

    async def add(self, snapshot: CompletedKvSnapshot) -> None:
        """Record a committed snapshot, then apply retention to its bucket."""
        await off_loop(
            self._store.add_kv_snapshot,
            KvSnapshotRecord(
                snapshot.bucket.table_id,
                snapshot.bucket.partition_id,
                snapshot.bucket.bucket,
                snapshot.snapshot_id,
                snapshot.to_json(),
            )
        )
        self._bucket(snapshot.bucket).snapshots[snapshot.snapshot_id] = snapshot
        # The snapshot is committed from here on: a retention failure must not make the caller treat
        # the commit as failed (and delete the files of what is now the latest snapshot).
        await self.apply_retention([snapshot.bucket])

    async def apply_retention(self, buckets: Iterable[TableBucket]) -> None:
        """Delete snapshots of ``buckets`` that are outside the retention window and not leased.

        Never raises: a snapshot whose metadata cannot be deleted stays (in memory and in the store),
        and retention tries again at the bucket's next commit or pin change. One pass at a time, so two
        never pick the same victims.
        """
        async with self._retention:
            await self._apply_retention(set(buckets))

    async def _apply_retention(self, buckets: set[TableBucket]) -> None:
        for bucket in buckets:
            entry = self._buckets.get(bucket)
            if entry is None:
                continue
            ids = sorted(entry.snapshots)
            retained = set(ids[-self._num_retained :])
            victims = [i for i in ids if i not in retained and not self._is_leased(bucket, i)]
            if not victims and not entry.orphaned_files:
                continue
            private_dirs = []
            for snapshot_id in victims:
                try:
                    await off_loop(self._store.delete_kv_snapshot, bucket.table_id, bucket.partition_id, bucket.bucket,
                                   snapshot_id)
                except Exception as exc:
                    log.warning("cannot delete snapshot %d of %s (will retry): %s", snapshot_id, bucket, exc)
                    break
                victim = entry.snapshots.pop(snapshot_id, None)
                if victim is None:
                    continue  # the bucket's table was dropped meanwhile
                entry.orphaned_files.update(f.remote_path for f in victim.files)
                entry.orphaned_files.add(victim.metadata_path)
                private_dirs.append(victim.metadata_path.rsplit("/", 1)[0])
            still_used = {f.remote_path for s in entry.snapshots.values() for f in s.files}
            still_used |= {s.metadata_path for s in entry.snapshots.values()}
            doomed = sorted(entry.orphaned_files - still_used)
            entry.orphaned_files -= set(doomed)
            if doomed:
                self._delete_files(bucket, doomed, private_dirs)

    def _delete_files(self, bucket: TableBucket, locations: list[str], directories: Sequence[str] = ()) -> None:
        """Delete files (then the emptied snapshot directories) off the event loop; failures are retried
        at the bucket's next cleanup, or by the start-up sweep."""

        async def delete() -> None:
            failed = []
            for location in locations:
                try:
                    await asyncio.to_thread(self._remote.delete, location)
                except OSError as exc:
                    log.warning("cannot delete %s of %s (will retry): %s", location, bucket, exc)
                    failed.append(location)
            for directory in directories:
                try:
                    await asyncio.to_thread(self._remote.delete_tree, directory)
                except OSError as exc:
                    log.warning("cannot delete %s of %s: %s", directory, bucket, exc)
            entry = self._buckets.get(bucket)
            if failed and entry is not None:  # a dropped bucket's leftovers wait for the start-up sweep
                entry.orphaned_files.update(failed)

        task = asyncio.ensure_future(delete())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    def drop_table(self, table_id: int, partition_id: int | None = None, remote_dir: str | None = None) -> None:
        """Forget a dropped table's (or partition's) snapshots and delete their files; ``remote_dir`` (the
        table's or partition's snapshot directory) is then removed whole, taking files no record names.

        The records are gone with the table's metadata already (the store drops them with the table), so a
        crash before the files are deleted leaves only unreferenced files: :meth:`sweep_unreferenced`
        removes those at the next start.
        """
        dropped = [
            bucket
            for bucket in self._buckets
            if bucket.table_id == table_id and (partition_id is None or bucket.partition_id == partition_id)
        ]
        for bucket in dropped:
            entry = self._buckets.pop(bucket)
            locations = {f.remote_path for s in entry.snapshots.values() for f in s.files} | entry.orphaned_files
            locations |= {s.metadata_path for s in entry.snapshots.values()}
            directories = sorted({s.metadata_path.rsplit("/", 1)[0] for s in entry.snapshots.values()})
            self._delete_files(bucket, sorted(locations), directories)
        if remote_dir is not None:
            self._delete_files(TableBucket(table_id, -1, partition_id), [], [remote_dir])

    def referenced_files(self) -> set[str]:
        """Every remote file a stored snapshot needs (its data files and its metadata file)."""
        return {
            location
            for entry in self._buckets.values()
            for snapshot in entry.snapshots.values()
            for location in (snapshot.metadata_path, *(f.remote_path for f in snapshot.files))
        }

    async def sweep_unreferenced(self) -> int:
        """Delete every file under the remote snapshot root that no stored snapshot references: files whose
        deletion failed before a restart, partial uploads of a killed process, tables whose files a crash
        kept from being deleted. Run at start-up, before any upload can be in flight. Returns the count."""
        referenced = self.referenced_files()
        present = await asyncio.to_thread(self._remote.list_files, KV_ROOT)
        doomed = [location for location in present if location not in referenced]
        for location in doomed:
            try:
                await asyncio.to_thread(self._remote.delete, location)
            except OSError as exc:
                log.warning("cannot delete unreferenced snapshot file %s: %s", location, exc)
        await asyncio.to_thread(self._remote.delete_empty_dirs, KV_ROOT)
        if doomed:
            log.info("removed %d unreferenced snapshot files", len(doomed))
        return len(doomed)

    async def wait_for_cleanups(self) -> None:
        """Wait until every file deletion started so far has finished (tests and shutdown)."""
        while self._cleanups:
            await asyncio.gather(*list(self._cleanups), return_exceptions=True)

    # ---- metrics ----
    def retained_per_table(self) -> dict[int, tuple[int, int]]:
        """``table id -> (snapshot count, bytes)``; shared files count once per bucket."""
        totals: dict[int, tuple[int, int]] = {}
        for bucket, entry in self._buckets.items():
            files = {f.remote_path: f.size_bytes for s in entry.snapshots.values() for f in s.files}
            count, size = totals.get(bucket.table_id, (0, 0))
            totals[bucket.table_id] = (count + len(entry.snapshots), size + sum(files.values()))
        return totals
