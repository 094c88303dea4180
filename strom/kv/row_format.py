"""A table's row formats in one place: stored values, keys and the Arrow changelog.

A stored value is ``schema_id (i16 LE)`` followed by a row in the table's kv format (COMPACTED by
default, or INDEXED). The changelog carries the same rows as Arrow columns, so this class converts in
both directions: rows → Arrow when writing the changelog, Arrow → (key, value) when replaying it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from strom.metadata.table_info import TableInfo
from strom.records import compacted, fastpath, indexed, indexed_log, keys, row_arrow
from strom.records.kv_batch import SCHEMA_ID
from strom.records.log_batch import ChangeType

_COMPRESSION = {"NONE": None, "LZ4_FRAME": "lz4", "ZSTD": "zstd"}
SCHEMA_ID_SIZE_BYTES = 2


class TableRowFormat:
    """Immutable, shared by every bucket of one table version."""

    def __init__(self, table: TableInfo) -> None:
        schema = table.schema
        self.schema_id = table.schema_id
        self.row_type = schema.row_type
        self.arrow_schema: pa.Schema = schema.arrow_schema
        self.primary_key_indexes: list[int] = list(schema.primary_key_indexes)
        physical = [name for name in (schema.primary_key or []) if name not in table.partition_keys]
        names = schema.column_names
        self.key_indexes = [names.index(name) for name in physical]
        self.kv_format = table.properties.get("table.kv.format", "COMPACTED").upper()
        self.log_compression = _COMPRESSION[table.properties.get("table.log.arrow.compression.type", "ZSTD").upper()]
        self.log_decoder = indexed_log.LogBatchDecoder(
            indexed_log.log_format(table.properties), self.row_type, self.arrow_schema
        )
        if self.kv_format == "INDEXED":
            self._decoder: indexed.IndexedRowDecoder | compacted.CompactedRowDecoder = indexed.IndexedRowDecoder(
                self.row_type
            )
            self._encoder: indexed.IndexedRowEncoder | compacted.CompactedRowEncoder = indexed.IndexedRowEncoder(
                self.row_type
            )
        else:
            self._decoder = compacted.CompactedRowDecoder(self.row_type)
            self._encoder = compacted.CompactedRowEncoder(self.row_type)
        self.key_lake_format = keys.key_lake_format(table.properties)
        self._key_encoder = keys.key_encoder(self.row_type, self.key_indexes, self.key_lake_format)

    def stored_values_to_batch(self, stored_values: Sequence[bytes]) -> pa.RecordBatch:
        """Decode stored values (schema id + row) into one Arrow batch of the table's schema."""
        return row_arrow.rows_to_record_batch(
            stored_values, self._decoder, self.arrow_schema, offset=SCHEMA_ID_SIZE_BYTES
        )

    def changelog_to_kv(
        self, batch: pa.RecordBatch, change_types: bytes, schema_id: int
    ) -> tuple[list[bytes | None], list[bytes | None]]:
        """For each changelog row: its key (None for -U, which changes nothing on its own) and the value
        to store (None for -D)."""
        prefix = SCHEMA_ID.pack(schema_id)
        if self.kv_format == "COMPACTED" and self.key_lake_format is None:
            rows, all_keys, _buckets = fastpath.encode_batch(
                batch, self.row_type, key_indexes=self.key_indexes, value_prefix=prefix
            )
            assert all_keys is not None
        else:
            row_values = row_arrow.record_batch_to_values(batch, self.row_type)
            rows = [prefix + self._encoder.encode(v) for v in row_values]
            all_keys = [self._key_encoder.encode(v) for v in row_values]
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        for change_type, key, row in zip(change_types, all_keys, rows, strict=True):
            if change_type == ChangeType.UPDATE_BEFORE:
                keys.append(None)  # the +U that follows carries the new value
                values.append(None)
            else:
                keys.append(key)
                values.append(None if change_type == ChangeType.DELETE else row)
        return keys, values

    def merge_partial(self, old: bytes, new: bytes, target_columns: Sequence[int]) -> bytes:
        """Partial update: target columns from ``new``, the rest from ``old`` (both stored values)."""
        if self.kv_format == "INDEXED":
            targets = set(target_columns)
            old_values = self.decode_stored(old)
            new_values = self.decode_stored(new)
            merged_values = [n if i in targets else o for i, (o, n) in enumerate(zip(old_values, new_values, strict=True))]
            return new[:2] + self._encoder.encode(merged_values)
        return new[:2] + compacted.merge_partial(self.row_type, old[2:], new[2:], target_columns)

    def null_out(self, old: bytes, target_columns: Sequence[int]) -> bytes | None:
        """Partial delete: null the target non-key columns; None when nothing but the key would remain."""
        if self.kv_format == "INDEXED":
            keys = set(self.primary_key_indexes)
            targets = set(target_columns) - keys
            values = [None if i in targets else v for i, v in enumerate(self.decode_stored(old))]
            if all(v is None for i, v in enumerate(values) if i not in keys):
                return None
            return old[:2] + self._encoder.encode(values)
        remaining = compacted.null_out(self.row_type, old[2:], target_columns, self.primary_key_indexes)
        return None if remaining is None else old[:2] + remaining

    def decode_stored(self, stored: bytes) -> tuple:
        return self._decoder.decode(memoryview(stored)[SCHEMA_ID_SIZE_BYTES:])

    def encode_row(self, row_values: Sequence[object]) -> bytes:
        """A row of the table's kv format (without the schema id), e.g. a merge engine's result."""
        return self._encoder.encode(row_values)

    def encode_key(self, row_values: Sequence[object]) -> bytes:
        return self._key_encoder.encode(row_values)
