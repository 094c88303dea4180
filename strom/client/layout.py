"""What writers and readers derive from a table's definition: its row types, codecs, keys and bucketing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cached_property

import pyarrow as pa

from strom import table_properties
from strom.errors import SchemaNotExistError
from strom.metadata.table_info import TableInfo
from strom.records import batch_statistics, keys, row_batches, row_log
from strom.records.arrow_compression import ArrowCompression
from strom.records.compacted import CompactedRowDecoder, CompactedRowEncoder
from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
from strom.records.kv_batch import SCHEMA_ID
from strom.records.types import RowType


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
        self.kv_format = info.options.kv_format
        self.log_compression = ArrowCompression.of_table(info.options.arrow_compression,
                                                         info.options.arrow_compression_zstd_level)
        self.log_format = row_log.log_format(info.properties)
        self.key_lake_format = keys.key_lake_format(info.properties)
        """Iceberg changes how keys are encoded and bucketed (:mod:`strom.records.keys`); None: Fluss's way."""
        self.bucket_of: keys.BucketFunction = keys.bucket_function(self.key_lake_format)
        self.statistics_columns = batch_statistics.statistics_columns(
            self.row_type, info.properties.get(table_properties.STATISTICS_COLUMNS)
        )
        """The columns whose statistics appended ARROW batches carry (``table.statistics.columns``)."""

    @cached_property
    def key_row_type(self) -> RowType:
        """The row type with every column but the key and bucket-key columns nullable: what a batch of keys
        alone (a lookup's, a delete's, a bucketing's) is encoded with, its other columns null even where the
        table declares them NOT NULL."""
        needed = {*self.key_indexes, *self.bucket_key_indexes, *self.partition_key_indexes}
        fields = [f if i in needed else dataclasses.replace(f, type=f.type.copy(nullable=True))
                  for i, f in enumerate(self.row_type.fields)]
        return dataclasses.replace(self.row_type, fields=tuple(fields))

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

    def present_rows(self, values: Sequence[bytes | None]) -> list[bytes]:
        """The values that hold a row (not None), in order, each checked as :meth:`check_values` checks
        them: in one C call where built."""
        rows, mismatch = row_batches.present_rows(values, self._schema_prefix)
        if mismatch >= 0:
            self.check_values((rows[mismatch],))
        return rows

    @cached_property
    def _schema_prefix(self) -> bytes:
        return SCHEMA_ID.pack(self.info.schema_id)

    @cached_property
    def log_decoder(self) -> row_log.LogBatchDecoder:
        """Decodes the table's log batches (ARROW, INDEXED or COMPACTED records) into batches of ``arrow_schema``."""
        return row_log.LogBatchDecoder(self.log_format, self.row_type, self.arrow_schema)

    @cached_property
    def log_row_encoder(self) -> row_log.RowEncoder:
        """Encodes appended rows for a table in a row log format (INDEXED or COMPACTED)."""
        return row_log.row_encoder(self.log_format, self.row_type)

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

    @cached_property
    def key_writer(self) -> row_batches.KeyWriter:
        """``key_encoder`` one key at a time, compiled where it can be (a single lookup)."""
        return row_batches.KeyWriter(self.key_encoder)

    @cached_property
    def bucket_key_writer(self) -> row_batches.KeyWriter:
        return row_batches.KeyWriter(self.bucket_key_encoder)

    @cached_property
    def row_reader(self) -> row_batches.RowReader:
        """Decodes one stored COMPACTED row to Python values, compiled where it can be (a single lookup)."""
        return row_batches.RowReader(self.row_type)

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


__all__ = ["TableLayout"]
