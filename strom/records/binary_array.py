"""BinaryArray and BinaryMap: the word-aligned containers for ARRAY and MAP values.

Both row formats embed these containers (CompactedRow and IndexedRow differ only in the
format of ROW elements), so the codec takes a ``NestedRows`` strategy for those.

BinaryArray layout, all integers little-endian::

    int32 element count
    null bitset, 4 * ceil(n / 32) bytes, bit i = element i (LSB first)
    n fixed-width slots (1, 2, 4 or 8 bytes, see ``slot_size``), padded to 8 bytes
    variable part: each value padded to 8 bytes

A variable-length element's 8-byte slot holds ``offset << 32 | size``, offset counted from
the array's first byte. Strings and bytes of at most 7 bytes live in the slot itself: data in
bytes 0..len, byte 7 = ``0x80 | len``. A non-compact timestamp keeps its epoch millis (i64)
in the variable part and its nano-of-millisecond in the slot's ``size`` half.

BinaryMap: int32 byte size of the key array, the key array, then the value array.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from strom.records import types
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

INT8 = struct.Struct("<b")
INT16 = struct.Struct("<h")
INT32 = struct.Struct("<i")
INT64 = struct.Struct("<q")
UINT64 = struct.Struct("<Q")
FLOAT32 = struct.Struct("<f")
FLOAT64 = struct.Struct("<d")

WORD_SIZE_BYTES = 8
INLINE_SIZE_BYTES_MAX = 7  # strings/bytes this short are stored inside their slot
INLINE_MARK = 0x80  # set in a slot's byte 7 when the value is inline
BIG_DECIMAL_RESERVED_BYTES = 16  # Java reserves this much per non-compact decimal element
ELEMENT_COUNT_MAX = 1 << 28  # sanity bound when decoding untrusted bytes
assert UINT64.size == WORD_SIZE_BYTES
assert BIG_DECIMAL_RESERVED_BYTES >= 16  # DECIMAL(38) unscaled bytes are at most 16

_SIZE_MASK = 0xFFFFFFFF
_INLINE_FLAG = 1 << 63
_FLOAT32_NAN = FLOAT32.pack(math.nan)
_FLOAT64_NAN = FLOAT64.pack(math.nan)

Reader = Callable[[bytes, int, int], Any]  # (data, array start, slot position) -> value
Writer = Callable[[bytearray, int, Any], None]  # (array buffer, slot position, value)


class NestedRows(Protocol):
    """How ROW elements are encoded, and how wide a non-compact decimal's reservation is.

    ``java_decimal_layout``: True reserves 16 bytes per non-compact decimal element as Java's
    BinaryArrayWriter does; False rounds the unscaled bytes up to a word as fluss-rust does.
    Both decode the same way; the Rust reader rejects a MAP whose last non-compact decimal
    value was written with the Java reservation but needs 8 bytes or fewer.
    """

    java_decimal_layout: bool

    def __hash__(self) -> int: ...  # compiled codecs are cached per strategy

    def row_encoder(self, row_type: RowType) -> Callable[[Any], bytes]: ...

    def row_decoder(self, row_type: RowType) -> Callable[[bytes, int, int], dict[str, Any]]: ...


C = TypeVar("C")


class ContainerCodecs(types.DataTypeVisitor[C]):
    """A per-type codec table whose ARRAY, MAP and ROW values are length-delimited blobs: a
    BinaryArray, a BinaryMap or a row in the ``nested`` format. Subclasses say how such a blob
    is stored (``container``) and how every other type is."""

    __slots__ = ("nested",)

    def __init__(self, nested: NestedRows) -> None:
        self.nested = nested

    def container(self, encode: Callable[[Any], bytes], decode: Callable[[bytes, int, int], Any]) -> C:
        raise NotImplementedError

    def visit_array(self, t: types.ArrayType) -> C:
        codec = array_codec(t.element, self.nested)
        return self.container(codec.encode, codec.decode)

    def visit_map(self, t: types.MapType) -> C:
        pair = map_codec(t.key, t.value, self.nested)
        return self.container(pair.encode, pair.decode)

    def visit_row(self, t: RowType) -> C:
        return self.container(self.nested.row_encoder(t), self.nested.row_decoder(t))


def header_size(element_count: int) -> int:
    """Bytes before the first slot: the count plus the 4-byte-aligned null bitset."""
    return 4 + ((element_count + 31) // 32) * 4


def round_to_word(size: int) -> int:
    return (size + 7) & ~7


class _SlotSize(types.DataTypeVisitor[int]):
    """Width of one element's fixed slot: 8 bytes unless the type is narrower."""

    __slots__ = ()

    def default(self, t: DataType) -> int:
        return 8

    def visit_boolean(self, t: types.BooleanType) -> int:
        return 1

    def visit_tinyint(self, t: types.TinyIntType) -> int:
        return 1

    def visit_smallint(self, t: types.SmallIntType) -> int:
        return 2

    def visit_int(self, t: types.IntType) -> int:
        return 4

    def visit_float(self, t: types.FloatType) -> int:
        return 4

    def visit_date(self, t: types.DateType) -> int:
        return 4

    def visit_time(self, t: types.TimeType) -> int:
        return 4


_SLOT_SIZE = _SlotSize()


def slot_size(t: DataType) -> int:
    """Width of one element's fixed slot (Java ``BinaryArray.calculateFixLengthPartSize``)."""
    return _SLOT_SIZE.visit(t)


class _Element:
    """Compiled reader and writer for one element type."""

    __slots__ = ("read", "size", "write")

    def __init__(self, size: int, read: Reader, write: Writer) -> None:
        self.size = size
        self.read = read
        self.write = write


def _fixed(codec: struct.Struct) -> _Element:
    unpack_from = codec.unpack_from
    pack_into = codec.pack_into
    return _Element(
        codec.size,
        lambda data, base, slot: unpack_from(data, slot)[0],
        lambda buf, slot, value: pack_into(buf, slot, value),
    )


def _append_var(buf: bytearray, slot: int, payload: bytes, reserved: int) -> None:
    """Append ``payload`` in ``reserved`` bytes (a word multiple) and point the slot at it."""
    offset = len(buf)
    buf += payload
    buf += bytes(reserved - len(payload))
    UINT64.pack_into(buf, slot, (offset << 32) | len(payload))


def _read_var(data: bytes, base: int, slot: int) -> bytes:
    packed = UINT64.unpack_from(data, slot)[0]
    if packed & _INLINE_FLAG:
        return data[slot : slot + ((packed >> 56) & 0x7F)]
    start = base + (packed >> 32)
    return data[start : start + (packed & _SIZE_MASK)]


def _write_bytes(buf: bytearray, slot: int, payload: bytes) -> None:
    size = len(payload)
    if size <= INLINE_SIZE_BYTES_MAX:
        buf[slot : slot + size] = payload
        buf[slot + 7] = INLINE_MARK | size
    else:
        _append_var(buf, slot, payload, round_to_word(size))


def _read_span(data: bytes, base: int, slot: int) -> tuple[int, int]:
    packed = UINT64.unpack_from(data, slot)[0]
    return base + (packed >> 32), packed & _SIZE_MASK


def _string_element() -> _Element:
    def read(data: bytes, base: int, slot: int) -> str:
        return _read_var(data, base, slot).decode("utf-8", "replace")

    def write(buf: bytearray, slot: int, value: str) -> None:
        _write_bytes(buf, slot, value.encode("utf-8"))

    return _Element(8, read, write)


def _bytes_element() -> _Element:
    def write(buf: bytearray, slot: int, value: bytes) -> None:
        _write_bytes(buf, slot, bytes(value))

    return _Element(8, _read_var, write)


def _float_element(codec: struct.Struct, nan_bytes: bytes) -> _Element:
    unpack_from = codec.unpack_from
    pack = codec.pack

    def write(buf: bytearray, slot: int, value: float) -> None:
        # Java's BinaryArrayWriter canonicalises NaN; do the same for identical bytes.
        buf[slot : slot + codec.size] = nan_bytes if math.isnan(value) else pack(value)

    return _Element(codec.size, lambda data, base, slot: unpack_from(data, slot)[0], write)


def _decimal_element(t: types.DecimalType, java_layout: bool) -> _Element:
    precision, scale = t.precision, t.scale
    if t.is_compact:

        def read_compact(data: bytes, base: int, slot: int) -> Any:
            return decimal_from_unscaled(INT64.unpack_from(data, slot)[0], scale)

        def write_compact(buf: bytearray, slot: int, value: Any) -> None:
            INT64.pack_into(buf, slot, decimal_to_unscaled(value, precision, scale))

        return _Element(8, read_compact, write_compact)

    def read(data: bytes, base: int, slot: int) -> Any:
        start, size = _read_span(data, base, slot)
        return decimal_from_unscaled(unscaled_from_bytes(data[start : start + size]), scale)

    def write(buf: bytearray, slot: int, value: Any) -> None:
        payload = unscaled_to_bytes(decimal_to_unscaled(value, precision, scale))
        reserved = BIG_DECIMAL_RESERVED_BYTES if java_layout else round_to_word(len(payload))
        _append_var(buf, slot, payload, reserved)

    return _Element(8, read, write)


def _timestamp_element(precision: int, compact: bool) -> _Element:
    if compact:

        def read_compact(data: bytes, base: int, slot: int) -> int:
            return timestamp_from_parts(INT64.unpack_from(data, slot)[0], 0, precision)

        def write_compact(buf: bytearray, slot: int, value: int) -> None:
            INT64.pack_into(buf, slot, timestamp_to_parts(value, precision)[0])

        return _Element(8, read_compact, write_compact)

    def read(data: bytes, base: int, slot: int) -> int:
        start, nano_of_milli = _read_span(data, base, slot)
        return timestamp_from_parts(INT64.unpack_from(data, start)[0], nano_of_milli, precision)

    def write(buf: bytearray, slot: int, value: int) -> None:
        millis, nano_of_milli = timestamp_to_parts(value, precision)
        offset = len(buf)
        buf += INT64.pack(millis)
        UINT64.pack_into(buf, slot, (offset << 32) | nano_of_milli)

    return _Element(8, read, write)


def _time_element(precision: int) -> _Element:
    def read(data: bytes, base: int, slot: int) -> int:
        return time_from_millis(INT32.unpack_from(data, slot)[0], precision)

    def write(buf: bytearray, slot: int, value: int) -> None:
        INT32.pack_into(buf, slot, time_to_millis(value, precision))

    return _Element(4, read, write)


def _container_element(encode: Callable[[Any], bytes], decode: Callable[[bytes, int, int], Any]) -> _Element:
    def read(data: bytes, base: int, slot: int) -> Any:
        start, size = _read_span(data, base, slot)
        return decode(data, start, size)

    def write(buf: bytearray, slot: int, value: Any) -> None:
        payload = encode(value)
        _append_var(buf, slot, payload, round_to_word(len(payload)))

    return _Element(8, read, write)


_BOOLEAN = _Element(
    1,
    lambda data, base, slot: data[slot] != 0,
    lambda buf, slot, value: buf.__setitem__(slot, 1 if value else 0),
)


class _ElementCodecs(ContainerCodecs[_Element]):
    """The ``_Element`` of each type, with ROW elements and decimal reservations per ``nested``."""

    __slots__ = ()

    def container(self, encode: Callable[[Any], bytes], decode: Callable[[bytes, int, int], Any]) -> _Element:
        return _container_element(encode, decode)

    def default(self, t: DataType) -> _Element:
        raise TypeError(f"unsupported array element type {t!r}")

    def visit_boolean(self, t: types.BooleanType) -> _Element:
        return _BOOLEAN

    def visit_tinyint(self, t: types.TinyIntType) -> _Element:
        return _fixed(INT8)

    def visit_smallint(self, t: types.SmallIntType) -> _Element:
        return _fixed(INT16)

    def visit_int(self, t: types.IntType) -> _Element:
        return _fixed(INT32)

    def visit_date(self, t: types.DateType) -> _Element:
        return _fixed(INT32)

    def visit_bigint(self, t: types.BigIntType) -> _Element:
        return _fixed(INT64)

    def visit_float(self, t: types.FloatType) -> _Element:
        return _float_element(FLOAT32, _FLOAT32_NAN)

    def visit_double(self, t: types.DoubleType) -> _Element:
        return _float_element(FLOAT64, _FLOAT64_NAN)

    def visit_string(self, t: types.StringType) -> _Element:
        return _string_element()

    def visit_char(self, t: types.CharType) -> _Element:
        return _string_element()

    def visit_bytes(self, t: types.BytesType) -> _Element:
        return _bytes_element()

    def visit_binary(self, t: types.BinaryType) -> _Element:
        return _bytes_element()

    def visit_decimal(self, t: types.DecimalType) -> _Element:
        return _decimal_element(t, self.nested.java_decimal_layout)

    def visit_time(self, t: types.TimeType) -> _Element:
        return _time_element(t.precision)

    def visit_timestamp(self, t: types.TimestampType) -> _Element:
        return _timestamp_element(t.precision, t.is_compact)

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> _Element:
        return _timestamp_element(t.precision, t.is_compact)


@functools.lru_cache(maxsize=1024)
def _element(t: DataType, nested: NestedRows) -> _Element:
    return _ElementCodecs(nested).visit(t)


class ArrayCodec:
    """Encodes a Python list as a BinaryArray and back, for one element type."""

    __slots__ = ("_element", "_element_type")

    def __init__(self, element_type: DataType, nested: NestedRows) -> None:
        self._element_type = element_type
        self._element = _element(element_type, nested)

    def encode(self, values: Sequence[Any]) -> bytes:
        count = len(values)
        size = self._element.size
        first_slot = header_size(count)
        buf = bytearray(round_to_word(first_slot + size * count))
        INT32.pack_into(buf, 0, count)
        write = self._element.write
        nullable = self._element_type.nullable
        for index, value in enumerate(values):
            if value is None:
                if not nullable:
                    raise ValueError(f"null element in array of {self._element_type}")
                buf[4 + (index >> 3)] |= 1 << (index & 7)
            else:
                write(buf, first_slot + index * size, value)
        return bytes(buf)

    def decode(self, data: bytes, offset: int, size_bytes: int) -> list[Any]:
        """Decode the array occupying ``data[offset : offset + size_bytes]``."""
        count = INT32.unpack_from(data, offset)[0]
        if not 0 <= count <= ELEMENT_COUNT_MAX or header_size(count) > size_bytes:
            raise ValueError(f"corrupt BinaryArray: {count} elements in {size_bytes} bytes")
        size = self._element.size
        slot = offset + header_size(count)
        if slot + size * count > offset + size_bytes:
            raise ValueError(f"corrupt BinaryArray: {count} slots overflow {size_bytes} bytes")
        read = self._element.read
        values: list[Any] = []
        append = values.append
        for index in range(count):
            if data[offset + 4 + (index >> 3)] & (1 << (index & 7)):
                append(None)
            else:
                append(read(data, offset, slot))
            slot += size
        return values


@functools.lru_cache(maxsize=1024)
def array_codec(element_type: DataType, nested: NestedRows) -> ArrayCodec:
    return ArrayCodec(element_type, nested)


class MapCodec:
    """Encodes a list of (key, value) pairs (or a dict) as a BinaryMap and back."""

    __slots__ = ("_keys", "_values")

    def __init__(self, key_type: DataType, value_type: DataType, nested: NestedRows) -> None:
        self._keys = array_codec(key_type, nested)
        self._values = array_codec(value_type, nested)

    def encode(self, entries: Mapping[Any, Any] | Sequence[tuple[Any, Any]]) -> bytes:
        pairs = list(entries.items()) if isinstance(entries, Mapping) else list(entries)
        key_bytes = self._keys.encode([k for k, _ in pairs])
        value_bytes = self._values.encode([v for _, v in pairs])
        return INT32.pack(len(key_bytes)) + key_bytes + value_bytes

    def decode(self, data: bytes, offset: int, size_bytes: int) -> list[tuple[Any, Any]]:
        key_size = INT32.unpack_from(data, offset)[0]
        if not 0 <= key_size <= size_bytes - 4:
            raise ValueError(f"corrupt BinaryMap: key array of {key_size} in {size_bytes} bytes")
        keys = self._keys.decode(data, offset + 4, key_size)
        values = self._values.decode(data, offset + 4 + key_size, size_bytes - 4 - key_size)
        if len(keys) != len(values):
            raise ValueError(f"corrupt BinaryMap: {len(keys)} keys but {len(values)} values")
        return list(zip(keys, values, strict=True))


@functools.lru_cache(maxsize=1024)
def map_codec(key_type: DataType, value_type: DataType, nested: NestedRows) -> MapCodec:
    return MapCodec(key_type, value_type, nested)
