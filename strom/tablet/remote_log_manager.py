"""Copying closed log segments to remote storage, and serving reads of them (Fluss's RemoteLogManager).

Every ``remote.log.task-interval-duration``, each bucket this server leads copies its rolled segments below
the high watermark (at most ``remote.log.task-max-upload-segments`` a run) to its remote log tablet
directory (:mod:`strom.remote.log_layout`), each with a sparse offset index; drops remote segments older than
``table.log.ttl``; writes a new manifest; and commits it through the coordinator
(CommitRemoteLogManifest). Only after the commit does it delete the copied segments' local files, keeping the
last ``table.log.tiered.local-segments`` (and, for a primary-key table, everything from its oldest KV
snapshot on, which recovery replays). So at any moment each offset is local, or remote and recorded.

A kill at any step leaves files no committed manifest leads to: the bucket's next leader deletes them
before its first upload. A failed or refused commit deletes its own files at once.

FetchLog below the local log start is answered with the remote segments that hold the offset and every
later one (``remote_log_fetch_info``): clients read them straight from remote storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from strom.clock import Clock
from strom.errors import StromError
from strom.ids import TableBucket
from strom.kv.snapshot import CompletedKvSnapshot
from strom.log.segment import LogSegment
from strom.metadata.store import RemoteLogManifestStore
from strom.metadata.table_info import TableInfo
from strom.remote import log_layout
from strom.remote.log_layout import RemoteLogManifest, RemoteLogManifestHandle, RemoteLogSegment
from strom.remote.storage import RemoteStorage
from strom.rpc.messages import pb
from strom.tablet.replica import Replica, ReplicaManager

log = logging.getLogger(__name__)

CommitManifest = Callable[[Any], Awaitable[Any]]
"""Sends a CommitRemoteLogManifestRequest to the coordinator; returns its response."""
ReadHandle = Callable[[TableBucket], "bytes | None"]
"""The bucket's manifest handle as the coordinator recorded it (from the metadata store)."""
PartitionName = Callable[[int], "str | None"]
OldestSnapshot = Callable[[TableBucket], "Awaitable[CompletedKvSnapshot | None]"]


def handle_reader(store: RemoteLogManifestStore) -> ReadHandle:
    """Reads a bucket's manifest handle from the metadata store the coordinator writes it to."""
    return lambda bucket: store.get_remote_log_manifest(bucket.table_id, bucket.partition_id, bucket.bucket)


@dataclass(slots=True)
class RemoteLogTablet:
    """What this server knows of one bucket's remote log."""

    tablet_dir: str
    """Relative to the remote root."""
    manifest: RemoteLogManifest
    manifest_path: str | None
    """The committed manifest's location (None: nothing committed yet)."""
    leader_epoch: int
    """The leader epoch whose first round swept orphans with this state (NOT_SWEPT: loaded as a follower,
    so a leadership's first round loads and sweeps again)."""
    indexes: dict[str, bytes] = field(default_factory=dict)
    """Offset indexes of segments, by segment id (loaded on demand)."""


@dataclass(frozen=True, slots=True)
class RemoteLogSettings:
    interval_ms: int
    max_upload_segments: int
    index_interval_bytes: int
    default_ttl: timedelta


NOT_SWEPT = -1


class RemoteLogManager:
    """Owned by the event loop; file transfers run in worker threads."""

    def __init__(
        self,
        replicas: ReplicaManager,
        storage: RemoteStorage,
        settings: RemoteLogSettings,
        clock: Clock,
        *,
        read_handle: ReadHandle,
        commit: CommitManifest,
        partition_name: PartitionName,
        oldest_snapshot: OldestSnapshot,
        coordinator_epoch: Callable[[], int] = lambda: 0,
    ) -> None:
        self._replicas = replicas
        self._storage = storage
        self._settings = settings
        self._clock = clock
        self._read_handle = read_handle
        self._commit = commit
        self._partition_name = partition_name
        self._oldest_snapshot = oldest_snapshot
        self._coordinator_epoch = coordinator_epoch
        self._tablets: dict[TableBucket, RemoteLogTablet] = {}
        self._task: asyncio.Task[None] | None = None
        self._index_loads: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.uploaded_bytes = 0

    @property
    def enabled(self) -> bool:
        return self._settings.interval_ms > 0

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._index_loads) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    async def _loop(self) -> None:
        while True:  # at once first: readers of a restarted server find the remote logs
            await self.run_once()
            await asyncio.sleep(self._settings.interval_ms / 1000)

    async def run_once(self) -> None:
        """One round over every hosted bucket: leaders copy and expire, followers follow the manifest."""
        async with self._lock:
            # a bucket never written has nothing to copy
            hosted = [r for r in self._replicas.hosted() if not r.stopped and (r.is_open or r.directory.exists())]
            # on threads of their own: the loop serves requests meanwhile, theirs open first
            await self._replicas.opened((r.bucket for r in hosted if not r.is_open), background=True)
            for replica in hosted:
                if replica.stopped:
                    continue
                try:
                    if not replica.is_open:  # opens it, KV state too, as its first request would
                        self._replicas.get_hosted(replica.bucket).open()
                    if replica.is_leader:
                        await self._tier(replica)
                    else:
                        await self._follow(replica)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the next round tries again; nothing local went before a commit
                    log.warning("remote log of %s: %s", replica.bucket, exc)

    # ---- state ----
    def _tablet_dir(self, table: TableInfo, bucket: TableBucket) -> tuple[str, str | None]:
        partition = None if bucket.partition_id is None else self._partition_name(bucket.partition_id)
        if bucket.partition_id is not None and partition is None:
            raise LookupError(f"partition {bucket.partition_id} of '{table.path}' is gone")
        path = log_layout.tablet_dir(table.path.database_name, table.path.table_name, bucket, partition)
        return path, partition

    async def _load(self, replica: Replica, *, sweep: bool) -> RemoteLogTablet:
        """The bucket's remote log as the coordinator last recorded it; ``sweep``: delete what no committed
        manifest leads to (a new leader, before its first upload)."""
        bucket, table = replica.bucket, replica.table
        # the leadership this load sweeps for, taken before any await: a follower's load that a new
        # leadership overtakes mid-way must not pass for that leadership's sweep (its orphans would stay)
        swept_for = replica.leader_epoch if sweep else NOT_SWEPT
        tablet_dir, partition = self._tablet_dir(table, bucket)
        payload = await asyncio.to_thread(self._read_handle, bucket)
        manifest = RemoteLogManifest(table.path.database_name, table.path.table_name, bucket, partition)
        manifest_path = None
        if payload is not None:
            handle = RemoteLogManifestHandle.from_bytes(payload)
            manifest = RemoteLogManifest.from_bytes(await asyncio.to_thread(self._storage.read_bytes, handle.manifest_path))
            manifest_path = handle.manifest_path
        state = RemoteLogTablet(tablet_dir, manifest, manifest_path, swept_for)
        previous = self._tablets.get(bucket)
        if previous is not None:
            listed = {segment.segment_id for segment in manifest.segments}
            state.indexes = {k: v for k, v in previous.indexes.items() if k in listed}
        if sweep:
            await asyncio.to_thread(self._sweep_orphans, state)
        self._tablets[bucket] = state
        return state

    def _sweep_orphans(self, state: RemoteLogTablet) -> None:
        """Delete every file under the tablet directory that the committed manifest does not lead to: segment
        directories it does not list, and manifests but the current one."""
        kept = {segment.segment_id for segment in state.manifest.segments}
        current = None if state.manifest_path is None else self._storage.relative(state.manifest_path)
        deleted = 0
        for location in self._storage.list_files(state.tablet_dir):
            relative = self._storage.relative(location)
            directory = relative[len(state.tablet_dir) + 1:].split("/", 1)[0]  # a segment id, or "metadata"
            if relative == current or directory in kept:
                continue
            self._storage.delete(location)
            deleted += 1
        if deleted:
            self._storage.delete_empty_dirs(state.tablet_dir)
            log.info("deleted %d remote log files of %s that no committed manifest references",
                     deleted, state.manifest.bucket)

    # ---- leading ----
    async def _tier(self, replica: Replica) -> None:
        state = self._tablets.get(replica.bucket)
        if state is None or state.leader_epoch != replica.leader_epoch:
            state = await self._load(replica, sweep=True)
        log_tablet = replica.log
        manifest = state.manifest
        expired = self._expired(replica, manifest)
        end = manifest.end_offset
        candidates = log_tablet.closed_segments(log_tablet.high_watermark)
        if end is not None:
            if candidates and candidates[0].base_offset > end:
                # the local log lost segments that were never copied (retention ran first): the remote log
                # starts afresh at the local log start, so it never has a gap
                log.warning("%s: local segments [%d, %d) were deleted before their upload; the remote log "
                            "starts again at %d", replica.bucket, end, candidates[0].base_offset,
                            candidates[0].base_offset)
                expired = list(manifest.segments)
            else:
                candidates = [segment for segment in candidates if segment.base_offset >= end]
        candidates = candidates[: self._settings.max_upload_segments]
        uploaded: list[tuple[RemoteLogSegment, bytes]] = []
        for segment in candidates:
            try:
                uploaded.append(await self._upload(state, segment))
            except Exception as exc:
                log.warning("%s: uploading segment %d failed: %s", replica.bucket, segment.base_offset, exc)
                break
        if (uploaded or expired) and not await self._commit_manifest(replica, state, expired, uploaded):
            return
        await self._delete_local(replica, state)

    def _expired(self, replica: Replica, manifest: RemoteLogManifest) -> list[RemoteLogSegment]:
        """Segments past ``table.log.ttl``, oldest first; of a lake-enabled table only those the lake holds
        whole (Fluss's rule: the log is the lake's source until it is tiered)."""
        table = replica.table
        override_ms = table.options.log_ttl_ms
        ttl_ms = override_ms if override_ms is not None else int(self._settings.default_ttl.total_seconds() * 1000)
        if ttl_ms <= 0:
            return []
        cutoff = self._clock.now_ms() - ttl_ms
        expired = []
        in_lake = self._replicas.retained.lake_end_offset(replica.bucket) if table.options.datalake_enabled else None
        for segment in manifest.segments:
            if segment.max_timestamp >= cutoff or (in_lake is not None and segment.end_offset > in_lake):
                break
            expired.append(segment)
        return expired

    async def _upload(self, state: RemoteLogTablet, segment: LogSegment) -> tuple[RemoteLogSegment, bytes]:
        """Copy one closed segment and its offset index; nothing refers to them until a manifest does."""
        segment_id = log_layout.new_segment_id()
        index = log_layout.encode_offset_index(segment.base_offset, segment.batch_ends(),
                                               self._settings.index_interval_bytes)
        remote = RemoteLogSegment(segment_id, segment.base_offset, segment.next_offset, segment.last_timestamp,
                                  segment.size_bytes)
        data_file = log_layout.segment_log_file(state.tablet_dir, segment_id, segment.base_offset)
        index_file = log_layout.segment_index_file(state.tablet_dir, segment_id, segment.base_offset)
        path = segment.path

        def copy() -> None:
            try:
                self._storage.write_bytes(index_file, index)
                size = self._storage.put_file(path, data_file)
                if size != remote.size_bytes:
                    raise OSError(f"segment {path} is {size} bytes, {remote.size_bytes} were expected")
            except BaseException:
                self._delete_segment_files(state.tablet_dir, segment_id)
                raise

        await asyncio.to_thread(copy)
        self.uploaded_bytes += remote.size_bytes
        return remote, index

    def _delete_segment_files(self, tablet_dir: str, segment_id: str) -> None:
        with contextlib.suppress(OSError):
            self._storage.delete_tree(log_layout.segment_dir(tablet_dir, segment_id))

    async def _commit_manifest(
        self, replica: Replica, state: RemoteLogTablet, expired: list[RemoteLogSegment],
        uploaded: list[tuple[RemoteLogSegment, bytes]],
    ) -> bool:
        """Write and commit the manifest with ``expired`` out and ``uploaded`` in; on success delete what
        the old manifest had alone, on failure what this round wrote. True when committed."""
        added = [segment for segment, _index in uploaded]
        manifest = state.manifest.changed(expired, added)
        manifest_file = log_layout.new_manifest_file(state.tablet_dir)
        manifest_path = self._storage.url(manifest_file)
        committed = False
        try:
            await asyncio.to_thread(self._storage.write_bytes, manifest_file, manifest.to_bytes())
            bucket = replica.bucket
            request = pb.CommitRemoteLogManifestRequest(
                table_id=bucket.table_id, bucket_id=bucket.bucket, remote_log_manifest_path=manifest_path,
                remote_log_start_offset=manifest.start_offset if manifest.start_offset is not None else 0,
                remote_log_end_offset=manifest.end_offset if manifest.end_offset is not None else 0,
                coordinator_epoch=self._coordinator_epoch(), bucket_leader_epoch=replica.leader_epoch,
            )
            if bucket.partition_id is not None:
                request.partition_id = bucket.partition_id
            try:
                response = await self._commit(request)
                committed = bool(response.commitSuccess)
            except StromError:
                raise  # the coordinator answered: refused
            except Exception:
                # no answer (the connection broke): the commit may have landed; the record says
                payload = await asyncio.to_thread(self._read_handle, bucket)
                committed = payload is not None and RemoteLogManifestHandle.from_bytes(payload).manifest_path == manifest_path
                if not committed:
                    raise
        finally:
            if not committed:  # nothing refers to this round's files: remove them
                def discard() -> None:
                    for segment in added:
                        self._delete_segment_files(state.tablet_dir, segment.segment_id)
                    with contextlib.suppress(OSError):
                        self._storage.delete(manifest_file)

                await asyncio.shield(asyncio.to_thread(discard))
        if not committed:
            return False
        previous_path = state.manifest_path
        state.manifest, state.manifest_path = manifest, manifest_path
        state.indexes.update({segment.segment_id: index for segment, index in uploaded})
        for segment in expired:
            state.indexes.pop(segment.segment_id, None)

        def clean() -> None:
            for segment in expired:
                self._delete_segment_files(state.tablet_dir, segment.segment_id)
            if previous_path is not None:
                with contextlib.suppress(OSError):
                    self._storage.delete(previous_path)

        await asyncio.to_thread(clean)
        if added:
            log.info("%s: copied offsets [%d, %d) to remote storage (%d segments)", replica.bucket,
                     added[0].start_offset, added[-1].end_offset, len(added))
        return True

    async def _delete_local(self, replica: Replica, state: RemoteLogTablet) -> None:
        """Delete local segments the remote log holds, keeping ``table.log.tiered.local-segments`` (and a
        primary-key bucket's changelog from its oldest KV snapshot on); of those, segments older than
        ``table.log.local-ttl`` go too, whatever the count (Fluss's local retention of a tiered log)."""
        end = state.manifest.end_offset
        if end is None:
            return
        bound = end
        if replica.is_kv:
            retain = self._replicas.retained.kv_min_retain(replica.bucket)
            if retain is None:  # not told since start: read the snapshot records
                oldest = await self._oldest_snapshot(replica.bucket)
                if oldest is None:
                    return  # recovery replays the whole changelog
                if replica.stopped or not replica.is_open:
                    return  # stopped while the snapshot was read
                retain = oldest.log_offset
            bound = min(bound, retain)
        options = replica.table.options
        freed = replica.log.delete_tiered_segments(bound, options.tiered_local_segments)
        local_ttl_ms = options.log_local_ttl_ms
        if local_ttl_ms is not None and local_ttl_ms > 0:
            freed += replica.log.delete_segments(older_than_ms=self._clock.now_ms() - local_ttl_ms, below_offset=bound)
        if freed:
            log.info("%s: deleted %d bytes of local log held in remote storage", replica.bucket, freed)

    # ---- following ----
    async def _follow(self, replica: Replica) -> None:
        """A follower never uploads; it reads what its leader committed and deletes its own local copies."""
        state = await self._load(replica, sweep=False)
        await self._delete_local(replica, state)

    async def notify_remote_log_offsets(self, request: Any, _context: object) -> Any:
        """NotifyRemoteLogOffsets (1028): the leader of a bucket this server follows committed a manifest."""
        partition_id = request.partition_id if request.HasField("partition_id") else None
        bucket = TableBucket(request.table_id, request.bucket_id, partition_id)
        replica = self._replicas.get_hosted(bucket)
        if replica.is_open and not replica.stopped and not replica.is_leader:
            async with self._lock:
                await self._follow(replica)
        return pb.NotifyRemoteLogOffsetsResponse()

    # ---- serving ----
    async def ensure_loaded(self, replica: Replica) -> None:
        """Know the bucket's remote log before serving a read below its local log (a restarted server's
        first round may not have reached it yet)."""
        if replica.bucket not in self._tablets:
            await self._load(replica, sweep=False)

    def start_offset(self, bucket: TableBucket) -> int | None:
        """Where the bucket's remote log starts (None: no remote log known here)."""
        state = self._tablets.get(bucket)
        return None if state is None else state.manifest.start_offset

    def remote_size_bytes(self, bucket: TableBucket) -> int:
        state = self._tablets.get(bucket)
        return 0 if state is None else state.manifest.size_bytes

    def remote_end_offset(self, bucket: TableBucket) -> int | None:
        state = self._tablets.get(bucket)
        return None if state is None else state.manifest.end_offset

    def fetch_info(self, bucket: TableBucket, offset: int) -> Any | None:
        """``remote_log_fetch_info`` for a read at ``offset``: the remote segment holding it and every later
        one; None when no remote segment holds it."""
        state = self._tablets.get(bucket)
        if state is None:
            return None
        segments = state.manifest.segments_from(offset)
        if not segments:
            return None
        info = pb.PbRemoteLogFetchInfo(remote_log_tablet_dir=self._storage.url(state.tablet_dir))
        if state.manifest.partition_name is not None:
            info.partition_name = state.manifest.partition_name
        for segment in segments:
            info.remote_log_segments.add(
                remote_log_segment_id=segment.segment_id, remote_log_start_offset=segment.start_offset,
                remote_log_end_offset=segment.end_offset, segment_size_in_bytes=segment.size_bytes,
                max_timestamp=segment.max_timestamp,
            )
        first = segments[0]
        index = state.indexes.get(first.segment_id)
        if index is None:
            self._load_index(state, first)
            info.first_start_pos = 0  # correct, only slower: readers skip records below their offset
        else:
            info.first_start_pos = log_layout.lookup_position(index, first.start_offset, offset)
        return info

    def _load_index(self, state: RemoteLogTablet, segment: RemoteLogSegment) -> None:
        async def load() -> None:
            location = log_layout.segment_index_file(state.tablet_dir, segment.segment_id, segment.start_offset)
            try:
                state.indexes[segment.segment_id] = await asyncio.to_thread(self._storage.read_bytes, location)
            except (OSError, ValueError) as exc:
                log.info("could not read the offset index %s: %s", location, exc)

        if len(self._index_loads) < 16:
            task = asyncio.get_running_loop().create_task(load())
            self._index_loads.add(task)
            task.add_done_callback(self._index_loads.discard)

    def forget(self, table_id: int, partition_id: int | None = None) -> None:
        """A dropped table's (or partition's) buckets: their remote logs are the coordinator's to delete."""
        for bucket in [b for b in self._tablets if b.table_id == table_id
                       and (partition_id is None or b.partition_id == partition_id)]:
            del self._tablets[bucket]


__all__ = ["RemoteLogManager", "RemoteLogSettings", "RemoteLogTablet", "handle_reader"]
