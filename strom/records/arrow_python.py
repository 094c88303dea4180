"""Encoded rows (CompactedRow / IndexedRow) to Arrow and back in pure Python, column by column.

This is the reference the C fast path (``row_batches`` + ``native/rowcodec.c``) must equal, and the code that
serves what it does not (IndexedRows, nested and wide types). ``row_arrow`` picks between the two;
callers use ``row_arrow``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import pyarrow as pa

from strom.records.compacted import CompactedRowDecoder
from strom.records.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    RowType,
    to_arrow_schema,
    to_arrow_type,
)


class RowDecoder(Protocol):
    row_type: RowType

    def decode_columns(self, rows: Iterable[bytes | bytearray | memoryview]) -> list[list[Any]]: ...


class RowEncoder(Protocol):
    row_type: RowType

    def encode(self, values: Sequence[Any]) -> bytes: ...


def _binary_padder(t: DataType) -> Callable[[Any], Any] | None:
    """A function fitting BINARY(n) values (at any depth) to n bytes, or None if there are none.

    Fluss does not enforce BINARY(n) lengths on write, but Arrow's fixed_size_binary does:
    short values are zero-padded, long ones cut to n bytes as Java's Arrow writer copies them.
    """
    if isinstance(t, BinaryType):
        length = t.length

        def pad(value: bytes | None) -> bytes | None:
            if value is None or len(value) == length:
                return value
            return bytes(value[:length]) + bytes(max(0, length - len(value)))

        return pad
    if isinstance(t, ArrayType):
        inner = _binary_padder(t.element)
        if inner is None:
            return None
        return lambda value: None if value is None else [inner(v) for v in value]
    if isinstance(t, MapType):
        key_pad, value_pad = _binary_padder(t.key), _binary_padder(t.value)
        if key_pad is None and value_pad is None:
            return None
        kp = key_pad or (lambda v: v)
        vp = value_pad or (lambda v: v)
        return lambda value: None if value is None else [(kp(k), vp(v)) for k, v in value]
    if isinstance(t, RowType):
        padders = [(f.name, _binary_padder(f.type)) for f in t.fields]
        if all(p is None for _, p in padders):
            return None

        def pad_row(value: dict[str, Any] | None) -> dict[str, Any] | None:
            if value is None:
                return None
            return {name: (p(value.get(name)) if p else value.get(name)) for name, p in padders}

        return pad_row
    return None


def columns_to_record_batch(
    columns: Sequence[Sequence[Any]], row_type: RowType, arrow_schema: pa.Schema | None = None
) -> pa.RecordBatch:
    """A batch from one list of internal values (see ``types``) per column."""
    schema = arrow_schema if arrow_schema is not None else to_arrow_schema(row_type)
    if not len(schema) == len(columns) == row_type.field_count:
        raise ValueError(
            f"{len(columns)} columns, {len(schema)} Arrow fields and {row_type.field_count} Fluss fields"
        )
    arrays = [
        column_to_array(column, fluss_field.type, arrow_field.type)
        for column, fluss_field, arrow_field in zip(columns, row_type.fields, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def column_to_array(column: Sequence[Any], fluss_type: DataType, arrow_type: pa.DataType) -> pa.Array:
    """One column of internal values as an Arrow array (BINARY(n) values fitted to n bytes)."""
    padder = _binary_padder(fluss_type)
    values = [padder(v) for v in column] if padder is not None else column
    try:
        return pa.array(values, type=arrow_type)
    except OverflowError as exc:  # a corrupt row decoded to a value beyond the Arrow type's 64 bits
        raise ValueError(f"a {fluss_type} value does not fit Arrow {arrow_type}: {exc}") from exc


def values_to_record_batch(
    rows: Sequence[Sequence[Any]], row_type: RowType, arrow_schema: pa.Schema | None = None
) -> pa.RecordBatch:
    """A batch from rows of internal values."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in range(row_type.field_count)]
    return columns_to_record_batch(columns, row_type, arrow_schema)


def rows_to_record_batch_python(
    rows: Sequence[bytes | bytearray | memoryview],
    decoder_or_row_type: RowDecoder | RowType,
    arrow_schema: pa.Schema | None = None,
    *,
    offset: int = 0,
) -> pa.RecordBatch:
    """``rows_to_record_batch`` in pure Python: the reference the native path must equal."""
    if isinstance(decoder_or_row_type, RowType):
        decoder: RowDecoder = CompactedRowDecoder(decoder_or_row_type)
    else:
        decoder = decoder_or_row_type
    if offset:
        rows = [memoryview(row)[offset:] for row in rows]
    return columns_to_record_batch(decoder.decode_columns(rows), decoder.row_type, arrow_schema)


def _physical_type(arrow_type: pa.DataType) -> pa.DataType:
    """The same layout with temporal types as plain integers, so values come out as ints."""
    if pa.types.is_timestamp(arrow_type) or pa.types.is_time64(arrow_type):
        return pa.int64()
    if pa.types.is_time32(arrow_type) or pa.types.is_date32(arrow_type):
        return pa.int32()
    if pa.types.is_list(arrow_type):
        return pa.list_(_physical_field(arrow_type.value_field))
    if pa.types.is_map(arrow_type):
        return pa.map_(_physical_field(arrow_type.key_field), _physical_field(arrow_type.item_field))
    if pa.types.is_struct(arrow_type):
        return pa.struct([_physical_field(arrow_type.field(i)) for i in range(arrow_type.num_fields)])
    return arrow_type


def _physical_field(arrow_field: pa.Field) -> pa.Field:
    return arrow_field.with_type(_physical_type(arrow_field.type))


def record_batch_to_values(batch: pa.RecordBatch, row_type: RowType | None = None) -> list[tuple[Any, ...]]:
    """Rows of internal values from a batch.

    With ``row_type``, each column is first cast to that type's Arrow form, so a DataFrame
    using large_string, date64 or another timestamp unit converts (lossless casts only).

    Raises:
        pyarrow.ArrowInvalid: a column cannot be cast without loss.
    """
    columns = []
    for index in range(batch.num_columns):
        array = batch.column(index)
        if row_type is not None:
            target = to_arrow_type(row_type.fields[index].type)
            if array.type != target:
                array = array.cast(target)
        columns.append(column_values(array))
    if row_type is not None and batch.num_columns != row_type.field_count:
        raise ValueError(f"batch has {batch.num_columns} columns, row type {row_type.field_count}")
    return list(zip(*columns, strict=True)) if columns else [() for _ in range(batch.num_rows)]


def column_values(array: pa.Array) -> list[Any]:
    """An array's internal values: temporal types as plain ints in their Arrow unit."""
    physical = _physical_type(array.type)
    if physical != array.type:
        array = array.view(physical)
    return array.to_pylist()  # type: ignore[no-any-return]


def record_batch_to_rows_python(batch: pa.RecordBatch, encoder: RowEncoder) -> list[bytes]:
    """``record_batch_to_rows`` in pure Python: the reference the native path must equal."""
    encode = encoder.encode
    return [encode(values) for values in record_batch_to_values(batch, encoder.row_type)]
