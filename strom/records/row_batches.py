"""Batch-level CompactedRow codecs with a native (C) fast path and a pure-Python fallback.

Every function here returns exactly what the pure-Python reference returns (the same bytes, the
same Arrow batch, the same exception): only speed differs. The native module
``strom.records._rowcodec`` (``native/rowcodec.c``) runs the per-row loops; this module decides
what it may handle and falls back to the reference for the rest:

* a type the C code does not decode (ARRAY, MAP, ROW, DECIMAL(p > 18)) is handled per column:
  the C loop records where each value starts and Python's field codec decodes just that column
  (encode: Python encodes that column's values and C splices the bytes in);
* anything the C code reports as a problem (a malformed row, an integer overflow, invalid UTF-8, a
  null in a NOT NULL field or a key, ...) reruns the whole batch through the reference, so the
  caller sees the reference's exception and message;
* without the compiled module (a build without a C compiler), everything is the reference.

API (``rows``: bytes, bytearray or memoryview CompactedRows; ``row_type``: the table's RowType):

``decode_rows(rows, row_type, *, offset=0, arrow_schema=None) -> pa.RecordBatch``
    Columnar decode into the client's exact Arrow layout (``types.to_arrow_schema``). ``offset``
    skips a prefix of every row, e.g. ``2`` for stored values that start with the schema id.
    Raises ValueError for a row that does not decode (as ``row_arrow.rows_to_record_batch``).

``encode_batch(batch, row_type, key_indexes=None, bucket_key_indexes=None, bucket_count=None, *,
value_prefix=b"", java_decimal_layout=False) -> (rows, keys | None, buckets | None)``
    Encode every row of a RecordBatch (columns in field order; cast to the table's Arrow types
    first if they differ, as ``row_arrow.record_batch_to_values`` does). With ``key_indexes``,
    also each row's ``CompactedKeyEncoder`` bytes; with ``bucket_key_indexes`` and
    ``bucket_count``, each row's ``bucketing.bucket_for_key`` over the bucket-key encoding.
    ``value_prefix`` is prepended to every row (e.g. a schema id); ``java_decimal_layout`` is
    ``CompactedRowEncoder``'s (it only matters for DECIMAL(p > 18) inside ARRAY/MAP). Raises what
    the reference raises: ValueError for a null in a NOT NULL field or a key, a value out of
    range, ...

``parse_kv_records(buffer, position, end, count) -> (keys, values)``
    The records of a KvRecordBatch body ``buffer[position:end]``; ``values[i] is None`` is a
    delete. Raises CorruptRecordError with ``kv_batch``'s messages.

``bucket_ids(keys, bucket_count) -> list[int]``
    ``bucketing.bucket_for_key`` of every key.

``encode_rows(batch, encoder) -> list[bytes]``
    ``encoder.encode`` (a CompactedRowEncoder) of every row: ``row_arrow.record_batch_to_rows``.

``RowReader(row_type).decode(data, offset) -> tuple`` and ``KeyWriter(encoder).encode(row) -> bytes``
    One row's Python values (``CompactedRowDecoder.decode`` of ``data[offset:]``) and one key's bytes
    (``CompactedKeyEncoder.encode``): a single lookup's client side, one C call each when every
    field is of a plain type (BOOLEAN to BYTES, not CHAR).

``decode_rows_python``, ``encode_batch_python``: the pure-Python references, same signatures.
``NATIVE_AVAILABLE``: whether the compiled module loaded.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from strom.records import arrow_python, types
from strom.records.bucketing import bucket_for_key
from strom.records.compacted import (
    _RUST_NESTING,
    CompactedKeyEncoder,
    CompactedRowDecoder,
    CompactedRowEncoder,
    _field,
)
from strom.records.keys import KeyEncoder
from strom.records.rowcodec_native import (
    NATIVE_AVAILABLE as NATIVE_AVAILABLE,  # what callers ask before a native-only path
)
from strom.records.rowcodec_native import native
from strom.records.types import DataType, RowType, to_arrow_schema

RowBytes = bytes | bytearray | memoryview
EncodedBatch = tuple[list[bytes], list[bytes] | None, list[int] | None]

# Field kinds of the C module (kept in sync with the enum in rowcodec.c).
_BOOLEAN, _TINYINT, _SMALLINT, _INT, _BIGINT, _FLOAT, _DOUBLE = 1, 2, 3, 4, 5, 6, 7
_STRING, _BYTES, _BINARY, _DECIMAL, _TIME, _TIMESTAMP, _OPAQUE = 8, 9, 10, 11, 12, 13, 14
_VAR_WIDTH = (_STRING, _BYTES)
if native is not None:
    assert (native.KIND_STRING, native.KIND_OPAQUE) == (_STRING, _OPAQUE), "rowcodec.c kinds changed"


class _Kinds(types.DataTypeVisitor[tuple[int, int]]):
    """The C module's (kind, parameter) of each field type."""

    __slots__ = ()

    def default(self, t: DataType) -> tuple[int, int]:
        raise TypeError(f"unsupported type for CompactedRow: {t!r}")

    def visit_boolean(self, t: types.BooleanType) -> tuple[int, int]:
        return _BOOLEAN, 0

    def visit_tinyint(self, t: types.TinyIntType) -> tuple[int, int]:
        return _TINYINT, 0

    def visit_smallint(self, t: types.SmallIntType) -> tuple[int, int]:
        return _SMALLINT, 0

    def visit_int(self, t: types.IntType) -> tuple[int, int]:
        return _INT, 0

    def visit_date(self, t: types.DateType) -> tuple[int, int]:
        return _INT, 0

    def visit_bigint(self, t: types.BigIntType) -> tuple[int, int]:
        return _BIGINT, 0

    def visit_float(self, t: types.FloatType) -> tuple[int, int]:
        return _FLOAT, 0

    def visit_double(self, t: types.DoubleType) -> tuple[int, int]:
        return _DOUBLE, 0

    def visit_string(self, t: types.StringType) -> tuple[int, int]:
        return _STRING, 0

    def visit_char(self, t: types.CharType) -> tuple[int, int]:
        return _STRING, 0

    def visit_bytes(self, t: types.BytesType) -> tuple[int, int]:
        return _BYTES, 0

    def visit_binary(self, t: types.BinaryType) -> tuple[int, int]:
        return _BINARY, t.length

    def visit_decimal(self, t: types.DecimalType) -> tuple[int, int]:
        return (_DECIMAL, t.precision) if t.is_compact else (_OPAQUE, 0)

    def visit_time(self, t: types.TimeType) -> tuple[int, int]:
        return _TIME, t.precision

    def visit_timestamp(self, t: types.TimestampType) -> tuple[int, int]:
        return _TIMESTAMP, t.precision

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> tuple[int, int]:
        return _TIMESTAMP, t.precision

    def visit_array(self, t: types.ArrayType) -> tuple[int, int]:
        return _OPAQUE, 0

    def visit_map(self, t: types.MapType) -> tuple[int, int]:
        return _OPAQUE, 0

    def visit_row(self, t: RowType) -> tuple[int, int]:
        return _OPAQUE, 0


_KINDS = _Kinds()


def _kind(t: DataType) -> tuple[int, int]:
    """(C kind, parameter) of a field type; nested and wide decimal types are OPAQUE."""
    return _KINDS.visit(t)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the C code needs to know about a row type, computed once per type."""

    specs: tuple[tuple[int, int, bool], ...]  # (kind, param, nullable) per field
    schema: pa.Schema  # to_arrow_schema(row_type)
    arrow_types: tuple[pa.DataType, ...]


@functools.lru_cache(maxsize=512)
def _plan(row_type: RowType) -> _Plan | None:
    """None when the native path cannot run for this type at all."""
    if native is None or row_type.field_count == 0:
        return None
    specs = []
    for f in row_type.fields:
        kind, param = _kind(f.type)
        specs.append((kind, param, f.type.nullable))
    schema = to_arrow_schema(row_type)
    return _Plan(
        specs=tuple(specs),
        schema=schema,
        arrow_types=tuple(schema.types),
    )


@functools.lru_cache(maxsize=512)
def _decoder(row_type: RowType) -> CompactedRowDecoder:
    return CompactedRowDecoder(row_type)  # compiles a reader: worth caching


@functools.lru_cache(maxsize=512)
def _encoder(row_type: RowType, java_decimal_layout: bool) -> CompactedRowEncoder:
    return CompactedRowEncoder(row_type, java_decimal_layout=java_decimal_layout)


# ---------------------------------------------------------------------------------------------
# Decode: CompactedRows -> Arrow
# ---------------------------------------------------------------------------------------------


def present_rows_python(values: Sequence[bytes | None], prefix: bytes) -> tuple[list[bytes], int]:
    """The values that are not None, in order, and the position among them of the first that does not
    start with ``prefix`` (a stored value's schema id), or -1."""
    rows = [value for value in values if value is not None]
    mismatch = next((position for position, row in enumerate(rows) if row[: len(prefix)] != prefix), -1)
    return rows, mismatch


def present_rows(values: Sequence[bytes | None], prefix: bytes) -> tuple[list[bytes], int]:
    """:func:`present_rows_python`, one C call where built (a batched lookup's answers, ~0.1 µs a value
    as a bytecode loop)."""
    if native is not None:
        return native.present_rows(values, prefix)  # type: ignore[no-any-return]
    return present_rows_python(values, prefix)


def decode_rows_python(
    rows: Sequence[RowBytes], row_type: RowType, *, offset: int = 0, arrow_schema: pa.Schema | None = None
) -> pa.RecordBatch:
    """The pure-Python reference of ``decode_rows``."""
    return arrow_python.rows_to_record_batch_python(rows, _decoder(row_type), arrow_schema, offset=offset)


def decode_rows(
    rows: Sequence[RowBytes], row_type: RowType, *, offset: int = 0, arrow_schema: pa.Schema | None = None
) -> pa.RecordBatch:
    """CompactedRows (each starting ``offset`` bytes into its buffer) as one Arrow batch.

    Raises:
        ValueError: a row does not decode with ``row_type``.
    """
    if not isinstance(rows, (list, tuple)):
        rows = list(rows)  # a one-shot iterable could not be replayed by the fallback
    plan = _plan(row_type)
    if arrow_schema is not None and plan is not None and arrow_schema.types != plan.schema.types:
        plan = None  # other Arrow types than the client's: let pyarrow convert, as the reference does
    if plan is None or native is None or offset < 0:
        return decode_rows_python(rows, row_type, offset=offset, arrow_schema=arrow_schema)
    try:
        columns = native.decode_columns(rows, offset, plan.specs)
        arrays = _arrays(columns, rows, row_type, plan, offset)
        return pa.RecordBatch.from_arrays(
            arrays, schema=arrow_schema if arrow_schema is not None else plan.schema
        )
    except Exception:
        # A malformed row or a value only Python handles exactly: the reference decides (and
        # raises its own error for a bad row).
        return decode_rows_python(rows, row_type, offset=offset, arrow_schema=arrow_schema)


def _arrays(
    columns: list[tuple[Any, ...]], rows: Sequence[RowBytes], row_type: RowType, plan: _Plan, offset: int
) -> list[pa.Array]:
    n = len(rows)
    arrays = []
    row_data: list[bytes] | None = None
    for index, (column, (kind, _, _), arrow_type) in enumerate(
        zip(columns, plan.specs, plan.arrow_types, strict=True)
    ):
        validity = None if column[0] is None else pa.py_buffer(column[0])
        if kind == _OPAQUE:
            if row_data is None:
                row_data = [_row_bytes(row, offset) for row in rows]
            field_type = row_type.fields[index].type
            values = _opaque_values(row_data, column[2], offset, field_type)
            arrays.append(arrow_python.column_to_array(values, field_type, arrow_type))
        elif kind in _VAR_WIDTH:
            buffers = [validity, pa.py_buffer(column[2]), pa.py_buffer(column[3])]
            arrays.append(pa.Array.from_buffers(arrow_type, n, buffers, column[1]))
        else:
            arrays.append(
                pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(column[2])], column[1])
            )
    return arrays


def _row_bytes(row: RowBytes, offset: int) -> bytes:
    """The row as the reference decoder sees it: bytes, without the prefix."""
    if offset:
        return bytes(memoryview(row)[offset:])
    return row if type(row) is bytes else bytes(row)


def _opaque_values(rows: list[bytes], positions: list[int | None], offset: int, t: DataType) -> list[Any]:
    """Values of one Python-decoded column; the C loop has checked each value's length prefix."""
    read = _field(t, _RUST_NESTING).read  # the field codec the reference decoder uses
    return [
        None if pos is None else read(data, pos - offset)[0]
        for data, pos in zip(rows, positions, strict=True)
    ]


# ---------------------------------------------------------------------------------------------
# Encode: Arrow -> CompactedRows, keys, buckets
# ---------------------------------------------------------------------------------------------


def encode_batch_python(
    batch: pa.RecordBatch,
    row_type: RowType,
    key_indexes: Sequence[int] | None = None,
    bucket_key_indexes: Sequence[int] | None = None,
    bucket_count: int | None = None,
    *,
    value_prefix: bytes = b"",
    java_decimal_layout: bool = False,
) -> EncodedBatch:
    """The pure-Python reference of ``encode_batch``."""
    encoder = _encoder(row_type, java_decimal_layout)
    return _encode_python(
        batch, encoder, key_indexes, bucket_key_indexes, bucket_count, value_prefix, java_decimal_layout
    )


def encode_batch(
    batch: pa.RecordBatch,
    row_type: RowType,
    key_indexes: Sequence[int] | None = None,
    bucket_key_indexes: Sequence[int] | None = None,
    bucket_count: int | None = None,
    *,
    value_prefix: bytes = b"",
    java_decimal_layout: bool = False,
) -> EncodedBatch:
    """Rows, keys and buckets of a batch; see the module docstring."""
    encoder = _encoder(row_type, java_decimal_layout)
    return _encode(
        batch, encoder, key_indexes, bucket_key_indexes, bucket_count, value_prefix, java_decimal_layout
    )


def encode_rows(batch: pa.RecordBatch, encoder: CompactedRowEncoder) -> list[bytes]:
    """``encoder.encode`` of every row of a batch (``row_arrow.record_batch_to_rows``)."""
    return _encode(batch, encoder, None, None, None, b"", False)[0]


def _encode_python(
    batch: pa.RecordBatch,
    encoder: CompactedRowEncoder,
    key_indexes: Sequence[int] | None,
    bucket_key_indexes: Sequence[int] | None,
    bucket_count: int | None,
    value_prefix: bytes,
    java_decimal_layout: bool,
) -> EncodedBatch:
    values = arrow_python.record_batch_to_values(batch, encoder.row_type)
    encode = encoder.encode
    rows = [value_prefix + encode(v) for v in values] if value_prefix else [encode(v) for v in values]
    keys = None
    if key_indexes is not None:
        key_encoder = CompactedKeyEncoder(
            encoder.row_type, key_indexes, java_decimal_layout=java_decimal_layout
        )
        keys = [key_encoder.encode(v) for v in values]
    buckets = None
    if bucket_key_indexes is not None:
        bucket_key_encoder = CompactedKeyEncoder(
            encoder.row_type, bucket_key_indexes, java_decimal_layout=java_decimal_layout
        )
        buckets = [bucket_for_key(bucket_key_encoder.encode(v), bucket_count) for v in values]  # type: ignore[arg-type]
    return rows, keys, buckets


def _encode(
    batch: pa.RecordBatch,
    encoder: CompactedRowEncoder,
    key_indexes: Sequence[int] | None,
    bucket_key_indexes: Sequence[int] | None,
    bucket_count: int | None,
    value_prefix: bytes,
    java_decimal_layout: bool,
) -> EncodedBatch:
    """Native when possible. Key columns of nested types are encoded by ``encoder``'s field writers,
    which match the key encoder's because both use ``java_decimal_layout`` (``encode_rows`` asks
    for no keys)."""
    plan = _plan(encoder.row_type)
    if plan is not None and _native_encodable(
        batch, encoder.row_type, key_indexes, bucket_key_indexes, bucket_count
    ):
        try:
            columns = _encode_columns(batch, encoder, plan)
            keys = None if key_indexes is None else tuple(key_indexes)
            bucket_keys = None if bucket_key_indexes is None else tuple(bucket_key_indexes)
            result: EncodedBatch = native.encode_rows(  # type: ignore[union-attr]
                batch.num_rows, columns, keys, bucket_keys, bucket_count or 0, value_prefix
            )
            return result
        except Exception:
            pass  # a value only Python handles exactly, or one it rejects: the reference decides
    return _encode_python(
        batch, encoder, key_indexes, bucket_key_indexes, bucket_count, value_prefix, java_decimal_layout
    )


def _native_encodable(
    batch: pa.RecordBatch,
    row_type: RowType,
    key_indexes: Sequence[int] | None,
    bucket_key_indexes: Sequence[int] | None,
    bucket_count: int | None,
) -> bool:
    """Cases the reference rejects in its own way, or that need Python objects, go to the reference."""
    if not isinstance(batch, pa.RecordBatch) or batch.num_columns != row_type.field_count:
        return False
    if bucket_key_indexes is not None and (type(bucket_count) is not int or not 0 < bucket_count < 1 << 31):
        return False
    for indexes in (key_indexes, bucket_key_indexes):
        for index in indexes or ():
            if type(index) is not int or not 0 <= index < row_type.field_count:
                return False
            if isinstance(row_type.fields[index].type, types.MapType):
                return False  # CompactedKeyEncoder refuses MAP keys
    return True


def _encode_columns(
    batch: pa.RecordBatch, encoder: CompactedRowEncoder, plan: _Plan
) -> tuple[tuple[Any, ...], ...]:
    """Per field, the C column description: Arrow buffers, or Python-encoded values for OPAQUE."""
    columns = []
    for index, ((kind, param, nullable), arrow_type) in enumerate(
        zip(plan.specs, plan.arrow_types, strict=True)
    ):
        array = batch.column(index)
        if array.type != arrow_type:
            array = array.cast(arrow_type)  # as record_batch_to_values does (lossless casts only)
        if kind == _OPAQUE:
            write = encoder._fields[index][3]  # the encoder's own field writer (its decimal layout)
            encoded: list[bytes | None] = []
            for value in arrow_python.column_values(array):
                if value is None:
                    encoded.append(None)
                else:
                    buf = bytearray()
                    write(buf, value)
                    encoded.append(bytes(buf))
            columns.append((kind, param, nullable, None, 0, encoded, None))
            continue
        buffers = array.buffers()
        validity = buffers[0] if array.null_count else None
        if kind in _VAR_WIDTH:
            columns.append((kind, param, nullable, validity, array.offset, buffers[2], buffers[1]))
        else:
            columns.append((kind, param, nullable, validity, array.offset, buffers[1], None))
    return tuple(columns)


# ---------------------------------------------------------------------------------------------
# One row, one key: Python values (a single lookup)
# ---------------------------------------------------------------------------------------------

_PLAIN_KINDS = frozenset(range(_BOOLEAN, _BYTES + 1))


def _plain_specs(field_types: Sequence[DataType]) -> tuple[tuple[int, int, bool], ...] | None:
    """C specs of fields whose Python values the C code reads and writes (not CHAR: Python pads it)."""
    if native is None:
        return None
    specs = []
    for t in field_types:
        kind, param = _kind(t)
        if kind not in _PLAIN_KINDS or isinstance(t, (types.CharType, types.DateType)):
            return None
        specs.append((kind, param, t.nullable))
    return tuple(specs)


def _row_specs(row_type: RowType) -> tuple[tuple[int, int, bool], ...] | None:
    return _plain_specs([f.type for f in row_type.fields])


def _key_specs(row_type: RowType, key_indexes: tuple[int, ...]) -> tuple[tuple[int, int, bool], ...] | None:
    return _plain_specs([row_type.fields[i].type for i in key_indexes])


class RowReader:
    """``CompactedRowDecoder.decode`` of one row at a time, in C for rows of plain types (build once per
    row type: the specs are worked out here, not per call)."""

    __slots__ = ("_decoder", "_specs")

    def __init__(self, row_type: RowType) -> None:
        self._decoder = _decoder(row_type)
        self._specs = _row_specs(row_type)

    def decode(self, data: bytes, offset: int = 0) -> tuple[Any, ...]:
        """The values of the row starting ``offset`` bytes into ``data``. Raises ValueError for a
        malformed row."""
        if self._specs is not None:
            try:
                return native.decode_plain_row(data, offset, self._specs)  # type: ignore[no-any-return]
            except ValueError:
                pass  # the reference raises its own error (or substitutes invalid UTF-8)
        return self._decoder.decode(memoryview(data)[offset:])


class KeyWriter:
    """``encoder.encode(row)`` of one key at a time, in C for keys of plain types (build once per
    encoder)."""

    __slots__ = ("_encoder", "_indexes", "_specs")

    def __init__(self, encoder: KeyEncoder) -> None:
        self._encoder = encoder
        self._indexes: tuple[int, ...] = ()
        self._specs = None
        if isinstance(encoder, CompactedKeyEncoder):  # the Iceberg encoder of lake tables stays Python
            self._indexes = encoder.key_indexes
            self._specs = _key_specs(encoder.row_type, encoder.key_indexes)

    def encode(self, row: Sequence[Any]) -> bytes:
        """The key bytes of a full row's values. Raises what the encoder raises."""
        encoded = self._compiled([row[i] for i in self._indexes]) if self._specs is not None else None
        return encoded if encoded is not None else self._encoder.encode(row)

    def encode_values(self, values: Sequence[Any], column_count: int) -> bytes:
        """The key bytes of the key columns' own values, in key order (a lookup's key, without a full row of
        ``column_count`` values to build first). CompactedRow keys only; raises what the encoder raises."""
        assert isinstance(self._encoder, CompactedKeyEncoder)
        encoded = self._compiled(values) if self._specs is not None else None
        if encoded is not None:
            return encoded
        row: list[Any] = [None] * column_count
        for index, value in zip(self._indexes, values, strict=True):
            row[index] = value
        return self._encoder.encode(row)

    def _compiled(self, values: Sequence[Any]) -> bytes | None:
        """The C encoding of the key's values; None where it declines (another type or a value out of
        range): the reference decides then."""
        try:
            return native.encode_plain_key(values, self._specs)  # type: ignore[no-any-return]
        except ValueError:
            return None
