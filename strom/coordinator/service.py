"""The coordinator role: the catalog (databases, tables, partitions), bucket leadership and cluster metadata.

It owns the metadata store and tells tablet servers what to host through a :class:`TabletServerGateway`.
Every handler validates its input and raises a :mod:`strom.errors` error, which the RPC layer turns into
the matching Fluss error code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from strom import table_properties
from strom.clock import Clock
from strom.config import (
    ALLOW_CREATE_KV_TABLES,
    ALLOW_CREATE_LOG_TABLES,
    DATALAKE_FORMAT,
    DEFAULT_BUCKET_NUMBER,
    DEFAULT_REPLICATION_FACTOR,
    KV_LEADER_REPLICA_MEMORY_RESERVED,
    MAX_BUCKET_NUM,
    MAX_PARTITION_NUM,
    TABLE_DATALAKE_FRESHNESS,
    Configuration,
)
from strom.coordinator.catalog import FIRST_SCHEMA_ID, CatalogReader
from strom.coordinator.gateway import TabletServerGateway
from strom.coordinator.kv_leader_capacity import KvLeaderCapacity
from strom.coordinator.lake_tiering import LakeTableTieringManager
from strom.coordinator.placement import BucketPlacement
from strom.errors import (
    BucketMaxNumError,
    DatabaseAlreadyExistError,
    DatabaseNotEmptyError,
    DatabaseNotExistError,
    InvalidAlterDatabaseError,
    InvalidAlterTableError,
    InvalidConfigError,
    InvalidDatabaseError,
    InvalidReplicationFactorError,
    InvalidTableError,
    PartitionAlreadyExistsError,
    PartitionMaxNumError,
    PartitionNotExistError,
    PartitionSpecInvalidError,
    StromError,
    TableAlreadyExistError,
    TableNotExistError,
    TableNotPartitionedError,
)
from strom.ids import TablePath
from strom.kv import auto_increment
from strom.kv.merge import options as merge_options
from strom.metadata import table_options
from strom.metadata.auto_partition import AutoPartitionStrategy
from strom.metadata.off_loop import off_loop
from strom.metadata.store import DatabaseRecord, MetadataStore, PartitionRecord
from strom.metadata.table_info import TableInfo, partition_name, validate_database_name, validate_table_name
from strom.records import keys
from strom.records import types as fluss_types
from strom.records.schema import Column, DatabaseDescriptor, TableDescriptor
from strom.records.types import MetadataJsonError
from strom.rpc.messages import pb
from strom.table_properties import TableProperties

log = logging.getLogger(__name__)

DEFAULT_DATABASE = "fluss"
DEFAULT_DATABASE_JSON = b'{"custom_properties":{},"version":1}'
ALTERABLE_TABLE_OPTIONS = frozenset({
    table_properties.DATALAKE_ENABLED,
    table_properties.DATALAKE_HISTORICAL_PARTITION,
    table_properties.DATALAKE_FRESHNESS,
    table_properties.DATALAKE_AUTO_COMPACTION,
    table_properties.LOG_TTL,
    table_properties.TIERED_LOCAL_SEGMENTS,
    table_properties.LOG_LOCAL_TTL,
    table_properties.AUTO_PARTITION_ENABLED,
    table_properties.AUTO_PARTITION_RETENTION,
    table_properties.AUTO_PARTITION_PRECREATE,
    table_properties.STATISTICS_COLUMNS,
    table_properties.STANDBY_REPLICA,
    table_properties.DATALAKE_FORMAT,
})
"""Table options AlterTable may change: Fluss's list (``FlussConfigUtils.ALTERABLE_TABLE_OPTIONS``), plus the
lake format, which may only be set to the cluster's. The changed properties are checked as at creation
(``table_options.validate``: each value's type, the rules between options, the values strom refuses), and
the hosted buckets serve the changed table at once, so options read per use (``table.log.ttl``) take
effect without a restart; what each option does in strom is in docs/table-options.md. Other ``table.*``
options shape how stored data is read, so they are fixed at creation; keys outside ``table.`` are custom
properties, which AlterTable changes freely (as in Fluss)."""
SENSITIVE_OPTION_WORDS = ("password", "secret", "key")
"""Server lake options whose key contains one of these are not copied into table properties, which every
client can read (Fluss's rule)."""
ALTER_SET, ALTER_DELETE = 0, 1
"""PbAlterConfig op types strom applies (Fluss's AlterConfigOpType SET and DELETE; APPEND and SUBTRACT are
for list-valued options, which strom's tables do not have)."""
TableDroppedHook = Callable[[TableInfo, int | None], Awaitable[None]]
TableChangedHook = Callable[[TableInfo], Awaitable[None]]
COLUMN_POSITION_LAST = 0
"""PbAddColumn.column_position_type of a column added at the end (FIRST is 1, AFTER 3), the only one
Fluss accepts."""
LANCE = "lance"
"""The lake format that holds log tables only."""
COLUMN_ADDING_LAKE_FORMATS = frozenset({"delta", "iceberg", "paimon"})
"""Lake formats whose tables gain a column when their strom table does (the next tiering round adds it)."""
HISTORICAL = table_properties.HISTORICAL_PARTITION_VALUE
"""The name of the system partition of a table with ``table.datalake.historical-partition.enabled`` (such a
table has one partition key, so its name is its value): created and dropped with the option, by the
coordinator alone."""


class CoordinatorService(CatalogReader):
    """Catalog and metadata RPCs: the catalog's reads (:class:`CatalogReader`) and every change to it. Runs on
    the event loop; its store calls run on store threads (:func:`off_loop`), and what it changed it keeps in
    memory (the catalog is complete once :meth:`start` loaded it)."""

    def __init__(
        self,
        store: MetadataStore,
        tablets: TabletServerGateway,
        config: Configuration,
        clock: Clock,
        placement: BucketPlacement,
        lake_tiering: LakeTableTieringManager,
        on_table_dropped: TableDroppedHook | None = None,
    ) -> None:
        """``on_table_dropped(table, partition_id)`` is awaited after a table (partition_id None) or one
        partition is dropped: KV snapshots, leases and lake offsets files of it are released there."""
        super().__init__(store, placement)
        self._tablets = tablets
        self._on_table_dropped = on_table_dropped
        self._clock = clock
        self._default_bucket_count = config.get(DEFAULT_BUCKET_NUMBER)
        self._default_replication_factor = config.get(DEFAULT_REPLICATION_FACTOR)
        self._allow_creation = {False: config.get(ALLOW_CREATE_LOG_TABLES), True: config.get(ALLOW_CREATE_KV_TABLES)}
        self._bucket_count_max = config.get(MAX_BUCKET_NUM)
        self._partition_count_max = config.get(MAX_PARTITION_NUM)
        self._lake_tiering = lake_tiering
        self._lake_format = config.get(DATALAKE_FORMAT)
        prefix = f"datalake.{self._lake_format}."
        self._lake_options = {
            table_properties.table_option_key(key): str(value) for key, value in config.to_dict().items()
            if key.startswith(prefix) and not any(word in key.lower() for word in SENSITIVE_OPTION_WORDS)
        }
        """``table.datalake.<format>.<key>`` -> value: what a lake-enabled table's properties get."""
        self._default_freshness_ms = config.get_ms(TABLE_DATALAKE_FRESHNESS)
        self._table_changed_hooks: list[TableChangedHook] = []
        self._read_modify_write = asyncio.Lock()
        """Held by a change decided on what it read (an alter, a partition counted against its maximum) from
        the read to the write, so two such changes never decide on the same old state."""
        self.kv_leader_capacity = KvLeaderCapacity(
            config.get(KV_LEADER_REPLICA_MEMORY_RESERVED),
            lambda: [node.memory_bytes for node in placement.tablet_servers()],
            self.kv_leader_replica_count,
        )
        """``kv.leader-replica.memory-reserved``: checked before a primary-key table or partition is created."""

    def on_table_changed(self, hook: TableChangedHook) -> None:
        """Await ``hook(table)`` after a table is created or altered, before the request is answered (the
        auto-partition manager creates a new table's partitions there)."""
        self._table_changed_hooks.append(hook)

    async def _table_changed(self, table: TableInfo) -> None:
        for hook in self._table_changed_hooks:
            await hook(table)

    def kv_leader_replica_count(self) -> int:
        """The buckets of primary-key tables and of their partitions: one KV leader replica each (from the
        loaded catalog)."""
        tables = self._tables_by_id
        count = sum(table.bucket_count for table in tables.values() if table.has_primary_key and not table.is_partitioned)
        for record in self._partitions_by_id.values():
            table = tables.get(record.table_id)
            if table is not None and table.has_primary_key:
                count += table.bucket_count
        return count

    async def start(self) -> None:
        """Create the default database, load the catalog and hand every stored bucket to the tablet server."""
        await off_loop(self._create_default_database)
        await self.load()
        table_ids: list[int] = []
        for table in self.tables():
            if table.is_partitioned:
                for partition in self.list_partitions(table):
                    self._tablets.become_leader(table, table.buckets(partition.partition_id))
            else:
                self._tablets.become_leader(table, table.buckets())
            await self._sync_lake(table)
            table_ids.append(table.table_id)
        await self._lake_tiering.retain_tables(table_ids)

    def _create_default_database(self) -> None:
        if self._store.get_database(DEFAULT_DATABASE) is None:
            now = self._clock.now_ms()
            self._store.create_database(DatabaseRecord(DEFAULT_DATABASE, DEFAULT_DATABASE_JSON, now, now))

    async def _sync_lake(self, table: TableInfo) -> None:
        """Register a lake-enabled table with the tiering manager (its freshness may have changed), or
        stop scheduling one whose lake was disabled."""
        if table.options.datalake_enabled:
            await self._lake_tiering.add_table(table.table_id, table.path, self._freshness_ms(table.options))
        else:
            await self._lake_tiering.disable_table(table.table_id)

    async def set_default_freshness_ms(self, freshness_ms: int) -> None:
        """A new ``table.datalake.freshness`` server default: lake tables that do not set their own are
        rescheduled with it."""
        if freshness_ms == self._default_freshness_ms:
            return
        self._default_freshness_ms = freshness_ms
        for table in self.tables():
            if table.options.datalake_enabled and table.options.datalake_freshness_ms is None:
                await self._sync_lake(table)

    def _freshness_ms(self, options: TableProperties) -> int:
        """The table's own freshness, else the server's default."""
        freshness_ms = options.datalake_freshness_ms
        return self._default_freshness_ms if freshness_ms is None else freshness_ms

    async def _require_database(self, name: str) -> DatabaseRecord:
        record = await off_loop(self._store.get_database, name)
        if record is None:
            raise DatabaseNotExistError(f"Database '{name}' does not exist.")
        return record

    # ---- databases ----
    async def create_database(self, request: Any, _context: object) -> Any:
        name = request.database_name
        validate_database_name(name)
        database_json = request.database_json if request.HasField("database_json") else DEFAULT_DATABASE_JSON
        _parse_json_object(database_json, "database_json")
        now = self._clock.now_ms()
        try:
            await off_loop(self._store.create_database, DatabaseRecord(name, database_json, now, now))
        except DatabaseAlreadyExistError:
            if not request.ignore_if_exists:
                raise
        return pb.CreateDatabaseResponse()

    async def drop_database(self, request: Any, _context: object) -> Any:
        name = request.database_name
        if await off_loop(self._store.get_database, name) is None:
            if request.ignore_if_not_exists:
                return pb.DropDatabaseResponse()
            raise DatabaseNotExistError(f"Database '{name}' does not exist.")
        tables = await off_loop(self._store.list_tables, name)
        if tables and not request.cascade:
            raise DatabaseNotEmptyError(f"Database '{name}' is not empty: it has {len(tables)} tables.")
        for table_name in tables:
            path = TablePath(name, table_name)
            table = self._tables_by_path.get(path) or await off_loop(self._read_table, path)
            if table is not None:  # else dropped meanwhile
                await self._drop_table(table)
        await off_loop(self._store.drop_database, name)
        return pb.DropDatabaseResponse()

    async def alter_database(self, request: Any, _context: object) -> Any:
        """Set or delete custom properties and replace the comment (an empty comment removes it), as
        Fluss does: every SET is applied, then every DELETE. A request that changes nothing leaves the
        database and its modified time as they were."""
        name = request.database_name
        to_set, to_delete = _database_changes(request.config_changes)
        comment = request.comment if request.HasField("comment") else None
        if comment is not None and not isinstance(comment, str):
            raise InvalidAlterDatabaseError("The comment is not valid UTF-8.")
        async with self._read_modify_write:
            return await self._alter_database(name, to_set, to_delete, comment, request.ignore_if_not_exists)

    async def _alter_database(
        self, name: Any, to_set: dict[str, str], to_delete: set[str], comment: str | None, ignore_if_not_exists: bool,
    ) -> Any:
        record = await off_loop(self._store.get_database, name) if isinstance(name, str) else None
        if record is None:
            if ignore_if_not_exists:
                return pb.AlterDatabaseResponse()
            raise DatabaseNotExistError(f"Database '{name}' does not exist.")
        try:
            current = DatabaseDescriptor.from_json(record.database_json)
        except MetadataJsonError as exc:
            message = f"The stored descriptor of database '{name}' is invalid: {exc}"
            raise InvalidDatabaseError(message) from None
        properties = {**current.custom_properties, **to_set}
        for key in to_delete:
            properties.pop(key, None)
        new_comment = current.comment if comment is None else (comment or None)
        altered = DatabaseDescriptor(new_comment, properties)
        if altered == current:
            return pb.AlterDatabaseResponse()
        await off_loop(self._store.update_database, name, altered.to_json(), self._clock.now_ms())
        changed = "properties" if comment is None else "properties and comment"
        log.info("altered database %s (%s)", name, changed)
        return pb.AlterDatabaseResponse()

    async def list_databases(self, request: Any, _context: object) -> Any:
        return await off_loop(self._list_databases, request.include_summary)

    def _list_databases(self, include_summary: bool) -> Any:
        response = pb.ListDatabasesResponse()
        for name in self._store.list_databases():
            record = self._store.get_database(name) if include_summary else None
            if include_summary and record is None:
                continue  # dropped meanwhile
            response.database_name.append(name)
            if record is not None:
                response.database_summary.add(
                    database_name=name, created_time=record.created_ms, table_count=len(self._store.list_tables(name))
                )
        return response

    async def database_exists(self, request: Any, _context: object) -> Any:
        found = await off_loop(self._store.get_database, request.database_name)
        return pb.DatabaseExistsResponse(exists=found is not None)

    async def get_database_info(self, request: Any, _context: object) -> Any:
        record = await self._require_database(request.database_name)
        return pb.GetDatabaseInfoResponse(
            database_json=record.database_json, created_time=record.created_ms, modified_time=record.modified_ms
        )

    # ---- tables ----
    async def create_table(self, request: Any, _context: object) -> Any:
        path = TablePath(request.table_path.database_name, request.table_path.table_name)
        validate_database_name(path.database_name)
        validate_table_name(path.table_name)
        await self._require_database(path.database_name)
        table_json = self._validated_table_json(request.table_json)
        requested = _kv_leader_replicas(table_json)
        historical = TableDescriptor.from_json(table_json).options.datalake_historical_partition
        checked = (historical or (bool(requested) and self.kv_leader_capacity.enabled)) \
            and path not in self._tables_by_path
        # checked: the count the new table's buckets join is the count checked (a partition holds it too),
        # and a historical partition is created with its table before any other partition
        async with self._read_modify_write if checked else contextlib.nullcontext():
            if checked:
                what = f"the historical partition of table '{path}'" if historical else f"table '{path}'"
                self.kv_leader_capacity.check(requested, what)
            try:
                record = await off_loop(
                    self._store.create_table,
                    path.database_name, path.table_name, table_json, FIRST_SCHEMA_ID, self._clock.now_ms(),
                )
            except TableAlreadyExistError:
                await self._heal(path)
                if request.ignore_if_exists:
                    return pb.CreateTableResponse()
                raise
            table = self.remember_table(TableInfo.from_record(record))
            if historical:
                await self._create_table_historical_partition(table)
        if not table.is_partitioned:
            await off_loop(self._placement.assign, table)
            self._tablets.become_leader(table, table.buckets())
        await self._sync_lake(table)
        log.info("created table %s (id %d, %d buckets)", path, table.table_id, table.bucket_count)
        await self._table_changed(table)
        return pb.CreateTableResponse()

    async def _create_table_historical_partition(self, table: TableInfo) -> None:
        """The new table's historical partition (its capacity and replication factor were checked before the
        table was stored). Holds ``_read_modify_write``.

        Raises:
            StromError: it could not be created (Fluss's FlussRuntimeException says the same): the table
                exists without it until the next auto-partition check creates it.
        """
        try:
            await self._create_historical_partition(table)
        except StromError as exc:
            raise type(exc)(
                f"Table '{table.path}' was created, but its historical system partition '{HISTORICAL}' could "
                f"not be: {exc} Lookups of expired partitions fail until the coordinator's next auto-partition "
                "check creates it; do not retry CreateTable (the table exists)."
            ) from exc

    async def _create_historical_partition(self, table: TableInfo) -> bool:
        """Create the table's ``__historical__`` partition (counted against ``max.partition.num`` and the KV
        leader capacity like any partition); False if it exists. Holds ``_read_modify_write``.

        Raises:
            PartitionMaxNumError, InsufficientKvLeaderReplicaCapacityError, InvalidReplicationFactorError.
        """
        return await self._create_partition(table, {table.partition_keys[0]: HISTORICAL}, HISTORICAL, True)

    async def reconcile_historical_partition(self, table: TableInfo) -> str | None:
        """Make the table's ``__historical__`` partition match its option, as Fluss's coordinator does at
        start: a table with ``table.datalake.historical-partition.enabled`` but without the partition (a
        creation that failed after the table was stored) gets it, one without the option loses it (a drop
        that failed after AlterTable stored the option). Returns ``"created"``, ``"dropped"`` or None
        (nothing to do).

        Raises:
            StromError: the partition could not be created (see :meth:`_create_historical_partition`).
        """
        if not await self._historical_partition_differs(table):
            return None
        async with self._read_modify_write:  # decided on the table and partitions as they are now
            current = await self.resolve_table_by_id(table.table_id)
            if current is None or not await self._historical_partition_differs(current):
                return None
            if current.options.datalake_historical_partition:
                await self._create_historical_partition(current)
                log.info("created the missing historical partition of %s", current.path)
                return "created"
            await self.drop_partition_of(current, await self.resolve_partition(current, HISTORICAL))
            return "dropped"

    async def _historical_partition_differs(self, table: TableInfo) -> bool:
        if not table.is_partitioned:
            return False
        try:
            await self.resolve_partition(table, HISTORICAL)
        except PartitionNotExistError:
            return table.options.datalake_historical_partition
        return not table.options.datalake_historical_partition

    def _validated_table_json(self, raw: bytes, *, creating: bool = True) -> bytes:
        """Parse and check a client's table descriptor; returns the JSON to store (bucket count filled in)."""
        document = _parse_json_object(raw, "table_json")
        try:
            descriptor = TableDescriptor.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidTableError(f"Invalid table descriptor: {exc}") from exc
        schema = descriptor.schema
        columns = schema.column_names
        if len(set(columns)) != len(columns):
            raise InvalidTableError(f"Column names must be unique, got {columns}.")
        if not columns:
            raise InvalidTableError("A table needs at least one column.")
        primary_key = list(schema.primary_key or [])
        for key in primary_key:
            if key not in columns:
                raise InvalidTableError(f"Primary key column '{key}' is not a column of the table.")
            column_type = schema.row_type.fields[columns.index(key)].type
            if isinstance(column_type, (fluss_types.MapType, fluss_types.ArrayType, fluss_types.RowType)):
                raise InvalidTableError(f"Primary key column '{key}' cannot be of type {column_type}.")
        for key in descriptor.partition_keys:
            if key not in columns:
                raise InvalidTableError(f"Partition key '{key}' is not a column of the table.")
            if primary_key and key not in primary_key:
                raise InvalidTableError(f"Partition key '{key}' must be part of the primary key {primary_key}.")
        physical_pk = [key for key in primary_key if key not in descriptor.partition_keys]
        if primary_key and not physical_pk:
            raise InvalidTableError("The primary key must contain at least one column that is not a partition key.")
        bucket_keys = list(descriptor.bucket_keys or [])
        for key in bucket_keys:
            if key not in columns:
                raise InvalidTableError(f"Bucket key '{key}' is not a column of the table.")
            if primary_key and key not in physical_pk:
                raise InvalidTableError(f"Bucket key '{key}' must be part of the physical primary key {physical_pk}.")
        if primary_key and not bucket_keys:
            document["bucket_key"] = physical_pk
        bucket_count = descriptor.bucket_count
        if bucket_count is None:
            bucket_count = self._default_bucket_count
            document["bucket_count"] = bucket_count
        if bucket_count <= 0:
            raise InvalidTableError(f"The bucket count must be positive, got {bucket_count}.")
        if bucket_count > self._bucket_count_max:
            raise BucketMaxNumError(
                f"Bucket count {bucket_count} exceeds the maximum of {self._bucket_count_max} (max.bucket.num)."
            )
        merge_options.fold_field_options(document)  # SQL-style fields.<column>.agg into the schema
        try:
            descriptor = TableDescriptor.from_json(document)
        except ValueError as exc:
            raise InvalidTableError(f"Invalid table descriptor: {exc}") from exc
        properties = dict(descriptor.properties)
        if creating:  # what Fluss's coordinator fills in before it validates
            if not self._allow_creation[bool(primary_key)]:  # Fluss's messages
                kind = "Primary Key Tables" if primary_key else "Log Tables"
                option = ALLOW_CREATE_KV_TABLES.key if primary_key else ALLOW_CREATE_LOG_TABLES.key
                raise InvalidTableError(f"Creation of {kind} is disallowed in the cluster ({option}).")
            properties = table_options.with_defaults(properties, has_primary_key=bool(primary_key),
                                                     replication_factor=self._default_replication_factor)
        table_options.check_system_columns(columns)
        # every key a known table.* option (new tables), every value of its type, options that fit together;
        # checked with the lake format the table gets when it sets none (Fluss fills it in before it checks)
        checked = properties if table_properties.DATALAKE_FORMAT in properties else {
            **properties, table_properties.DATALAKE_FORMAT: self._lake_format}
        table_options.validate(checked, descriptor.schema, descriptor.partition_keys, creating=creating)
        merge_options.validate(descriptor.schema, properties)
        auto_increment.cache_size(properties)  # a positive integer (InvalidConfigError)
        # a partition's replicas are checked when it is created, but a historical one comes with its table
        if creating and (not descriptor.partition_keys or TableProperties(properties).datalake_historical_partition):
            self._check_replication_factor(properties)
        document["properties"] = completed = self._with_lake_properties(properties, creating, bool(primary_key))
        lake_keys = keys.key_lake_format(completed)
        if lake_keys is not None:  # the keys must encode as the lake format hashes them (InvalidTableError)
            for key_columns in dict.fromkeys((tuple(physical_pk), tuple(bucket_keys or physical_pk))):
                if key_columns:
                    keys.key_encoder(schema.row_type, [columns.index(k) for k in key_columns], lake_keys)
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    def _check_replication_factor(self, properties: dict[str, str]) -> None:
        """InvalidReplicationFactorError (Fluss's message) when the table wants more replicas than there
        are tablet servers to hold them."""
        factor = TableProperties(properties).replication_factor
        available = len(self._placement.tablet_servers())
        if factor > available:
            raise InvalidReplicationFactorError(
                f"Replication factor: {factor} larger than available tablet servers: {available}."
            )


    def _with_lake_properties(self, properties: dict[str, str], creating: bool, has_primary_key: bool) -> dict[str, str]:
        """Check the ``table.datalake.*`` options. A lake-enabled table gets the cluster's format and its
        options (copied once: a table keeps its lake location when the server's options change later).
        Lance holds log tables only: a primary-key table cannot enable it (Fluss refuses it as well)."""
        options = TableProperties(properties)
        enabled, lake_format = options.datalake_enabled, options.datalake_format
        if lake_format is not None and lake_format != self._lake_format:
            raise InvalidConfigError(
                f"{table_properties.DATALAKE_FORMAT}={options.text(table_properties.DATALAKE_FORMAT)!r} is not the "
                f"cluster's lake format: this server tiers into '{self._lake_format}' (datalake.format). Leave "
                "the option unset."
            )
        completed = dict(properties)
        if table_properties.DATALAKE_ENABLED in completed:  # stored as Fluss writes a boolean
            completed[table_properties.DATALAKE_ENABLED] = "true" if enabled else "false"
        if lake_format is not None or (creating and self._lake_format in keys.KEYED_LAKE_FORMATS):
            # Iceberg and Paimon decide how keys are encoded and bucketed, so every table of such a cluster
            # carries the format from its creation (as Fluss does): its buckets then match the lake's
            # whenever its lake is enabled.
            completed[table_properties.DATALAKE_FORMAT] = self._lake_format
        if not enabled:
            return completed
        if has_primary_key and self._lake_format == LANCE:
            raise InvalidTableError(
                "Currently, we don't support tiering a primary key table to Lance: this cluster's lake format is "
                "lance (datalake.format), which holds log tables only."
            )
        if self._lake_format in keys.KEYED_LAKE_FORMATS and lake_format is None and not creating:
            name = self._lake_format
            raise InvalidConfigError(
                f"This table was created before the cluster's lake format was {name}: its keys are bucketed "
                f"by Fluss's hash, not {name.capitalize()}'s, so its buckets cannot be the lake's. Re-create it "
                f"to tier it into {name.capitalize()}."
            )
        completed[table_properties.DATALAKE_FORMAT] = self._lake_format
        for key, value in self._lake_options.items():
            completed.setdefault(key, value)
        return completed

    async def drop_table(self, request: Any, _context: object) -> Any:
        path = TablePath(request.table_path.database_name, request.table_path.table_name)
        try:
            table = await self.resolve_table(path)
        except TableNotExistError:
            if request.ignore_if_not_exists:
                return pb.DropTableResponse()
            raise
        await self._drop_table(table)
        return pb.DropTableResponse()

    async def _heal(self, path: TablePath) -> None:
        """The store has a table memory lacks (a creation whose answer was lost to a store failure, and
        which the store made all the same): remember it, as a retried creation finds it."""
        if path not in self._tables_by_path:
            found = await off_loop(self._read_table, path)
            if found is not None:
                self.remember_table(found)

    async def _drop_table(self, table: TableInfo) -> None:
        await off_loop(self._store.drop_table, table.table_id)
        self.forget_table(table.table_id)
        await self._tablets.stop_replicas(table.table_id, None, delete=True)
        if self._on_table_dropped is not None:
            await self._on_table_dropped(table, None)
        log.info("dropped table %s (id %d)", table.path, table.table_id)

    async def alter_table(self, request: Any, _context: object) -> Any:
        """Set or reset table options and custom properties, validated as at creation, and add nullable
        columns at the end (a new schema id; rows written before read with nulls there). Enabling the lake
        registers the table for tiering, disabling it stops its schedule, and a new freshness re-arms its
        timer. The hosted buckets serve the changed table from the next request on."""
        async with self._read_modify_write:
            altered = await self._alter_table(request)
        if altered is not None:
            await self._tablets.change_table(altered)
            await self._sync_lake(altered)
            await self._table_changed(altered)
            log.info("altered table %s: %d option changes, %d added columns (schema %d)", altered.path,
                     len(request.config_changes), len(request.add_columns), altered.schema_id)
        return pb.AlterTableResponse()

    async def _alter_table(self, request: Any) -> TableInfo | None:
        """The altered table, stored and remembered; None when the request changes nothing."""
        path = TablePath(request.table_path.database_name, request.table_path.table_name)
        try:
            table = await self.resolve_table(path)
        except TableNotExistError:
            if request.ignore_if_not_exists:
                return None
            raise
        for refused, what in (
            (request.drop_columns, "drop"), (request.rename_columns, "rename"), (request.modify_columns, "modify")
        ):
            if refused:
                raise InvalidAlterTableError(f"Not support {what} column now: only ADD COLUMN changes the columns of '{path}'.")
        document = json.loads(table.table_json)
        schema_id = table.schema_id
        if request.add_columns:
            if table.options.datalake_enabled and self._lake_format not in COLUMN_ADDING_LAKE_FORMATS:
                raise InvalidAlterTableError(
                    f"Adding columns to '{path}' is not supported while it is tiered into {self._lake_format} "
                    f"({table_properties.DATALAKE_ENABLED}=true): strom evolves Delta, Iceberg and Paimon lake tables only."
                )
            document["schema"] = _with_added_columns(table, request.add_columns)
            schema_id += 1
        properties = dict(document.get("properties") or {})
        custom = dict(document.get("custom_properties") or {})
        changed = list(dict.fromkeys(change.config_key for change in request.config_changes))
        unsupported = [k for k in changed
                       if k.startswith(table_properties.TABLE_OPTION_PREFIX) and k not in ALTERABLE_TABLE_OPTIONS]
        if unsupported:  # Fluss's message, every such key at once
            raise InvalidAlterTableError(
                f"The following options are not supported to alter yet: {', '.join(repr(k) for k in unsupported)}."
            )
        if table_properties.STANDBY_REPLICA in changed and not table.has_primary_key:
            raise InvalidAlterTableError(
                f"'{table_properties.STANDBY_REPLICA}' can only be altered on primary key tables."
            )
        for change in request.config_changes:
            key = change.config_key
            target = properties if key.startswith(table_properties.TABLE_OPTION_PREFIX) else custom
            if change.op_type == ALTER_SET:
                if not change.HasField("config_value"):
                    raise InvalidAlterTableError(f"Setting '{key}' needs a value.")
                target[key] = change.config_value
            elif change.op_type == ALTER_DELETE:
                target.pop(key, None)
            else:
                raise InvalidAlterTableError(
                    f"Alter operation {change.op_type} on '{key}' is not supported; use SET (0) or DELETE (1)."
                )
        if table.options.datalake_enabled and not TableProperties(properties).datalake_enabled:
            # Disabling forgets what enabling copied (the format and its options); enabling copies them
            # again. An Iceberg table keeps its format: its keys are encoded for it.
            lake_prefix = table_properties.datalake_option_prefix(self._lake_format)
            keep_format = keys.key_lake_format(properties) is not None
            for key in [k for k in properties
                        if (k == table_properties.DATALAKE_FORMAT and not keep_format) or k.startswith(lake_prefix)]:
                del properties[key]
        document["properties"] = properties
        document["custom_properties"] = custom
        table_json = self._validated_table_json(json.dumps(document).encode(), creating=False)
        if table_json == table.table_json:
            return None
        was_historical = table.options.datalake_historical_partition
        versions = table.versions if schema_id == table.schema_id else {**table.versions, table.schema_id: table.table_json}
        provisional = dataclasses.replace(table, table_json=table_json, schema_id=schema_id, versions=versions)
        if provisional.options.datalake_historical_partition and not was_historical:
            await self._enable_historical_partition(provisional)
        record = await off_loop(self._store.update_table, table.table_id, table_json, self._clock.now_ms(),
                                schema_id=schema_id)
        altered = self.remember_table(await off_loop(self._with_versions, record))
        if was_historical and not altered.options.datalake_historical_partition:
            await self._disable_historical_partition(altered)
        return altered

    async def _enable_historical_partition(self, table: TableInfo) -> None:
        """The historical partition of a table AlterTable turns the option on for (``table``: as it will be
        stored), created before the option is stored, as Fluss does. Holds ``_read_modify_write``.

        Raises:
            StromError: it could not be created (e.g. InsufficientKvLeaderReplicaCapacityError, 71); the
                option was not changed.
        """
        try:
            created = await self._create_historical_partition(table)
        except StromError as exc:
            raise type(exc)(
                f"Enabling '{table_properties.DATALAKE_HISTORICAL_PARTITION}' on '{table.path}' needs its historical "
                f"system partition '{HISTORICAL}', which could not be created: {exc} The option was not changed."
            ) from exc
        if created:
            log.info("created the historical partition of %s", table.path)

    async def _disable_historical_partition(self, table: TableInfo) -> None:
        """Drop the historical partition of a table AlterTable turned the option off for (after it was stored).
        A failure is logged: the next auto-partition check drops the partition."""
        try:
            await self.drop_partition_of(table, await self.resolve_partition(table, HISTORICAL))
        except PartitionNotExistError:
            return
        except Exception:
            log.exception("dropping the historical partition of %s failed; the next auto-partition check "
                          "drops it", table.path)

    async def list_tables(self, request: Any, _context: object) -> Any:
        await self._require_database(request.database_name)
        return pb.ListTablesResponse(table_name=await off_loop(self._store.list_tables, request.database_name))

    async def table_exists(self, request: Any, _context: object) -> Any:
        path = TablePath(request.table_path.database_name, request.table_path.table_name)
        try:
            await self.resolve_table(path)
        except TableNotExistError:
            return pb.TableExistsResponse(exists=False)
        return pb.TableExistsResponse(exists=True)

    # ---- partitions ----
    async def list_partition_infos(self, request: Any, _context: object) -> Any:
        table = await self.resolve_table(
            TablePath(request.table_path.database_name, request.table_path.table_name)
        )
        if not table.is_partitioned:
            raise TableNotPartitionedError(f"Table '{table.path}' is not a partitioned table.")
        wanted = {kv.key: kv.value for kv in request.partial_partition_spec.partition_key_values}
        unknown = set(wanted) - set(table.partition_keys)
        if unknown:
            raise PartitionSpecInvalidError(f"{sorted(unknown)} are not partition keys of '{table.path}'.")
        response = pb.ListPartitionInfosResponse()
        for partition in await self.resolve_partitions(table):
            if partition.name == HISTORICAL:  # a system partition (Fluss hides it too); GetMetadata resolves it
                continue
            spec = dict(partition.spec)
            if any(spec.get(key) != value for key, value in wanted.items()):
                continue
            info = response.partitions_info.add(partition_id=partition.partition_id)
            # The client rebuilds the partition name from these entries in order: partition-key order.
            for key in table.partition_keys:
                info.partition_spec.partition_key_values.add(key=key, value=spec[key])
        return response

    async def create_partition(self, request: Any, _context: object) -> Any:
        table = await self.resolve_table(
            TablePath(request.table_path.database_name, request.table_path.table_name)
        )
        spec = {kv.key: kv.value for kv in request.partition_spec.partition_key_values}
        if table.is_partitioned and HISTORICAL in spec.values():
            raise PartitionSpecInvalidError(
                f"The partition value '{HISTORICAL}' is reserved for the historical system partition, which the "
                f"coordinator creates for tables with '{table_properties.DATALAKE_HISTORICAL_PARTITION}' = true; it "
                "cannot be created manually."
            )
        if table.is_partitioned:
            AutoPartitionStrategy.of(table.properties, table.partition_keys).check_new_partition(
                spec, self._clock.now_ms()
            )
        # Fluss's name for "ignore if it already exists" is ignore_if_not_exists
        await self.create_partition_of(table, spec, ignore_if_exists=request.ignore_if_not_exists)
        return pb.CreatePartitionResponse()

    async def create_partition_of(self, table: TableInfo, spec: dict[str, str], *, ignore_if_exists: bool) -> bool:
        """Create a partition and hand its buckets to the tablet servers; False if it existed (and
        ``ignore_if_exists``).

        Raises:
            TableNotPartitionedError, PartitionSpecInvalidError, PartitionAlreadyExistsError,
            PartitionMaxNumError, InvalidReplicationFactorError.
        """
        if not table.is_partitioned:
            raise TableNotPartitionedError(f"Table '{table.path}' is not a partitioned table.")
        name = partition_name(spec, table.partition_keys)
        async with self._read_modify_write:  # the count checked is the count the new partition joins
            return await self._create_partition(table, spec, name, ignore_if_exists)

    async def _create_partition(self, table: TableInfo, spec: dict[str, str], name: str, ignore_if_exists: bool) -> bool:
        existing = await self.resolve_partitions(table)
        if any(p.name == name for p in existing):
            if ignore_if_exists:
                return False
            raise PartitionAlreadyExistsError(f"Partition '{name}' of table '{table.path}' already exists.")
        if len(existing) >= self._partition_count_max:
            raise PartitionMaxNumError(
                f"Table '{table.path}' already has {len(existing)} partitions (max.partition.num)."
            )
        self._check_replication_factor(table.properties)
        if table.has_primary_key:
            self.kv_leader_capacity.check(table.bucket_count, f"partition '{name}' of table '{table.path}'")
        ordered = tuple((key, spec[key]) for key in table.partition_keys)
        try:
            record = await off_loop(self._store.create_partition, table.table_id, name, ordered, self._clock.now_ms())
        except PartitionAlreadyExistsError:  # made by a creation whose answer a store failure lost
            found = await off_loop(self._store.get_partition, table.table_id, name)
            if found is not None:
                self.remember_partition(found)
            if ignore_if_exists:
                return False
            raise
        self.remember_partition(record)
        await off_loop(self._placement.assign, table, record.partition_id)
        self._tablets.become_leader(table, table.buckets(record.partition_id))
        return True

    async def drop_partition(self, request: Any, _context: object) -> Any:
        table = await self.resolve_table(
            TablePath(request.table_path.database_name, request.table_path.table_name)
        )
        if not table.is_partitioned:
            raise TableNotPartitionedError(f"Table '{table.path}' is not a partitioned table.")
        spec = {kv.key: kv.value for kv in request.partition_spec.partition_key_values}
        if HISTORICAL in spec.values():  # Fluss's InvalidPartitionException
            option = table_properties.DATALAKE_HISTORICAL_PARTITION
            how = (f"setting '{option}' to false drops it" if table.options.datalake_historical_partition
                   else f"the coordinator drops it, as '{option}' is false")
            raise PartitionSpecInvalidError(
                f"Historical system partition '{HISTORICAL}' of table '{table.path}' is managed by the "
                f"coordinator and cannot be dropped manually: {how}."
            )
        name = partition_name(spec, table.partition_keys)
        try:
            record = await self.resolve_partition(table, name)
        except PartitionNotExistError:
            if request.ignore_if_not_exists:
                return pb.DropPartitionResponse()
            raise
        await self.drop_partition_of(table, record)
        return pb.DropPartitionResponse()

    async def drop_partition_of(self, table: TableInfo, record: PartitionRecord) -> None:
        """Drop a partition: its record, its replicas' local data, then (the dropped hook) its KV
        snapshots, leases and remote log files. A lake copy is not touched."""
        await off_loop(self._store.drop_partition, record.partition_id)
        self.forget_partition(table.table_id, record.name)
        await self._tablets.stop_replicas(table.table_id, record.partition_id, delete=True)
        if self._on_table_dropped is not None:
            await self._on_table_dropped(table, record.partition_id)
        log.info("dropped partition %s of %s (id %d)", record.name, table.path, record.partition_id)



def _database_changes(changes: Any) -> tuple[dict[str, str], set[str]]:
    """The properties an AlterDatabase request sets and those it deletes.

    Raises:
        InvalidAlterDatabaseError: an op type other than SET (0) or DELETE (1), a SET without a value, or
            a key or value that is not valid UTF-8 (protobuf hands such a string over as bytes).
    """
    to_set: dict[str, str] = {}
    to_delete: set[str] = set()
    for change in changes:
        key = change.config_key
        if not isinstance(key, str):
            raise InvalidAlterDatabaseError(f"The property key {key!r} is not valid UTF-8.")
        if change.op_type == ALTER_SET:
            if not change.HasField("config_value"):
                raise InvalidAlterDatabaseError(f"Setting the database property '{key}' needs a value.")
            if not isinstance(change.config_value, str):
                raise InvalidAlterDatabaseError(f"The value of the database property '{key}' is not UTF-8.")
            to_set[key] = change.config_value
        elif change.op_type == ALTER_DELETE:
            to_delete.add(key)
        else:
            raise InvalidAlterDatabaseError(
                f"Unsupported alter database configs op type {change.op_type} on '{key}'; "
                "use SET (0) or DELETE (1)."
            )
    return to_set, to_delete


def _kv_leader_replicas(table_json: bytes) -> int:
    """The KV leader replicas creating a (validated) table adds: a primary-key table's buckets; none for a log
    table, nor for a partitioned table (its partitions add theirs when created) but for the buckets of the
    historical partition created with it."""
    descriptor = TableDescriptor.from_json(table_json)
    if not descriptor.has_primary_key:
        return 0
    if descriptor.is_partitioned and not descriptor.options.datalake_historical_partition:
        return 0
    return descriptor.bucket_count or 0


def _parse_json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidTableError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidTableError(f"{what} must be a JSON object")
    return document


def _with_added_columns(table: TableInfo, added: Any) -> dict[str, Any]:
    """The table's schema JSON with ``added`` (PbAddColumn) appended under new column ids, checked as Fluss
    checks them: a new name, at the end, nullable; an aggregate function (aggregation tables) kept."""
    names = set(table.schema.column_names)
    columns: list[Column] = []
    for column in added:
        name = column.column_name
        if name in names:
            raise InvalidAlterTableError(f"Column {name} already exists.")
        if column.column_position_type != COLUMN_POSITION_LAST:
            raise InvalidAlterTableError(f"Only support addColumn column at last now; '{name}' asks for another position.")
        try:
            data_type = fluss_types.data_type_from_json(json.loads(column.data_type_json))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidAlterTableError(f"Column {name}: invalid data type: {exc}") from exc
        if not data_type.nullable:
            raise InvalidAlterTableError(f"Column {name} must be nullable.")
        function = None
        if column.HasField("agg_function_type"):
            parameters = {p.key: p.value for p in column.agg_function_params}
            function = merge_options.AggFunction(column.agg_function_type.strip().lower(), parameters).to_json()
        comment = column.comment if column.HasField("comment") else None
        columns.append(Column(name, data_type, comment, agg_function=function))
        names.add(name)
    return table.schema.with_columns_appended(columns).to_json()
