"""The catalog's part of the ZooKeeper metadata store: databases, tables (and their schema history) and
partitions, the :class:`~strom.metadata.store.CatalogStore` contract.

A database, table or partition is registered under its name (``/metadata/databases/...``) and, for tables
and partitions, under its id (``/tabletservers/tables/<id>``, ``/tabletservers/partitions/<id>``) in the
same transaction, with the id counter's bump. Dropping a table or partition deletes the subtrees of its id,
where everything else the store keeps of it hangs, registration last.
"""

from __future__ import annotations

import uuid
from urllib.parse import unquote

from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from strom.errors import (
    DatabaseAlreadyExistError,
    DatabaseNotEmptyError,
    DatabaseNotExistError,
    InvalidAlterTableError,
    PartitionAlreadyExistsError,
    TableAlreadyExistError,
    TableNotExistError,
)
from strom.metadata.store import CatalogStore, DatabaseRecord, PartitionRecord, TableRecord
from strom.zk import documents
from strom.zk.documents import escape, nonce_of, unpack
from strom.zk.session import Conflict, Transaction, ZooKeeperSession, check_value_size


class ZooKeeperCatalogStore(ZooKeeperSession, CatalogStore):
    """Databases, tables and partitions in ZooKeeper."""

    # ---- databases ----
    def create_database(self, record: DatabaseRecord) -> None:
        nonce = uuid.uuid4().hex
        path = self._database_path(record.name)

        def create() -> None:
            found = self._get(path)
            if found is not None:
                if nonce_of(found[0]) == nonce:
                    return  # our own create, whose reply a lost connection swallowed
                raise DatabaseAlreadyExistError(f"Database {record.name} already exists.")
            transaction = Transaction(self._client)
            transaction.create(
                path, documents.database_value(record.created_ms, record.modified_ms, record.database_json, nonce)
            )
            transaction.create(f"{path}/tables")
            transaction.commit()

        self._run(create)

    def get_database(self, name: str) -> DatabaseRecord | None:
        found = self._run(lambda: self._get(self._database_path(name)))
        if found is None:
            return None
        return documents.database_record(name, found[0])

    def list_databases(self) -> list[str]:
        names = self._run(lambda: self._children(self._path("/metadata/databases")))
        return sorted(unquote(name) for name in names)

    def update_database(self, name: str, database_json: bytes, now_ms: int) -> DatabaseRecord:
        path = self._database_path(name)

        def update() -> DatabaseRecord:
            found = self._get(path)
            if found is None:
                raise DatabaseNotExistError(f"Database {name} does not exist.")
            header, _ = unpack(found[0])
            created_ms = int(header["created_ms"])
            value = documents.database_value(created_ms, now_ms, database_json)
            check_value_size(path, value)
            try:
                self._client.set(path, value, version=found[1].version)
            except (BadVersionError, NoNodeError):
                raise Conflict(name) from None
            return DatabaseRecord(name, database_json, created_ms, now_ms)

        return self._run(update)

    def drop_database(self, name: str) -> None:
        path = self._database_path(name)

        def drop() -> None:
            if self._get(path) is None:
                return
            if self._children(f"{path}/tables"):
                raise DatabaseNotEmptyError(f"Database {name} still has tables.")
            transaction = Transaction(self._client)
            if self._client.exists(f"{path}/tables") is not None:
                transaction.delete(f"{path}/tables")
            transaction.delete(path)
            transaction.commit()

        self._run(drop)

    # ---- tables ----
    def create_table(self, database: str, name: str, table_json: bytes, schema_id: int, now_ms: int) -> TableRecord:
        nonce = uuid.uuid4().hex
        path = self._table_path(database, name)

        def create() -> TableRecord:
            if self._get(self._database_path(database)) is None:
                raise DatabaseNotExistError(f"Database {database} does not exist.")
            found = self._get(path)
            if found is not None:
                if nonce_of(found[0]) == nonce:
                    return documents.table_record(database, name, found[0])
                raise TableAlreadyExistError(f"Table {database}.{name} already exists.")
            transaction = Transaction(self._client)
            table_id = self._next_value(transaction, "table")
            transaction.check(self._database_path(database), -1)
            transaction.create(path, documents.table_value(table_id, schema_id, now_ms, now_ms, table_json, nonce))
            transaction.create(f"{path}/partitions")
            id_path = self._table_id_path(table_id)
            id_value = documents.table_id_value(database, name)
            existing = self._get(id_path)  # a KV snapshot recorded ahead of its table (tests do)
            if existing is None:
                transaction.create(id_path, id_value)
            else:
                transaction.set_data(id_path, id_value, existing[1].version)
            transaction.commit()
            return TableRecord(table_id, database, name, table_json, schema_id, now_ms, now_ms)

        return self._run(create)

    def get_table(self, database: str, name: str) -> TableRecord | None:
        found = self._run(lambda: self._get(self._table_path(database, name)))
        return None if found is None else documents.table_record(database, name, found[0])

    def _table_location(self, table_id: int) -> tuple[str, str] | None:
        """(database, table) of a registered table id."""
        found = self._get(self._table_id_path(table_id))
        if found is None:
            return None
        return documents.table_location(found[0])

    def _get_table_by_id(self, table_id: int) -> tuple[TableRecord, ZnodeStat] | None:
        location = self._table_location(table_id)
        if location is None:
            return None
        found = self._get(self._table_path(*location))
        if found is None:
            return None
        record = documents.table_record(*location, found[0])
        return (record, found[1]) if record.table_id == table_id else None

    def get_table_by_id(self, table_id: int) -> TableRecord | None:
        found = self._run(lambda: self._get_table_by_id(table_id))
        return None if found is None else found[0]

    def list_tables(self, database: str) -> list[str]:
        names = self._run(lambda: self._children(f"{self._database_path(database)}/tables"))
        return sorted(unquote(name) for name in names)

    def update_table(self, table_id: int, table_json: bytes, now_ms: int, schema_id: int | None = None) -> TableRecord:
        def update() -> TableRecord:
            found = self._get_table_by_id(table_id)
            if found is None:
                raise TableNotExistError(f"Table id {table_id} does not exist.")
            record, stat = found
            new_schema_id = record.schema_id if schema_id is None else schema_id
            table_path = self._table_path(record.database, record.name)
            value = documents.table_value(table_id, new_schema_id, record.created_ms, now_ms, table_json)
            check_value_size(table_path, value)
            transaction = Transaction(self._client)
            transaction.set_data(table_path, value, stat.version)
            if new_schema_id != record.schema_id:
                if new_schema_id != record.schema_id + 1:
                    raise InvalidAlterTableError(
                        f"Table id {table_id} is at schema {record.schema_id}, not {new_schema_id - 1}: its schema "
                        "changed meanwhile; retry."
                    )
                schemas = f"{self._table_id_path(table_id)}/schemas"
                if self._get(schemas) is None:
                    transaction.create(schemas)
                transaction.create(f"{schemas}/{record.schema_id}", record.table_json)
            transaction.commit()
            return TableRecord(
                table_id, record.database, record.name, table_json, new_schema_id, record.created_ms, now_ms
            )

        return self._run(update)

    def table_versions(self, table_id: int) -> dict[int, bytes]:
        def read() -> dict[int, bytes]:
            schemas = f"{self._table_id_path(table_id)}/schemas"
            names = self._children(schemas)
            values = self._get_many([f"{schemas}/{name}" for name in names])
            return {int(name): value for name, value in zip(names, values, strict=True) if value is not None}

        return self._run(read)

    def drop_table(self, table_id: int) -> None:
        def drop() -> None:
            location = self._table_location(table_id)
            last = []
            if location is not None:
                table_path = self._table_path(*location)
                found = self._get(table_path)
                if found is not None and unpack(found[0])[0].get("table_id") == table_id:
                    last.append(table_path)
            roots = [self._partition_id_path(pid) for pid in self._partition_ids_of(table_id)]
            roots += [self._path(f"/lake/tiering/{table_id}"), self._table_id_path(table_id)]
            self._delete_tree_in_transactions(roots, last)

        self._run(drop)

    # ---- partitions ----
    def create_partition(
        self, table_id: int, name: str, spec: tuple[tuple[str, str], ...], now_ms: int
    ) -> PartitionRecord:
        nonce = uuid.uuid4().hex

        def create() -> PartitionRecord:
            found = self._get_table_by_id(table_id)
            if found is None:
                raise TableNotExistError(f"Table id {table_id} does not exist.")
            table, _ = found
            table_path = self._table_path(table.database, table.name)
            path = f"{table_path}/partitions/{escape(name)}"
            existing = self._get(path)
            if existing is not None:
                if nonce_of(existing[0]) == nonce:
                    return documents.partition_record(table_id, name, existing[0])
                raise PartitionAlreadyExistsError(f"Partition {name} already exists.")
            transaction = Transaction(self._client)
            partition_id = self._next_value(transaction, "partition")
            transaction.check(table_path, -1)
            transaction.create(path, documents.partition_value(partition_id, spec, now_ms, nonce))
            id_path = self._partition_id_path(partition_id)
            id_value = documents.partition_id_value(table_id, table.database, table.name, name)
            id_node = self._get(id_path)
            if id_node is None:
                transaction.create(id_path, id_value)
            else:
                transaction.set_data(id_path, id_value, id_node[1].version)
            transaction.commit()
            return PartitionRecord(partition_id, table_id, name, spec, now_ms)

        return self._run(create)

    def list_partitions(self, table_id: int) -> list[PartitionRecord]:
        def read() -> list[PartitionRecord]:
            location = self._table_location(table_id)
            if location is None:
                return []
            parent = f"{self._table_path(*location)}/partitions"
            names = self._children(parent)
            values = self._get_many([f"{parent}/{name}" for name in names])
            records = [
                documents.partition_record(table_id, unquote(name), value)
                for name, value in zip(names, values, strict=True)
                if value is not None
            ]
            return sorted(records, key=lambda record: record.partition_id)

        return self._run(read)

    def get_partition(self, table_id: int, name: str) -> PartitionRecord | None:
        def read() -> PartitionRecord | None:
            location = self._table_location(table_id)
            if location is None:
                return None
            found = self._get(f"{self._table_path(*location)}/partitions/{escape(name)}")
            return None if found is None else documents.partition_record(table_id, name, found[0])

        return self._run(read)

    def _partition_location(self, partition_id: int) -> tuple[int, str] | None:
        """(table id, registration path) of a registered partition id."""
        found = self._get(self._partition_id_path(partition_id))
        if found is None:
            return None
        location = documents.partition_location(found[0])
        if location is None:
            return None
        table_id, database, table, partition = location
        return table_id, f"{self._table_path(database, table)}/partitions/{escape(partition)}"

    def get_partition_by_id(self, partition_id: int) -> PartitionRecord | None:
        def read() -> PartitionRecord | None:
            location = self._partition_location(partition_id)
            if location is None:
                return None
            table_id, path = location
            found = self._get(path)
            if found is None:
                return None
            record = documents.partition_record(table_id, unquote(path.rsplit("/", 1)[1]), found[0])
            return record if record.partition_id == partition_id else None

        return self._run(read)

    def drop_partition(self, partition_id: int) -> None:
        def drop() -> None:
            location = self._partition_location(partition_id)
            last = []
            if location is not None:
                found = self._get(location[1])
                if found is not None and unpack(found[0])[0].get("partition_id") == partition_id:
                    last.append(location[1])
            self._delete_tree_in_transactions([self._partition_id_path(partition_id)], last)

        self._run(drop)
