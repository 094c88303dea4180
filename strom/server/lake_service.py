"""The coordinator's lake RPCs: LakeTieringHeartbeat, PrepareLakeTableSnapshot, CommitLakeTableSnapshot,
GetLakeSnapshot, and strom's DescribeLakeTiering.

Offsets files use Fluss's layout (``{"version":1,"table_id":N,"bucket_offsets":[...]}``, or
``partition_offsets`` for partitioned tables; -1 marks a bucket never tiered) and live in remote storage
under ``lake/{db}/{table}-{id}/metadata/{uuid}.offsets``. Per-table errors go into the responses; a
request about one table never fails another. Remote I/O runs off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from strom.errors import (
    InvalidCoordinatorError,
    LakeSnapshotNotExistError,
    LogOffsetOutOfRangeError,
    StromError,
    TableNotExistError,
    code_for_exception,
)
from strom.ids import TableBucket, TablePath
from strom.metadata.table_info import TableInfo
from strom.remote.storage import RemoteStorage
from strom.rpc.messages import ext, pb
from strom.server.coordinator import CoordinatorService
from strom.server.lake_tiering import LakeSnapshotRecord, LakeTableEntry, LakeTableTieringManager

log = logging.getLogger(__name__)

COORDINATOR_EPOCH = 0
"""A single coordinator that never fails over: its epoch is always 0."""
OFFSETS_FILE_VERSION = 1
NEVER_TIERED = -1


def lake_metadata_dir(path: TablePath, table_id: int) -> str:
    return f"lake/{path.database_name}/{path.table_name}-{table_id}"


def encode_offsets(table_id: int, offsets: Mapping[TableBucket, int]) -> bytes:
    """Fluss's offsets file: bucket offsets by bucket id (holes are -1), per partition if partitioned."""

    def as_list(buckets: Mapping[int, int]) -> list[int]:
        listed = [NEVER_TIERED] * (max(buckets) + 1)
        for bucket, offset in buckets.items():
            listed[bucket] = offset
        return listed

    by_partition: dict[int | None, dict[int, int]] = {}
    for bucket, offset in offsets.items():
        by_partition.setdefault(bucket.partition_id, {})[bucket.bucket] = offset
    document: dict[str, Any] = {"version": OFFSETS_FILE_VERSION, "table_id": table_id}
    if None in by_partition:
        document["bucket_offsets"] = as_list(by_partition[None])
    else:
        document["partition_offsets"] = [
            {"partition_id": pid, "bucket_offsets": as_list(buckets)} for pid, buckets in sorted(by_partition.items())
        ]
    return json.dumps(document, separators=(",", ":")).encode()


def decode_offsets(raw: bytes) -> tuple[int, dict[TableBucket, int]]:
    try:
        document = json.loads(raw)
        table_id = int(document["table_id"])
        offsets: dict[TableBucket, int] = {}
        for bucket, offset in enumerate(document.get("bucket_offsets", [])):
            if offset >= 0:
                offsets[TableBucket(table_id, bucket)] = int(offset)
        for partition in document.get("partition_offsets", []):
            for bucket, offset in enumerate(partition["bucket_offsets"]):
                if offset >= 0:
                    offsets[TableBucket(table_id, bucket, int(partition["partition_id"]))] = int(offset)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StromError(f"not a lake offsets file: {exc}") from None
    return table_id, offsets


def _set_error(target: Any, exc: StromError) -> None:
    target.error_code, target.error_message = code_for_exception(exc)


class LakeTieringService:
    def __init__(self, coordinator: CoordinatorService, manager: LakeTableTieringManager, remote: RemoteStorage) -> None:
        self._coordinator = coordinator
        self._manager = manager
        self._remote = remote
        self._ticker: asyncio.Task[None] | None = None

    def start(self, tick_interval_ms: int = 100) -> None:
        async def tick() -> None:
            while True:
                await asyncio.sleep(tick_interval_ms / 1000)
                try:
                    self._manager.tick()
                except Exception:
                    log.exception("lake tiering timers failed")

        self._ticker = asyncio.get_running_loop().create_task(tick())

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker

    # ---- LakeTieringHeartbeat ----
    def lake_tiering_heartbeat(self, request: Any, _context: object) -> Any:
        manager = self._manager
        response = pb.LakeTieringHeartbeatResponse(coordinator_epoch=COORDINATOR_EPOCH)
        forced = set(request.force_finished_tables)

        def each(tables: Any, target: Any, action: Any) -> None:
            for table in tables:
                entry = target.add(table_id=table.table_id)
                try:
                    if table.coordinator_epoch != COORDINATOR_EPOCH:
                        raise InvalidCoordinatorError(
                            f"coordinator epoch {table.coordinator_epoch} is not the current {COORDINATOR_EPOCH}"
                        )
                    action(table)
                except StromError as exc:
                    _set_error(entry.error, exc)

        def finish(table: Any) -> None:
            stats = table.lake_tiering_stats if table.HasField("lake_tiering_stats") else None
            manager.finish(
                table.table_id, table.tiering_epoch, table.table_id in forced,
                stats.file_size if stats is not None and stats.HasField("file_size") else None,
                stats.record_count if stats is not None and stats.HasField("record_count") else None,
            )

        each(request.failed_tables, response.failed_table_resp, lambda t: manager.fail(t.table_id, t.tiering_epoch))
        each(request.tiering_tables, response.tiering_table_resp, lambda t: manager.renew(t.table_id, t.tiering_epoch))
        each(request.finished_tables, response.finished_table_resp, finish)
        if request.request_table:
            assignment = manager.request_table()
            if assignment is not None:
                response.tiering_table.table_id = assignment.table_id
                response.tiering_table.table_path.database_name = assignment.path.database_name
                response.tiering_table.table_path.table_name = assignment.path.table_name
                response.tiering_table.tiering_epoch = assignment.tiering_epoch
                log.info("handing %s to a tiering job (epoch %d)", assignment.path, assignment.tiering_epoch)
        return response

    def _lake_entry(self, table_id: int, path: TablePath | None, tiering_epoch: int | None) -> LakeTableEntry:
        """The entry of a lake table that still exists under ``path`` (the same id)."""
        if tiering_epoch is None:
            entry = self._manager.entry(table_id)
        else:
            entry = self._manager.tiering_entry(table_id, tiering_epoch)
        current = self._coordinator.table_info_by_id(table_id)
        if current is None or (path is not None and current.path != path):
            raise TableNotExistError(f"The table {table_id} doesn't exist.")
        return entry

    # ---- PrepareLakeTableSnapshot ----
    async def prepare_lake_table_snapshot(self, request: Any, _context: object) -> Any:
        response = pb.PrepareLakeTableSnapshotResponse()
        for table in request.bucket_offsets:
            result = response.prepare_lake_table_resp.add(table_id=table.table_id)
            try:
                path = TablePath(table.table_path.database_name, table.table_path.table_name)
                epoch = table.tiering_epoch if table.HasField("tiering_epoch") else None
                entry = self._lake_entry(table.table_id, path, epoch)
                offsets: dict[TableBucket, int] = {}
                latest = entry.latest_snapshot
                if latest is not None and not request.ignore_previous_table_offsets:
                    offsets.update(latest.bucket_offsets(table.table_id))
                for bucket_offset in table.bucket_offsets:
                    if not bucket_offset.HasField("log_end_offset"):
                        continue
                    partition = bucket_offset.partition_id if bucket_offset.HasField("partition_id") else None
                    offsets[TableBucket(table.table_id, bucket_offset.bucket_id, partition)] = bucket_offset.log_end_offset
                location = f"{lake_metadata_dir(path, table.table_id)}/metadata/{uuid.uuid4()}.offsets"
                await asyncio.to_thread(self._remote.write_bytes, location, encode_offsets(table.table_id, offsets))
                result.lake_table_offsets_path = self._remote.url(location)
            except StromError as exc:
                _set_error(result, exc)
        return response

    # ---- CommitLakeTableSnapshot ----
    async def commit_lake_table_snapshot(self, request: Any, _context: object) -> Any:
        response = pb.CommitLakeTableSnapshotResponse()
        for metadata in request.lake_table_snapshot_metadata:
            result = response.table_resp.add(table_id=metadata.table_id)
            try:
                await self._commit(metadata)
            except StromError as exc:
                _set_error(result, exc)
        for info in request.tables_req:  # legacy: per-bucket max timestamps, for lag metrics
            if info.HasField("table_id") and info.table_id in self._manager:
                timestamps = {
                    TableBucket(info.table_id, b.bucket_id, b.partition_id if b.HasField("partition_id") else None):
                    b.max_timestamp
                    for b in info.buckets_req if b.HasField("max_timestamp")
                }
                self._manager.record_max_timestamps(self._manager.entry(info.table_id), timestamps)
        return response

    async def _commit(self, metadata: Any) -> None:
        epoch = metadata.tiering_epoch if metadata.HasField("tiering_epoch") else None
        entry = self._lake_entry(metadata.table_id, None, epoch)
        path = metadata.tiered_bucket_offsets_file_path
        if not path.startswith(self._remote.root + "/"):
            raise StromError(f"the lake offsets file {path!r} is not under the remote data dir {self._remote.root}")
        try:
            raw = await asyncio.to_thread(self._remote.read_bytes, path)
        except (OSError, ValueError) as exc:
            raise StromError(f"cannot read the lake offsets file {path!r}: {exc}") from None
        table_id, offsets = decode_offsets(raw)
        if table_id != metadata.table_id:
            raise StromError(f"the offsets file {path!r} belongs to table {table_id}, not {metadata.table_id}")
        entry = self._lake_entry(metadata.table_id, None, epoch)  # re-checked: the file read yielded the loop
        latest = entry.latest_snapshot
        if latest is not None:
            previous = latest.bucket_offsets(metadata.table_id)
            for bucket, offset in offsets.items():
                if offset < previous.get(bucket, NEVER_TIERED):
                    raise LogOffsetOutOfRangeError(
                        f"lake snapshot {metadata.snapshot_id} would move {bucket} back from offset "
                        f"{previous[bucket]} to {offset}: lake offsets only move forward"
                    )
        readable = metadata.readable_bucket_offsets_file_path if metadata.HasField("readable_bucket_offsets_file_path") else None
        record = LakeSnapshotRecord(
            metadata.snapshot_id, path, readable,
            sorted(((b.partition_id, b.bucket, o) for b, o in offsets.items()), key=lambda t: (t[0] or -1, t[1])),
        )
        keep = metadata.earliest_snapshot_id_to_keep if metadata.HasField("earliest_snapshot_id_to_keep") else None
        dropped = self._manager.add_snapshot(entry, record, keep)
        in_use = {s.tiered_offsets_path for s in entry.snapshots} | {s.readable_offsets_path for s in entry.snapshots}
        for old in dropped:
            for file in {old.tiered_offsets_path, old.readable_offsets_path} - in_use - {None}:
                await asyncio.to_thread(self._delete_quietly, file)  # type: ignore[arg-type]

    def _delete_quietly(self, location: str) -> None:
        try:
            self._remote.delete(location)
        except OSError as exc:
            log.warning("could not delete the old lake offsets file %s: %s", location, exc)

    # ---- GetLakeSnapshot ----
    def get_lake_snapshot(self, request: Any, _context: object) -> Any:
        path = TablePath(request.table_path.database_name, request.table_path.table_name)
        table = self._coordinator.table_info(path)
        entry = self._manager.entry(table.table_id) if table.table_id in self._manager else None
        snapshots = entry.snapshots if entry is not None else []
        if request.HasField("snapshot_id"):
            chosen = [s for s in snapshots if s.snapshot_id == request.snapshot_id]
        elif request.readable:
            chosen = [s for s in snapshots if s.readable_offsets_path is not None]
        else:
            chosen = snapshots
        if not chosen:
            if request.HasField("snapshot_id"):
                raise LakeSnapshotNotExistError(f"Lake snapshot {request.snapshot_id} of table '{path}' does not exist.")
            raise LakeSnapshotNotExistError(f"Table '{path}' has no lake snapshot yet.")
        snapshot = chosen[-1]
        response = pb.GetLakeSnapshotResponse(table_id=table.table_id, snapshotId=snapshot.snapshot_id)
        self._add_bucket_offsets(response.bucket_snapshots, table, snapshot, with_offset_field="log_offset")
        return response

    def _add_bucket_offsets(self, target: Any, table: TableInfo, snapshot: LakeSnapshotRecord, with_offset_field: str) -> None:
        names: dict[int, str | None] = {}
        for partition_id, bucket, offset in snapshot.offsets:
            entry = target.add(bucket_id=bucket)
            setattr(entry, with_offset_field, offset)
            if partition_id is not None:
                entry.partition_id = partition_id
                if partition_id not in names:
                    record = self._coordinator.partition_by_id(partition_id)
                    names[partition_id] = record.name if record is not None and record.table_id == table.table_id else None
                if names[partition_id] is not None:
                    entry.partition_name = names[partition_id]

    # ---- DescribeLakeTiering (strom extension) ----
    def describe_lake_tiering(self, request: Any, _context: object) -> Any:
        wanted = None
        if request.HasField("table_path"):
            wanted = TablePath(request.table_path.database_name, request.table_path.table_name)
            self._coordinator.table_info(wanted)  # TableNotExist for an unknown table
        response = ext.DescribeLakeTieringResponse()
        for entry in sorted(self._manager, key=lambda e: e.table_id):
            if wanted is not None and entry.path != wanted:
                continue
            table = self._coordinator.table_info_by_id(entry.table_id)
            if table is None:
                continue
            status = response.tables.add(
                table_id=entry.table_id, state=entry.state.value, tiering_epoch=entry.tiering_epoch,
                freshness_ms=entry.freshness_ms, last_tiered_time=entry.last_tiered_ms if entry.snapshots else -1,
                last_round_duration_ms=entry.last_round_duration_ms, failures=entry.failures,
                pending_since=entry.pending_since_ms, file_size=entry.file_size, record_count=entry.record_count,
            )
            status.table_path.database_name = entry.path.database_name
            status.table_path.table_name = entry.path.table_name
            latest = entry.latest_snapshot
            if latest is not None:
                status.lake_snapshot_id = latest.snapshot_id
                self._add_bucket_offsets(status.bucket_offsets, table, latest, with_offset_field="log_offset")
        return response

    # ---- table lifecycle ----
    def drop_table(self, table_id: int) -> None:
        """Forget a dropped table's tiering state and delete its offsets files (never the lake table)."""
        entry = self._manager.remove_table(table_id)
        if entry is None:
            return
        try:
            self._remote.delete_tree(lake_metadata_dir(entry.path, table_id))
        except OSError as exc:
            log.warning("could not delete the lake offsets of dropped table %s: %s", entry.path, exc)
