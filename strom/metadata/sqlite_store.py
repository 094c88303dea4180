"""The embedded metadata store: one SQLite file in WAL mode with ``synchronous=FULL``.

Every call is one transaction, committed (and fsynced) before it returns, so metadata a client was told
about survives a crash. The store is used from one thread at a time (the server's event loop); the
connection is opened with ``check_same_thread=False`` so tests and tools may hand it between threads.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager

from strom.errors import (
    DatabaseAlreadyExistError,
    DatabaseNotEmptyError,
    DatabaseNotExistError,
    InvalidAlterTableError,
    PartitionAlreadyExistsError,
    TableAlreadyExistError,
    TableNotExistError,
)
from strom.metadata.store import (
    AclRecord,
    DatabaseRecord,
    KvSnapshotRecord,
    LakeSnapshotRecord,
    MetadataStore,
    PartitionRecord,
    TableRecord,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS databases (
    name TEXT PRIMARY KEY, database_json BLOB NOT NULL, created_ms INTEGER NOT NULL, modified_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tables (
    table_id INTEGER PRIMARY KEY, database TEXT NOT NULL REFERENCES databases(name), name TEXT NOT NULL,
    table_json BLOB NOT NULL, schema_id INTEGER NOT NULL, created_ms INTEGER NOT NULL, modified_ms INTEGER NOT NULL,
    UNIQUE (database, name));
CREATE TABLE IF NOT EXISTS partitions (
    partition_id INTEGER PRIMARY KEY, table_id INTEGER NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
    created_ms INTEGER NOT NULL, UNIQUE (table_id, name));
CREATE TABLE IF NOT EXISTS table_versions (
    table_id INTEGER NOT NULL, schema_id INTEGER NOT NULL, table_json BLOB NOT NULL, PRIMARY KEY (table_id, schema_id));
CREATE TABLE IF NOT EXISTS sequences (name TEXT PRIMARY KEY, next_value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS kv_snapshots (
    table_id INTEGER NOT NULL, partition_id INTEGER NOT NULL, bucket INTEGER NOT NULL, snapshot_id INTEGER NOT NULL,
    snapshot_json BLOB NOT NULL, PRIMARY KEY (table_id, partition_id, bucket, snapshot_id));
CREATE TABLE IF NOT EXISTS bucket_assignments (
    table_id INTEGER NOT NULL, partition_id INTEGER NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (table_id, partition_id));
CREATE TABLE IF NOT EXISTS remote_log_manifests (
    table_id INTEGER NOT NULL, partition_id INTEGER NOT NULL, bucket INTEGER NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (table_id, partition_id, bucket));
CREATE TABLE IF NOT EXISTS leases (lease_id TEXT PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS lake_tiering (table_id INTEGER PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS producer_offsets (producer_id TEXT PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS cluster_documents (name TEXT PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS lake_snapshots (
    table_id INTEGER NOT NULL, seq INTEGER NOT NULL, snapshot_id INTEGER NOT NULL, readable INTEGER NOT NULL,
    snapshot_json BLOB NOT NULL, PRIMARY KEY (table_id, seq), UNIQUE (table_id, snapshot_id));
CREATE TABLE IF NOT EXISTS acls (
    resource_type INTEGER NOT NULL, resource_name TEXT NOT NULL, principal_type TEXT NOT NULL,
    principal_name TEXT NOT NULL, host TEXT NOT NULL, operation INTEGER NOT NULL, permission INTEGER NOT NULL,
    PRIMARY KEY (resource_type, resource_name, principal_type, principal_name, host, operation, permission));
"""

# SQLite cannot key on NULL, so "no partition" is stored as -1 (Fluss never assigns negative ids).
_NO_PARTITION = -1


def _partition_key(partition_id: int | None) -> int:
    return _NO_PARTITION if partition_id is None else partition_id


class SqliteMetadataStore(MetadataStore):
    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, *args: object) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- databases ----
    def create_database(self, record: DatabaseRecord) -> None:
        try:
            with self._transaction() as db:
                db.execute(
                    "INSERT INTO databases VALUES (?, ?, ?, ?)",
                    (record.name, record.database_json, record.created_ms, record.modified_ms),
                )
        except sqlite3.IntegrityError as exc:
            raise DatabaseAlreadyExistError(f"Database {record.name} already exists.") from exc

    def get_database(self, name: str) -> DatabaseRecord | None:
        rows = self._query("SELECT name, database_json, created_ms, modified_ms FROM databases WHERE name = ?", name)
        return DatabaseRecord(*rows[0]) if rows else None

    def list_databases(self) -> list[str]:
        return [row[0] for row in self._query("SELECT name FROM databases ORDER BY name")]

    def update_database(self, name: str, database_json: bytes, now_ms: int) -> DatabaseRecord:
        with self._transaction() as db:
            updated = db.execute(
                "UPDATE databases SET database_json = ?, modified_ms = ? WHERE name = ?",
                (database_json, now_ms, name),
            ).rowcount
            if updated == 0:
                raise DatabaseNotExistError(f"Database {name} does not exist.")
            row = db.execute(
                "SELECT name, database_json, created_ms, modified_ms FROM databases WHERE name = ?", (name,)
            ).fetchone()
        return DatabaseRecord(*row)

    def drop_database(self, name: str) -> None:
        try:
            with self._transaction() as db:
                db.execute("DELETE FROM databases WHERE name = ?", (name,))
        except sqlite3.IntegrityError as exc:  # the tables' foreign key: the caller did not drop them first
            raise DatabaseNotEmptyError(f"Database {name} still has tables.") from exc

    # ---- tables ----
    def create_table(self, database: str, name: str, table_json: bytes, schema_id: int, now_ms: int) -> TableRecord:
        try:
            with self._transaction() as db:
                if db.execute("SELECT 1 FROM databases WHERE name = ?", (database,)).fetchone() is None:
                    raise DatabaseNotExistError(f"Database {database} does not exist.")
                table_id = self._next_id(db, "table")
                db.execute(
                    "INSERT INTO tables VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (table_id, database, name, table_json, schema_id, now_ms, now_ms),
                )
        except sqlite3.IntegrityError as exc:
            raise TableAlreadyExistError(f"Table {database}.{name} already exists.") from exc
        return TableRecord(table_id, database, name, table_json, schema_id, now_ms, now_ms)

    _TABLE_COLUMNS = "table_id, database, name, table_json, schema_id, created_ms, modified_ms"

    def get_table(self, database: str, name: str) -> TableRecord | None:
        rows = self._query(f"SELECT {self._TABLE_COLUMNS} FROM tables WHERE database = ? AND name = ?", database, name)
        return TableRecord(*rows[0]) if rows else None

    def get_table_by_id(self, table_id: int) -> TableRecord | None:
        rows = self._query(f"SELECT {self._TABLE_COLUMNS} FROM tables WHERE table_id = ?", table_id)
        return TableRecord(*rows[0]) if rows else None

    def list_tables(self, database: str) -> list[str]:
        return [row[0] for row in self._query("SELECT name FROM tables WHERE database = ? ORDER BY name", database)]

    def update_table(self, table_id: int, table_json: bytes, now_ms: int, schema_id: int | None = None) -> TableRecord:
        with self._transaction() as db:
            row = db.execute(f"SELECT {self._TABLE_COLUMNS} FROM tables WHERE table_id = ?", (table_id,)).fetchone()
            if row is None:
                raise TableNotExistError(f"Table id {table_id} does not exist.")
            current = TableRecord(*row)
            if schema_id is not None and schema_id != current.schema_id:
                if schema_id != current.schema_id + 1:
                    raise InvalidAlterTableError(
                        f"Table id {table_id} is at schema {current.schema_id}, not {schema_id - 1}: its schema "
                        "changed meanwhile; retry."
                    )
                db.execute(
                    "INSERT INTO table_versions VALUES (?, ?, ?)", (table_id, current.schema_id, current.table_json)
                )
            new_schema_id = current.schema_id if schema_id is None else schema_id
            db.execute(
                "UPDATE tables SET table_json = ?, schema_id = ?, modified_ms = ? WHERE table_id = ?",
                (table_json, new_schema_id, now_ms, table_id),
            )
        return TableRecord(
            table_id, current.database, current.name, table_json, new_schema_id, current.created_ms, now_ms
        )

    def table_versions(self, table_id: int) -> dict[int, bytes]:
        rows = self._query("SELECT schema_id, table_json FROM table_versions WHERE table_id = ?", table_id)
        return {int(schema_id): bytes(table_json) for schema_id, table_json in rows}

    def drop_table(self, table_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM tables WHERE table_id = ?", (table_id,))
            db.execute("DELETE FROM partitions WHERE table_id = ?", (table_id,))
            db.execute("DELETE FROM table_versions WHERE table_id = ?", (table_id,))
            db.execute("DELETE FROM kv_snapshots WHERE table_id = ?", (table_id,))
            db.execute("DELETE FROM bucket_assignments WHERE table_id = ?", (table_id,))
            db.execute("DELETE FROM remote_log_manifests WHERE table_id = ?", (table_id,))
            db.execute("DELETE FROM lake_tiering WHERE table_id = ?", (table_id,))
            db.execute("DELETE FROM lake_snapshots WHERE table_id = ?", (table_id,))

    # ---- partitions ----
    def create_partition(
        self, table_id: int, name: str, spec: tuple[tuple[str, str], ...], now_ms: int
    ) -> PartitionRecord:
        try:
            with self._transaction() as db:
                if db.execute("SELECT 1 FROM tables WHERE table_id = ?", (table_id,)).fetchone() is None:
                    raise TableNotExistError(f"Table id {table_id} does not exist.")
                partition_id = self._next_id(db, "partition")
                db.execute(
                    "INSERT INTO partitions VALUES (?, ?, ?, ?, ?)",
                    (partition_id, table_id, name, json.dumps([list(kv) for kv in spec]), now_ms),
                )
        except sqlite3.IntegrityError as exc:
            raise PartitionAlreadyExistsError(f"Partition {name} already exists.") from exc
        return PartitionRecord(partition_id, table_id, name, spec, now_ms)

    @staticmethod
    def _partition(row: tuple) -> PartitionRecord:
        spec = tuple((str(k), str(v)) for k, v in json.loads(row[3]))
        return PartitionRecord(row[0], row[1], row[2], spec, row[4])

    def list_partitions(self, table_id: int) -> list[PartitionRecord]:
        rows = self._query("SELECT * FROM partitions WHERE table_id = ? ORDER BY partition_id", table_id)
        return [self._partition(row) for row in rows]

    def get_partition(self, table_id: int, name: str) -> PartitionRecord | None:
        rows = self._query("SELECT * FROM partitions WHERE table_id = ? AND name = ?", table_id, name)
        return self._partition(rows[0]) if rows else None

    def get_partition_by_id(self, partition_id: int) -> PartitionRecord | None:
        rows = self._query("SELECT * FROM partitions WHERE partition_id = ?", partition_id)
        return self._partition(rows[0]) if rows else None

    def drop_partition(self, partition_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM partitions WHERE partition_id = ?", (partition_id,))
            db.execute("DELETE FROM kv_snapshots WHERE partition_id = ?", (partition_id,))
            db.execute("DELETE FROM bucket_assignments WHERE partition_id = ?", (partition_id,))
            db.execute("DELETE FROM remote_log_manifests WHERE partition_id = ?", (partition_id,))

    # ---- bucket assignment ----
    def put_bucket_assignment(self, table_id: int, partition_id: int | None, leaders: Mapping[int, int]) -> None:
        payload = json.dumps({str(bucket): server for bucket, server in sorted(leaders.items())})
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO bucket_assignments VALUES (?, ?, ?)",
                (table_id, _partition_key(partition_id), payload),
            )

    def get_bucket_assignment(self, table_id: int, partition_id: int | None) -> dict[int, int] | None:
        rows = self._query(
            "SELECT payload FROM bucket_assignments WHERE table_id = ? AND partition_id = ?",
            table_id,
            _partition_key(partition_id),
        )
        return _assignment(rows[0][0]) if rows else None

    # ---- remote log manifests ----
    def put_remote_log_manifest(self, table_id: int, partition_id: int | None, bucket: int, payload: bytes) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO remote_log_manifests VALUES (?, ?, ?, ?)",
                       (table_id, _partition_key(partition_id), bucket, payload))

    def get_remote_log_manifest(self, table_id: int, partition_id: int | None, bucket: int) -> bytes | None:
        rows = self._query(
            "SELECT payload FROM remote_log_manifests WHERE table_id = ? AND partition_id = ? AND bucket = ?",
            table_id, _partition_key(partition_id), bucket,
        )
        return bytes(rows[0][0]) if rows else None

    def list_remote_log_manifests(self, table_id: int, partition_id: int | None) -> dict[int, bytes]:
        rows = self._query(
            "SELECT bucket, payload FROM remote_log_manifests WHERE table_id = ? AND partition_id = ? ORDER BY bucket",
            table_id, _partition_key(partition_id),
        )
        return {int(row[0]): bytes(row[1]) for row in rows}

    # ---- sequences ----
    @staticmethod
    def _next_id(db: sqlite3.Connection, sequence: str, count: int = 1) -> int:
        row = db.execute("SELECT next_value FROM sequences WHERE name = ?", (sequence,)).fetchone()
        value = 0 if row is None else int(row[0])
        db.execute("INSERT OR REPLACE INTO sequences VALUES (?, ?)", (sequence, value + count))
        return value

    def next_id(self, sequence: str, count: int = 1) -> int:
        if count <= 0:
            raise ValueError(f"a counter reserves a positive count of values, got {count}")
        with self._transaction() as db:
            return self._next_id(db, sequence, count)

    # ---- KV snapshots ----
    def add_kv_snapshot(self, record: KvSnapshotRecord) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO kv_snapshots VALUES (?, ?, ?, ?, ?)",
                (
                    record.table_id,
                    _partition_key(record.partition_id),
                    record.bucket,
                    record.snapshot_id,
                    record.snapshot_json,
                ),
            )

    def list_kv_snapshots(self, table_id: int | None = None) -> list[KvSnapshotRecord]:
        sql = "SELECT * FROM kv_snapshots"
        args: list[object] = []
        if table_id is not None:
            sql += " WHERE table_id = ?"
            args.append(table_id)
        rows = self._query(sql + " ORDER BY table_id, partition_id, bucket, snapshot_id", *args)
        return [
            KvSnapshotRecord(r[0], None if r[1] == _NO_PARTITION else r[1], r[2], r[3], bytes(r[4])) for r in rows
        ]

    def list_bucket_kv_snapshots(self, table_id: int, partition_id: int | None, bucket: int) -> list[KvSnapshotRecord]:
        rows = self._query(
            "SELECT * FROM kv_snapshots WHERE table_id = ? AND partition_id = ? AND bucket = ? ORDER BY snapshot_id",
            table_id, _partition_key(partition_id), bucket,
        )
        return [KvSnapshotRecord(table_id, partition_id, bucket, r[3], bytes(r[4])) for r in rows]

    def delete_kv_snapshot(self, table_id: int, partition_id: int | None, bucket: int, snapshot_id: int) -> None:
        with self._transaction() as db:
            db.execute(
                "DELETE FROM kv_snapshots WHERE table_id = ? AND partition_id = ? AND bucket = ? AND snapshot_id = ?",
                (table_id, _partition_key(partition_id), bucket, snapshot_id),
            )

    # ---- leases ----
    def put_lease(self, lease_id: str, payload: bytes) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?)", (lease_id, payload))

    def delete_lease(self, lease_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))

    def list_leases(self) -> dict[str, bytes]:
        return {row[0]: bytes(row[1]) for row in self._query("SELECT lease_id, payload FROM leases")}

    # ---- producer offsets ----
    def create_producer_offsets(self, producer_id: str, payload: bytes) -> bool:
        with self._transaction() as db:
            cursor = db.execute("INSERT OR IGNORE INTO producer_offsets VALUES (?, ?)", (producer_id, payload))
            return cursor.rowcount == 1

    def get_producer_offsets(self, producer_id: str) -> bytes | None:
        rows = self._query("SELECT payload FROM producer_offsets WHERE producer_id = ?", producer_id)
        return bytes(rows[0][0]) if rows else None

    def delete_producer_offsets(self, producer_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM producer_offsets WHERE producer_id = ?", (producer_id,))

    def list_producer_ids(self) -> list[str]:
        return [row[0] for row in self._query("SELECT producer_id FROM producer_offsets ORDER BY producer_id")]

    # ---- one-document settings: cluster configs, server tags, the rebalance task ----
    def _document(self, name: str) -> bytes | None:
        rows = self._query("SELECT payload FROM cluster_documents WHERE name = ?", name)
        return bytes(rows[0][0]) if rows else None

    def _put_document(self, name: str, payload: bytes) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO cluster_documents VALUES (?, ?)", (name, payload))

    def get_cluster_configs(self) -> bytes | None:
        return self._document("cluster_configs")

    def put_cluster_configs(self, payload: bytes) -> None:
        self._put_document("cluster_configs", payload)

    def get_server_tags(self) -> bytes | None:
        return self._document("server_tags")

    def put_server_tags(self, payload: bytes) -> None:
        self._put_document("server_tags", payload)

    def get_rebalance_task(self) -> bytes | None:
        return self._document("rebalance")

    def put_rebalance_task(self, payload: bytes) -> None:
        self._put_document("rebalance", payload)

    # ---- lake tiering state ----
    def put_lake_tiering_state(self, table_id: int, payload: bytes) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO lake_tiering VALUES (?, ?)", (table_id, payload))

    def delete_lake_tiering_state(self, table_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM lake_tiering WHERE table_id = ?", (table_id,))

    def list_lake_tiering_states(self) -> dict[int, bytes]:
        return {int(row[0]): bytes(row[1]) for row in self._query("SELECT table_id, payload FROM lake_tiering")}

    # ---- lake snapshots ----
    # ``seq`` orders a table's snapshots by commit: lake snapshot ids need not grow (Iceberg's are random).
    _LAKE_COLUMNS = "table_id, snapshot_id, readable, snapshot_json"

    @staticmethod
    def _lake_snapshot(row: tuple) -> LakeSnapshotRecord:
        return LakeSnapshotRecord(int(row[0]), int(row[1]), bool(row[2]), bytes(row[3]))

    def commit_lake_snapshot(
        self, record: LakeSnapshotRecord, discard_snapshot_ids: Collection[int] = ()
    ) -> list[LakeSnapshotRecord]:
        assert record.snapshot_id not in discard_snapshot_ids, "a snapshot cannot replace and discard itself"
        with self._transaction() as db:
            discarded = []
            for snapshot_id in discard_snapshot_ids:
                row = db.execute(
                    f"SELECT {self._LAKE_COLUMNS} FROM lake_snapshots WHERE table_id = ? AND snapshot_id = ?",
                    (record.table_id, snapshot_id),
                ).fetchone()
                if row is not None:
                    discarded.append(self._lake_snapshot(row))
                    db.execute(
                        "DELETE FROM lake_snapshots WHERE table_id = ? AND snapshot_id = ?",
                        (record.table_id, snapshot_id),
                    )
            db.execute(
                "DELETE FROM lake_snapshots WHERE table_id = ? AND snapshot_id = ?", (record.table_id, record.snapshot_id)
            )
            (last_seq,) = db.execute(
                "SELECT COALESCE(MAX(seq), -1) FROM lake_snapshots WHERE table_id = ?", (record.table_id,)
            ).fetchone()
            db.execute(
                "INSERT INTO lake_snapshots VALUES (?, ?, ?, ?, ?)",
                (record.table_id, int(last_seq) + 1, record.snapshot_id, int(record.readable), record.snapshot_json),
            )
        return discarded

    def list_lake_snapshot_ids(self, table_id: int) -> list[int]:
        rows = self._query("SELECT snapshot_id FROM lake_snapshots WHERE table_id = ? ORDER BY seq", table_id)
        return [int(row[0]) for row in rows]

    def get_lake_snapshot(
        self, table_id: int, snapshot_id: int | None = None, readable: bool = False
    ) -> LakeSnapshotRecord | None:
        sql = f"SELECT {self._LAKE_COLUMNS} FROM lake_snapshots WHERE table_id = ?"
        args: list[object] = [table_id]
        if snapshot_id is not None:
            sql += " AND snapshot_id = ?"
            args.append(snapshot_id)
        if readable:
            sql += " AND readable = 1"
        rows = self._query(sql + " ORDER BY seq DESC LIMIT 1", *args)
        return self._lake_snapshot(rows[0]) if rows else None

    # ---- ACLs ----
    def add_acls(self, records: Collection[AclRecord]) -> None:
        with self._transaction() as db:
            db.executemany("INSERT OR IGNORE INTO acls VALUES (?, ?, ?, ?, ?, ?, ?)", [_acl_row(r) for r in records])

    def delete_acls(self, records: Collection[AclRecord]) -> None:
        with self._transaction() as db:
            db.executemany(
                "DELETE FROM acls WHERE resource_type = ? AND resource_name = ? AND principal_type = ? AND "
                "principal_name = ? AND host = ? AND operation = ? AND permission = ?",
                [_acl_row(r) for r in records],
            )

    def list_acls(self) -> list[AclRecord]:
        rows = self._query("SELECT * FROM acls ORDER BY 1, 2, 3, 4, 5, 6, 7")
        return [AclRecord(int(a), b, c, d, e, int(f), int(g)) for a, b, c, d, e, f, g in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _assignment(payload: str | bytes) -> dict[int, int]:
    return {int(bucket): int(server) for bucket, server in json.loads(payload).items()}


def _acl_row(record: AclRecord) -> tuple[int, str, str, str, str, int, int]:
    return (record.resource_type, record.resource_name, record.principal_type, record.principal_name, record.host,
            record.operation, record.permission)
