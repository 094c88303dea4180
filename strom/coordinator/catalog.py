"""The catalog's reads — tables, partitions, where each bucket is led — and the requests answered from them
alone (GetMetadata, GetTableInfo, GetTableSchema, InitWriter). Every server of a cluster answers those, so
the coordinator's :class:`~strom.coordinator.service.CoordinatorService` extends this class with the
changes, and a tablet server or a standby coordinator uses it as it is: a reader, nothing to stub out."""

from __future__ import annotations

import json
from typing import Any

from strom.coordinator.placement import BucketPlacement
from strom.errors import PartitionNotExistError, TableNotExistError, TableNotPartitionedError
from strom.ids import TablePath
from strom.metadata.store import MetadataStore, PartitionRecord, TableRecord
from strom.metadata.table_info import TableInfo
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.rpc.server import Handler, RequestContext

FIRST_SCHEMA_ID = 1


class CatalogReader:
    """Reads of the metadata store. Runs on the event loop."""

    def __init__(self, store: MetadataStore, placement: BucketPlacement, *, remember: bool = False) -> None:
        """``remember``: keep the tables and partitions read, and answer from them without reading the store
        again — for the one process that makes every change to the catalog (the active coordinator), which
        calls :meth:`forget_table` and :meth:`forget_partition` as it changes them. With ZooKeeper slow or
        briefly unreachable, GetMetadata is then answered from memory."""
        self._store = store
        self._placement = placement
        self._remember = remember
        self._tables_by_path: dict[TablePath, TableInfo] = {}
        self._tables_by_id: dict[int, TableInfo] = {}
        self._partitions_by_name: dict[tuple[int, str], PartitionRecord] = {}
        self._partitions_by_id: dict[int, PartitionRecord] = {}

    def forget_table(self, table_id: int) -> None:
        """A table changed or is gone (its partitions with it): read it from the store next time."""
        table = self._tables_by_id.pop(table_id, None)
        if table is not None:
            self._tables_by_path.pop(table.path, None)
        for key in [key for key in self._partitions_by_name if key[0] == table_id]:
            self._partitions_by_id.pop(self._partitions_by_name.pop(key).partition_id, None)

    def forget_partition(self, table_id: int, name: str) -> None:
        record = self._partitions_by_name.pop((table_id, name), None)
        if record is not None:
            self._partitions_by_id.pop(record.partition_id, None)

    def _remembered(self, table: TableInfo) -> TableInfo:
        if self._remember:
            self._tables_by_path[table.path] = self._tables_by_id[table.table_id] = table
        return table

    def handlers(self) -> dict[ApiKey, Handler]:
        """What every server of a cluster answers from the metadata store: clients ask whichever they know."""
        return {
            ApiKey.GET_METADATA: self.metadata,
            ApiKey.GET_TABLE_INFO: self.get_table_info,
            ApiKey.GET_TABLE_SCHEMA: self.get_table_schema,
            ApiKey.INIT_WRITER: self.init_writer,
        }

    def table_info(self, path: TablePath) -> TableInfo:
        known = self._tables_by_path.get(path)
        if known is not None:
            return known
        record = self._store.get_table(path.database_name, path.table_name)
        if record is None:
            raise TableNotExistError(f"Table '{path}' does not exist.")
        return self._remembered(self._with_versions(record))

    def table_info_by_id(self, table_id: int) -> TableInfo | None:
        known = self._tables_by_id.get(table_id)
        if known is not None:
            return known
        record = self._store.get_table_by_id(table_id)
        return self._remembered(self._with_versions(record)) if record else None

    def _with_versions(self, record: TableRecord) -> TableInfo:
        """The table with its earlier schemas (read only for a table whose columns changed)."""
        versions = self._store.table_versions(record.table_id) if record.schema_id > FIRST_SCHEMA_ID else None
        return TableInfo.from_record(record, versions)

    def partition(self, table: TableInfo, name: str) -> PartitionRecord:
        if not table.is_partitioned:
            raise TableNotPartitionedError(f"Table '{table.path}' is not a partitioned table.")
        record = self._partitions_by_name.get((table.table_id, name)) or self._store.get_partition(table.table_id, name)
        if record is None:
            raise PartitionNotExistError(f"Partition '{name}' of table '{table.path}' does not exist.")
        return self._remembered_partition(record)

    def partition_by_id(self, partition_id: int) -> PartitionRecord | None:
        record = self._partitions_by_id.get(partition_id) or self._store.get_partition_by_id(partition_id)
        return self._remembered_partition(record) if record is not None else None

    def _remembered_partition(self, record: PartitionRecord) -> PartitionRecord:
        if self._remember:
            self._partitions_by_name[(record.table_id, record.name)] = self._partitions_by_id[record.partition_id] = record
        return record

    def list_partitions(self, table: TableInfo) -> list[PartitionRecord]:
        return self._store.list_partitions(table.table_id)

    def get_table_info(self, request: Any, _context: object) -> Any:
        table = self.table_info(TablePath(request.table_path.database_name, request.table_path.table_name))
        return pb.GetTableInfoResponse(
            table_id=table.table_id,
            schema_id=table.schema_id,
            table_json=table.table_json,
            created_time=table.created_ms,
            modified_time=table.modified_ms,
        )

    def get_table_schema(self, request: Any, _context: object) -> Any:
        table = self.table_info(TablePath(request.table_path.database_name, request.table_path.table_name))
        schema_id = request.schema_id if request.HasField("schema_id") else table.schema_id
        table.schema_of(schema_id)  # SchemaNotExistError
        table_json = table.table_json if schema_id == table.schema_id else table.versions[schema_id]
        document = json.loads(table_json)
        schema_json = json.dumps(document["schema"], sort_keys=True, separators=(",", ":")).encode()
        return pb.GetTableSchemaResponse(schema_id=schema_id, schema_json=schema_json)

    # ---- cluster metadata ----
    def tables(self) -> list[TableInfo]:
        """Every table of every database."""
        return [
            self.table_info(TablePath(database, name))
            for database in self._store.list_databases()
            for name in self._store.list_tables(database)
        ]

    def metadata(self, request: Any, context: object) -> Any:
        """Servers are named by their endpoints of the listener the request came in on; a server without
        that listener is left out (as in Fluss)."""
        listener = context.listener if isinstance(context, RequestContext) else None
        response = pb.MetadataResponse()
        coordinator = self._placement.coordinator().for_listener(listener)
        if coordinator is not None:
            response.coordinator_server.CopyFrom(coordinator.to_pb())
        for tablet_server in self._placement.tablet_servers():
            node = tablet_server.for_listener(listener)
            if node is not None:
                response.tablet_servers.append(node.to_pb())
        for table_path in request.table_path:
            table = self.table_info(TablePath(table_path.database_name, table_path.table_name))
            metadata = response.table_metadata.add(
                table_path=table_path,
                table_id=table.table_id,
                schema_id=table.schema_id,
                table_json=table.table_json,
                created_time=table.created_ms,
                modified_time=table.modified_ms,
            )
            if not table.is_partitioned:  # partitioned tables carry buckets per partition
                self._add_buckets(metadata.bucket_metadata, table)
        for partition_path in request.partitions_path:
            table = self.table_info(TablePath(partition_path.database_name, partition_path.table_name))
            record = self.partition(table, partition_path.partition_name)
            self._add_partition(response, table, record)
        for partition_id in request.partitions_id:
            partition = self.partition_by_id(partition_id)
            table_info = self.table_info_by_id(partition.table_id) if partition else None
            if partition is None or table_info is None:
                raise PartitionNotExistError.unknown_id(partition_id)
            self._add_partition(response, table_info, partition)
        return response

    def _add_partition(self, response: Any, table: TableInfo, record: PartitionRecord) -> None:
        metadata = response.partition_metadata.add(
            table_id=table.table_id, partition_name=record.name, partition_id=record.partition_id
        )
        self._add_buckets(metadata.bucket_metadata, table, record.partition_id)

    def _add_buckets(self, target: Any, table: TableInfo, partition_id: int | None = None) -> None:
        described = self._placement.describe(table, partition_id)
        for bucket in range(table.bucket_count):
            leadership = described.get(bucket)
            if leadership is None:
                target.add(bucket_id=bucket, leader_epoch=0)
                continue
            entry = target.add(bucket_id=bucket, replica_id=list(leadership.replicas), leader_epoch=leadership.leader_epoch)
            if leadership.leader is not None:  # else its replicas are down: no leader until one is back
                entry.leader_id = leadership.leader

    def init_writer(self, _request: Any, _context: object) -> Any:
        return pb.InitWriterResponse(writer_id=self._store.next_id("writer"))


__all__ = ["FIRST_SCHEMA_ID", "CatalogReader"]
