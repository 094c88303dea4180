"""A table's row formats in one place: stored values, keys and the Arrow changelog.

A stored value is ``schema_id (i16 LE)`` followed by a row in the table's kv format (COMPACTED by
default, or INDEXED). The changelog carries the same rows as Arrow columns, so this class converts in
both directions: rows → Arrow when writing the changelog, Arrow → (key, value) when replaying it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from strom.errors import SchemaNotExistError
from strom.metadata.table_info import TableInfo
from strom.records import compacted, indexed, keys, log_batch, row_arrow, row_batches, row_log
from strom.records.arrow_compression import ArrowCompression
from strom.records.kv_batch import SCHEMA_ID
from strom.records.log_batch import ChangeType, LogBatchHeader
from strom.records.schema_evolution import RowUpgrader

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
        self.kv_format = table.options.kv_format
        self.log_compression = ArrowCompression.of_table(table.options.arrow_compression,
                                                         table.options.arrow_compression_zstd_level)
        log_format = row_log.log_format(table.properties)
        self.log_decoder = row_log.LogBatchDecoder(log_format, self.row_type, self.arrow_schema)
        self._log_decoders = {
            schema_id: row_log.LogBatchDecoder(log_format, old.row_type, old.arrow_schema)
            for schema_id, old in table.schemas.items()
            if schema_id != self.schema_id
        }
        self.log_decoders = {self.schema_id: self.log_decoder, **self._log_decoders}
        """The decoder of each schema id log batches of this table may carry."""
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
        upgrader = RowUpgrader(table.schemas, self.schema_id, self.kv_format)
        self.upgrader: RowUpgrader | None = upgrader if upgrader.has_history else None
        """Set when the table's columns changed: rows of earlier schemas are upgraded where they are read."""

    def current_values(self, stored_values: list[bytes | None]) -> list[bytes | None]:
        """Stored values as values of the current schema (the list itself when all already are)."""
        return stored_values if self.upgrader is None else self.upgrader.values(stored_values)

    def current_rows(self, schema_id: int, rows: Sequence[bytes | None]) -> Sequence[bytes | None]:
        """Rows a writer encoded under ``schema_id`` (an older one while its metadata is stale), as rows of
        the current schema. Raises SchemaNotExistError for an id the table never had."""
        if schema_id == self.schema_id:
            return rows
        upgrader = self.upgrader
        if upgrader is None:
            raise SchemaNotExistError(f"Schema {schema_id} does not exist (known: [{self.schema_id}]).")
        upgrader.schema(schema_id)  # an unknown id is refused before any row is touched
        return [None if row is None else upgrader.row(schema_id, row) for row in rows]

    def read_log_batch(
        self, buffer: bytes | bytearray | memoryview, position: int, header: LogBatchHeader
    ) -> tuple[bytes | None, pa.RecordBatch]:
        """A log batch of any of the table's schemas, decoded with its own and returned in the current one."""
        if header.schema_id == self.schema_id:
            return self.log_decoder.read(buffer, position, header)
        decoder = self._log_decoders.get(header.schema_id)
        if decoder is None or self.upgrader is None:
            raise SchemaNotExistError(f"A log batch carries schema id {header.schema_id}, unknown to the table.")
        change_types, batch = decoder.read(buffer, position, header)
        return change_types, self.upgrader.batch(batch, header.schema_id)

    def upgrade_log(self, records: bytes) -> bytes:
        """Fetched log batches with every batch of an earlier schema re-encoded in the current one (offsets,
        timestamps and writer state kept), so every reader sees one schema; the bytes themselves when no
        batch needs it."""
        if self.upgrader is None:
            return records
        headers = list(log_batch.iter_batches(records, verify_crc=False))
        if all(header.schema_id == self.schema_id for _, header in headers):
            return records
        parts: list[bytes | memoryview] = []
        view = memoryview(records)
        for position, header in headers:
            if header.schema_id == self.schema_id:
                parts.append(view[position : position + header.size_bytes])
                continue
            change_types, batch = self.read_log_batch(records, position, header)
            parts.append(self._rebuilt_log_batch(header, batch, change_types))
        return b"".join(parts)

    def _rebuilt_log_batch(self, header: LogBatchHeader, batch: pa.RecordBatch, change_types: bytes | None) -> bytes:
        if self.log_decoder.log_format in row_log.ROW_FORMATS:
            encoder = (indexed.IndexedRowEncoder(self.row_type) if self.log_decoder.log_format == row_log.INDEXED
                       else row_log.row_encoder(self.log_decoder.log_format, self.row_type))
            data = bytearray(
                row_log.encode_row_batch(
                    batch, encoder, schema_id=self.schema_id,
                    change_types=change_types, writer_id=header.writer_id, batch_sequence=header.batch_sequence,
                )
            )
        else:
            data = bytearray(
                log_batch.build_arrow_batch(
                    batch, schema_id=self.schema_id, change_types=change_types, compression=self.log_compression,
                    writer_id=header.writer_id, batch_sequence=header.batch_sequence,
                )
            )
        log_batch.stamp(data, 0, header.base_offset, header.commit_timestamp)
        return bytes(data)

    def stored_values_to_batch(self, stored_values: Sequence[bytes]) -> pa.RecordBatch:
        """Decode stored values (schema id + row) into one Arrow batch of the table's schema."""
        return row_arrow.rows_to_record_batch(
            stored_values, self._decoder, self.arrow_schema, offset=SCHEMA_ID_SIZE_BYTES
        )

    def changelog_to_kv(
        self, batch: pa.RecordBatch, change_types: bytes
    ) -> tuple[list[bytes | None], list[bytes | None]]:
        """For each changelog row of ``batch`` (in the current schema: :meth:`read_log_batch`): its key (None
        for -U, which changes nothing on its own) and the value to store (None for -D)."""
        prefix = SCHEMA_ID.pack(self.schema_id)
        if self.kv_format == "COMPACTED" and self.key_lake_format is None:
            rows, all_keys, _buckets = row_batches.encode_batch(
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
