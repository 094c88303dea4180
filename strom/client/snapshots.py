"""KV snapshots and snapshot leases (Fluss FIP-22) on the client, plus a reader for leased snapshots.

A reader of a primary-key table leases the snapshots it is about to read, so the server keeps them even
when newer snapshots roll past ``kv.snapshot.num-retained``; it releases each bucket once read, and an
abandoned lease expires on its own.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from strom.client.layout import TableLayout
from strom.client.rpc_client import ClusterRpc
from strom.errors import SchemaNotExistError
from strom.ids import TableBucket, TablePath
from strom.records.kv_batch import SCHEMA_ID
from strom.records.schema import Schema
from strom.records.schema_evolution import RowUpgrader
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import add_snapshot_pins, ext, pb, read_snapshot_pins

SNAPSHOT_BATCH_ROWS = 65_536
SCHEMA_ID_SIZE_BYTES = 2


@dataclass(frozen=True, slots=True)
class KvSnapshotInfo:
    """A bucket's snapshot as GetLatestKvSnapshots reports it; ``log_offset`` is exclusive."""

    snapshot_id: int
    log_offset: int


@dataclass(frozen=True, slots=True)
class KvSnapshots:
    """``bucket id -> latest snapshot`` (None where the bucket has none: read its log from the start)."""

    table_id: int
    partition_id: int | None
    snapshots: dict[int, KvSnapshotInfo | None]

    def table_bucket(self, bucket_id: int) -> TableBucket:
        return TableBucket(self.table_id, bucket_id, self.partition_id)


@dataclass(frozen=True, slots=True)
class KvSnapshotMetadata:
    log_offset: int
    files: list[tuple[str, str]]
    """``(remote path, local file name)`` of every file of the snapshot."""


@dataclass(frozen=True, slots=True)
class AcquireKvSnapshotLeaseResult:
    unavailable_snapshots: dict[TableBucket, int] = field(default_factory=dict)
    """Buckets whose requested snapshot does not exist (never taken or already deleted): not pinned."""

    @property
    def unavailable_table_buckets(self) -> set[TableBucket]:
        return set(self.unavailable_snapshots)


@dataclass(frozen=True, slots=True)
class KvSnapshotLeaseInfo:
    """strom extension: a lease as the coordinator holds it."""

    lease_id: str
    expiration_ms: int
    snapshots: dict[TableBucket, int]


class KvSnapshotLease:
    """A lease handle from ``admin.create_kv_snapshot_lease`` (creating it sends nothing)."""

    def __init__(self, connection: ClusterRpc, lease_id: str, lease_duration_ms: int) -> None:
        if not lease_id:
            raise ValueError("a lease needs a non-empty id")
        if lease_duration_ms <= 0:
            raise ValueError(f"the lease duration must be positive, got {lease_duration_ms} ms")
        self._connection = connection
        self.lease_id = lease_id
        self.lease_duration_ms = lease_duration_ms

    async def acquire_snapshots(self, snapshot_ids: Mapping[TableBucket, int]) -> AcquireKvSnapshotLeaseResult:
        """Pin one snapshot per bucket (moving an earlier pin of the same bucket); renews the lease.

        Raises:
            ValueError: ``snapshot_ids`` is empty (use :meth:`renew`).
            NonPrimaryKeyTableError: a bucket belongs to a log table.
            UnknownTableOrBucketError: a table id does not exist.
        """
        if not snapshot_ids:
            raise ValueError("acquire_snapshots needs at least one bucket; use renew() to extend the lease")
        request = pb.AcquireKvSnapshotLeaseRequest(lease_id=self.lease_id, lease_duration_ms=self.lease_duration_ms)
        add_snapshot_pins(request.snapshots_to_lease, snapshot_ids)
        response = await self._connection.coordinator_request(ApiKey.ACQUIRE_KV_SNAPSHOT_LEASE, request)
        return AcquireKvSnapshotLeaseResult(read_snapshot_pins(response.unavailable_snapshots))

    async def renew(self) -> None:
        """Push the expiry to now + duration (creates an empty lease if it does not exist)."""
        request = pb.AcquireKvSnapshotLeaseRequest(lease_id=self.lease_id, lease_duration_ms=self.lease_duration_ms)
        await self._connection.coordinator_request(ApiKey.ACQUIRE_KV_SNAPSHOT_LEASE, request)

    async def release_snapshots(self, buckets: Iterable[TableBucket]) -> None:
        """Unpin buckets; releasing the last one deletes the lease. Unknown buckets are ignored."""
        request = pb.ReleaseKvSnapshotLeaseRequest(lease_id=self.lease_id)
        for bucket in buckets:
            entry = request.buckets_to_release.add(table_id=bucket.table_id, bucket_id=bucket.bucket)
            if bucket.partition_id is not None:
                entry.partition_id = bucket.partition_id
        await self._connection.coordinator_request(ApiKey.RELEASE_KV_SNAPSHOT_LEASE, request)

    async def drop(self) -> None:
        """Delete the lease and all its pins (succeeds if it does not exist)."""
        await self._connection.coordinator_request(
            ApiKey.DROP_KV_SNAPSHOT_LEASE, pb.DropKvSnapshotLeaseRequest(lease_id=self.lease_id)
        )

    drop_lease = drop


class SnapshotAdmin:
    """The snapshot and lease half of :class:`~strom.client.admin.Admin`."""

    _connection: ClusterRpc

    async def get_latest_kv_snapshots(self, table_path: TablePath, partition_name: str | None = None) -> KvSnapshots:
        request = pb.GetLatestKvSnapshotsRequest(
            table_path=pb.PbTablePath(database_name=table_path.database_name, table_name=table_path.table_name)
        )
        if partition_name is not None:
            request.partition_name = partition_name
        response = await self._connection.coordinator_request(ApiKey.GET_LATEST_KV_SNAPSHOTS, request)
        snapshots: dict[int, KvSnapshotInfo | None] = {}
        for entry in response.latest_snapshots:
            has_id, has_offset = entry.HasField("snapshot_id"), entry.HasField("log_offset")
            if has_id != has_offset:
                raise ValueError(f"bucket {entry.bucket_id}: snapshot id and log offset must come together")
            snapshots[entry.bucket_id] = KvSnapshotInfo(entry.snapshot_id, entry.log_offset) if has_id else None
        partition_id = response.partition_id if response.HasField("partition_id") else None
        return KvSnapshots(response.table_id, partition_id, snapshots)

    async def get_kv_snapshot_metadata(self, bucket: TableBucket, snapshot_id: int) -> KvSnapshotMetadata:
        """Raises KvSnapshotNotExistError (41) for a snapshot that is unknown or deleted."""
        request = pb.GetKvSnapshotMetadataRequest(table_id=bucket.table_id, bucket_id=bucket.bucket, snapshot_id=snapshot_id)
        if bucket.partition_id is not None:
            request.partition_id = bucket.partition_id
        response = await self._connection.coordinator_request(ApiKey.GET_KV_SNAPSHOT_METADATA, request)
        return KvSnapshotMetadata(
            response.log_offset, [(f.remote_path, f.local_file_name) for f in response.snapshot_files]
        )

    async def list_kv_snapshots(self, table_id: int, partition_id: int | None = None) -> list[tuple[int, int, int]]:
        """``(bucket id, snapshot id, log offset)`` of every retained or leased snapshot."""
        request = pb.ListKvSnapshotsRequest(table_id=table_id)
        if partition_id is not None:
            request.partition_id = partition_id
        response = await self._connection.coordinator_request(ApiKey.LIST_KV_SNAPSHOTS, request)
        return [(s.bucket_id, s.snapshot_id, s.log_offset) for s in response.active_snapshots]

    async def list_remote_log_manifests(self, table_id: int, partition_id: int | None = None) -> list[tuple[int, str, int]]:
        """``(bucket id, manifest location, remote log end offset)`` of every bucket with a remote log
        (ListRemoteLogManifests, 1063)."""
        request = pb.ListRemoteLogManifestsRequest(table_id=table_id)
        if partition_id is not None:
            request.partition_id = partition_id
        response = await self._connection.coordinator_request(ApiKey.LIST_REMOTE_LOG_MANIFESTS, request)
        return [(m.table_bucket.bucket_id, m.remote_log_manifest_path, m.remote_log_end_offset)
                for m in response.manifests]

    def create_kv_snapshot_lease(self, lease_id: str, lease_duration_ms: int) -> KvSnapshotLease:
        return KvSnapshotLease(self._connection, lease_id, lease_duration_ms)

    async def list_kv_snapshot_leases(self, lease_id: str | None = None) -> list[KvSnapshotLeaseInfo]:
        """strom extension (api key 3000, not in Fluss): the leases the coordinator holds."""
        request = ext.ListKvSnapshotLeasesRequest()
        if lease_id is not None:
            request.lease_id = lease_id
        response = await self._connection.coordinator_request(ApiKey.LIST_KV_SNAPSHOT_LEASES, request)
        leases = []
        for summary in response.leases:
            pins = {
                TableBucket(s.table_id, s.bucket_id, s.partition_id if s.HasField("partition_id") else None): s.snapshot_id
                for s in summary.snapshots
            }
            leases.append(KvSnapshotLeaseInfo(summary.lease_id, summary.expiration_time, pins))
        return leases


class KvSnapshotReader:
    """Reads one snapshot's rows from its remote files, read-only, as Arrow batches.

    Files are copied to a local temporary directory (RocksDB cannot read fsspec URLs directly), which is
    removed on :meth:`close`. Use as a context manager.
    """

    def __init__(
        self,
        layout: TableLayout,
        metadata: KvSnapshotMetadata,
        *,
        work_dir: Path | None = None,
        schemas: Mapping[int, Schema] | None = None,
    ) -> None:
        """``schemas``: every schema of the table by id (``Admin.get_table_schemas``), needed once columns
        were added, since a snapshot keeps each row as it was written; rows come out in ``layout``'s schema."""
        self._layout = layout
        self.metadata = metadata
        self._upgrader: RowUpgrader | None = None
        if schemas is not None and len(schemas) > 1:
            self._upgrader = RowUpgrader(schemas, layout.info.schema_id, layout.kv_format)
        self._directory = Path(tempfile.mkdtemp(prefix="strom-snapshot-", dir=work_dir))
        self._db: Any = None

    def open(self) -> KvSnapshotReader:
        from strom.kv.rocksdb import open_rocksdb
        from strom.remote.storage import download

        for remote_path, local_name in self.metadata.files:
            download(remote_path, self._directory / local_name)
        self._db = open_rocksdb(self._directory, read_only=True)
        return self

    def iter_batches(self, batch_rows: int = SNAPSHOT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Rows in key order, at most ``batch_rows`` each (values alone, copied out ``batch_rows`` at a time)."""
        assert self._db is not None, "open() first"
        rows = self._db.iterator()
        try:
            while chunk := rows.next(batch_rows, keys=False):
                yield self._decode(chunk)
        finally:
            rows.close()

    def iter_keyed_batches(self, batch_rows: int = SNAPSHOT_BATCH_ROWS) -> Iterator[tuple[list[bytes], pa.RecordBatch]]:
        """``(keys, rows)`` in key order, at most ``batch_rows`` rows each (the checkpoint is read-only, so its
        view cannot move)."""
        assert self._db is not None, "open() first"
        rows = self._db.iterator()
        try:
            while chunk := rows.next(batch_rows):
                keys, values = zip(*chunk, strict=True)
                yield list(keys), self._decode(list(values))
        finally:
            rows.close()

    def _decode(self, values: list[bytes]) -> pa.RecordBatch:
        from strom.records import row_arrow

        layout = self._layout
        if self._upgrader is not None:
            values = self._upgrader.values(values)  # type: ignore[arg-type,assignment]
        else:
            _check_schema_ids(values, layout.info.schema_id)
        return row_arrow.rows_to_record_batch(
            values, layout.row_decoder, layout.arrow_schema, offset=SCHEMA_ID_SIZE_BYTES
        )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        shutil.rmtree(self._directory, ignore_errors=True)

    def __enter__(self) -> KvSnapshotReader:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_schema_ids(values: list[bytes], schema_id: int) -> None:
    """Refuse rows of another schema than the layout's (decoding them with it would misread them).

    A table whose columns never changed is checked on each batch's first row only (~100 ns a row would be
    a tenth of the read): its snapshots can only hold rows of a later schema when the table was altered
    between reading its metadata and choosing the snapshot."""
    prefix = SCHEMA_ID.pack(schema_id)
    for value in values if schema_id > 1 else values[:1]:
        if value[:SCHEMA_ID_SIZE_BYTES] != prefix:
            raise SchemaNotExistError(
                f"The snapshot holds a row of schema {SCHEMA_ID.unpack(value[:SCHEMA_ID_SIZE_BYTES])[0]}, not "
                f"{schema_id}: the table's columns changed; read it with every schema (Admin.get_table_schemas)."
            )
