"""The coordinator's lake RPCs: LakeTieringHeartbeat, PrepareLakeTableSnapshot, CommitLakeTableSnapshot,
GetLakeSnapshot, and strom's DescribeLakeTiering.

Per-table errors go into the responses: a request about one table never fails another. Remote I/O (the
offsets files) runs in worker threads; every check that an ``await`` could invalidate is made again after
it, and the store is written in an await-free stretch right after the last check.

Beyond Fluss, prepare and commit accept a ``tiering_epoch`` (strom's field 100 of ``PbTableOffsets`` and
``PbLakeTableSnapshotMetadata``): when present, the call is refused unless a round of the table runs under
that epoch. Official clients never send it and are served as Fluss serves them. Whoever commits, a lake
snapshot never moves a bucket's offset back, and a prepare naming an offset beyond its bucket's high
watermark (asked of the bucket's leader) is refused: no caller can record lake offsets the log has not
reached, which would make every honest commit after it look like a step back. Errors name the caller's
own table path or id, never the real path behind an id or a remote directory. An offsets file prepared but
never committed is deleted at the table's next commit, and a table keeps at most
:data:`UNCOMMITTED_FILES_MAX` of them in between. Who may call these RPCs at all is the authorizer's
(``strom.security.access``: ALTER on the cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from strom.coordinator.gateway import TabletServerGateway
from strom.coordinator.lake_snapshots import (
    LakeSnapshot,
    decode_offsets_file,
    encode_offsets_file,
    lake_table_dir,
    offsets_file_dir,
    snapshots_to_discard,
)
from strom.coordinator.lake_tiering import UNKNOWN, LakeTableTieringManager
from strom.coordinator.service import CoordinatorService
from strom.errors import (
    InvalidCoordinatorError,
    LakeSnapshotNotExistError,
    LogOffsetOutOfRangeError,
    PartitionNotExistError,
    StorageError,
    StromError,
    TableNotExistError,
    UnknownTableOrBucketError,
    UnsupportedVersionError,
    code_for_exception,
)
from strom.ids import TableBucket, TablePath
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.remote.storage import RemoteStorage
from strom.rpc.api_keys import COORDINATOR_EPOCH
from strom.rpc.messages import ext, pb

log = logging.getLogger(__name__)

UNCOMMITTED_FILES_MAX = 8
"""Offsets files a table may hold from prepares not yet committed; a prepare beyond deletes the oldest."""
TICK_INTERVAL_MS = 100
"""How often the loop task fires due schedules (heartbeat timeouts are checked at their own interval)."""
IDLE_TICK_INTERVAL_MS = 1_000
"""How often it looks while no lake table is scheduled or tiering (a safety net: arming wakes it)."""


def _set_error(target: Any, exc: StromError) -> None:
    target.error_code, target.error_message = code_for_exception(exc)


def _bucket(table_id: int, entry: Any) -> TableBucket:
    return TableBucket(table_id, entry.bucket_id, entry.partition_id if entry.HasField("partition_id") else None)


def _optional(message: Any, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


class LakeTieringService:
    """Serves the lake RPCs from the tiering manager, the metadata store and remote storage (event loop)."""

    def __init__(
        self, coordinator: CoordinatorService, manager: LakeTableTieringManager, store: MetadataStore,
        remote: RemoteStorage, tablets: TabletServerGateway,
    ) -> None:
        self._tablets = tablets
        self._uncommitted: dict[int, list[str]] = {}
        """Per table, the offsets files prepared since its last commit, oldest first."""
        self._coordinator = coordinator
        self._manager = manager
        self._store = store
        self._remote = remote
        self._ticker: asyncio.Task[None] | None = None
        self._committing = asyncio.Lock()

    def start(self) -> None:
        async def tick() -> None:
            manager = self._manager
            while True:
                manager.armed.clear()
                if manager.idle():  # no lake table: wait for one instead of waking ten times a second
                    with contextlib.suppress(TimeoutError):  # not wait_for: see LeaderElector._run
                        async with asyncio.timeout(IDLE_TICK_INTERVAL_MS / 1000):
                            await manager.armed.wait()
                await asyncio.sleep(TICK_INTERVAL_MS / 1000)
                try:
                    await self._manager.tick()
                except StromError as exc:  # e.g. a store write; the timers fire again next tick
                    log.warning("lake tiering timers: %s", exc)
                except Exception:
                    log.exception("lake tiering timers failed")

        self._ticker = asyncio.get_running_loop().create_task(tick())

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker

    # ---- LakeTieringHeartbeat ----
    async def lake_tiering_heartbeat(self, request: Any, _context: object) -> Any:
        """Fluss's order: failed rounds, renewals, finished rounds, then (if asked) one table to tier."""
        manager = self._manager
        response = pb.LakeTieringHeartbeatResponse(coordinator_epoch=COORDINATOR_EPOCH)
        forced = set(request.force_finished_tables)

        async def each(tables: Any, target: Any, action: Any) -> None:
            for table in tables:
                entry = target.add(table_id=table.table_id)
                try:
                    if table.coordinator_epoch != COORDINATOR_EPOCH:
                        raise InvalidCoordinatorError(
                            f"The coordinator epoch {table.coordinator_epoch} is not the current "
                            f"{COORDINATOR_EPOCH}."
                        )
                    done = action(table)
                    if done is not None:
                        await done
                except StromError as exc:
                    _set_error(entry.error, exc)

        def finish(table: Any) -> Any:
            stats = _optional(table, "lake_tiering_stats")
            return manager.finish(
                table.table_id, table.tiering_epoch, table.table_id in forced,
                _optional(stats, "file_size") if stats is not None else None,
                _optional(stats, "record_count") if stats is not None else None,
            )

        await each(request.failed_tables, response.failed_table_resp,
                   lambda t: manager.fail(t.table_id, t.tiering_epoch, t.failure_reason))
        await each(request.tiering_tables, response.tiering_table_resp,
                   lambda t: manager.renew(t.table_id, t.tiering_epoch))
        await each(request.finished_tables, response.finished_table_resp, finish)
        if request.request_table:
            assignment = await manager.request_table()
            if assignment is not None:
                response.tiering_table.table_id = assignment.table_id
                response.tiering_table.table_path.database_name = assignment.path.database_name
                response.tiering_table.table_path.table_name = assignment.path.table_name
                response.tiering_table.tiering_epoch = assignment.tiering_epoch
                log.info("handing %s to a tiering job (epoch %d)", assignment.path, assignment.tiering_epoch)
        return response

    # ---- checks shared by prepare and commit ----
    def _table(self, table_id: int, path: TablePath | None, tiering_epoch: int | None) -> TableInfo:
        """The table ``table_id`` (still at ``path``), held under ``tiering_epoch`` when one is given."""
        if tiering_epoch is not None:
            self._manager.check_tiering(table_id, tiering_epoch)
        table = self._coordinator.table_info_by_id(table_id)
        if table is None:
            raise TableNotExistError(f"The table {table_id} doesn't exist.")
        if path is not None and table.path != path:
            raise TableNotExistError(f"The table {table_id} is not '{path}'.")
        return table

    def _check_buckets(self, table: TableInfo, offsets: Mapping[TableBucket, int]) -> None:
        """Offsets name real buckets of the table (partition ids are not checked at commit: a partition
        dropped since the prepare keeps its offsets, as in Fluss)."""
        for bucket, offset in offsets.items():
            if not 0 <= bucket.bucket < table.bucket_count:
                raise UnknownTableOrBucketError(
                    f"Table '{table.path}' has {table.bucket_count} buckets; there is no bucket {bucket.bucket}."
                )
            if (bucket.partition_id is None) == table.is_partitioned:
                needs = "needs" if table.is_partitioned else "has no"
                raise UnknownTableOrBucketError(f"{bucket} of table '{table.path}': the table {needs} partitions.")
            if offset < 0:
                raise LogOffsetOutOfRangeError(f"The lake offset {offset} of {bucket} is negative.")

    def _offsets_location(self, table: TableInfo, location: str) -> str:
        """``location`` if it names an offsets file of ``table`` in remote storage (nothing else is read, and
        retention deletes nothing else)."""
        directory = self._remote.url(offsets_file_dir(table.path, table.table_id)) + "/"
        name = location[len(directory):] if location.startswith(directory) else ""
        if not name or "/" in name or name in (".", ".."):
            raise StromError(f"{location!r} is not an offsets file of table {table.table_id}")
        return location

    async def _read_offsets(self, table: TableInfo, location: str) -> dict[TableBucket, int]:
        self._offsets_location(table, location)
        try:
            raw = await asyncio.to_thread(self._remote.read_bytes, location)
        except FileNotFoundError:
            raise StromError(f"The lake offsets file {location} does not exist.") from None
        except (OSError, ValueError) as exc:
            raise StorageError(f"Cannot read the lake offsets file {location}: {exc}") from None
        table_id, offsets = decode_offsets_file(raw, location)
        if table_id != table.table_id:
            raise StromError(f"The offsets file {location} belongs to table {table_id}, not {table.table_id}.")
        self._check_buckets(table, offsets)
        return offsets

    async def _latest(self, table_id: int) -> LakeSnapshot | None:
        record = await off_loop(self._store.get_lake_snapshot, table_id)
        return LakeSnapshot.from_record(record) if record is not None else None

    # ---- PrepareLakeTableSnapshot ----
    async def prepare_lake_table_snapshot(self, request: Any, _context: object) -> Any:
        """Write each table's offsets file (merged over its latest lake snapshot) and return its path."""
        response = pb.PrepareLakeTableSnapshotResponse()
        for entry in request.bucket_offsets:
            result = response.prepare_lake_table_resp.add(table_id=entry.table_id)
            try:
                result.lake_table_offsets_path = await self._prepare(entry, request.ignore_previous_table_offsets)
            except StromError as exc:
                _set_error(result, exc)
        return response

    async def _prepare(self, entry: Any, ignore_previous: bool) -> str:
        path = TablePath(entry.table_path.database_name, entry.table_path.table_name)
        epoch = _optional(entry, "tiering_epoch")
        table = self._table(entry.table_id, path, epoch)
        new = {_bucket(table.table_id, b): b.log_end_offset for b in entry.bucket_offsets if b.HasField("log_end_offset")}
        self._check_buckets(table, new)
        for partition_id in {b.partition_id for b in new if b.partition_id is not None}:
            partition = self._coordinator.partition_by_id(partition_id)
            if partition is None or partition.table_id != table.table_id:
                raise PartitionNotExistError(f"Partition id {partition_id} of table '{table.path}' does not exist.")
        await self._check_reached(table, new)
        table = self._table(entry.table_id, path, epoch)  # the high watermarks' requests yielded the loop
        offsets: dict[TableBucket, int] = {}
        latest = await self._latest(table.table_id)
        if latest is not None and not ignore_previous:
            offsets.update(latest.tiered_offsets)
        offsets.update(new)
        location = self._remote.url(f"{offsets_file_dir(table.path, table.table_id)}/{uuid.uuid4()}.offsets")
        try:
            await asyncio.to_thread(self._remote.write_bytes, location, encode_offsets_file(table.table_id, offsets))
        except OSError as exc:
            raise StorageError(f"Cannot write the lake offsets file {location}: {exc}") from None
        await self._remember_uncommitted(table, location)
        return location

    async def _check_reached(self, table: TableInfo, offsets: Mapping[TableBucket, int]) -> None:
        """Every offset is at most its bucket's high watermark: tiering reads only acknowledged records."""
        if not offsets:
            return
        reached = await self._tablets.high_watermarks(table, sorted(offsets, key=lambda b: (b.partition_id or -1, b.bucket)))
        for bucket, offset in offsets.items():
            if offset > reached[bucket]:
                raise LogOffsetOutOfRangeError(
                    f"The lake offset {offset} of {bucket} is beyond its log's high watermark {reached[bucket]}."
                )

    async def _remember_uncommitted(self, table: TableInfo, location: str) -> None:
        files = self._uncommitted.setdefault(table.table_id, [])
        files.append(location)
        while len(files) > UNCOMMITTED_FILES_MAX:
            await self._delete_quietly(files.pop(0))

    async def _delete_quietly(self, location: str) -> None:
        try:
            await asyncio.to_thread(self._remote.delete, location)
        except OSError as exc:
            log.warning("could not delete the lake offsets file %s: %s", location, exc)

    async def _delete_unreferenced(self, table: TableInfo) -> None:
        """After a commit: delete the offsets files no recorded lake snapshot refers to any more, those of
        the snapshots retention just discarded and those of prepares never committed (failed rounds, or
        requests that were not rounds at all)."""
        self._uncommitted.pop(table.table_id, None)
        in_use = await off_loop(self._paths_in_use, table.table_id)
        directory = self._remote.url(offsets_file_dir(table.path, table.table_id))
        try:
            listed = await asyncio.to_thread(self._remote.list_files, directory)
        except OSError as exc:
            log.warning("could not list the lake offsets files of %s: %s", table.path, exc)
            return
        for location in sorted(set(listed) - in_use):
            await self._delete_quietly(location)

    def _paths_in_use(self, table_id: int) -> set[str]:
        """The offsets files the table's recorded lake snapshots refer to (blocks: store reads)."""
        in_use: set[str] = set()
        for snapshot_id in self._store.list_lake_snapshot_ids(table_id):
            record = self._store.get_lake_snapshot(table_id, snapshot_id)
            if record is not None:
                in_use |= LakeSnapshot.from_record(record).paths
        return in_use

    # ---- CommitLakeTableSnapshot ----
    async def commit_lake_table_snapshot(self, request: Any, _context: object) -> Any:
        """Record each table's lake snapshot. ``tables_req`` (Fluss's older form) only lends its per-bucket
        max timestamps to the snapshot committed for the same table."""
        response = pb.CommitLakeTableSnapshotResponse()
        timestamps: dict[int, dict[TableBucket, int]] = {}
        for info in request.tables_req:
            if info.HasField("table_id"):
                by_bucket = timestamps.setdefault(info.table_id, {})
                for b in info.buckets_req:
                    if b.HasField("max_timestamp") and b.max_timestamp >= 0:
                        bucket = _bucket(info.table_id, b)
                        by_bucket[bucket] = max(b.max_timestamp, by_bucket.get(bucket, -1))
        for metadata in request.lake_table_snapshot_metadata:
            result = response.table_resp.add(table_id=metadata.table_id)
            try:
                await self._commit(metadata, timestamps.get(metadata.table_id, {}))
            except StromError as exc:
                _set_error(result, exc)
        for table_id in timestamps.keys() - {m.table_id for m in request.lake_table_snapshot_metadata}:
            _set_error(response.table_resp.add(table_id=table_id), UnsupportedVersionError(
                f"Table {table_id}: a lake snapshot is committed with lake_table_snapshot_metadata "
                "(Fluss 0.8 and later); tables_req alone is not supported."
            ))
        return response

    async def _commit(self, metadata: Any, max_timestamps: dict[TableBucket, int]) -> None:
        epoch = _optional(metadata, "tiering_epoch")
        table = self._table(metadata.table_id, None, epoch)
        tiered_path = self._offsets_location(table, metadata.tiered_bucket_offsets_file_path)
        readable_path = _optional(metadata, "readable_bucket_offsets_file_path")
        if readable_path is not None:
            self._offsets_location(table, readable_path)
        self._check_buckets(table, max_timestamps)
        tiered = await self._read_offsets(table, tiered_path)
        readable = None
        if readable_path is not None:
            readable = tiered if readable_path == tiered_path else await self._read_offsets(table, readable_path)
        async with self._committing:  # the reads yielded the loop: check again, and one commit at a time
            table = await self._record(metadata, epoch, tiered_path, readable_path, tiered, readable, max_timestamps)
        await self._delete_unreferenced(table)  # the discarded snapshots' files and never-committed prepares

    async def _record(
        self, metadata: Any, epoch: int | None, tiered_path: str, readable_path: str | None,
        tiered: dict[TableBucket, int], readable: dict[TableBucket, int] | None, max_timestamps: dict[TableBucket, int],
    ) -> TableInfo:
        """Check the snapshot against the latest one and record it; returns the table."""
        table = self._table(metadata.table_id, None, epoch)
        latest = await self._latest(table.table_id)
        if latest is not None:
            self._check_forward(table, metadata.snapshot_id, latest.tiered_offsets, tiered)
        merged_timestamps = dict(latest.max_timestamps) if latest is not None else {}
        for bucket, timestamp in max_timestamps.items():
            merged_timestamps[bucket] = max(timestamp, merged_timestamps.get(bucket, -1))
        names = self._partition_names(table, [*tiered, *(readable or {})], latest)
        snapshot = LakeSnapshot(table.table_id, metadata.snapshot_id, tiered_path, readable_path, tiered, readable,
                                merged_timestamps, names)
        stored_ids = await off_loop(self._store.list_lake_snapshot_ids, table.table_id)
        committed_ids = [i for i in stored_ids if i != snapshot.snapshot_id]
        discard = snapshots_to_discard(committed_ids, snapshot.snapshot_id,
                                       _optional(metadata, "earliest_snapshot_id_to_keep"))
        await off_loop(self._store.commit_lake_snapshot, snapshot.to_record(), discard)
        if max_timestamps:
            try:  # the commit is recorded; a failed write of this statistic must not report it as failed
                await self._manager.record_newest_timestamp(table.table_id, max(max_timestamps.values()))
            except StromError as exc:
                log.warning("table %s: cannot record the lake's newest timestamp: %s", table.path, exc)
        log.info("table %s: lake snapshot %d committed (%d buckets)", table.path, snapshot.snapshot_id, len(tiered))
        self._tablets.notify_lake_table_offsets(table, snapshot.snapshot_id, tiered, merged_timestamps)
        return table

    def _partition_names(
        self, table: TableInfo, buckets: list[TableBucket], latest: LakeSnapshot | None
    ) -> dict[int, str]:
        """The name of each partition in ``buckets``: the catalog's, or the one recorded when it was
        tiered before it was dropped."""
        names: dict[int, str] = {}
        for partition_id in {b.partition_id for b in buckets if b.partition_id is not None}:
            partition = self._coordinator.partition_by_id(partition_id)
            if partition is not None and partition.table_id == table.table_id:
                names[partition_id] = partition.name
            elif latest is not None and partition_id in latest.partition_names:
                names[partition_id] = latest.partition_names[partition_id]
        return names

    @staticmethod
    def _check_forward(
        table: TableInfo, snapshot_id: int, previous: Mapping[TableBucket, int], new: Mapping[TableBucket, int]
    ) -> None:
        """A bucket's lake offset never moves back, and a tiered bucket is never forgotten (the next round
        would tier it again from the start)."""
        for bucket, offset in previous.items():
            if bucket not in new:
                raise LogOffsetOutOfRangeError(
                    f"Lake snapshot {snapshot_id} of table '{table.path}' has no offset for {bucket}, which the "
                    f"latest lake snapshot has at {offset}: lake offsets only move forward."
                )
            if new[bucket] < offset:
                raise LogOffsetOutOfRangeError(
                    f"Lake snapshot {snapshot_id} of table '{table.path}' would move {bucket} back from offset "
                    f"{offset} to {new[bucket]}: lake offsets only move forward."
                )

    # ---- GetLakeSnapshot ----
    async def get_lake_snapshot(self, request: Any, _context: object) -> Any:
        path = TablePath(request.table_path.database_name, request.table_path.table_name)
        table = await self._coordinator.resolve_table(path)
        snapshot_id = _optional(request, "snapshot_id")
        record = await off_loop(self._store.get_lake_snapshot, table.table_id, snapshot_id, readable=request.readable)
        if record is None:
            if snapshot_id is not None:
                raise LakeSnapshotNotExistError(f"Lake snapshot {snapshot_id} of table '{path}' does not exist.")
            which = "readable lake snapshot" if request.readable else "lake snapshot"
            raise LakeSnapshotNotExistError(f"Table '{path}' has no {which} yet.")
        snapshot = LakeSnapshot.from_record(record)
        offsets = snapshot.readable_offsets if request.readable else snapshot.tiered_offsets
        assert offsets is not None, "the store returned a readable snapshot"
        response = pb.GetLakeSnapshotResponse(table_id=table.table_id, snapshotId=snapshot.snapshot_id)
        self._add_bucket_offsets(response.bucket_snapshots, offsets, snapshot.partition_names)
        return response

    @staticmethod
    def _add_bucket_offsets(target: Any, offsets: Mapping[TableBucket, int], names: Mapping[int, str]) -> None:
        for bucket, offset in sorted(offsets.items(), key=lambda item: (item[0].partition_id or 0, item[0].bucket)):
            entry = target.add(bucket_id=bucket.bucket, log_offset=offset)
            if bucket.partition_id is not None:
                entry.partition_id = bucket.partition_id
                if bucket.partition_id in names:
                    entry.partition_name = names[bucket.partition_id]

    # ---- DescribeLakeTiering (strom extension) ----
    async def describe_lake_tiering(self, request: Any, _context: object) -> Any:
        wanted = None
        if request.HasField("table_path"):
            wanted = (await self._coordinator.resolve_table(
                TablePath(request.table_path.database_name, request.table_path.table_name)
            )).table_id
        response = ext.DescribeLakeTieringResponse()
        for tiering in self._manager.tables():
            if wanted is not None and tiering.table_id != wanted:
                continue
            table = self._coordinator.table_info_by_id(tiering.table_id)
            if table is None:
                continue
            status = response.tables.add(
                table_id=tiering.table_id, state=tiering.state.value, tiering_epoch=tiering.tiering_epoch,
                freshness_ms=tiering.freshness_ms, last_tiered_time=tiering.last_tiered_ms,
                last_round_duration_ms=tiering.last_round_duration_ms, failures=tiering.failures,
                pending_since=tiering.pending_since_ms, file_size=tiering.file_size,
                record_count=tiering.record_count,
            )
            status.table_path.database_name = table.path.database_name
            status.table_path.table_name = table.path.table_name
            if tiering.newest_timestamp_ms != UNKNOWN:
                status.newest_timestamp = tiering.newest_timestamp_ms
            if tiering.last_failure:
                status.last_failure = tiering.last_failure
                status.last_failure_time = tiering.last_failure_ms
            latest = await self._latest(tiering.table_id)
            if latest is not None:
                status.lake_snapshot_id = latest.snapshot_id
                self._add_bucket_offsets(status.bucket_offsets, latest.tiered_offsets, latest.partition_names)
        return response

    # ---- table lifecycle ----
    async def drop_table(self, table: TableInfo) -> None:
        """Forget a dropped table's tiering state (the store already dropped its records with the table)
        and delete its offsets files; the lake table itself is left alone."""
        await self._manager.drop_table(table.table_id)
        try:
            await asyncio.to_thread(self._remote.delete_tree, lake_table_dir(table.path, table.table_id))
        except OSError as exc:
            log.warning("could not delete the lake offsets files of dropped table %s: %s", table.path, exc)
