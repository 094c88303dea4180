"""Rows for the keys a lookup inserts when they are missing (LookupRequest ``insert_if_not_exists``).

Fluss's dictionary-table pattern: a lookup of a key that does not exist inserts a row holding only that key
(every other column null, an auto-increment column filled by the server) and answers the new row, so an id
is assigned the first time a key is seen. The row is written as a partial update of the primary-key columns,
so a concurrent writer's values for the other columns are never overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence

from strom.errors import InvalidTableError, MalformedRowError
from strom.kv.row_format import TableRowFormat
from strom.records.compacted import CompactedRowDecoder, null_bitset_size
from strom.records.types import RowType


class MissingKeyRows:
    """Builds the row of a missing key from its key bytes. One per table version."""

    def __init__(self, row_format: TableRowFormat, auto_increment: Sequence[int] = ()) -> None:
        """Raises: InvalidTableError: the table's rows cannot be rebuilt from its keys alone."""
        self._format = row_format
        self.target_columns = list(row_format.primary_key_indexes)
        if len(row_format.key_indexes) != len(row_format.primary_key_indexes):
            raise InvalidTableError(
                "Lookup with insert_if_not_exists is not supported on partitioned tables here: a key's bytes "
                "do not carry its partition values."
            )
        if row_format.key_lake_format is not None:
            raise InvalidTableError(
                f"Lookup with insert_if_not_exists is not supported on tables keyed for {row_format.key_lake_format}."
            )
        filled = set(self.target_columns) | set(auto_increment)
        not_null = [f.name for i, f in enumerate(row_format.row_type.fields) if i not in filled and not f.type.nullable]
        if not_null:
            raise InvalidTableError(
                f"Lookup with insert_if_not_exists needs every column outside the primary key to be nullable; "
                f"{not_null} are NOT NULL."
            )
        fields = row_format.row_type.fields
        key_type = RowType(tuple(fields[i] for i in row_format.key_indexes))
        self._key_decoder = CompactedRowDecoder(key_type)
        self._header = bytes(null_bitset_size(key_type.field_count))  # key bytes are a row without null bits
        self._width = len(fields)

    def row(self, key: bytes) -> bytes:
        """The row (without schema id) of ``key``: its key columns set, the rest null.

        Raises: MalformedRowError: ``key`` is not a key of this table.
        """
        try:
            key_values = self._key_decoder.decode(self._header + key)
        except ValueError as exc:
            raise MalformedRowError(f"a lookup key does not decode as this table's key: {exc}") from exc
        values: list[object] = [None] * self._width
        for index, value in zip(self._format.key_indexes, key_values, strict=True):
            values[index] = value
        return self._format.encode_row(values)
