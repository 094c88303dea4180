"""Rows written under an earlier schema of a table, read under its current one.

A table's columns only change by ``ALTER TABLE ... ADD COLUMN`` of nullable columns at the end (Fluss's
rule), so a row of an earlier schema is the current row with nulls in the columns added since. Columns
are matched by column id, not position, so the mapping stays right if other changes arrive later.

Stored values (``schema_id i16 LE`` + row) and Arrow batches are both upgraded here. A COMPACTED row
needs no decoding: its fields are written in order with nulls omitted, so appending null columns only
widens the null bitset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from strom.errors import SchemaNotExistError
from strom.records import compacted, indexed
from strom.records.kv_batch import SCHEMA_ID
from strom.records.schema import Schema

SCHEMA_ID_SIZE_BYTES = 2


def column_mapping(old: Schema, new: Schema) -> list[int | None]:
    """For each column of ``new``: the position of the same column (by id) in ``old``, None if added."""
    positions = {column.column_id: index for index, column in enumerate(old.columns)}
    return [positions.get(column.column_id) for column in new.columns]


def _appends_only(mapping: Sequence[int | None]) -> bool:
    """The new schema is the old one with columns appended (every ALTER strom accepts)."""
    kept = [position for position in mapping if position is not None]
    return kept == list(range(len(kept))) and all(position is None for position in mapping[len(kept):])


class _CompactedWidening:
    """Appends null fields to COMPACTED rows of one earlier schema: the null bitset, read as a
    little-endian integer, gains the new fields' bits (a few C-level calls per row)."""

    __slots__ = ("_mask", "_new_size", "_old_size", "one_byte")

    def __init__(self, old_count: int, new_count: int) -> None:
        self._old_size = compacted.null_bitset_size(old_count)
        self._new_size = compacted.null_bitset_size(new_count)
        self._mask = sum(1 << index for index in range(old_count, new_count))
        self.one_byte: list[bytes] | None = None
        """Both bitsets one byte (tables of up to 8 columns): the new byte for each old one."""
        if self._old_size == self._new_size == 1:
            self.one_byte = [bytes([byte | self._mask]) for byte in range(256)]

    def __call__(self, row: bytes | memoryview) -> bytes:
        old_size = self._old_size
        bits = int.from_bytes(row[:old_size], "little") | self._mask
        return bits.to_bytes(self._new_size, "little") + row[old_size:]


def widen_compacted_row(row: bytes | memoryview, old_count: int, new_count: int) -> bytes:
    """A COMPACTED row of ``old_count`` fields with ``new_count - old_count`` null fields appended."""
    return _CompactedWidening(old_count, new_count)(bytes(row))


class RowUpgrader:
    """Brings stored values and Arrow batches of any schema of one table to its current schema.

    Immutable and shared; built from every schema the table has had (:attr:`TableInfo.schemas`).
    """

    def __init__(self, schemas: Mapping[int, Schema], current_schema_id: int, kv_format: str = "COMPACTED") -> None:
        self.current_schema_id = current_schema_id
        self.current = schemas[current_schema_id]
        self._schemas = dict(schemas)
        self._prefix = SCHEMA_ID.pack(current_schema_id)
        self._kv_format = kv_format.upper()
        self._mappings = {schema_id: column_mapping(schema, self.current) for schema_id, schema in schemas.items()}
        self._value_upgrades: dict[bytes, _CompactedWidening | tuple[indexed.IndexedRowDecoder, list[int | None]]] = {}
        self._encoder = indexed.IndexedRowEncoder(self.current.row_type) if self._kv_format == "INDEXED" else None
        for schema_id, schema in schemas.items():
            if schema_id == current_schema_id:
                continue
            mapping = self._mappings[schema_id]
            if self._kv_format == "INDEXED" or not _appends_only(mapping):
                if self._kv_format != "INDEXED":
                    raise ValueError(f"schema {schema_id} is not a prefix of schema {current_schema_id}")
                self._value_upgrades[SCHEMA_ID.pack(schema_id)] = (indexed.IndexedRowDecoder(schema.row_type), mapping)
            else:
                self._value_upgrades[SCHEMA_ID.pack(schema_id)] = _CompactedWidening(
                    len(schema.columns), len(self.current.columns)
                )

    @property
    def has_history(self) -> bool:
        """Whether rows of another schema can exist at all (else every call returns its input)."""
        return bool(self._value_upgrades)

    def schema(self, schema_id: int) -> Schema:
        try:
            return self._schemas[schema_id]
        except KeyError:
            raise SchemaNotExistError(f"Schema {schema_id} does not exist (known: {sorted(self._schemas)}).") from None

    def arrow_schema(self, schema_id: int) -> pa.Schema:
        return self.schema(schema_id).arrow_schema

    # ---- stored values ----
    def value(self, stored: bytes) -> bytes:
        """``stored`` (schema id + row) as a value of the current schema."""
        head = stored[:SCHEMA_ID_SIZE_BYTES]
        if head == self._prefix:
            return stored
        upgrade = self._value_upgrades.get(head)
        if upgrade is None:
            raise SchemaNotExistError(f"A stored row carries schema id {SCHEMA_ID.unpack(head)[0]}, unknown to the table.")
        if isinstance(upgrade, _CompactedWidening):
            if upgrade.one_byte is not None:  # the common case, kept to a few C calls
                return self._prefix + upgrade.one_byte[stored[SCHEMA_ID_SIZE_BYTES]] + stored[SCHEMA_ID_SIZE_BYTES + 1 :]
            return self._prefix + upgrade(stored[SCHEMA_ID_SIZE_BYTES:])
        decoder, mapping = upgrade
        old_values = decoder.decode(memoryview(stored)[SCHEMA_ID_SIZE_BYTES:])
        assert self._encoder is not None
        return self._prefix + self._encoder.encode([None if p is None else old_values[p] for p in mapping])

    def values(self, stored: list[bytes | None]) -> list[bytes | None]:
        """:meth:`value` of each (None stays None); the list itself when the table has one schema."""
        if not self._value_upgrades:
            return stored
        prefix, value = self._prefix, self.value
        return [v if v is None or v[:SCHEMA_ID_SIZE_BYTES] == prefix else value(v) for v in stored]

    def row(self, schema_id: int, row: bytes) -> bytes:
        """A row (without schema id) written under ``schema_id``, as a row of the current schema."""
        if schema_id == self.current_schema_id:
            return row
        return self.value(SCHEMA_ID.pack(schema_id) + bytes(row))[SCHEMA_ID_SIZE_BYTES:]

    # ---- Arrow ----
    def batch(self, batch: pa.RecordBatch, schema_id: int) -> pa.RecordBatch:
        """An Arrow batch of schema ``schema_id`` with the current schema's columns (nulls where added)."""
        if schema_id == self.current_schema_id:
            return batch
        try:
            mapping = self._mappings[schema_id]
        except KeyError:
            raise SchemaNotExistError(f"A log batch carries schema id {schema_id}, unknown to the table.") from None
        target = self.current.arrow_schema
        columns = [
            batch.column(position) if position is not None else pa.nulls(batch.num_rows, field.type)
            for field, position in zip(target, mapping, strict=True)
        ]
        return pa.RecordBatch.from_arrays(columns, schema=target)


__all__ = ["RowUpgrader", "column_mapping", "widen_compacted_row"]
