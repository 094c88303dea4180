"""Fluss's AlignedRow: the fixed-slot binary row its log batch statistics carry their min and max rows in.

Layout (little-endian), for a row of ``n`` fields::

    null bits: ((n + 63 + 8) // 64) * 8 bytes — bit ``i + 8`` set when field ``i`` is null (the first byte
               is the row kind, 0 here)
    n slots of 8 bytes, one per field
    variable part: what does not fit a slot, each piece padded to a multiple of 8 bytes

A slot holds a fixed-size value at its start (boolean and TINYINT 1 byte, SMALLINT 2, INT, DATE, TIME and
FLOAT 4, BIGINT and DOUBLE 8, the rest of the slot zero); a string of up to 7 bytes inline (its bytes, then
``0x80 | length`` in the slot's last byte); a longer one as ``offset << 32 | length`` pointing into the
variable part. A DECIMAL of precision up to 18 is its unscaled value as a long; a larger one takes 16 bytes
of the variable part holding the unscaled value's big-endian two's complement (minimal length) and the slot
``offset << 32 | length``. A TIMESTAMP or TIMESTAMP_LTZ of precision up to 3 is its epoch millis as a long;
a finer one takes 8 bytes of the variable part (the millis) and the slot ``offset << 32 | nano of milli``.
A null field's slot is zero. Only the types statistics support are encoded here.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from strom.records import types
from strom.records.types import DataType, DataTypeVisitor

_LONG = struct.Struct("<q")
_ULONG = struct.Struct("<Q")
_SLOT = 8
INLINE_BYTES_MAX = 7
COMPACT_DECIMAL_PRECISION_MAX = 18
COMPACT_TIMESTAMP_PRECISION_MAX = 3


def null_bits_size(arity: int) -> int:
    return ((arity + 63 + 8) // 64) * 8


def _padded(size: int) -> int:
    return (size + 7) & ~7


class _SlotWriter(DataTypeVisitor[None]):
    """Writes one non-null value of the visited type into the row being built."""

    def __init__(self, row: bytearray, slot: int, value: Any) -> None:
        self._row = row
        self._slot = slot
        self._value = value

    def _fixed(self, fmt: str) -> None:
        struct.pack_into("<" + fmt, self._row, self._slot, self._value)

    def _variable(self, data: bytes, low: int) -> None:
        """Append ``data`` (padded) to the variable part; the slot points to it, ``low`` its low half."""
        offset = len(self._row)
        self._row += data + bytes(_padded(len(data)) - len(data))
        _ULONG.pack_into(self._row, self._slot, offset << 32 | low)

    def _bytes(self, data: bytes) -> None:
        if len(data) <= INLINE_BYTES_MAX:
            self._row[self._slot : self._slot + len(data)] = data
            self._row[self._slot + 7] = 0x80 | len(data)
        else:
            self._variable(data, len(data))

    def visit_boolean(self, t: types.BooleanType) -> None:
        self._fixed("?")

    def visit_tinyint(self, t: types.TinyIntType) -> None:
        self._fixed("b")

    def visit_smallint(self, t: types.SmallIntType) -> None:
        self._fixed("h")

    def visit_int(self, t: types.IntType) -> None:
        self._fixed("i")

    def visit_date(self, t: types.DateType) -> None:
        self._fixed("i")

    def visit_time(self, t: types.TimeType) -> None:
        self._fixed("i")

    def visit_bigint(self, t: types.BigIntType) -> None:
        self._fixed("q")

    def visit_float(self, t: types.FloatType) -> None:
        self._fixed("f")

    def visit_double(self, t: types.DoubleType) -> None:
        self._fixed("d")

    def visit_string(self, t: types.StringType) -> None:
        self._bytes(self._value.encode())

    def visit_char(self, t: types.CharType) -> None:
        self._bytes(self._value.encode())

    def visit_decimal(self, t: types.DecimalType) -> None:
        unscaled: int = self._value  # the unscaled integer
        if t.precision <= COMPACT_DECIMAL_PRECISION_MAX:
            _LONG.pack_into(self._row, self._slot, unscaled)
            return
        data = unscaled.to_bytes(max(1, (unscaled.bit_length() + 8) // 8), "big", signed=True)
        offset = len(self._row)
        self._row += data + bytes(16 - len(data))
        _ULONG.pack_into(self._row, self._slot, offset << 32 | len(data))

    def _timestamp(self, precision: int) -> None:
        millis, nanos_of_milli = self._value  # (epoch millis, nanos within the milli)
        if precision <= COMPACT_TIMESTAMP_PRECISION_MAX:
            _LONG.pack_into(self._row, self._slot, millis)
        else:
            self._variable(_LONG.pack(millis), nanos_of_milli)

    def visit_timestamp(self, t: types.TimestampType) -> None:
        self._timestamp(t.precision)

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> None:
        self._timestamp(t.precision)


class _SlotReader(DataTypeVisitor[Any]):
    """Reads one non-null value of the visited type from a row."""

    def __init__(self, row: bytes | memoryview, slot: int) -> None:
        self._row = row
        self._slot = slot

    def _fixed(self, fmt: str) -> Any:
        return struct.unpack_from("<" + fmt, self._row, self._slot)[0]

    def _pointer(self) -> tuple[int, int]:
        word = _ULONG.unpack_from(self._row, self._slot)[0]
        return word >> 32, word & 0xFFFFFFFF

    def _bytes(self) -> bytes:
        marker = self._row[self._slot + 7]
        if marker & 0x80:
            return bytes(self._row[self._slot : self._slot + (marker & 0x7F)])
        offset, length = self._pointer()
        if offset + length > len(self._row):
            raise ValueError(f"a variable-length field points beyond the row ({offset} + {length} > {len(self._row)})")
        return bytes(self._row[offset : offset + length])

    def visit_boolean(self, t: types.BooleanType) -> Any:
        return self._fixed("?")

    def visit_tinyint(self, t: types.TinyIntType) -> Any:
        return self._fixed("b")

    def visit_smallint(self, t: types.SmallIntType) -> Any:
        return self._fixed("h")

    def visit_int(self, t: types.IntType) -> Any:
        return self._fixed("i")

    def visit_date(self, t: types.DateType) -> Any:
        return self._fixed("i")

    def visit_time(self, t: types.TimeType) -> Any:
        return self._fixed("i")

    def visit_bigint(self, t: types.BigIntType) -> Any:
        return self._fixed("q")

    def visit_float(self, t: types.FloatType) -> Any:
        return self._fixed("f")

    def visit_double(self, t: types.DoubleType) -> Any:
        return self._fixed("d")

    def visit_string(self, t: types.StringType) -> Any:
        return self._bytes().decode()

    def visit_char(self, t: types.CharType) -> Any:
        return self._bytes().decode()

    def visit_decimal(self, t: types.DecimalType) -> Any:
        if t.precision <= COMPACT_DECIMAL_PRECISION_MAX:
            return self._fixed("q")
        offset, length = self._pointer()
        if length > 16 or offset + length > len(self._row):
            raise ValueError(f"a DECIMAL field points beyond the row ({offset} + {length})")
        return int.from_bytes(self._row[offset : offset + length], "big", signed=True)

    def _timestamp(self, precision: int) -> tuple[int, int]:
        if precision <= COMPACT_TIMESTAMP_PRECISION_MAX:
            return self._fixed("q"), 0
        offset, nanos_of_milli = self._pointer()
        if offset + 8 > len(self._row):
            raise ValueError(f"a TIMESTAMP field points beyond the row ({offset})")
        return _LONG.unpack_from(self._row, offset)[0], nanos_of_milli

    def visit_timestamp(self, t: types.TimestampType) -> Any:
        return self._timestamp(t.precision)

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> Any:
        return self._timestamp(t.precision)


def encode(field_types: Sequence[DataType], values: Sequence[Any]) -> bytes:
    """An AlignedRow of ``values`` (None: null). Values are Fluss's internal ones: an unscaled int for a
    DECIMAL, ``(epoch millis, nanos of milli)`` for a timestamp, days for a DATE, millis of day for a TIME."""
    arity = len(field_types)
    bits = null_bits_size(arity)
    row = bytearray(bits + _SLOT * arity)
    for index, (field_type, value) in enumerate(zip(field_types, values, strict=True)):
        if value is None:
            bit = index + 8
            row[bit // 8] |= 1 << (bit % 8)
        else:
            _SlotWriter(row, bits + _SLOT * index, value).visit(field_type)
    return bytes(row)


def decode(field_types: Sequence[DataType], row: bytes | memoryview) -> list[Any]:
    """The values of an AlignedRow, as :func:`encode` takes them. Raises ValueError for a row too short
    for its fields or a pointer outside it."""
    arity = len(field_types)
    bits = null_bits_size(arity)
    if len(row) < bits + _SLOT * arity:
        raise ValueError(f"an AlignedRow of {arity} fields needs {bits + _SLOT * arity} bytes, got {len(row)}")
    values: list[Any] = []
    for index, field_type in enumerate(field_types):
        bit = index + 8
        if row[bit // 8] & (1 << (bit % 8)):
            values.append(None)
        else:
            values.append(_SlotReader(row, bits + _SLOT * index).visit(field_type))
    return values


__all__ = ["decode", "encode", "null_bits_size"]
