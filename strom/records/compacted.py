"""CompactedRow, Fluss's default kv format (``table.kv.format = COMPACTED``), and its key form.

Layout: a null bitset of ``ceil(n / 8)`` bytes (field i null when bit ``i & 7`` of byte
``i >> 3`` is set), then each non-null field in schema order with no padding:

========================================  ==============================================
BOOLEAN, TINYINT                           1 byte
SMALLINT / FLOAT / DOUBLE                  2 / 4 / 8 bytes little-endian
INTEGER, DATE, TIME (millis of day)        unsigned LEB128 of the u32 bit pattern
BIGINT, DECIMAL(p <= 18) unscaled          unsigned LEB128 of the u64 bit pattern
TIMESTAMP[_LTZ](p <= 3)                    LEB128 epoch millis
TIMESTAMP[_LTZ](p > 3)                     LEB128 epoch millis, LEB128 nano-of-millisecond
STRING, CHAR, BYTES, BINARY                LEB128 length, then the bytes (UTF-8 for text)
DECIMAL(p > 18)                            LEB128 length, big-endian two's complement
ARRAY / MAP / ROW                          LEB128 length, BinaryArray / BinaryMap /
                                           nested CompactedRow
========================================  ==============================================

A non-nullable field is read even if its null bit is set, as both Fluss readers do. Key
bytes (``CompactedKeyEncoder``) are the same field encodings concatenated with no bitset.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from strom.records import types
from strom.records.binary_array import (
    FLOAT32,
    FLOAT64,
    INT8,
    INT16,
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

VARINT32_SIZE_MAX = 5
VARINT64_SIZE_MAX = 10
_U32 = 1 << 32
_U64 = 1 << 64
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

Read = Callable[[bytes, int], tuple[Any, int]]  # (data, position) -> (value, next position)
Write = Callable[[bytearray, Any], None]  # appends the field's bytes
Skip = Callable[[bytes, int], int]  # (data, position) -> next position


def null_bitset_size(field_count: int) -> int:
    return (field_count + 7) // 8


# ---------------------------------------------------------------------------------------
# LEB128 varints, no zigzag: negative numbers take the full 5 / 10 bytes.
# ---------------------------------------------------------------------------------------


def _read_uvarint(data: bytes, pos: int, size_max: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = pos + size_max
    while pos < end:
        byte = data[pos]
        pos += 1
        if byte < 0x80:
            return result | (byte << shift), pos
        result |= (byte & 0x7F) << shift
        shift += 7
    raise ValueError(f"varint longer than {size_max} bytes before position {pos}")


def read_varint32(data: bytes, pos: int) -> tuple[int, int]:
    """A signed int32 from the unsigned LEB128 of its bit pattern."""
    value, pos = _read_uvarint(data, pos, VARINT32_SIZE_MAX)
    value &= _U32 - 1  # a 5th byte may carry bits above 32; Java drops them too
    return (value - _U32 if value > _I32_MAX else value), pos


def read_varint64(data: bytes, pos: int) -> tuple[int, int]:
    """A signed int64 from the unsigned LEB128 of its bit pattern."""
    value, pos = _read_uvarint(data, pos, VARINT64_SIZE_MAX)
    value &= _U64 - 1
    return (value - _U64 if value > _I64_MAX else value), pos


def skip_varint(data: bytes, pos: int) -> int:
    while data[pos] >= 0x80:
        pos += 1
    return pos + 1


def _append_uvarint(buf: bytearray, value: int) -> None:
    while value >= 0x80:
        buf.append((value & 0x7F) | 0x80)
        value >>= 7
    buf.append(value)


def write_varint32(buf: bytearray, value: int) -> None:
    if not _I32_MIN <= value <= _I32_MAX:
        raise ValueError(f"{value} does not fit a 32-bit integer")
    _append_uvarint(buf, value & (_U32 - 1))


def write_varint64(buf: bytearray, value: int) -> None:
    if not _I64_MIN <= value <= _I64_MAX:
        raise ValueError(f"{value} does not fit a 64-bit integer")
    _append_uvarint(buf, value & (_U64 - 1))


def _read_sized(data: bytes, pos: int) -> tuple[int, int]:
    """(start, end) of a length-prefixed payload."""
    size, start = read_varint32(data, pos)
    end = start + size
    if size < 0 or end > len(data):
        raise ValueError(f"length {size} at {pos} overruns the {len(data)}-byte row")
    return start, end


def _skip_sized(data: bytes, pos: int) -> int:
    return _read_sized(data, pos)[1]


def _write_sized(buf: bytearray, payload: bytes) -> None:
    write_varint32(buf, len(payload))
    buf += payload


# ---------------------------------------------------------------------------------------
# Per-type field codecs
# ---------------------------------------------------------------------------------------


class _Field:
    __slots__ = ("read", "skip", "write")

    def __init__(self, read: Read, write: Write, skip: Skip) -> None:
        self.read = read
        self.write = write
        self.skip = skip


def _fixed_field(codec: struct.Struct) -> _Field:
    unpack_from, pack, size = codec.unpack_from, codec.pack, codec.size

    def write(buf: bytearray, value: Any) -> None:
        buf += pack(value)

    return _Field(
        lambda data, pos: (unpack_from(data, pos)[0], pos + size),
        write,
        lambda data, pos: pos + size,
    )


def _mapped_field(read: Read, write: Write, decode: Callable, encode: Callable, skip: Skip) -> _Field:
    def read_mapped(data: bytes, pos: int) -> tuple[Any, int]:
        raw, pos = read(data, pos)
        return decode(raw), pos

    def write_mapped(buf: bytearray, value: Any) -> None:
        write(buf, encode(value))

    return _Field(read_mapped, write_mapped, skip)


def _read_string(data: bytes, pos: int) -> tuple[str, int]:
    start, end = _read_sized(data, pos)
    return data[start:end].decode("utf-8", "replace"), end


def _read_bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    start, end = _read_sized(data, pos)
    return data[start:end], end


def _write_string(buf: bytearray, value: str) -> None:
    _write_sized(buf, value.encode("utf-8"))


def _write_bytes(buf: bytearray, value: bytes) -> None:
    _write_sized(buf, bytes(value))


def _boolean_write(buf: bytearray, value: Any) -> None:
    buf.append(1 if value else 0)


_BOOLEAN = _Field(lambda data, pos: (data[pos] != 0, pos + 1), _boolean_write, lambda d, p: p + 1)
_INT = _Field(read_varint32, write_varint32, skip_varint)
_BIGINT = _Field(read_varint64, write_varint64, skip_varint)
_STRING = _Field(_read_string, _write_string, _skip_sized)
_BYTES = _Field(_read_bytes, _write_bytes, _skip_sized)


def _timestamp_field(precision: int, compact: bool) -> _Field:
    if compact:
        return _mapped_field(
            read_varint64,
            write_varint64,
            lambda millis: timestamp_from_parts(millis, 0, precision),
            lambda value: timestamp_to_parts(value, precision)[0],
            skip_varint,
        )

    def read(data: bytes, pos: int) -> tuple[int, int]:
        millis, pos = read_varint64(data, pos)
        nano_of_milli, pos = read_varint32(data, pos)
        return timestamp_from_parts(millis, nano_of_milli, precision), pos

    def write(buf: bytearray, value: int) -> None:
        millis, nano_of_milli = timestamp_to_parts(value, precision)
        write_varint64(buf, millis)
        write_varint32(buf, nano_of_milli)

    return _Field(read, write, lambda data, pos: skip_varint(data, skip_varint(data, pos)))


def _decimal_field(t: types.DecimalType) -> _Field:
    precision, scale = t.precision, t.scale
    if t.is_compact:
        return _mapped_field(
            read_varint64,
            write_varint64,
            lambda unscaled: decimal_from_unscaled(unscaled, scale),
            lambda value: decimal_to_unscaled(value, precision, scale),
            skip_varint,
        )
    return _mapped_field(
        _read_bytes,
        _write_sized,
        lambda raw: decimal_from_unscaled(unscaled_from_bytes(raw), scale),
        lambda value: unscaled_to_bytes(decimal_to_unscaled(value, precision, scale)),
        _skip_sized,
    )


def _container_field(encode: Callable[[Any], bytes], decode: Callable[[bytes, int, int], Any]) -> _Field:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        start, end = _read_sized(data, pos)
        return decode(data, start, end - start), end

    def write(buf: bytearray, value: Any) -> None:
        _write_sized(buf, encode(value))

    return _Field(read, write, _skip_sized)


class _FieldCodecs(ContainerCodecs[_Field]):
    """The ``_Field`` of each type, with ROW values (nested or in arrays and maps) per ``nested``."""

    __slots__ = ()

    def container(self, encode: Callable[[Any], bytes], decode: Callable[[bytes, int, int], Any]) -> _Field:
        return _container_field(encode, decode)

    def default(self, t: DataType) -> _Field:
        raise TypeError(f"unsupported type for CompactedRow: {t!r}")

    def visit_boolean(self, t: types.BooleanType) -> _Field:
        return _BOOLEAN

    def visit_tinyint(self, t: types.TinyIntType) -> _Field:
        return _fixed_field(INT8)

    def visit_smallint(self, t: types.SmallIntType) -> _Field:
        return _fixed_field(INT16)

    def visit_int(self, t: types.IntType) -> _Field:
        return _INT

    def visit_date(self, t: types.DateType) -> _Field:
        return _INT

    def visit_time(self, t: types.TimeType) -> _Field:
        p = t.precision
        return _mapped_field(
            read_varint32,
            write_varint32,
            lambda millis: time_from_millis(millis, p),
            lambda value: time_to_millis(value, p),
            skip_varint,
        )

    def visit_bigint(self, t: types.BigIntType) -> _Field:
        return _BIGINT

    def visit_float(self, t: types.FloatType) -> _Field:
        return _fixed_field(FLOAT32)

    def visit_double(self, t: types.DoubleType) -> _Field:
        return _fixed_field(FLOAT64)

    def visit_string(self, t: types.StringType) -> _Field:
        return _STRING

    def visit_char(self, t: types.CharType) -> _Field:
        return _STRING

    def visit_bytes(self, t: types.BytesType) -> _Field:
        return _BYTES

    def visit_binary(self, t: types.BinaryType) -> _Field:
        return _BYTES

    def visit_decimal(self, t: types.DecimalType) -> _Field:
        return _decimal_field(t)

    def visit_timestamp(self, t: types.TimestampType) -> _Field:
        return _timestamp_field(t.precision, t.is_compact)

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> _Field:
        return _timestamp_field(t.precision, t.is_compact)


@functools.lru_cache(maxsize=1024)
def _field(t: DataType, nesting: _CompactedNesting) -> _Field:
    return _FieldCodecs(nesting).visit(t)


class _CompactedNesting:
    """ROW elements of arrays and maps are CompactedRows; see ``binary_array.NestedRows``."""

    __slots__ = ("java_decimal_layout",)

    def __init__(self, java_decimal_layout: bool) -> None:
        self.java_decimal_layout = java_decimal_layout

    def row_encoder(self, row_type: RowType) -> Callable[[Any], bytes]:
        return _row_encoder(row_type, self).encode_nested

    def row_decoder(self, row_type: RowType) -> Callable[[bytes, int, int], dict[str, Any]]:
        return _row_decoder(row_type, self).decode_nested


_RUST_NESTING = _CompactedNesting(java_decimal_layout=False)
_JAVA_NESTING = _CompactedNesting(java_decimal_layout=True)


def _nesting(java_decimal_layout: bool) -> _CompactedNesting:
    return _JAVA_NESTING if java_decimal_layout else _RUST_NESTING


# ---------------------------------------------------------------------------------------
# Row reader generation
#
# Decoding is the changelog's hot path, and in CPython a function call per field costs more
# than the field itself. So each row type gets one generated function with the common
# flat types read inline and every other type delegated to its ``_Field.read``. The source
# is built only from integer constants and fixed names (never from field names or data),
# and the property tests run every type through it.
# ---------------------------------------------------------------------------------------


def _read_length_slow(data: bytes, pos: int) -> tuple[int, int]:
    size, pos = read_varint32(data, pos)
    if size < 0:
        raise ValueError(f"negative length {size} before position {pos}")
    return size, pos


_VARINT_TEMPLATE = """\
b = data[pos]
if b < 128:
    {var} = b
    pos += 1
else:
    {var}, pos = {slow}(data, pos)"""

_SIZED_TEMPLATE = """\
n = data[pos]
if n < 128:
    pos += 1
else:
    n, pos = _read_length_slow(data, pos)
end = pos + n
{var} = data[pos:end]{decode}
pos = end"""

_STRUCT_TEMPLATE = """\
{var} = {unpack}(data, pos)[0]
pos += {size}"""

class _InlineRead(types.DataTypeVisitor[str]):
    """Source reading one non-null field into ``var`` and advancing ``pos``: the common flat
    types inline, every other type through its ``_Field.read`` (bound in ``env``)."""

    __slots__ = ("env", "index", "var")

    def __init__(self, var: str, index: int, env: dict[str, Any]) -> None:
        self.var = var
        self.index = index
        self.env = env

    def default(self, t: DataType) -> str:
        self.env[f"_read{self.index}"] = _field(t, _RUST_NESTING).read
        return f"{self.var}, pos = _read{self.index}(data, pos)"

    def _varint(self, slow: str) -> str:
        return _VARINT_TEMPLATE.format(var=self.var, slow=slow)

    def _sized(self, decode: str) -> str:
        return _SIZED_TEMPLATE.format(var=self.var, decode=decode)

    def _struct(self, codec: struct.Struct) -> str:
        self.env[f"_unpack{self.index}"] = codec.unpack_from
        return _STRUCT_TEMPLATE.format(var=self.var, unpack=f"_unpack{self.index}", size=codec.size)

    def visit_boolean(self, t: types.BooleanType) -> str:
        return f"{self.var} = data[pos] != 0\npos += 1"

    def visit_int(self, t: types.IntType) -> str:
        return self._varint("read_varint32")

    def visit_date(self, t: types.DateType) -> str:
        return self._varint("read_varint32")

    def visit_bigint(self, t: types.BigIntType) -> str:
        return self._varint("read_varint64")

    def visit_string(self, t: types.StringType) -> str:
        return self._sized(".decode('utf-8', 'replace')")

    def visit_char(self, t: types.CharType) -> str:
        return self._sized(".decode('utf-8', 'replace')")

    def visit_bytes(self, t: types.BytesType) -> str:
        return self._sized("")

    def visit_binary(self, t: types.BinaryType) -> str:
        return self._sized("")

    def visit_tinyint(self, t: types.TinyIntType) -> str:
        return self._struct(INT8)

    def visit_smallint(self, t: types.SmallIntType) -> str:
        return self._struct(INT16)

    def visit_float(self, t: types.FloatType) -> str:
        return self._struct(FLOAT32)

    def visit_double(self, t: types.DoubleType) -> str:
        return self._struct(FLOAT64)


def _inline_read(t: DataType, var: str, index: int, env: dict[str, Any]) -> str:
    """Source reading one non-null field into ``var`` and advancing ``pos``."""
    return _InlineRead(var, index, env).visit(t)


def _fields_source(row_type: RowType, env: dict[str, Any]) -> list[str]:
    """Lines (one indent level) reading every field into ``v0..vn`` from ``data[offset:]``."""
    env.update(read_varint32=read_varint32, read_varint64=read_varint64, _read_length_slow=_read_length_slow)
    lines = [f"pos = offset + {null_bitset_size(row_type.field_count)}"]
    for index, f in enumerate(row_type.fields):
        var = f"v{index}"
        body = _inline_read(f.type, var, index, env).splitlines()
        if f.type.nullable:
            lines.append(f"if data[offset + {index >> 3}] & {1 << (index & 7)}:")
            lines.append(f"    {var} = None")
            lines.append("else:")
            lines.extend("    " + line for line in body)
        else:
            lines.extend(body)
    return ["    " + line for line in lines]


def _define(lines: list[str], name: str, env: dict[str, Any], row_type: RowType) -> Any:
    exec(compile("\n".join(lines), f"<compacted {name} {row_type}>", "exec"), env)
    return env[name]


def _compile_row_reader(row_type: RowType) -> Callable[[bytes, int], tuple[tuple[Any, ...], int]]:
    """``read_row(data, offset) -> (values, end)`` for one row of ``row_type``."""
    env: dict[str, Any] = {}
    names = "".join(f"v{i}, " for i in range(row_type.field_count))
    lines = ["def read_row(data, offset):", *_fields_source(row_type, env), f"    return ({names}), pos"]
    return _define(lines, "read_row", env, row_type)  # type: ignore[no-any-return]


def _compile_columns_reader(
    row_type: RowType,
) -> Callable[[Iterable[bytes | bytearray | memoryview], Sequence[Any]], None]:
    """``read_columns(rows, appends)``: append field i of every row with ``appends[i]``.

    One call for a whole batch saves the per-row call, tuple and transposition.
    """
    env: dict[str, Any] = {"ValueError": ValueError}
    count = row_type.field_count
    names = "".join(f"a{i}, " for i in range(count))
    lines = [
        "def read_columns(rows, appends):",
        f"    ({names}) = appends",
        "    offset = 0",
        "    for data in rows:",
        "        if type(data) is not bytes:",
        "            data = bytes(data)",
        *("    " + line for line in _fields_source(row_type, env)),
        *(f"        a{i}(v{i})" for i in range(count)),
        "        if pos > len(data):",
        "            raise ValueError('truncated CompactedRow: fields overrun the row')",
    ]
    return _define(lines, "read_columns", env, row_type)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------


class CompactedRowDecoder:
    """Decodes CompactedRow bytes into a tuple of internal values (see ``types``)."""

    __slots__ = ("_names", "_read_columns", "_read_row", "row_type")

    def __init__(self, row_type: RowType) -> None:
        self.row_type = row_type
        self._names = tuple(row_type.field_names)
        self._read_row = _compile_row_reader(row_type)
        self._read_columns: (
            Callable[[Iterable[bytes | bytearray | memoryview], Sequence[Any]], None] | None
        ) = None

    def decode(self, data: bytes | bytearray | memoryview) -> tuple[Any, ...]:
        """Raises: ValueError: the bytes are not a row of this type."""
        if type(data) is not bytes:
            data = bytes(data)
        try:
            values, end = self._read_row(data, 0)
        except (IndexError, struct.error) as e:
            raise ValueError(f"truncated CompactedRow for {self.row_type}: {e}") from e
        if end > len(data):
            raise ValueError(f"truncated CompactedRow for {self.row_type}")
        return values

    def decode_columns(self, rows: Iterable[bytes | bytearray | memoryview]) -> list[list[Any]]:
        """Decode many rows into one list per field (the shape Arrow arrays are built from).

        Raises: ValueError: a row is not a row of this type.
        """
        if self._read_columns is None:
            self._read_columns = _compile_columns_reader(self.row_type)
        columns: list[list[Any]] = [[] for _ in self._names]
        try:
            self._read_columns(rows, [column.append for column in columns])
        except (IndexError, struct.error) as e:
            raise ValueError(f"truncated CompactedRow for {self.row_type}: {e}") from e
        return columns

    def decode_nested(self, data: bytes, offset: int, size: int) -> dict[str, Any]:
        values, end = self._read_row(data, offset)
        if end > offset + size:
            raise ValueError(f"nested CompactedRow overruns its {size} bytes")
        return dict(zip(self._names, values, strict=True))


class CompactedRowEncoder:
    """Encodes a sequence of internal values (one per field) as CompactedRow bytes.

    ``java_decimal_layout`` only matters for DECIMAL(p > 18) elements inside arrays and maps;
    see ``binary_array.NestedRows``. The default produces what fluss-rust writes, which both
    clients can read.
    """

    __slots__ = ("_fields", "_header_size", "_names", "row_type")

    def __init__(self, row_type: RowType, *, java_decimal_layout: bool = False) -> None:
        self.row_type = row_type
        self._header_size = null_bitset_size(row_type.field_count)
        self._names = tuple(row_type.field_names)
        nesting = _nesting(java_decimal_layout)
        self._fields = tuple(
            (i >> 3, 1 << (i & 7), f.type.nullable, _field(f.type, nesting).write)
            for i, f in enumerate(row_type.fields)
        )

    def encode(self, values: Sequence[Any]) -> bytes:
        """Raises: ValueError: wrong arity, a null in a NOT NULL field, or an unfit value."""
        if len(values) != len(self._fields):
            raise ValueError(f"{len(values)} values for {len(self._fields)} fields")
        buf = bytearray(self._header_size)
        for (null_byte, null_bit, nullable, write), value in zip(self._fields, values, strict=True):
            if value is None:
                if not nullable:
                    raise ValueError(f"null in NOT NULL field of {self.row_type}")
                buf[null_byte] |= null_bit
            else:
                write(buf, value)
        return bytes(buf)

    def encode_nested(self, value: Mapping[str, Any] | Sequence[Any]) -> bytes:
        if isinstance(value, Mapping):
            return self.encode([value.get(name) for name in self._names])
        return self.encode(value)


@functools.lru_cache(maxsize=1024)
def _row_decoder(row_type: RowType, nesting: _CompactedNesting) -> CompactedRowDecoder:
    return CompactedRowDecoder(row_type)


@functools.lru_cache(maxsize=1024)
def _row_encoder(row_type: RowType, nesting: _CompactedNesting) -> CompactedRowEncoder:
    return CompactedRowEncoder(row_type, java_decimal_layout=nesting.java_decimal_layout)


class CompactedKeyEncoder:
    """Encodes the key columns of a row: field encodings concatenated, no null bitset.

    These are the bytes clients send as PK keys and hash for bucketing. MAP columns cannot
    be keys (the Rust client refuses them).
    """

    __slots__ = ("_key_indexes", "_writers", "row_type")

    def __init__(
        self, row_type: RowType, key_indexes: Sequence[int], *, java_decimal_layout: bool = False
    ) -> None:
        self.row_type = row_type
        self._key_indexes = tuple(key_indexes)
        nesting = _nesting(java_decimal_layout)
        for index in self._key_indexes:
            if isinstance(row_type.fields[index].type, types.MapType):
                raise TypeError(f"MAP column {row_type.fields[index].name!r} cannot be a key")
        self._writers = tuple(_field(row_type.fields[i].type, nesting).write for i in key_indexes)

    @property
    def key_indexes(self) -> tuple[int, ...]:
        """The row positions of the key's fields, in key order."""
        return self._key_indexes

    def encode(self, values: Sequence[Any]) -> bytes:
        """Key bytes from a full row's values (indexed by field position)."""
        return self.encode_key([values[i] for i in self._key_indexes])

    def encode_key(self, key_values: Sequence[Any]) -> bytes:
        """Key bytes from the key columns' values alone, in key order."""
        buf = bytearray()
        for write, value in zip(self._writers, key_values, strict=True):
            if value is None:
                raise ValueError(f"null key value for {self.row_type}")
            write(buf, value)
        return bytes(buf)


# ---------------------------------------------------------------------------------------
# Byte-level field surgery for partial updates (Java PartialUpdater semantics)
# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _skippers(row_type: RowType) -> tuple[tuple[int, int, Skip], ...]:
    return tuple(
        (i >> 3, (1 << (i & 7)) if f.type.nullable else 0, _field(f.type, _RUST_NESTING).skip)
        for i, f in enumerate(row_type.fields)
    )


def field_spans(row_type: RowType, data: bytes | memoryview) -> list[tuple[int, int] | None]:
    """The ``(start, end)`` byte range of each field of a row, or None for a null field.

    Raises:
        ValueError: the bytes end before the last field does.
    """
    if not isinstance(data, bytes):
        data = bytes(data)
    pos = null_bitset_size(row_type.field_count)
    spans: list[tuple[int, int] | None] = []
    try:
        for null_byte, null_bit, skip in _skippers(row_type):
            if data[null_byte] & null_bit:
                spans.append(None)
            else:
                end = skip(data, pos)
                spans.append((pos, end))
                pos = end
    except IndexError as e:
        raise ValueError(f"truncated CompactedRow for {row_type}") from e
    if pos > len(data):
        raise ValueError(f"truncated CompactedRow for {row_type}")
    return spans


def _assemble(row_type: RowType, parts: Sequence[tuple[bytes | memoryview, tuple[int, int] | None]]) -> bytes:
    header = bytearray(null_bitset_size(row_type.field_count))
    body = []
    for index, (source, span) in enumerate(parts):
        if span is None:
            header[index >> 3] |= 1 << (index & 7)
        else:
            body.append(source[span[0] : span[1]])
    return bytes(header) + b"".join(body)


def merge_partial(
    row_type: RowType,
    old: bytes | memoryview,
    new: bytes | memoryview,
    target_indexes: Collection[int],
) -> bytes:
    """The row with the target columns taken from ``new`` and every other column from ``old``.

    The caller checks that the targets include the primary key (Fluss rejects the request
    otherwise); bytes are copied, never decoded, so nested values merge as well.
    """
    targets = frozenset(target_indexes)
    old_spans = field_spans(row_type, old)
    new_spans = field_spans(row_type, new)
    return _assemble(
        row_type,
        [(new, new_spans[i]) if i in targets else (old, old_spans[i]) for i in range(row_type.field_count)],
    )


def null_out(
    row_type: RowType,
    old: bytes | memoryview,
    target_indexes: Collection[int],
    primary_key_indexes: Collection[int],
) -> bytes | None:
    """A partial delete: null the target non-key columns of ``old``.

    Returns:
        The remaining row, or None when every non-key column would then be null, in which
        case the whole row is deleted.

    Raises:
        ValueError: a target non-key column is NOT NULL (Fluss rejects such a request).
    """
    targets = frozenset(target_indexes)
    keys = frozenset(primary_key_indexes)
    for index in targets - keys:
        if not row_type.fields[index].type.nullable:
            raise ValueError(f"partial delete of NOT NULL column {row_type.fields[index].name!r}")
    spans = field_spans(row_type, old)
    kept = [None if (i in targets and i not in keys) else span for i, span in enumerate(spans)]
    if all(span is None for i, span in enumerate(kept) if i not in keys):
        return None
    return _assemble(row_type, [(old, span) for span in kept])
