"""IndexedRow, the kv format ``table.kv.format = INDEXED`` (Java IndexedRowWriter/Reader).

Layout, integers little-endian::

    null bitset, ceil(n / 8) bytes (LSB first)
    int32 length of each non-null variable-length field, in field order; the list is
        sized for every variable-length field, so nulls leave trailing zeros
    the non-null values in field order, no padding; nulls take no space

Fixed-width values: BOOLEAN/TINYINT 1, SMALLINT 2, INTEGER/DATE/TIME(millis)/FLOAT 4,
BIGINT/DOUBLE/DECIMAL(p <= 18) 8, TIMESTAMP[_LTZ] 8 (p <= 3) or 12 (i64 millis + i32
nano-of-millisecond), CHAR(n) and BINARY(n) exactly n bytes zero-padded. Variable-length:
STRING, BYTES, DECIMAL(p > 18) (two's complement), ARRAY/MAP (BinaryArray/BinaryMap whose
ROW elements are IndexedRows) and ROW (nested IndexedRow).

Reading follows Java except that BYTES and BINARY(n) keep trailing zero bytes: Java's
sequential reader strips them, which loses data and breaks fixed-size Arrow columns. CHAR
values have their zero padding stripped, as in Java.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from strom.records import types
from strom.records.binary_array import (
    FLOAT32,
    FLOAT64,
    INT8,
    INT16,
    INT32,
    INT64,
    ContainerCodecs,
)
from strom.records.types import (
    DataType,
    RowType,
    decimal_from_unscaled,
    decimal_to_unscaled,
    time_from_millis,
    time_to_millis,
    timestamp_from_parts,
    timestamp_to_parts,
    unscaled_from_bytes,
    unscaled_to_bytes,
)

VARIABLE_LENGTH_SIZE_BYTES = 4
_TIMESTAMP_PARTS = struct.Struct("<qi")
assert _TIMESTAMP_PARTS.size == 12


class _Field:
    """``size`` is the fixed width, or None for a variable-length field.

    ``read(data, pos, size)`` returns the value stored in ``data[pos:pos + size]``;
    ``encode(value)`` returns exactly those bytes.
    """

    __slots__ = ("encode", "read", "size")

    def __init__(
        self, size: int | None, read: Callable[[bytes, int, int], Any], encode: Callable[[Any], bytes]
    ) -> None:
        self.size = size
        self.read = read
        self.encode = encode


def _fixed(codec: struct.Struct, decode: Callable | None = None, encode: Callable | None = None) -> _Field:
    unpack_from, pack = codec.unpack_from, codec.pack
    if decode is None or encode is None:
        return _Field(codec.size, lambda data, pos, size: unpack_from(data, pos)[0], pack)
    to_value, from_value = decode, encode
    return _Field(
        codec.size,
        lambda data, pos, size: to_value(unpack_from(data, pos)[0]),
        lambda value: pack(from_value(value)),
    )


def _padded(length: int, what: str) -> Callable[[bytes], bytes]:
    def pad(payload: bytes) -> bytes:
        if len(payload) > length:
            raise ValueError(f"{len(payload)} bytes do not fit {what}({length})")
        return payload + bytes(length - len(payload))

    return pad


def _char_field(length: int) -> _Field:
    pad = _padded(length, "CHAR")

    def read(data: bytes, pos: int, size: int) -> str:
        return data[pos : pos + size].rstrip(b"\x00").decode("utf-8", "replace")

    return _Field(length, read, lambda value: pad(value.encode("utf-8")))


def _timestamp_field(precision: int, compact: bool) -> _Field:
    if compact:
        return _fixed(
            INT64,
            lambda millis: timestamp_from_parts(millis, 0, precision),
            lambda value: timestamp_to_parts(value, precision)[0],
        )

    def read(data: bytes, pos: int, size: int) -> int:
        millis, nano_of_milli = _TIMESTAMP_PARTS.unpack_from(data, pos)
        return timestamp_from_parts(millis, nano_of_milli, precision)

    return _Field(
        _TIMESTAMP_PARTS.size,
        read,
        lambda value: _TIMESTAMP_PARTS.pack(*timestamp_to_parts(value, precision)),
    )


def _var(decode: Callable[[bytes, int, int], Any], encode: Callable[[Any], bytes]) -> _Field:
    return _Field(None, decode, encode)


def _read_bytes(data: bytes, pos: int, size: int) -> bytes:
    return data[pos : pos + size]


class _FieldCodecs(ContainerCodecs[_Field]):
    """The ``_Field`` of each type, with ROW values (nested or in arrays and maps) per ``nested``."""

    __slots__ = ()

    def container(self, encode: Callable[[Any], bytes], decode: Callable[[bytes, int, int], Any]) -> _Field:
        return _var(decode, encode)

    def default(self, t: DataType) -> _Field:
        raise TypeError(f"unsupported type for IndexedRow: {t!r}")

    def visit_boolean(self, t: types.BooleanType) -> _Field:
        return _Field(1, lambda data, pos, size: data[pos] != 0, lambda value: b"\x01" if value else b"\x00")

    def visit_tinyint(self, t: types.TinyIntType) -> _Field:
        return _fixed(INT8)

    def visit_smallint(self, t: types.SmallIntType) -> _Field:
        return _fixed(INT16)

    def visit_int(self, t: types.IntType) -> _Field:
        return _fixed(INT32)

    def visit_date(self, t: types.DateType) -> _Field:
        return _fixed(INT32)

    def visit_time(self, t: types.TimeType) -> _Field:
        p = t.precision
        return _fixed(INT32, lambda millis: time_from_millis(millis, p), lambda v: time_to_millis(v, p))

    def visit_bigint(self, t: types.BigIntType) -> _Field:
        return _fixed(INT64)

    def visit_float(self, t: types.FloatType) -> _Field:
        return _fixed(FLOAT32)

    def visit_double(self, t: types.DoubleType) -> _Field:
        return _fixed(FLOAT64)

    def visit_char(self, t: types.CharType) -> _Field:
        return _char_field(t.length)

    def visit_string(self, t: types.StringType) -> _Field:
        return _var(
            lambda data, pos, size: data[pos : pos + size].decode("utf-8", "replace"),
            lambda value: value.encode("utf-8"),
        )

    def visit_binary(self, t: types.BinaryType) -> _Field:
        pad = _padded(t.length, "BINARY")
        return _Field(t.length, _read_bytes, lambda value: pad(bytes(value)))

    def visit_bytes(self, t: types.BytesType) -> _Field:
        return _var(_read_bytes, bytes)

    def visit_decimal(self, t: types.DecimalType) -> _Field:
        precision, scale = t.precision, t.scale
        if t.is_compact:
            return _fixed(
                INT64,
                lambda unscaled: decimal_from_unscaled(unscaled, scale),
                lambda value: decimal_to_unscaled(value, precision, scale),
            )
        return _var(
            lambda data, pos, size: decimal_from_unscaled(unscaled_from_bytes(data[pos : pos + size]), scale),
            lambda value: unscaled_to_bytes(decimal_to_unscaled(value, precision, scale)),
        )

    def visit_timestamp(self, t: types.TimestampType) -> _Field:
        return _timestamp_field(t.precision, t.is_compact)

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> _Field:
        return _timestamp_field(t.precision, t.is_compact)


@functools.lru_cache(maxsize=1024)
def _field(t: DataType, nesting: _IndexedNesting) -> _Field:
    return _FieldCodecs(nesting).visit(t)


class _IndexedNesting:
    """ROW elements of arrays and maps are IndexedRows; see ``binary_array.NestedRows``."""

    __slots__ = ("java_decimal_layout",)

    def __init__(self, java_decimal_layout: bool) -> None:
        self.java_decimal_layout = java_decimal_layout

    def row_encoder(self, row_type: RowType) -> Callable[[Any], bytes]:
        return _row_encoder(row_type, self).encode_nested

    def row_decoder(self, row_type: RowType) -> Callable[[bytes, int, int], dict[str, Any]]:
        return _row_decoder(row_type).decode_nested


_RUST_NESTING = _IndexedNesting(java_decimal_layout=False)
_JAVA_NESTING = _IndexedNesting(java_decimal_layout=True)


def _header(row_type: RowType) -> tuple[int, int]:
    """(null bitset size, total header size)."""
    null_size = (row_type.field_count + 7) // 8
    var_count = sum(1 for f in row_type.fields if _field(f.type, _RUST_NESTING).size is None)
    return null_size, null_size + VARIABLE_LENGTH_SIZE_BYTES * var_count


class IndexedRowDecoder:
    """Decodes IndexedRow bytes into a tuple of internal values (see ``types``)."""

    __slots__ = ("_fields", "_header_size", "_names", "_null_size", "row_type")

    def __init__(self, row_type: RowType) -> None:
        self.row_type = row_type
        self._null_size, self._header_size = _header(row_type)
        self._names = tuple(row_type.field_names)
        self._fields = tuple(
            (i >> 3, (1 << (i & 7)) if f.type.nullable else 0, _field(f.type, _RUST_NESTING))
            for i, f in enumerate(row_type.fields)
        )

    def decode(self, data: bytes | bytearray | memoryview) -> tuple[Any, ...]:
        """Raises: ValueError: the bytes are not a row of this type."""
        if type(data) is not bytes:
            data = bytes(data)
        try:
            values, end = self._decode_at(data, 0)
        except (IndexError, struct.error) as e:
            raise ValueError(f"truncated IndexedRow for {self.row_type}: {e}") from e
        if end > len(data):
            raise ValueError(f"truncated IndexedRow for {self.row_type}")
        return values

    def _decode_at(self, data: bytes, offset: int) -> tuple[tuple[Any, ...], int]:
        length_pos = offset + self._null_size
        pos = offset + self._header_size
        values: list[Any] = []
        append = values.append
        for null_byte, null_bit, field in self._fields:
            if data[offset + null_byte] & null_bit:
                append(None)
                continue
            size = field.size
            if size is None:
                size = INT32.unpack_from(data, length_pos)[0]
                length_pos += VARIABLE_LENGTH_SIZE_BYTES
                if size < 0 or pos + size > len(data):
                    raise ValueError(f"IndexedRow field length {size} overruns the row")
            append(field.read(data, pos, size))
            pos += size
        return tuple(values), pos

    def decode_columns(self, rows: Iterable[bytes | bytearray | memoryview]) -> list[list[Any]]:
        """Decode many rows into one list per field (the shape Arrow arrays are built from)."""
        columns: list[list[Any]] = [[] for _ in self._names]
        appends = [column.append for column in columns]
        for row in rows:
            for append, value in zip(appends, self.decode(row), strict=True):
                append(value)
        return columns

    def decode_nested(self, data: bytes, offset: int, size: int) -> dict[str, Any]:
        values, end = self._decode_at(data, offset)
        if end > offset + size:
            raise ValueError(f"nested IndexedRow overruns its {size} bytes")
        return dict(zip(self._names, values, strict=True))


class IndexedRowEncoder:
    """Encodes a sequence of internal values as IndexedRow bytes (see ``CompactedRowEncoder``)."""

    __slots__ = ("_fields", "_header_size", "_names", "_null_size", "row_type")

    def __init__(self, row_type: RowType, *, java_decimal_layout: bool = False) -> None:
        self.row_type = row_type
        self._null_size, self._header_size = _header(row_type)
        self._names = tuple(row_type.field_names)
        nesting = _JAVA_NESTING if java_decimal_layout else _RUST_NESTING
        self._fields = tuple(
            (i >> 3, 1 << (i & 7), f.type.nullable, _field(f.type, nesting))
            for i, f in enumerate(row_type.fields)
        )

    def encode(self, values: Sequence[Any]) -> bytes:
        """Raises: ValueError: wrong arity, a null in a NOT NULL field, or an unfit value."""
        if len(values) != len(self._fields):
            raise ValueError(f"{len(values)} values for {len(self._fields)} fields")
        buf = bytearray(self._header_size)
        length_pos = self._null_size
        for (null_byte, null_bit, nullable, field), value in zip(self._fields, values, strict=True):
            if value is None:
                if not nullable:
                    raise ValueError(f"null in NOT NULL field of {self.row_type}")
                buf[null_byte] |= null_bit
                continue
            payload = field.encode(value)
            if field.size is None:
                INT32.pack_into(buf, length_pos, len(payload))
                length_pos += VARIABLE_LENGTH_SIZE_BYTES
            buf += payload
        return bytes(buf)

    def encode_nested(self, value: Mapping[str, Any] | Sequence[Any]) -> bytes:
        if isinstance(value, Mapping):
            return self.encode([value.get(name) for name in self._names])
        return self.encode(value)


@functools.lru_cache(maxsize=1024)
def _row_decoder(row_type: RowType) -> IndexedRowDecoder:
    return IndexedRowDecoder(row_type)


@functools.lru_cache(maxsize=1024)
def _row_encoder(row_type: RowType, nesting: _IndexedNesting) -> IndexedRowEncoder:
    return IndexedRowEncoder(row_type, java_decimal_layout=nesting.java_decimal_layout)
