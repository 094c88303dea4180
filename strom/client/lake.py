"""The lake half of :class:`~strom.client.admin.Admin`: lake snapshots (public in Fluss), the tiering
service's coordinator calls (private in Fluss, so pyfluss does not offer them), and strom's tiering status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from strom.client.rpc_client import ClusterRpc
from strom.errors import StromError, error_for_code
from strom.ids import TableBucket, TablePath
from strom.rpc.api_keys import COORDINATOR_EPOCH, ApiKey
from strom.rpc.messages import ext, pb

_NO_TABLES: Mapping[int, int] = MappingProxyType({})
_NO_REASONS: Mapping[int, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LakeSnapshot:
    table_id: int
    snapshot_id: int
    bucket_offsets: dict[TableBucket, int]
    """Per tiered bucket, the next offset to tier (the exclusive end of what the lake holds)."""
    partition_names: dict[int, str]
    """Partition id -> name, for partitioned tables (partitions dropped since are missing)."""


@dataclass(frozen=True, slots=True)
class TieringAssignment:
    """A table the coordinator handed to this tiering job, and the epoch to present for it."""

    table_id: int
    table_path: TablePath
    tiering_epoch: int


@dataclass(frozen=True, slots=True)
class FinishedTiering:
    """A round to report as finished; ``force_finished`` when it was cut at the freshness deadline (the
    table is due again at once). ``file_size`` and ``record_count`` are the lake table's totals."""

    table_id: int
    tiering_epoch: int
    force_finished: bool = False
    file_size: int | None = None
    record_count: int | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    coordinator_epoch: int
    assignment: TieringAssignment | None
    """The table to tier next, when one was requested and one is due."""
    errors: dict[int, StromError]
    """Table id -> the coordinator's error for it (fenced epoch, table gone, ...), from any of the lists."""


@dataclass(frozen=True, slots=True)
class LakeTieringStatus:
    """strom extension: one lake-enabled table as the coordinator's tiering manager sees it. Times are
    epoch milliseconds of the coordinator's clock; None where unknown."""

    table_id: int
    table_path: TablePath
    state: str
    """New, Scheduled, Pending, Tiering, Tiered or Failed."""
    tiering_epoch: int
    freshness_ms: int
    last_tiered_time: int | None
    """End of the last finished round; None before the first."""
    last_round_duration_ms: int | None
    failures: int
    pending_since: int | None
    """When the table became Pending; None unless it is."""
    lake_snapshot_id: int | None
    bucket_offsets: dict[TableBucket, int]
    """The latest lake snapshot's offsets (the next offset to tier per bucket)."""
    partition_names: dict[int, str]
    file_size: int | None
    record_count: int | None
    newest_timestamp: int | None
    """Newest record timestamp in the lake, when commits reported max timestamps."""
    last_failure: str | None = None
    """Why the last failed round failed (the job's reason or a heartbeat timeout); None before one."""
    last_failure_time: int | None = None


TIERING_LEASE_SUFFIX = "-kv-snapshots"


def tiering_lease_id(job_id: str) -> str:
    """The KV snapshot lease of the tiering job ``job_id``: a pure function of the job id, so a restarted job
    owns it again, and operator tools tell tiering leases from others (they end in :data:`TIERING_LEASE_SUFFIX`)."""
    return f"{job_id}{TIERING_LEASE_SUFFIX}"


def _path(table_path: TablePath) -> Any:
    return pb.PbTablePath(database_name=table_path.database_name, table_name=table_path.table_name)


def _known(value: int) -> int | None:
    return None if value < 0 else value


def _bucket_offsets(table_id: int, entries: Any) -> tuple[dict[TableBucket, int], dict[int, str]]:
    offsets: dict[TableBucket, int] = {}
    names: dict[int, str] = {}
    for entry in entries:
        partition = entry.partition_id if entry.HasField("partition_id") else None
        if entry.HasField("log_offset"):
            offsets[TableBucket(table_id, entry.bucket_id, partition)] = entry.log_offset
        if partition is not None and entry.HasField("partition_name"):
            names[partition] = entry.partition_name
    return offsets, names


def _raise_per_table(entry: Any) -> None:
    if entry.HasField("error_code") and entry.error_code != 0:
        raise error_for_code(entry.error_code, entry.error_message)


def _heartbeat_entry(target: Any, table_id: int, tiering_epoch: int) -> Any:
    return target.add(table_id=table_id, coordinator_epoch=COORDINATOR_EPOCH, tiering_epoch=tiering_epoch)


class LakeAdmin:
    """Mixed into :class:`~strom.client.admin.Admin`; every call goes to the coordinator."""

    _connection: ClusterRpc

    async def get_lake_snapshot(
        self, table_path: TablePath, snapshot_id: int | None = None, readable: bool = False
    ) -> LakeSnapshot:
        """The latest lake snapshot of a table, or the one with ``snapshot_id``, or the latest readable one.

        Raises:
            LakeSnapshotNotExistError: the table has no (such) lake snapshot.
            TableNotExistError: the table does not exist.
        """
        request = pb.GetLakeSnapshotRequest(table_path=_path(table_path))
        if snapshot_id is not None:
            request.snapshot_id = snapshot_id
        if readable:
            request.readable = True
        response = await self._connection.coordinator_request(ApiKey.GET_LAKE_SNAPSHOT, request)
        offsets, names = _bucket_offsets(response.table_id, response.bucket_snapshots)
        return LakeSnapshot(response.table_id, response.snapshotId, offsets, names)

    async def lake_tiering_heartbeat(
        self,
        tiering: Mapping[int, int] = _NO_TABLES,
        finished: Sequence[FinishedTiering] = (),
        failed: Mapping[int, int] = _NO_TABLES,
        request_table: bool = False,
        failure_reasons: Mapping[int, str] = _NO_REASONS,
    ) -> HeartbeatResult:
        """One heartbeat of a tiering job: renew the rounds in ``tiering`` (table id -> tiering epoch), report
        ``finished`` and ``failed`` (table id -> epoch) rounds, and optionally ask for a table to tier. An
        empty heartbeat registers the job. ``failure_reasons`` (table id -> one line) tells a strom
        coordinator why a failed round failed (a Fluss coordinator ignores it). Per-table refusals come back in ``errors``, never raised."""
        request = pb.LakeTieringHeartbeatRequest()
        for table_id, epoch in tiering.items():
            _heartbeat_entry(request.tiering_tables, table_id, epoch)
        for table_id, epoch in failed.items():
            entry = _heartbeat_entry(request.failed_tables, table_id, epoch)
            if table_id in failure_reasons:
                entry.failure_reason = failure_reasons[table_id]
        for done in finished:
            entry = _heartbeat_entry(request.finished_tables, done.table_id, done.tiering_epoch)
            if done.file_size is not None or done.record_count is not None:
                entry.lake_tiering_stats.SetInParent()
                if done.file_size is not None:
                    entry.lake_tiering_stats.file_size = done.file_size
                if done.record_count is not None:
                    entry.lake_tiering_stats.record_count = done.record_count
            if done.force_finished:
                request.force_finished_tables.append(done.table_id)
        if request_table:
            request.request_table = True
        response = await self._connection.coordinator_request(ApiKey.LAKE_TIERING_HEARTBEAT, request)
        errors: dict[int, StromError] = {}
        for entries in (response.failed_table_resp, response.tiering_table_resp, response.finished_table_resp):
            for entry in entries:
                if entry.HasField("error"):
                    errors[entry.table_id] = error_for_code(entry.error.error_code, entry.error.error_message)
        assignment = None
        if response.HasField("tiering_table"):
            table = response.tiering_table
            assignment = TieringAssignment(
                table.table_id, TablePath(table.table_path.database_name, table.table_path.table_name),
                table.tiering_epoch,
            )
        return HeartbeatResult(response.coordinator_epoch, assignment, errors)

    async def prepare_lake_table_snapshot(
        self, table_id: int, table_path: TablePath, offsets: Mapping[TableBucket, int],
        tiering_epoch: int | None = None,
    ) -> str:
        """Have the coordinator write the offsets file a lake commit will carry: ``offsets`` (the next
        offset to tier per bucket) merged over the table's latest lake snapshot. Returns the file's path.

        Raises:
            FencedTieringEpochError: ``tiering_epoch`` given, and no round of the table runs under it.
            TableNotExistError: no table ``table_id`` at ``table_path``.
        """
        request = pb.PrepareLakeTableSnapshotRequest()
        table = request.bucket_offsets.add(table_id=table_id, table_path=_path(table_path))
        if tiering_epoch is not None:
            table.tiering_epoch = tiering_epoch
        for bucket, offset in sorted(offsets.items(), key=lambda i: (i[0].partition_id or 0, i[0].bucket)):
            entry = table.bucket_offsets.add(bucket_id=bucket.bucket, log_end_offset=offset)
            if bucket.partition_id is not None:
                entry.partition_id = bucket.partition_id
        response = await self._connection.coordinator_request(ApiKey.PREPARE_LAKE_TABLE_SNAPSHOT, request)
        [result] = response.prepare_lake_table_resp
        _raise_per_table(result)
        return str(result.lake_table_offsets_path)

    async def commit_lake_table_snapshot(
        self, table_id: int, lake_snapshot_id: int, tiered_offsets_path: str, *,
        tiering_epoch: int | None = None, max_timestamps: Mapping[TableBucket, int] | None = None,
        earliest_snapshot_id_to_keep: int | None = None, readable: bool = True,
    ) -> None:
        """Record a committed lake snapshot whose offsets are in ``tiered_offsets_path`` (from
        :meth:`prepare_lake_table_snapshot`), readable at once unless ``readable`` is False. Retention:
        ``earliest_snapshot_id_to_keep`` None keeps only this snapshot, -1 keeps all, an id keeps from it on.

        Raises:
            FencedTieringEpochError: ``tiering_epoch`` given, and no round of the table runs under it.
            LogOffsetOutOfRangeError: a bucket's offset would move back.
            TableNotExistError: no table ``table_id``.
        """
        request = pb.CommitLakeTableSnapshotRequest()
        metadata = request.lake_table_snapshot_metadata.add(
            table_id=table_id, snapshot_id=lake_snapshot_id, tiered_bucket_offsets_file_path=tiered_offsets_path
        )
        if readable:
            metadata.readable_bucket_offsets_file_path = tiered_offsets_path
        if tiering_epoch is not None:
            metadata.tiering_epoch = tiering_epoch
        if earliest_snapshot_id_to_keep is not None:
            metadata.earliest_snapshot_id_to_keep = earliest_snapshot_id_to_keep
        if max_timestamps:
            info = request.tables_req.add(table_id=table_id, snapshot_id=lake_snapshot_id)
            for bucket, timestamp in max_timestamps.items():
                entry = info.buckets_req.add(bucket_id=bucket.bucket, max_timestamp=timestamp)
                if bucket.partition_id is not None:
                    entry.partition_id = bucket.partition_id
        response = await self._connection.coordinator_request(ApiKey.COMMIT_LAKE_TABLE_SNAPSHOT, request)
        for result in response.table_resp:
            _raise_per_table(result)

    async def describe_lake_tiering(self, table_path: TablePath | None = None) -> list[LakeTieringStatus]:
        """strom extension: every lake-enabled table's tiering state (or one table's; [] if its lake is
        not enabled).

        Raises:
            TableNotExistError: ``table_path`` does not exist.
        """
        request = ext.DescribeLakeTieringRequest()
        if table_path is not None:
            request.table_path.database_name = table_path.database_name
            request.table_path.table_name = table_path.table_name
        response = await self._connection.coordinator_request(ApiKey.DESCRIBE_LAKE_TIERING, request)
        statuses = []
        for table in response.tables:
            offsets, names = _bucket_offsets(table.table_id, table.bucket_offsets)
            statuses.append(
                LakeTieringStatus(
                    table.table_id, TablePath(table.table_path.database_name, table.table_path.table_name),
                    table.state, table.tiering_epoch, table.freshness_ms, _known(table.last_tiered_time),
                    _known(table.last_round_duration_ms), table.failures, _known(table.pending_since),
                    table.lake_snapshot_id if table.HasField("lake_snapshot_id") else None, offsets, names,
                    _known(table.file_size), _known(table.record_count),
                    table.newest_timestamp if table.HasField("newest_timestamp") else None,
                    table.last_failure if table.HasField("last_failure") else None,
                    table.last_failure_time if table.HasField("last_failure_time") else None,
                )
            )
        return statuses
