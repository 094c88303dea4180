"""Catalog and cluster administration (``connection.get_admin()``), named as in pyfluss."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from strom.client.acls import AclAdmin
from strom.client.cluster_configs import ClusterConfigsAdmin
from strom.client.lake import LakeAdmin
from strom.client.layout import TableLayout
from strom.client.producers import ProducerOffsetsAdmin
from strom.client.rebalance import RebalanceAdmin
from strom.client.rpc_client import ClusterRpc
from strom.client.snapshots import KvSnapshotReader, SnapshotAdmin
from strom.client.stats import StatsAdmin
from strom.errors import TableNotExistError, error_for_code
from strom.ids import TableBucket, TablePath
from strom.metadata.rebalance_plan import ServerTag
from strom.metadata.table_info import TableInfo
from strom.records.schema import Column, DatabaseDescriptor, Schema, TableDescriptor
from strom.records.types import data_type_to_json
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb

EARLIEST_OFFSET = -2


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Which offset ListOffsets returns: ``earliest()``, ``latest()`` or ``timestamp(ms)``."""

    offset_type: int
    timestamp_ms: int | None = None

    @classmethod
    def earliest(cls) -> OffsetSpec:
        return cls(0)

    @classmethod
    def latest(cls) -> OffsetSpec:
        return cls(1)

    @classmethod
    def timestamp(cls, timestamp_ms: int) -> OffsetSpec:
        return cls(2, timestamp_ms)


@dataclass(frozen=True, slots=True)
class ServerNode:
    id: int
    host: str
    port: int
    server_type: str
    rack: str | None = None
    """A tablet server's ``tablet-server.rack``, when it has one."""
    tag: str | None = None
    """A tablet server's tag (``PERMANENT_OFFLINE``, ``TEMPORARY_OFFLINE``), when asked for and it has one."""


@dataclass(frozen=True, slots=True)
class BucketLeadership:
    """Where one bucket is led, as the cluster's metadata says (``isr`` is strom's extension; empty from a
    server that does not send it)."""

    bucket: TableBucket
    leader: int | None
    """None while no replica can lead it."""
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class DatabaseInfo:
    database_name: str
    descriptor: DatabaseDescriptor
    created_time: int
    modified_time: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition_id: int
    partition_name: str
    spec: dict[str, str]


ALTER_SET, ALTER_DELETE = 0, 1
COLUMN_POSITION_LAST = 0  # PbAddColumn: at the end, the only position Fluss accepts
"""PbAlterConfig op types (Fluss's AlterConfigOpType)."""


def _path(table_path: TablePath) -> Any:
    return pb.PbTablePath(database_name=table_path.database_name, table_name=table_path.table_name)


class Admin(SnapshotAdmin, LakeAdmin, AclAdmin, ProducerOffsetsAdmin, StatsAdmin, ClusterConfigsAdmin,
            RebalanceAdmin):
    """Every method is a coroutine that raises the :mod:`strom.errors` error of the server's code."""

    def __init__(self, connection: ClusterRpc) -> None:
        self._connection = connection

    async def _coordinator(self, key: ApiKey, message: Any) -> Any:
        return await self._connection.coordinator_request(key, message)

    # ---- databases ----
    async def create_database(
        self, database_name: str, descriptor: DatabaseDescriptor | None = None, ignore_if_exists: bool = False
    ) -> None:
        request = pb.CreateDatabaseRequest(database_name=database_name, ignore_if_exists=ignore_if_exists)
        if descriptor is not None:
            request.database_json = descriptor.to_json()
        await self._coordinator(ApiKey.CREATE_DATABASE, request)

    async def drop_database(self, database_name: str, ignore_if_not_exists: bool = False, cascade: bool = True) -> None:
        await self._coordinator(
            ApiKey.DROP_DATABASE,
            pb.DropDatabaseRequest(
                database_name=database_name, ignore_if_not_exists=ignore_if_not_exists, cascade=cascade
            ),
        )

    async def alter_database(
        self,
        database_name: str,
        set_properties: Mapping[str, str] | None = None,
        reset_properties: Sequence[str] = (),
        comment: str | None = None,
        ignore_if_not_exists: bool = False,
    ) -> None:
        """Set or reset the database's custom properties and replace its comment (``""`` removes it;
        None leaves it). A key both set and reset ends up reset, as in Fluss.

        Raises:
            DatabaseNotExistError: the database does not exist (unless ``ignore_if_not_exists``).
            AuthorizationError: the principal may not ALTER the database.
        """
        request = pb.AlterDatabaseRequest(
            database_name=database_name, ignore_if_not_exists=ignore_if_not_exists
        )
        for key, value in (set_properties or {}).items():
            request.config_changes.add(config_key=key, config_value=str(value), op_type=ALTER_SET)
        for key in reset_properties:
            request.config_changes.add(config_key=key, op_type=ALTER_DELETE)
        if comment is not None:
            request.comment = comment
        await self._coordinator(ApiKey.ALTER_DATABASE, request)

    async def list_databases(self) -> list[str]:
        response = await self._coordinator(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest())
        return list(response.database_name)

    async def database_exists(self, database_name: str) -> bool:
        response = await self._coordinator(ApiKey.DATABASE_EXISTS, pb.DatabaseExistsRequest(database_name=database_name))
        return bool(response.exists)

    async def get_database_info(self, database_name: str) -> DatabaseInfo:
        response = await self._coordinator(
            ApiKey.GET_DATABASE_INFO, pb.GetDatabaseInfoRequest(database_name=database_name)
        )
        return DatabaseInfo(
            database_name,
            DatabaseDescriptor.from_json(response.database_json),
            response.created_time,
            response.modified_time,
        )

    # ---- tables ----
    async def create_table(
        self, table_path: TablePath, descriptor: TableDescriptor, ignore_if_exists: bool = False
    ) -> None:
        await self._coordinator(
            ApiKey.CREATE_TABLE,
            pb.CreateTableRequest(
                table_path=_path(table_path), table_json=descriptor.to_json(), ignore_if_exists=ignore_if_exists
            ),
        )

    async def drop_table(self, table_path: TablePath, ignore_if_not_exists: bool = False) -> None:
        await self._coordinator(
            ApiKey.DROP_TABLE,
            pb.DropTableRequest(table_path=_path(table_path), ignore_if_not_exists=ignore_if_not_exists),
        )

    async def alter_table(
        self,
        table_path: TablePath,
        set_properties: Mapping[str, str] | None = None,
        reset_properties: Sequence[str] = (),
        ignore_if_not_exists: bool = False,
        add_columns: Sequence[Column] = (),
    ) -> None:
        """Set or reset table options and custom properties (e.g. ``{"table.datalake.enabled": "true"}``)
        and add nullable columns at the end, all in one change.

        The ``table.*`` options that may change are listed in docs/table-options.md; keys outside
        ``table.`` are custom properties. Added columns read as null in rows written before; each column's
        ``agg_function`` (``{"type": "sum"}``) sets its aggregate on an aggregation table. Tables opened
        before the change keep their schema: open the table again to read and write the new columns.

        Raises:
            TableNotExistError: the table does not exist (unless ``ignore_if_not_exists``).
            InvalidAlterTableError: an option that cannot change after creation, a column that exists, is
                NOT NULL, or a table tiered into the lake.
            InvalidConfigError: a value the table would not be created with either.
        """
        request = pb.AlterTableRequest(table_path=_path(table_path), ignore_if_not_exists=ignore_if_not_exists)
        for key, value in (set_properties or {}).items():
            request.config_changes.add(config_key=key, config_value=str(value), op_type=ALTER_SET)
        for key in reset_properties:
            request.config_changes.add(config_key=key, op_type=ALTER_DELETE)
        for column in add_columns:
            added = request.add_columns.add(
                column_name=column.name,
                data_type_json=json.dumps(data_type_to_json(column.data_type)).encode(),
                column_position_type=COLUMN_POSITION_LAST,
            )
            if column.comment is not None:
                added.comment = column.comment
            if column.agg_function is not None:
                added.agg_function_type = str(column.agg_function["type"])
                for key, value in (column.agg_function.get("parameters") or {}).items():
                    added.agg_function_params.add(key=key, value=str(value))
        await self._coordinator(ApiKey.ALTER_TABLE, request)
        try:
            await self._connection.metadata.refresh_table(table_path)  # the next get_table sees the change
        except TableNotExistError:
            if not ignore_if_not_exists:
                raise

    async def get_table_info(self, table_path: TablePath) -> TableInfo:
        return await self._connection.metadata.refresh_table(table_path)

    async def list_tables(self, database_name: str) -> list[str]:
        response = await self._coordinator(ApiKey.LIST_TABLES, pb.ListTablesRequest(database_name=database_name))
        return list(response.table_name)

    async def table_exists(self, table_path: TablePath) -> bool:
        response = await self._coordinator(ApiKey.TABLE_EXISTS, pb.TableExistsRequest(table_path=_path(table_path)))
        return bool(response.exists)

    # ---- partitions ----
    async def create_partition(
        self, table_path: TablePath, partition_spec: Mapping[str, str], ignore_if_exists: bool = False
    ) -> None:
        request = pb.CreatePartitionRequest(table_path=_path(table_path), ignore_if_not_exists=ignore_if_exists)
        for key, value in partition_spec.items():
            request.partition_spec.partition_key_values.add(key=key, value=str(value))
        await self._coordinator(ApiKey.CREATE_PARTITION, request)

    async def drop_partition(
        self, table_path: TablePath, partition_spec: Mapping[str, str], ignore_if_not_exists: bool = False
    ) -> None:
        request = pb.DropPartitionRequest(table_path=_path(table_path), ignore_if_not_exists=ignore_if_not_exists)
        for key, value in partition_spec.items():
            request.partition_spec.partition_key_values.add(key=key, value=str(value))
        await self._coordinator(ApiKey.DROP_PARTITION, request)

    async def list_partition_infos(
        self, table_path: TablePath, partition_spec: Mapping[str, str] | None = None
    ) -> list[PartitionInfo]:
        request = pb.ListPartitionInfosRequest(table_path=_path(table_path))
        for key, value in (partition_spec or {}).items():
            request.partial_partition_spec.partition_key_values.add(key=key, value=str(value))
        response = await self._coordinator(ApiKey.LIST_PARTITION_INFOS, request)
        infos = []
        for info in response.partitions_info:
            spec = {kv.key: kv.value for kv in info.partition_spec.partition_key_values}
            name = "$".join(kv.value for kv in info.partition_spec.partition_key_values)
            infos.append(PartitionInfo(info.partition_id, name, spec))
        return infos

    # ---- offsets and servers ----
    async def list_offsets(
        self,
        table_path: TablePath,
        bucket_ids: Sequence[int],
        offset_spec: OffsetSpec,
        partition_name: str | None = None,
    ) -> dict[int, int]:
        """``bucket id -> offset`` per ``offset_spec`` (latest = high watermark)."""
        table = await self._connection.metadata.table(table_path)
        partition_id = None
        if partition_name is not None:
            partition_id = await self._connection.metadata.partition_id(table, partition_name)
        return await self.list_bucket_offsets(table.table_id, partition_id, bucket_ids, offset_spec)

    async def list_bucket_offsets(
        self, table_id: int, partition_id: int | None, bucket_ids: Sequence[int], offset_spec: OffsetSpec
    ) -> dict[int, int]:
        """Asked again of the leaders the metadata names next while a bucket's leadership moves (~35 s)."""
        return await self._connection.while_leadership_moves(
            [TableBucket(table_id, bucket_id, partition_id) for bucket_id in bucket_ids],
            lambda: self._list_bucket_offsets(table_id, partition_id, bucket_ids, offset_spec),
        )

    async def _list_bucket_offsets(
        self, table_id: int, partition_id: int | None, bucket_ids: Sequence[int], offset_spec: OffsetSpec
    ) -> dict[int, int]:
        by_leader = await self._connection.metadata.by_leader(
            TableBucket(table_id, bucket_id, partition_id) for bucket_id in bucket_ids
        )
        offsets: dict[int, int] = {}
        for address, buckets in by_leader.items():
            request = pb.ListOffsetsRequest(
                follower_server_id=-1, offset_type=offset_spec.offset_type, table_id=table_id,
                bucket_id=[bucket.bucket for bucket in buckets],
            )
            if partition_id is not None:
                request.partition_id = partition_id
            if offset_spec.timestamp_ms is not None:
                request.startTimestamp = offset_spec.timestamp_ms
            response = await self._connection.request(address, ApiKey.LIST_OFFSETS, request)
            for bucket_response in response.buckets_resp:
                if bucket_response.HasField("error_code") and bucket_response.error_code != 0:
                    raise error_for_code(bucket_response.error_code, bucket_response.error_message)
                offsets[bucket_response.bucket_id] = bucket_response.offset
        return offsets

    async def get_server_nodes(self, include_tags: bool = False) -> list[ServerNode]:
        """The coordinator and the live tablet servers. ``include_tags`` also asks for each server's tag
        (strom's extension; a Fluss server leaves the tags out)."""
        request = pb.MetadataRequest(include_server_tags=True) if include_tags else pb.MetadataRequest()
        response = await self._connection.bootstrap_request(ApiKey.GET_METADATA, request)
        nodes = []
        if response.HasField("coordinator_server"):  # absent when the coordinator lacks this listener
            coordinator = response.coordinator_server
            nodes.append(ServerNode(coordinator.node_id, coordinator.host, coordinator.port, "CoordinatorServer"))
        nodes += [ServerNode(n.node_id, n.host, n.port, "TabletServer", n.rack if n.HasField("rack") else None,
                             _tag_name(n.server_tag) if n.HasField("server_tag") else None)
                  for n in response.tablet_servers]
        return nodes

    async def get_bucket_leaderships(
        self, table_path: TablePath, partition_name: str | None = None
    ) -> list[BucketLeadership]:
        """Each bucket's leader, replicas, ISR and leader epoch, fresh from the cluster (not the client's
        cache). Raises TableNotExistError, PartitionNotExistError."""
        request = pb.MetadataRequest()
        request.table_path.add(database_name=table_path.database_name, table_name=table_path.table_name)
        if partition_name is not None:
            request.partitions_path.add(database_name=table_path.database_name,
                                        table_name=table_path.table_name, partition_name=partition_name)
        response = await self._connection.bootstrap_request(ApiKey.GET_METADATA, request)
        if not response.table_metadata:
            raise TableNotExistError(f"Table '{table_path}' does not exist, or this principal may not describe it.")
        table_id = response.table_metadata[0].table_id
        if partition_name is None:
            entries = [(None, b) for b in response.table_metadata[0].bucket_metadata]
        else:
            entries = [(p.partition_id, b) for p in response.partition_metadata for b in p.bucket_metadata]
        return [
            BucketLeadership(TableBucket(table_id, b.bucket_id, partition_id),
                             b.leader_id if b.HasField("leader_id") else None,
                             tuple(b.replica_id), tuple(b.isr), b.leader_epoch)
            for partition_id, b in entries
        ]

    async def get_table_schema_json(self, table_path: TablePath, schema_id: int | None = None) -> dict[str, Any]:
        """The table's schema JSON, the current one or that of ``schema_id``. Raises SchemaNotExistError."""
        request = pb.GetTableSchemaRequest(table_path=_path(table_path))
        if schema_id is not None:
            request.schema_id = schema_id
        response = await self._coordinator(ApiKey.GET_TABLE_SCHEMA, request)
        return dict(json.loads(response.schema_json))

    async def get_table_schemas(self, table: TableInfo) -> dict[int, Schema]:
        """Every schema the table has had up to ``table``'s, by id (what rows in its KV snapshots may carry)."""
        schemas = {table.schema_id: table.schema}
        for schema_id in range(1, table.schema_id):
            schemas[schema_id] = Schema.from_json(await self.get_table_schema_json(table.path, schema_id))
        return schemas


def _tag_name(code: int) -> str:
    try:
        return ServerTag(code).name
    except ValueError:  # a tag this client does not know
        return str(code)


async def read_snapshot(
    connection: ClusterRpc, layout: TableLayout, bucket: TableBucket, snapshot_id: int
) -> pa.Table:
    """Convenience: all rows of one snapshot as a table (fetching its metadata first)."""
    admin = Admin(connection)
    metadata = await admin.get_kv_snapshot_metadata(bucket, snapshot_id)
    schemas = await admin.get_table_schemas(layout.info)

    def read() -> pa.Table:
        with KvSnapshotReader(layout, metadata, schemas=schemas) as reader:
            batches = list(reader.iter_batches())
        return pa.Table.from_batches(batches, schema=layout.arrow_schema)

    return await asyncio.to_thread(read)
