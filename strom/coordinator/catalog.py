"""The catalog's reads — tables, partitions, where each bucket is led — and the requests answered from them
alone (GetMetadata, GetTableInfo, GetTableSchema, InitWriter). Every server of a cluster answers those, so
the coordinator's :class:`~strom.coordinator.service.CoordinatorService` extends this class with the
changes, and a tablet server or a standby coordinator uses it as it is: a reader, nothing to stub out.

The process that makes every change (the active coordinator) loads the whole catalog once
(:meth:`CatalogReader.load`) and from then on answers every read from memory: its own changes keep it
current, so a slow ZooKeeper holds up no read. Another server reads the store per request, on a store
thread (:func:`~strom.metadata.off_loop.off_loop`), never on its event loop."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from strom.coordinator.placement import BucketLeadership, BucketPlacement
from strom.errors import PartitionNotExistError, TableNotExistError, TableNotPartitionedError
from strom.ids import TablePath
from strom.metadata.off_loop import off_loop
from strom.metadata.rebalance_plan import decode_tags
from strom.metadata.store import MetadataStore, PartitionRecord, TableRecord
from strom.metadata.table_info import TableInfo
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.rpc.server import Handler, RequestContext

FIRST_SCHEMA_ID = 1
TABLET_SERVER_METADATA_MAX_AGE_S = 10.0
"""How long a tablet server's metadata cache answers with a table or partition without reading it again:
the coordinator's notices (UpdateMetadata, StopReplica) make it read a changed one at once; this bounds
what a notice lost on the way costs."""


class CatalogReader:
    """Reads of the metadata store, from memory once :meth:`load` ran (the active coordinator), or through
    a metadata cache (a tablet server). Runs on the event loop."""

    def __init__(self, store: MetadataStore, placement: BucketPlacement, *, cache_max_age_s: float = 0.0) -> None:
        """``cache_max_age_s`` (a tablet server's metadata cache): keep each table and partition read, until
        the coordinator says it changed (:meth:`forget_table`, :meth:`forget_partition`, :meth:`forget_all`:
        its UpdateMetadata and StopReplica) and for that long at most, a bound on what a lost notice costs;
        0: read the store for each lookup (a standby coordinator, which no notice reaches)."""
        self._store = store
        self._placement = placement
        self._cache_max_age_s = cache_max_age_s
        self._complete = False
        """Set by :meth:`load`: memory holds every table and partition, a miss means there is none."""
        self._tables_by_path: dict[TablePath, TableInfo] = {}
        self._tables_by_id: dict[int, TableInfo] = {}
        self._partitions_by_name: dict[tuple[int, str], PartitionRecord] = {}
        self._partitions_by_id: dict[int, PartitionRecord] = {}
        self._read_at: dict[int, float] = {}
        """Cache mode: when each table (by id) was read."""
        self._partition_read_at: dict[int, float] = {}

    async def load(self) -> None:
        """Read every table and partition once, for the one process that makes every change to the
        catalog (the active coordinator): it then keeps memory current as it changes the catalog
        (:meth:`remember_table`, :meth:`forget_table`, :meth:`remember_partition`, :meth:`forget_partition`)
        and reads the store no more. With ZooKeeper slow or briefly unreachable, GetMetadata is answered
        from memory."""
        tables, partitions = await off_loop(self._read_everything)
        self._complete = True
        for table in tables:
            self.remember_table(table)
        for record in partitions:
            self.remember_partition(record)

    def _read_everything(self) -> tuple[list[TableInfo], list[PartitionRecord]]:
        tables = self._read_tables()
        partitions = [record for table in tables if table.is_partitioned
                      for record in self._store.list_partitions(table.table_id)]
        return tables, partitions

    def _read_tables(self) -> list[TableInfo]:
        """Every table of every database, from the store (blocks)."""
        tables: list[TableInfo] = []
        for database in self._store.list_databases():
            for name in self._store.list_tables(database):
                record = self._store.get_table(database, name)
                if record is not None:  # else dropped meanwhile
                    tables.append(self._with_versions(record))
        return tables

    # ---- memory: a complete catalog, or a cache ----
    @property
    def _keeps(self) -> bool:
        return self._complete or self._cache_max_age_s > 0

    def remember_table(self, table: TableInfo) -> TableInfo:
        """A table created, altered or read (its older version replaced)."""
        if self._keeps:
            old = self._tables_by_id.get(table.table_id)
            if old is not None and old.path != table.path:
                self._tables_by_path.pop(old.path, None)
            self._tables_by_path[table.path] = self._tables_by_id[table.table_id] = table
            self._read_at[table.table_id] = time.monotonic()
        return table

    def _fresh_table(self, table: TableInfo | None) -> TableInfo | None:
        """``table`` if memory may answer with it (a cached one younger than the cache's bound)."""
        if table is None or self._complete:
            return table
        age = time.monotonic() - self._read_at.get(table.table_id, -math.inf)
        return table if age < self._cache_max_age_s else None

    def _fresh_partition(self, record: PartitionRecord | None) -> PartitionRecord | None:
        if record is None or self._complete:
            return record
        age = time.monotonic() - self._partition_read_at.get(record.partition_id, -math.inf)
        return record if age < self._cache_max_age_s else None

    def forget_all(self) -> None:
        """Everything kept may be stale (a new coordinator took over): read each table again when used."""
        assert not self._complete, "a complete catalog is current by construction"
        for kept in (self._tables_by_path, self._tables_by_id, self._partitions_by_name, self._partitions_by_id,
                     self._read_at, self._partition_read_at):
            kept.clear()

    def forget_table(self, table_id: int) -> None:
        """A table is gone, its partitions with it."""
        table = self._tables_by_id.pop(table_id, None)
        self._read_at.pop(table_id, None)
        if table is not None:
            self._tables_by_path.pop(table.path, None)
        for key in [key for key in self._partitions_by_name if key[0] == table_id]:
            self._forget_partition_record(self._partitions_by_name.pop(key))

    def remember_partition(self, record: PartitionRecord) -> PartitionRecord:
        if self._keeps:
            self._partitions_by_name[(record.table_id, record.name)] = self._partitions_by_id[record.partition_id] = record
            self._partition_read_at[record.partition_id] = time.monotonic()
        return record

    def forget_partition(self, table_id: int, name: str) -> None:
        record = self._partitions_by_name.pop((table_id, name), None)
        if record is not None:
            self._forget_partition_record(record)

    def forget_partition_id(self, partition_id: int) -> None:
        record = self._partitions_by_id.get(partition_id)
        if record is not None:
            self._partitions_by_name.pop((record.table_id, record.name), None)
            self._forget_partition_record(record)

    def _forget_partition_record(self, record: PartitionRecord) -> None:
        self._partitions_by_id.pop(record.partition_id, None)
        self._partition_read_at.pop(record.partition_id, None)

    def handlers(self) -> dict[ApiKey, Handler]:
        """What every server of a cluster answers from the catalog: clients ask whichever they know."""
        return {
            ApiKey.GET_METADATA: self.metadata,
            ApiKey.GET_TABLE_INFO: self.get_table_info,
            ApiKey.GET_TABLE_SCHEMA: self.get_table_schema,
            ApiKey.INIT_WRITER: self.init_writer,
        }

    # ---- reads: from memory when complete; else the store, on this thread (sync) or a store thread (async) ----
    def table_info(self, path: TablePath) -> TableInfo:
        known = self._fresh_table(self._tables_by_path.get(path))
        if known is not None or self._complete:
            return self._found_table(path, known)
        return self._found_table(path, self._kept(self._read_table(path)))

    async def resolve_table(self, path: TablePath) -> TableInfo:
        """:meth:`table_info` for a coroutine: a store read runs off the event loop."""
        known = self._fresh_table(self._tables_by_path.get(path))
        if known is not None or self._complete:
            return self._found_table(path, known)
        return self._found_table(path, self._kept(await off_loop(self._read_table, path)))

    def _kept(self, table: TableInfo | None) -> TableInfo | None:
        return None if table is None else self.remember_table(table)

    @staticmethod
    def _found_table(path: TablePath, table: TableInfo | None) -> TableInfo:
        if table is None:
            raise TableNotExistError(f"Table '{path}' does not exist.")
        return table

    def _read_table(self, path: TablePath) -> TableInfo | None:
        record = self._store.get_table(path.database_name, path.table_name)
        return None if record is None else self._with_versions(record)

    def table_info_by_id(self, table_id: int) -> TableInfo | None:
        known = self._fresh_table(self._tables_by_id.get(table_id))
        if known is not None or self._complete:
            return known
        return self._kept(self._read_table_by_id(table_id))

    async def resolve_table_by_id(self, table_id: int) -> TableInfo | None:
        known = self._fresh_table(self._tables_by_id.get(table_id))
        if known is not None or self._complete:
            return known
        return self._kept(await off_loop(self._read_table_by_id, table_id))

    def _read_table_by_id(self, table_id: int) -> TableInfo | None:
        record = self._store.get_table_by_id(table_id)
        return None if record is None else self._with_versions(record)

    def _with_versions(self, record: TableRecord) -> TableInfo:
        """The table with its earlier schemas (read only for a table whose columns changed). Blocks."""
        versions = self._store.table_versions(record.table_id) if record.schema_id > FIRST_SCHEMA_ID else None
        return TableInfo.from_record(record, versions)

    def partition(self, table: TableInfo, name: str) -> PartitionRecord:
        self._check_partitioned(table)
        record = self._fresh_partition(self._partitions_by_name.get((table.table_id, name)))
        if record is None and not self._complete:
            record = self._kept_partition(self._store.get_partition(table.table_id, name))
        return self._found_partition(table, name, record)

    async def resolve_partition(self, table: TableInfo, name: str) -> PartitionRecord:
        self._check_partitioned(table)
        record = self._fresh_partition(self._partitions_by_name.get((table.table_id, name)))
        if record is None and not self._complete:
            record = self._kept_partition(await off_loop(self._store.get_partition, table.table_id, name))
        return self._found_partition(table, name, record)

    def _kept_partition(self, record: PartitionRecord | None) -> PartitionRecord | None:
        return None if record is None else self.remember_partition(record)

    @staticmethod
    def _check_partitioned(table: TableInfo) -> None:
        if not table.is_partitioned:
            raise TableNotPartitionedError(f"Table '{table.path}' is not a partitioned table.")

    @staticmethod
    def _found_partition(table: TableInfo, name: str, record: PartitionRecord | None) -> PartitionRecord:
        if record is None:
            raise PartitionNotExistError(f"Partition '{name}' of table '{table.path}' does not exist.")
        return record

    def partition_by_id(self, partition_id: int) -> PartitionRecord | None:
        known = self._fresh_partition(self._partitions_by_id.get(partition_id))
        if known is not None or self._complete:
            return known
        return self._kept_partition(self._store.get_partition_by_id(partition_id))

    async def resolve_partition_by_id(self, partition_id: int) -> PartitionRecord | None:
        known = self._fresh_partition(self._partitions_by_id.get(partition_id))
        if known is not None or self._complete:
            return known
        return self._kept_partition(await off_loop(self._store.get_partition_by_id, partition_id))

    def list_partitions(self, table: TableInfo) -> list[PartitionRecord]:
        """The table's partitions by id (the store's order)."""
        if not self._complete:
            return self._store.list_partitions(table.table_id)
        return sorted((p for (table_id, _), p in self._partitions_by_name.items() if table_id == table.table_id),
                      key=lambda p: p.partition_id)

    async def resolve_partitions(self, table: TableInfo) -> list[PartitionRecord]:
        if not self._complete:
            return await off_loop(self._store.list_partitions, table.table_id)
        return self.list_partitions(table)

    def tables(self) -> list[TableInfo]:
        """Every table of every database (a complete catalog's, by id)."""
        if self._complete:
            return [self._tables_by_id[table_id] for table_id in sorted(self._tables_by_id)]
        return self._read_tables()

    # ---- requests ----
    async def get_table_info(self, request: Any, _context: object) -> Any:
        table = await self.resolve_table(TablePath(request.table_path.database_name, request.table_path.table_name))
        return pb.GetTableInfoResponse(
            table_id=table.table_id,
            schema_id=table.schema_id,
            table_json=table.table_json,
            created_time=table.created_ms,
            modified_time=table.modified_ms,
        )

    async def get_table_schema(self, request: Any, _context: object) -> Any:
        table = await self.resolve_table(TablePath(request.table_path.database_name, request.table_path.table_name))
        schema_id = request.schema_id if request.HasField("schema_id") else table.schema_id
        table.schema_of(schema_id)  # SchemaNotExistError
        table_json = table.table_json if schema_id == table.schema_id else table.versions[schema_id]
        document = json.loads(table_json)
        schema_json = json.dumps(document["schema"], sort_keys=True, separators=(",", ":")).encode()
        return pb.GetTableSchemaResponse(schema_id=schema_id, schema_json=schema_json)

    async def metadata(self, request: Any, context: object) -> Any:
        """Servers are named by their endpoints of the listener the request came in on; a server without
        that listener is left out (as in Fluss)."""
        listener = context.listener if isinstance(context, RequestContext) else None
        response = pb.MetadataResponse()
        coordinator = self._placement.coordinator().for_listener(listener)
        if coordinator is not None:
            response.coordinator_server.CopyFrom(coordinator.to_pb())
        tags = decode_tags(await off_loop(self._store.get_server_tags)) if request.include_server_tags else {}
        for tablet_server in self._placement.tablet_servers():
            node = tablet_server.for_listener(listener)
            if node is not None:
                entry = response.tablet_servers.add()
                entry.CopyFrom(node.to_pb())
                if node.node_id in tags:
                    entry.server_tag = tags[node.node_id]
        for table_path in request.table_path:
            table = await self.resolve_table(TablePath(table_path.database_name, table_path.table_name))
            metadata = response.table_metadata.add(
                table_path=table_path,
                table_id=table.table_id,
                schema_id=table.schema_id,
                table_json=table.table_json,
                created_time=table.created_ms,
                modified_time=table.modified_ms,
            )
            if not table.is_partitioned:  # partitioned tables carry buckets per partition
                self._add_buckets(metadata.bucket_metadata, table, await self._leaderships(table))
        for partition_path in request.partitions_path:
            table = await self.resolve_table(TablePath(partition_path.database_name, partition_path.table_name))
            record = await self.resolve_partition(table, partition_path.partition_name)
            await self._add_partition(response, table, record)
        for partition_id in request.partitions_id:
            partition = await self.resolve_partition_by_id(partition_id)
            table_info = await self.resolve_table_by_id(partition.table_id) if partition else None
            if partition is None or table_info is None:
                raise PartitionNotExistError.unknown_id(partition_id)
            await self._add_partition(response, table_info, partition)
        return response

    async def _add_partition(self, response: Any, table: TableInfo, record: PartitionRecord) -> None:
        metadata = response.partition_metadata.add(
            table_id=table.table_id, partition_name=record.name, partition_id=record.partition_id
        )
        self._add_buckets(metadata.bucket_metadata, table, await self._leaderships(table, record.partition_id))

    async def _leaderships(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership]:
        """Where each bucket is led: from memory where the placement knows it (the active coordinator made
        every change of leadership); else read from ZooKeeper off the event loop."""
        known = self._placement.describe_known(table, partition_id)
        return known if known is not None else await off_loop(self._placement.describe, table, partition_id)

    @staticmethod
    def _add_buckets(target: Any, table: TableInfo, described: dict[int, BucketLeadership]) -> None:
        for bucket in range(table.bucket_count):
            leadership = described.get(bucket)
            if leadership is None:
                target.add(bucket_id=bucket, leader_epoch=0)
                continue
            entry = target.add(bucket_id=bucket, replica_id=list(leadership.replicas), leader_epoch=leadership.leader_epoch,
                               isr=list(leadership.isr))
            if leadership.leader is not None:  # else its replicas are down: no leader until one is back
                entry.leader_id = leadership.leader

    async def init_writer(self, _request: Any, _context: object) -> Any:
        return pb.InitWriterResponse(writer_id=await off_loop(self._store.next_id, "writer"))


__all__ = ["FIRST_SCHEMA_ID", "TABLET_SERVER_METADATA_MAX_AGE_S", "CatalogReader"]
