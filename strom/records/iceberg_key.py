"""Key bytes for tables whose lake format is Iceberg (Fluss's ``IcebergKeyEncoder``).

Fluss encodes the primary key (and the bucket key) of such a table as Iceberg hashes a single value for
its ``bucket[N]`` transform, so that the bucket a row lands in is the Iceberg partition the lake copy
keeps it in. Exactly one key column is allowed. Per type, little-endian where a width is fixed:

* INT and DATE widen to an 8-byte long; BIGINT is 8 bytes;
* TIME is microseconds of the day as a long (Fluss keeps milliseconds: x 1000);
* TIMESTAMP (without time zone) is epoch microseconds as a long;
* FLOAT and DOUBLE are 4 and 8 bytes (Iceberg itself does not bucket them; Fluss hashes their bits);
* STRING and CHAR are their UTF-8 bytes, BYTES and BINARY the raw bytes, no length prefix;
* DECIMAL is the unscaled value's minimal big-endian two's complement (Java's ``BigInteger.toByteArray``).

Other types (BOOLEAN, TINYINT, SMALLINT, TIMESTAMP_LTZ, ARRAY, MAP, ROW) cannot be such keys, as in Fluss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from strom.errors import InvalidTableError
from strom.records import types
from strom.records.binary_array import FLOAT32, FLOAT64, INT64
from strom.records.types import (
    DataType,
    RowType,
    decimal_to_unscaled,
    time_to_millis,
    timestamp_to_parts,
    unscaled_to_bytes,
)

_MICROS_PER_MILLI = 1000
_INT64_MASK = (1 << 64) - 1


def _wrap_long(value: int) -> int:
    """Java's long arithmetic wraps on overflow; so must the encoded micros."""
    value &= _INT64_MASK
    return value - (1 << 64) if value >= 1 << 63 else value


Write = Callable[[Any], bytes]


class _Writers(types.DataTypeVisitor[Write]):
    """The key bytes of one value of each type a key column may have."""

    __slots__ = ()

    def default(self, t: DataType) -> Write:
        raise InvalidTableError(
            f"a {t!r} column cannot be the key of a table whose lake format is Iceberg "
            "(INT, BIGINT, DATE, TIME, TIMESTAMP, FLOAT, DOUBLE, DECIMAL, STRING, CHAR, BINARY or BYTES can)"
        )

    def visit_int(self, t: types.IntType) -> Write:
        return INT64.pack

    def visit_date(self, t: types.DateType) -> Write:
        return INT64.pack

    def visit_bigint(self, t: types.BigIntType) -> Write:
        return INT64.pack

    def visit_time(self, t: types.TimeType) -> Write:
        precision = t.precision
        return lambda value: INT64.pack(_wrap_long(time_to_millis(value, precision) * _MICROS_PER_MILLI))

    def visit_timestamp(self, t: types.TimestampType) -> Write:
        precision = t.precision

        def timestamp(value: int) -> bytes:
            millis, nano_of_milli = timestamp_to_parts(value, precision)
            return INT64.pack(_wrap_long(millis * _MICROS_PER_MILLI + nano_of_milli // _MICROS_PER_MILLI))

        return timestamp

    def visit_float(self, t: types.FloatType) -> Write:
        return FLOAT32.pack

    def visit_double(self, t: types.DoubleType) -> Write:
        return FLOAT64.pack

    def visit_string(self, t: types.StringType) -> Write:
        return _encode_text

    def visit_char(self, t: types.CharType) -> Write:
        return _encode_text

    def visit_bytes(self, t: types.BytesType) -> Write:
        return bytes

    def visit_binary(self, t: types.BinaryType) -> Write:
        return bytes

    def visit_decimal(self, t: types.DecimalType) -> Write:
        precision, scale = t.precision, t.scale
        return lambda value: unscaled_to_bytes(decimal_to_unscaled(value, precision, scale))


def _encode_text(value: str) -> bytes:
    return value.encode()


_WRITERS = _Writers()


def _writer(t: DataType) -> Write:
    return _WRITERS.visit(t)


class IcebergKeyEncoder:
    """Encodes the single key column of a row as Iceberg hashes it (same interface as
    :class:`strom.records.compacted.CompactedKeyEncoder`)."""

    __slots__ = ("_index", "_write", "row_type")

    def __init__(self, row_type: RowType, key_indexes: Sequence[int]) -> None:
        if len(key_indexes) != 1:
            names = [row_type.fields[i].name for i in key_indexes]
            raise InvalidTableError(
                f"a table whose lake format is Iceberg needs exactly one key column, got {names}"
            )
        self.row_type = row_type
        (self._index,) = key_indexes
        self._write = _writer(row_type.fields[self._index].type)

    def encode(self, values: Sequence[Any]) -> bytes:
        """Key bytes from a full row's values (indexed by field position)."""
        return self.encode_key([values[self._index]])

    def encode_key(self, key_values: Sequence[Any]) -> bytes:
        """Key bytes from the key column's value alone."""
        (value,) = key_values
        if value is None:
            raise ValueError("a key column of a table whose lake format is Iceberg cannot be null")
        return self._write(value)
