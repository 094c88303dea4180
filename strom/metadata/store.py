"""Where cluster metadata lives: databases, tables, partitions, id sequences, KV snapshots, leases, the
lake tiering state and lake snapshots of lake-enabled tables, and ACLs.

``MetadataStore`` is the contract; backends implement it in their own modules (``sqlite_store`` here,
``strom.zk.metadata_store``) and :func:`strom.server.metadata_stores.open_store` picks one by name, above
them, so this contract imports none of its backends.
Every method is atomic: it either applies completely or raises and changes nothing. Every method may
block (a ZooKeeper round trip, an SQLite commit): code on an event loop calls it through
:func:`strom.metadata.off_loop.off_loop`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DatabaseRecord:
    name: str
    database_json: bytes
    created_ms: int
    modified_ms: int


@dataclass(frozen=True, slots=True)
class TableRecord:
    table_id: int
    database: str
    name: str
    table_json: bytes
    schema_id: int
    created_ms: int
    modified_ms: int


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    partition_id: int
    table_id: int
    name: str
    spec: tuple[tuple[str, str], ...]
    created_ms: int


@dataclass(frozen=True, slots=True)
class KvSnapshotRecord:
    """A completed KV snapshot of one bucket; ``snapshot_json`` is its ``_METADATA`` document (the files
    it references, its exclusive log offset, its row count)."""

    table_id: int
    partition_id: int | None
    bucket: int
    snapshot_id: int
    snapshot_json: bytes


@dataclass(frozen=True, slots=True)
class LakeSnapshotRecord:
    """A lake snapshot of a table as the coordinator recorded it (Fluss's lake table entry).

    ``readable`` says whether readers may use it (it has readable offsets); ``snapshot_json`` is the
    coordinator's document: the offsets files' paths and the offsets in them, so reads need no remote I/O.
    """

    table_id: int
    snapshot_id: int
    readable: bool
    snapshot_json: bytes


@dataclass(frozen=True, slots=True, order=True)
class AclRecord:
    """One stored ACL entry; the codes are Fluss's (``strom.security.acl`` gives them names)."""

    resource_type: int
    resource_name: str
    principal_type: str
    principal_name: str
    host: str
    operation: int
    permission: int


class CatalogStore(ABC):
    """Databases, tables (with their earlier schemas) and partitions: what the catalog reads and the coordinator changes."""

    # ---- databases ----
    @abstractmethod
    def create_database(self, record: DatabaseRecord) -> None:
        """Raises DatabaseAlreadyExistError."""

    @abstractmethod
    def get_database(self, name: str) -> DatabaseRecord | None: ...

    @abstractmethod
    def list_databases(self) -> list[str]: ...

    @abstractmethod
    def update_database(self, name: str, database_json: bytes, now_ms: int) -> DatabaseRecord:
        """Replace the database's JSON and set its modified time to ``now_ms`` (its created time stays);
        returns the new record. Raises DatabaseNotExistError."""

    @abstractmethod
    def drop_database(self, name: str) -> None:
        """Drops the database row only; the caller dropped (or refused to drop) its tables first."""

    # ---- tables ----
    @abstractmethod
    def create_table(self, database: str, name: str, table_json: bytes, schema_id: int, now_ms: int) -> TableRecord:
        """Assigns a new table id. Raises TableAlreadyExistError or DatabaseNotExistError."""

    @abstractmethod
    def get_table(self, database: str, name: str) -> TableRecord | None: ...

    @abstractmethod
    def get_table_by_id(self, table_id: int) -> TableRecord | None: ...

    @abstractmethod
    def list_tables(self, database: str) -> list[str]: ...

    @abstractmethod
    def update_table(self, table_id: int, table_json: bytes, now_ms: int, schema_id: int | None = None) -> TableRecord:
        """Replace the table's document. A new ``schema_id`` (the current one plus one) records a schema
        change: the document it replaces is kept as that of the old schema id (:meth:`table_versions`), so
        rows written under it can still be read. Raises TableNotExistError; InvalidAlterTableError when
        ``schema_id`` is not the next one (another change got there first)."""

    @abstractmethod
    def table_versions(self, table_id: int) -> dict[int, bytes]:
        """The documents schema changes replaced, by their schema id (the current one is the table's own)."""

    @abstractmethod
    def drop_table(self, table_id: int) -> None:
        """Drops the table, its partitions, its KV snapshot records, its lake tiering state and its lake
        snapshot records."""

    # ---- partitions ----
    @abstractmethod
    def create_partition(
        self, table_id: int, name: str, spec: tuple[tuple[str, str], ...], now_ms: int
    ) -> PartitionRecord:
        """Assigns a new partition id. Raises PartitionAlreadyExistsError."""

    @abstractmethod
    def list_partitions(self, table_id: int) -> list[PartitionRecord]: ...

    @abstractmethod
    def get_partition(self, table_id: int, name: str) -> PartitionRecord | None: ...

    @abstractmethod
    def get_partition_by_id(self, partition_id: int) -> PartitionRecord | None: ...

    @abstractmethod
    def drop_partition(self, partition_id: int) -> None: ...


class BucketAssignmentStore(ABC):
    """Each bucket's replicas as placed at creation or moved by a rebalance."""

    # ---- bucket assignment ----
    @abstractmethod
    def put_bucket_assignment(self, table_id: int, partition_id: int | None, leaders: Mapping[int, int]) -> None:
        """Record which tablet server leads each bucket (bucket id -> server id) of a table or one
        partition; replaces an earlier assignment. Dropping the table (or the partition) drops it too."""

    @abstractmethod
    def get_bucket_assignment(self, table_id: int, partition_id: int | None) -> dict[int, int] | None:
        """The recorded assignment (bucket id -> server id), None when there is none."""


class RemoteLogManifestStore(ABC):
    """One remote-log manifest handle per bucket; dropping the table or partition drops them."""

    # ---- remote log manifests (one handle per bucket; dropping the table or partition drops them) ----
    @abstractmethod
    def put_remote_log_manifest(self, table_id: int, partition_id: int | None, bucket: int, payload: bytes) -> None:
        """Create or replace the bucket's remote log manifest handle (the current manifest's location)."""

    @abstractmethod
    def get_remote_log_manifest(self, table_id: int, partition_id: int | None, bucket: int) -> bytes | None: ...

    @abstractmethod
    def list_remote_log_manifests(self, table_id: int, partition_id: int | None) -> dict[int, bytes]:
        """The handles of the table's (or partition's) buckets that have a remote log, by bucket."""


class SequenceStore(ABC):
    """Id sequences (tables, partitions, writers): never reused."""

    # ---- sequences ----
    @abstractmethod
    def next_id(self, sequence: str, count: int = 1) -> int:
        """The next value of a named counter (0, 1, 2, ...), durable before it is returned; ``count``
        reserves that many values at once (the next call returns the value after them)."""


class KvSnapshotRecordStore(ABC):
    """The records of completed KV snapshots."""

    # ---- KV snapshots ----
    @abstractmethod
    def add_kv_snapshot(self, record: KvSnapshotRecord) -> None: ...

    @abstractmethod
    def list_kv_snapshots(self, table_id: int | None = None) -> list[KvSnapshotRecord]:
        """Snapshots (of one table, or all) ordered by table, partition, bucket, snapshot id."""

    @abstractmethod
    def list_bucket_kv_snapshots(self, table_id: int, partition_id: int | None, bucket: int) -> list[KvSnapshotRecord]:
        """One bucket's snapshots by snapshot id (what a tablet server asks about the buckets it leads)."""

    @abstractmethod
    def delete_kv_snapshot(self, table_id: int, partition_id: int | None, bucket: int, snapshot_id: int) -> None: ...


class LeaseStore(ABC):
    """KV snapshot leases, one document each."""

    # ---- KV snapshot leases ----
    @abstractmethod
    def put_lease(self, lease_id: str, payload: bytes) -> None:
        """Create or replace a lease's encoded state."""

    @abstractmethod
    def delete_lease(self, lease_id: str) -> None: ...

    @abstractmethod
    def list_leases(self) -> dict[str, bytes]: ...


class ProducerOffsetStore(ABC):
    """Producer offsets: one document per producer id, what an exactly-once writer registered."""

    # ---- producer offsets (one document per producer id: what an exactly-once writer registered) ----
    @abstractmethod
    def create_producer_offsets(self, producer_id: str, payload: bytes) -> bool:
        """Store a producer's offsets unless it has some already: True if created, False if they existed
        (atomic, so of two concurrent registrations exactly one creates)."""

    @abstractmethod
    def get_producer_offsets(self, producer_id: str) -> bytes | None: ...

    @abstractmethod
    def delete_producer_offsets(self, producer_id: str) -> None: ...

    @abstractmethod
    def list_producer_ids(self) -> list[str]: ...


class ClusterConfigStore(ABC):
    """The one document of the settings AlterClusterConfigs changed at run time."""

    # ---- cluster configs (one document: the settings AlterClusterConfigs changed at run time) ----
    @abstractmethod
    def get_cluster_configs(self) -> bytes | None:
        """The encoded dynamic cluster configs, None if none were ever set."""

    @abstractmethod
    def put_cluster_configs(self, payload: bytes) -> None:
        """Create or replace the encoded dynamic cluster configs."""


class RebalanceStore(ABC):
    """Fluss's server tags and rebalance task, one document each."""

    # ---- rebalance (Fluss's server tags and rebalance task, one document each) ----
    @abstractmethod
    def get_server_tags(self) -> bytes | None:
        """The encoded server tags, None if none were ever set."""

    @abstractmethod
    def put_server_tags(self, payload: bytes) -> None: ...

    @abstractmethod
    def get_rebalance_task(self) -> bytes | None:
        """The encoded current (or last) rebalance task, None if there never was one."""

    @abstractmethod
    def put_rebalance_task(self, payload: bytes) -> None: ...


class LakeTieringStateStore(ABC):
    """One small document per lake table the tiering manager knows."""

    # ---- lake tiering state (one small document per lake table the tiering manager knows) ----
    @abstractmethod
    def put_lake_tiering_state(self, table_id: int, payload: bytes) -> None:
        """Create or replace a table's encoded tiering state."""

    @abstractmethod
    def delete_lake_tiering_state(self, table_id: int) -> None: ...

    @abstractmethod
    def list_lake_tiering_states(self) -> dict[int, bytes]: ...


class LakeSnapshotStore(ABC):
    """Lake snapshots per table, in commit order."""

    # ---- lake snapshots (per table, in commit order) ----
    @abstractmethod
    def commit_lake_snapshot(
        self, record: LakeSnapshotRecord, discard_snapshot_ids: Collection[int] = ()
    ) -> list[LakeSnapshotRecord]:
        """Append ``record`` as the table's newest lake snapshot (replacing an entry with the same id) and
        delete the table's ``discard_snapshot_ids``, in one transaction; returns the deleted records."""

    @abstractmethod
    def list_lake_snapshot_ids(self, table_id: int) -> list[int]:
        """The table's lake snapshot ids, oldest commit first."""

    @abstractmethod
    def get_lake_snapshot(
        self, table_id: int, snapshot_id: int | None = None, readable: bool = False
    ) -> LakeSnapshotRecord | None:
        """The snapshot with ``snapshot_id``, else the newest one (the newest readable one if ``readable``)."""


class AclStore(ABC):
    """The ACL entries."""

    # ---- ACLs ----
    @abstractmethod
    def add_acls(self, records: Collection[AclRecord]) -> None:
        """Store the entries; one already stored is kept once."""

    @abstractmethod
    def delete_acls(self, records: Collection[AclRecord]) -> None:
        """Remove the entries; one not stored is ignored."""

    @abstractmethod
    def list_acls(self) -> list[AclRecord]:
        """Every stored entry, sorted."""


class MetadataStore(
    CatalogStore, BucketAssignmentStore, RemoteLogManifestStore, SequenceStore, KvSnapshotRecordStore, LeaseStore,
    ProducerOffsetStore, ClusterConfigStore, RebalanceStore, LakeTieringStateStore, LakeSnapshotStore, AclStore,
):
    """Durable cluster metadata, every concern of it: each component is handed the one it uses (the lease
    manager a :class:`LeaseStore`, the ACL authorizer an :class:`AclStore`, …). Names are case-sensitive;
    ids are never reused."""

    @abstractmethod
    def close(self) -> None: ...


__all__ = [
    "AclRecord",
    "AclStore",
    "BucketAssignmentStore",
    "CatalogStore",
    "ClusterConfigStore",
    "DatabaseRecord",
    "KvSnapshotRecord",
    "KvSnapshotRecordStore",
    "LakeSnapshotRecord",
    "LakeSnapshotStore",
    "LakeTieringStateStore",
    "LeaseStore",
    "MetadataStore",
    "PartitionRecord",
    "ProducerOffsetStore",
    "RebalanceStore",
    "RemoteLogManifestStore",
    "SequenceStore",
    "TableRecord",
]
