"""A table handle (``connection.get_table(path)``) and the builders it hands out, named as in pyfluss."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import pyarrow as pa

from strom.errors import SchemaNotExistError
from strom.ids import TableBucket, TablePath
from strom.metadata.table_info import TableInfo
from strom.records import indexed_log, keys
from strom.records.compacted import CompactedRowDecoder, CompactedRowEncoder
from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
from strom.records.kv_batch import SCHEMA_ID
from strom.records.types import RowType

if TYPE_CHECKING:
    from strom.client.batch_scanner import BatchScanner, BucketBatchScanner
    from strom.client.blocking import BlockingLookuper
    from strom.client.connection import Connection
    from strom.client.log_scanner import LogScanner
    from strom.client.lookup import Lookuper, PrefixLookuper
    from strom.client.writer import AppendWriter, UpsertWriter


class TableLayout:
    """Derived facts about a table's rows that writers and readers share (immutable)."""

    def __init__(self, info: TableInfo) -> None:
        self.info = info
        schema = info.schema
        self.row_type: RowType = schema.row_type
        self.arrow_schema: pa.Schema = schema.arrow_schema
        self.column_names: list[str] = list(schema.column_names)
        self.primary_key: list[str] = list(schema.primary_key or [])
        self.partition_keys: list[str] = list(info.partition_keys)
        self.physical_primary_key = [k for k in self.primary_key if k not in self.partition_keys]
        self.key_indexes = [self.column_names.index(k) for k in self.physical_primary_key]
        bucket_keys = list(info.descriptor.bucket_keys or []) or list(self.physical_primary_key)
        self.bucket_key_indexes = [self.column_names.index(k) for k in bucket_keys]
        self.partition_key_indexes = [self.column_names.index(k) for k in self.partition_keys]
        self.bucket_count = info.bucket_count
        self.kv_format = info.properties.get("table.kv.format", "COMPACTED").upper()
        compression = info.properties.get("table.log.arrow.compression.type", "ZSTD").upper()
        self.log_compression = {"NONE": None, "LZ4_FRAME": "lz4", "ZSTD": "zstd"}[compression]
        self.log_format = indexed_log.log_format(info.properties)
        self.key_lake_format = keys.key_lake_format(info.properties)
        """Iceberg changes how keys are encoded and bucketed (:mod:`strom.records.keys`); None: Fluss's way."""
        self.bucket_of: keys.BucketFunction = keys.bucket_function(self.key_lake_format)

    def check_schema_id(self, schema_id: int) -> None:
        """Refuse rows of another schema than this layout's: the server sends rows in the table's current
        schema, so another id means the table's columns changed after it was opened here."""
        if schema_id != self.info.schema_id:
            raise SchemaNotExistError(
                f"Table '{self.info.path}' now has schema {schema_id}, this handle was opened with schema "
                f"{self.info.schema_id}: its columns changed; open the table again (connection.get_table)."
            )

    def check_values(self, values: Sequence[bytes | memoryview]) -> None:
        """:meth:`check_schema_id` of stored values (schema id + row)."""
        prefix = self._schema_prefix
        for value in values:
            if value[:2] != prefix:
                self.check_schema_id(SCHEMA_ID.unpack(bytes(value[:2]))[0])

    @cached_property
    def _schema_prefix(self) -> bytes:
        return SCHEMA_ID.pack(self.info.schema_id)

    @cached_property
    def log_decoder(self) -> indexed_log.LogBatchDecoder:
        """Decodes the table's log batches (ARROW or INDEXED records) into batches of ``arrow_schema``."""
        return indexed_log.LogBatchDecoder(self.log_format, self.row_type, self.arrow_schema)

    @cached_property
    def log_row_encoder(self) -> IndexedRowEncoder:
        """Encodes appended rows for a table in log format INDEXED (Java's nested-decimal layout)."""
        return IndexedRowEncoder(self.row_type, java_decimal_layout=True)

    @cached_property
    def row_decoder(self) -> CompactedRowDecoder | IndexedRowDecoder:
        if self.kv_format == "INDEXED":
            return IndexedRowDecoder(self.row_type)
        return CompactedRowDecoder(self.row_type)

    @cached_property
    def row_encoder(self) -> CompactedRowEncoder | IndexedRowEncoder:
        if self.kv_format == "INDEXED":
            return IndexedRowEncoder(self.row_type)
        return CompactedRowEncoder(self.row_type)

    @cached_property
    def key_encoder(self) -> keys.KeyEncoder:
        return keys.key_encoder(self.row_type, self.key_indexes, self.key_lake_format)

    @cached_property
    def bucket_key_encoder(self) -> keys.KeyEncoder:
        return keys.key_encoder(self.row_type, self.bucket_key_indexes, self.key_lake_format)

    def column_indexes(self, columns: Sequence[int | str]) -> list[int]:
        indexes = []
        for column in columns:
            if isinstance(column, str):
                if column not in self.column_names:
                    raise ValueError(f"table {self.info.path} has no column {column!r}")
                indexes.append(self.column_names.index(column))
            else:
                if not 0 <= column < len(self.column_names):
                    raise ValueError(f"column index {column} is out of range for {self.info.path}")
                indexes.append(column)
        return indexes


class Table:
    """An existing table of the cluster."""

    def __init__(self, connection: Connection, info: TableInfo) -> None:
        self.connection = connection
        self.layout = TableLayout(info)

    @property
    def table_info(self) -> TableInfo:
        return self.layout.info

    def get_table_info(self) -> TableInfo:
        return self.layout.info

    @property
    def table_path(self) -> TablePath:
        return self.layout.info.path

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.layout.arrow_schema

    def has_primary_key(self) -> bool:
        return self.layout.info.has_primary_key

    def bucket(self, bucket_id: int, partition_id: int | None = None) -> TableBucket:
        return TableBucket(self.layout.info.table_id, bucket_id, partition_id)

    def new_upsert(self) -> TableUpsert:
        return TableUpsert(self)

    def new_append(self) -> TableAppend:
        return TableAppend(self)

    def new_lookup(self) -> TableLookup:
        return TableLookup(self)

    def new_scan(self) -> TableScan:
        return TableScan(self)


class TableUpsert:
    def __init__(self, table: Table) -> None:
        self._table = table
        self._targets: list[int] | None = None

    def partial_update(self, columns: Sequence[int | str]) -> TableUpsert:
        """Only write these columns (they must include the primary key); others keep their values."""
        self._targets = self._table.layout.column_indexes(columns)
        return self

    partial_update_by_name = partial_update
    partial_update_by_index = partial_update

    def create_writer(self) -> UpsertWriter:
        from strom.client.writer import UpsertWriter

        return UpsertWriter(self._table, self._targets)


class TableAppend:
    def __init__(self, table: Table) -> None:
        self._table = table

    def create_writer(self) -> AppendWriter:
        from strom.client.writer import AppendWriter

        return AppendWriter(self._table)


class TableLookup:
    def __init__(self, table: Table) -> None:
        self._table = table
        self._prefix: list[str] | None = None
        self._insert_if_not_exists = False

    def lookup_by(self, columns: Sequence[str]) -> TableLookup:
        self._prefix = list(columns)
        return self

    def insert_if_not_exists(self) -> TableLookup:
        """Lookups insert a row for each missing key (the key alone; an auto-increment column gets its id)
        and return it: Fluss's dictionary-table lookup. Needs write access to the table."""
        self._insert_if_not_exists = True
        return self

    def create_blocking_lookuper(self) -> BlockingLookuper:
        """A lookuper for synchronous code: no event loop, one blocking socket per leader (lowest latency)."""
        from strom.client.blocking import BlockingLookuper

        if self._prefix is not None or self._insert_if_not_exists:
            raise ValueError("prefix lookups and inserting lookups have no blocking variant; use create_lookuper()")
        return BlockingLookuper(self._table)

    def create_lookuper(self) -> Lookuper | PrefixLookuper:
        from strom.client.lookup import Lookuper, PrefixLookuper

        if self._prefix is not None:
            if self._insert_if_not_exists:
                raise ValueError("prefix lookups cannot insert missing keys; use a key lookup")
            return PrefixLookuper(self._table, self._prefix)
        return Lookuper(self._table, insert_if_not_exists=self._insert_if_not_exists)


class TableScan:
    """Builder for scanners: the log scanner here; the KV batch scanners come with ScanKv support."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.projection: list[int] | None = None
        self.row_limit: int | None = None

    def project(self, columns: Sequence[int | str]) -> TableScan:
        self.projection = sorted(set(self.table.layout.column_indexes(columns)))
        return self

    project_by_name = project

    def limit(self, row_limit: int) -> TableScan:
        if row_limit <= 0:
            raise ValueError(f"limit must be positive, got {row_limit}")
        self.row_limit = row_limit
        return self

    def create_log_scanner(self) -> LogScanner:
        from strom.client.log_scanner import LogScanner

        return LogScanner(self.table, self.projection)

    def create_bucket_batch_scanner(self, bucket: TableBucket) -> BucketBatchScanner:
        """Scan one bucket's current rows (ScanKv)."""
        from strom.client.batch_scanner import BucketBatchScanner

        return BucketBatchScanner(self.table, bucket, projection=self.projection, limit=self.row_limit)

    async def create_batch_scanner(self, parallelism: int = 4) -> BatchScanner:
        """Scan every bucket (of every partition) of the table, ``parallelism`` at a time."""
        from strom.client.batch_scanner import BatchScanner

        layout = self.table.layout
        partition_ids: list[int | None] = [None]
        if layout.partition_keys:
            admin = self.table.connection.get_admin()
            partitions = await admin.list_partition_infos(layout.info.path)
            partition_ids = [p.partition_id for p in partitions]
        buckets = [self.table.bucket(b, p) for p in partition_ids for b in range(layout.bucket_count)]
        return BatchScanner(
            self.table, buckets, projection=self.projection, limit=self.row_limit, parallelism=parallelism
        )
