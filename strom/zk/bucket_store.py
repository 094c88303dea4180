"""What the ZooKeeper metadata store keeps per bucket and the id counters: bucket leaders, remote log
manifest handles, KV snapshot records and sequences (the :class:`~strom.metadata.store.BucketAssignmentStore`,
:class:`~strom.metadata.store.RemoteLogManifestStore`, :class:`~strom.metadata.store.KvSnapshotRecordStore`
and :class:`~strom.metadata.store.SequenceStore` contracts).

Every per-bucket node hangs under its table id's (or partition id's) node, so dropping the table or the
partition removes it with the rest of the subtree. A partition's per-bucket node may be written before the
partition is registered: the partition id's node is then created naming only its table, so that the
table's listings and drop still find what hangs under it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from kazoo.exceptions import NodeExistsError, NoNodeError

from strom.metadata.store import (
    BucketAssignmentStore,
    KvSnapshotRecord,
    KvSnapshotRecordStore,
    RemoteLogManifestStore,
    SequenceStore,
)
from strom.zk import documents
from strom.zk.documents import unpack
from strom.zk.session import Conflict, Transaction, ZooKeeperSession, check_value_size


class ZooKeeperBucketStore(
    ZooKeeperSession, BucketAssignmentStore, RemoteLogManifestStore, SequenceStore, KvSnapshotRecordStore
):
    """Bucket leaders, remote log manifests, sequences and KV snapshot records in ZooKeeper."""

    # ---- bucket assignment ----
    # The node lives under the table id's (or partition id's) node, so drop_table and drop_partition,
    # which delete those subtrees, remove it with them.
    def put_bucket_assignment(self, table_id: int, partition_id: int | None, leaders: Mapping[int, int]) -> None:
        value = documents.assignment_value(leaders)
        self._put_owned(table_id, partition_id, self._assignment_path(table_id, partition_id), value)

    def _put_owned(self, table_id: int, partition_id: int | None, path: str, value: bytes) -> None:
        """Create or replace a node under a table's or partition's node (creating its parents); a partition's
        node names its table, so drop_table finds (and deletes) what hangs under it."""
        check_value_size(path, value)

        def put() -> None:
            if partition_id is not None:
                with contextlib.suppress(NodeExistsError):
                    self._client.create(self._partition_id_path(partition_id),
                                        documents.partition_owner_value(table_id), makepath=True)
            try:
                self._client.set(path, value)
            except NoNodeError:
                try:
                    self._client.create(path, value, makepath=True)
                except NodeExistsError:
                    raise Conflict(path) from None

        self._run(put)

    def get_bucket_assignment(self, table_id: int, partition_id: int | None) -> dict[int, int] | None:
        found = self._run(lambda: self._get(self._assignment_path(table_id, partition_id)))
        if found is None:
            return None
        return documents.assignment_of(found[0])

    # ---- remote log manifests ----
    def put_remote_log_manifest(self, table_id: int, partition_id: int | None, bucket: int, payload: bytes) -> None:
        self._put_owned(table_id, partition_id, self._remote_logs_path(table_id, partition_id, bucket), payload)

    def get_remote_log_manifest(self, table_id: int, partition_id: int | None, bucket: int) -> bytes | None:
        return self._value(self._remote_logs_path(table_id, partition_id, bucket))

    def list_remote_log_manifests(self, table_id: int, partition_id: int | None) -> dict[int, bytes]:
        owner = self._owner_path(table_id, partition_id)

        def read() -> dict[int, bytes]:
            found = {}
            for bucket in self._children(f"{owner}/buckets"):
                if bucket.isdigit():
                    node = self._get(self._remote_logs_path(table_id, partition_id, int(bucket)))
                    if node is not None:
                        found[int(bucket)] = node[0]
            return dict(sorted(found.items()))

        return self._run(read)

    # ---- sequences ----
    def next_id(self, sequence: str, count: int = 1) -> int:
        if count <= 0:
            raise ValueError(f"a counter reserves a positive count of values, got {count}")

        def bump() -> int:
            transaction = Transaction(self._client)
            value = self._next_value(transaction, sequence, count)
            transaction.commit()
            return value

        return self._run(bump)

    # ---- KV snapshots ----
    def add_kv_snapshot(self, record: KvSnapshotRecord) -> None:
        path = f"{self._bucket_snapshots_path(record.table_id, record.partition_id, record.bucket)}/{record.snapshot_id}"
        check_value_size(path, record.snapshot_json)

        def add() -> None:
            if record.partition_id is not None:
                # the partition's node names its table, for the table's listings and drop
                with contextlib.suppress(NodeExistsError):
                    self._client.create(
                        self._partition_id_path(record.partition_id), documents.partition_owner_value(record.table_id)
                    )
            try:
                self._client.create(path, record.snapshot_json, makepath=True)
            except NodeExistsError:
                existing = self._get(path)
                if existing is None:
                    raise Conflict(path) from None
                if existing[0] != record.snapshot_json:  # the same record again is a retried add
                    raise ValueError(f"KV snapshot {path} is already recorded with another document") from None

        self._run(add)

    def _snapshots_under(self, owners: list[tuple[int, int | None, str]]) -> list[KvSnapshotRecord]:
        """Snapshot records under the given (table id, partition id, owner node) triples."""
        bucket_lists = self._children_many([f"{owner}/buckets" for _, _, owner in owners])
        buckets = [
            (table_id, partition_id, int(bucket), f"{owner}/buckets/{bucket}/snapshots")
            for (table_id, partition_id, owner), names in zip(owners, bucket_lists, strict=True)
            for bucket in names
        ]
        snapshot_lists = self._children_many([path for *_, path in buckets])
        leaves = [
            (table_id, partition_id, bucket, int(snapshot_id), f"{path}/{snapshot_id}")
            for (table_id, partition_id, bucket, path), names in zip(buckets, snapshot_lists, strict=True)
            for snapshot_id in names
        ]
        values = self._get_many([path for *_, path in leaves])
        records = [
            KvSnapshotRecord(table_id, partition_id, bucket, snapshot_id, value)
            for (table_id, partition_id, bucket, snapshot_id, _), value in zip(leaves, values, strict=True)
            if value is not None
        ]
        return sorted(records, key=lambda r: (r.table_id, -1 if r.partition_id is None else r.partition_id,
                                              r.bucket, r.snapshot_id))

    def list_kv_snapshots(self, table_id: int | None = None) -> list[KvSnapshotRecord]:
        def read() -> list[KvSnapshotRecord]:
            owners: list[tuple[int, int | None, str]] = []
            if table_id is None:
                tables = self._children(self._path("/tabletservers/tables"))
                owners += [(int(name), None, self._table_id_path(int(name))) for name in tables]
                parent = self._path("/tabletservers/partitions")
                partitions = self._children(parent)
                values = self._get_many([f"{parent}/{name}" for name in partitions])
                owners += [
                    (int(unpack(value)[0]["table_id"]), int(name), f"{parent}/{name}")
                    for name, value in zip(partitions, values, strict=True)
                    if value is not None
                ]
            else:
                owners.append((table_id, None, self._table_id_path(table_id)))
                owners += [(table_id, pid, self._partition_id_path(pid)) for pid in self._partition_ids_of(table_id)]
            return self._snapshots_under(owners)

        return self._run(read)

    def list_bucket_kv_snapshots(self, table_id: int, partition_id: int | None, bucket: int) -> list[KvSnapshotRecord]:
        def read() -> list[KvSnapshotRecord]:
            parent = self._bucket_snapshots_path(table_id, partition_id, bucket)
            ids = sorted(int(name) for name in self._children(parent))
            values = self._get_many([f"{parent}/{snapshot_id}" for snapshot_id in ids])
            return [
                KvSnapshotRecord(table_id, partition_id, bucket, snapshot_id, value)
                for snapshot_id, value in zip(ids, values, strict=True)
                if value is not None
            ]

        return self._run(read)

    def delete_kv_snapshot(self, table_id: int, partition_id: int | None, bucket: int, snapshot_id: int) -> None:
        self._delete(f"{self._bucket_snapshots_path(table_id, partition_id, bucket)}/{snapshot_id}")
