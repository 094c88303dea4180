"""Key bytes for tables whose lake format is Paimon (Fluss's ``PaimonKeyEncoder``): the key columns as a
Paimon ``BinaryRow``, so that the bucket Fluss's Paimon bucket function gives a key is the bucket Paimon
itself gives the row (``abs(murmur3(BinaryRow) % N)``), and a strom bucket is a Paimon bucket of the lake.

A ``BinaryRow`` of n fields (little-endian throughout):

* a header of ``((n + 63 + 8) // 64) * 8`` bytes: byte 0 is the row kind (INSERT, 0, for a key), then one
  null bit per field from bit 8 on;
* one 8-byte slot per field: BOOLEAN and TINYINT in its first byte, SMALLINT in two, INT, DATE and TIME
  (milliseconds of the day) in four, BIGINT, FLOAT and DOUBLE in eight; DECIMAL(p ≤ 18) its unscaled long,
  TIMESTAMP(p ≤ 3) and TIMESTAMP_LTZ(p ≤ 3) epoch milliseconds; a null field's slot is zero;
* strings and bytes of at most 7 bytes inline in the slot (the bytes, then ``0x80 | length`` in the
  slot's last byte); longer ones in a variable part after the slots, padded to 8 bytes, the slot holding
  ``offset << 32 | length``;
* DECIMAL(p > 18): 16 bytes in the variable part holding the unscaled value's big-endian two's complement
  (Java's ``BigInteger.toByteArray``); TIMESTAMP(p > 3): 8 bytes of epoch milliseconds there, the slot
  holding ``offset << 32 | nano-of-millisecond``.

ARRAY, MAP and ROW cannot be such keys, as in Fluss.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from strom.errors import InvalidTableError
from strom.records import types
from strom.records.types import (
    DataType,
    RowType,
    decimal_to_unscaled,
    time_to_millis,
    timestamp_to_parts,
    unscaled_to_bytes,
)

HEADER_BITS = 8
INLINE_BYTES_MAX = 7
COMPACT_DECIMAL_PRECISION_MAX = 18
COMPACT_TIMESTAMP_PRECISION_MAX = 3
_SLOT = 8
_I8, _I16, _I32, _I64 = struct.Struct("<b"), struct.Struct("<h"), struct.Struct("<i"), struct.Struct("<q")
_F32, _F64, _U64 = struct.Struct("<f"), struct.Struct("<d"), struct.Struct("<Q")


def header_size(arity: int) -> int:
    """Bytes of the row-kind byte and the null bits of an ``arity``-field row."""
    return ((arity + 63 + HEADER_BITS) // 64) * 8


class _Row:
    """One BinaryRow being written: the fixed part (header and slots) and the variable part."""

    __slots__ = ("fixed", "header", "variable")

    def __init__(self, arity: int) -> None:
        self.header = header_size(arity)
        self.fixed = bytearray(self.header + _SLOT * arity)
        self.variable = bytearray()

    def slot(self, pos: int, data: bytes) -> None:
        start = self.header + _SLOT * pos
        self.fixed[start:start + len(data)] = data

    def null(self, pos: int) -> None:
        bit = pos + HEADER_BITS
        self.fixed[bit >> 3] |= 1 << (bit & 7)

    def to_variable(self, pos: int, data: bytes, size: int, padded: int) -> None:
        """``data`` (``padded`` bytes long in the row) into the variable part; ``size`` goes in the slot."""
        offset = len(self.fixed) + len(self.variable)
        self.variable += data + bytes(padded - len(data))
        self.slot(pos, _U64.pack(offset << 32 | size))

    def bytes_field(self, pos: int, data: bytes) -> None:
        if len(data) <= INLINE_BYTES_MAX:
            slot = bytearray(_SLOT)
            slot[:len(data)] = data
            slot[7] = 0x80 | len(data)
            self.slot(pos, bytes(slot))
        else:
            self.to_variable(pos, data, len(data), (len(data) + 7) & ~7)

    def to_bytes(self) -> bytes:
        return bytes(self.fixed + self.variable)


Write = Callable[[_Row, int, Any], None]


def _packed(packer: struct.Struct) -> Write:
    return lambda row, pos, value: row.slot(pos, packer.pack(value))


class _Writers(types.DataTypeVisitor[Write]):
    """How a value of each key type goes into the row."""

    __slots__ = ()

    def default(self, t: DataType) -> Write:
        raise InvalidTableError(
            f"a {t!r} column cannot be the key of a table whose lake format is Paimon (ARRAY, MAP and ROW cannot)"
        )

    def visit_boolean(self, t: types.BooleanType) -> Write:
        return lambda row, pos, value: row.slot(pos, b"\x01" if value else b"\x00")

    def visit_tinyint(self, t: types.TinyIntType) -> Write:
        return _packed(_I8)

    def visit_smallint(self, t: types.SmallIntType) -> Write:
        return _packed(_I16)

    def visit_int(self, t: types.IntType) -> Write:
        return _packed(_I32)

    def visit_date(self, t: types.DateType) -> Write:
        return _packed(_I32)

    def visit_time(self, t: types.TimeType) -> Write:
        precision = t.precision
        return lambda row, pos, value: row.slot(pos, _I32.pack(time_to_millis(value, precision)))

    def visit_bigint(self, t: types.BigIntType) -> Write:
        return _packed(_I64)

    def visit_float(self, t: types.FloatType) -> Write:
        return _packed(_F32)

    def visit_double(self, t: types.DoubleType) -> Write:
        return _packed(_F64)

    def visit_string(self, t: types.StringType) -> Write:
        return lambda row, pos, value: row.bytes_field(pos, value.encode())

    def visit_char(self, t: types.CharType) -> Write:
        return lambda row, pos, value: row.bytes_field(pos, value.encode())

    def visit_bytes(self, t: types.BytesType) -> Write:
        return lambda row, pos, value: row.bytes_field(pos, bytes(value))

    def visit_binary(self, t: types.BinaryType) -> Write:
        return lambda row, pos, value: row.bytes_field(pos, bytes(value))

    def visit_decimal(self, t: types.DecimalType) -> Write:
        precision, scale = t.precision, t.scale
        if precision <= COMPACT_DECIMAL_PRECISION_MAX:
            return lambda row, pos, value: row.slot(pos, _I64.pack(decimal_to_unscaled(value, precision, scale)))

        def wide(row: _Row, pos: int, value: Any) -> None:
            data = unscaled_to_bytes(decimal_to_unscaled(value, precision, scale))
            row.to_variable(pos, data, len(data), 16)

        return wide

    def _timestamp(self, precision: int) -> Write:
        if precision <= COMPACT_TIMESTAMP_PRECISION_MAX:
            return lambda row, pos, value: row.slot(pos, _I64.pack(timestamp_to_parts(value, precision)[0]))

        def wide(row: _Row, pos: int, value: Any) -> None:
            millis, nano_of_milli = timestamp_to_parts(value, precision)
            row.to_variable(pos, _I64.pack(millis), nano_of_milli, _SLOT)

        return wide

    def visit_timestamp(self, t: types.TimestampType) -> Write:
        return self._timestamp(t.precision)

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> Write:
        return self._timestamp(t.precision)


_WRITERS = _Writers()


class PaimonKeyEncoder:
    """Encodes the key columns of a row as a Paimon ``BinaryRow`` (same interface as
    :class:`strom.records.compacted.CompactedKeyEncoder`)."""

    __slots__ = ("_key_indexes", "_writes", "row_type")

    def __init__(self, row_type: RowType, key_indexes: Sequence[int]) -> None:
        self.row_type = row_type
        self._key_indexes = tuple(key_indexes)
        self._writes = [_WRITERS.visit(row_type.fields[i].type) for i in self._key_indexes]

    @property
    def key_indexes(self) -> tuple[int, ...]:
        return self._key_indexes

    def encode(self, values: Sequence[Any]) -> bytes:
        """Key bytes from a full row's values (indexed by field position)."""
        return self.encode_key([values[i] for i in self._key_indexes])

    def encode_key(self, key_values: Sequence[Any]) -> bytes:
        """Key bytes from the key columns' values alone (a null is written as Paimon writes one)."""
        row = _Row(len(self._writes))
        for pos, (write, value) in enumerate(zip(self._writes, key_values, strict=True)):
            if value is None:
                row.null(pos)
            else:
                write(row, pos, value)
        return row.to_bytes()
