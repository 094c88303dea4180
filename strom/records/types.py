"""Fluss's logical type system, its JSON form, and its mapping to Arrow.

Types are immutable values: the schema, the row codecs and the Arrow conversion all key
their compiled state on them. The JSON form is the one Fluss stores in ``table_json`` and
``schema_json``; the Arrow mapping is the one the Rust client (pyfluss) computes for its own
decoding, so a batch built from ``to_arrow_type`` decodes on the client byte for byte.
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa

DECIMAL_PRECISION_MAX = 38
DECIMAL_COMPACT_PRECISION_MAX = 18  # unscaled value fits an i64
TIMESTAMP_COMPACT_PRECISION_MAX = 3  # only epoch millis stored
TIME_PRECISION_MAX = 9
FIELD_ID_UNASSIGNED = -1

# Arrow time unit for precisions 0..9, as both Fluss clients compute it.
TIME_UNIT_BY_PRECISION = ("s", "ms", "ms", "ms", "us", "us", "us", "ns", "ns", "ns")
assert len(TIME_UNIT_BY_PRECISION) == TIME_PRECISION_MAX + 1


class MetadataJsonError(ValueError):
    """JSON that is not a valid Fluss type, schema or descriptor; the message names the key."""


@dataclass(frozen=True, slots=True)
class DataType:
    """Base of every Fluss type; ``nullable`` is keyword-only so parameters stay positional."""

    nullable: bool = field(default=True, kw_only=True)
    type_root: ClassVar[str] = ""

    def copy(self, nullable: bool) -> DataType:
        """The same type with a different nullability (Java ``DataType.copy(boolean)``)."""
        return dataclasses.replace(self, nullable=nullable)

    def __str__(self) -> str:
        return type_to_string(self)


@dataclass(frozen=True, slots=True)
class BooleanType(DataType):
    type_root: ClassVar[str] = "BOOLEAN"


@dataclass(frozen=True, slots=True)
class TinyIntType(DataType):
    type_root: ClassVar[str] = "TINYINT"


@dataclass(frozen=True, slots=True)
class SmallIntType(DataType):
    type_root: ClassVar[str] = "SMALLINT"


@dataclass(frozen=True, slots=True)
class IntType(DataType):
    type_root: ClassVar[str] = "INTEGER"


@dataclass(frozen=True, slots=True)
class BigIntType(DataType):
    type_root: ClassVar[str] = "BIGINT"


@dataclass(frozen=True, slots=True)
class FloatType(DataType):
    type_root: ClassVar[str] = "FLOAT"


@dataclass(frozen=True, slots=True)
class DoubleType(DataType):
    type_root: ClassVar[str] = "DOUBLE"


@dataclass(frozen=True, slots=True)
class CharType(DataType):
    length: int = 1
    type_root: ClassVar[str] = "CHAR"

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"CHAR length must be at least 1, got {self.length}")


@dataclass(frozen=True, slots=True)
class StringType(DataType):
    type_root: ClassVar[str] = "STRING"


@dataclass(frozen=True, slots=True)
class DecimalType(DataType):
    precision: int = 10
    scale: int = 0
    type_root: ClassVar[str] = "DECIMAL"

    def __post_init__(self) -> None:
        if not 1 <= self.precision <= DECIMAL_PRECISION_MAX:
            raise ValueError(f"DECIMAL precision must be 1..38, got {self.precision}")
        if not 0 <= self.scale <= self.precision:
            raise ValueError(f"DECIMAL scale must be 0..{self.precision}, got {self.scale}")

    @property
    def is_compact(self) -> bool:
        """Whether the unscaled value is stored as an i64 rather than as big-endian bytes."""
        return self.precision <= DECIMAL_COMPACT_PRECISION_MAX


@dataclass(frozen=True, slots=True)
class DateType(DataType):
    type_root: ClassVar[str] = "DATE"


def _check_time_precision(kind: str, precision: int) -> None:
    if not 0 <= precision <= TIME_PRECISION_MAX:
        raise ValueError(f"{kind} precision must be 0..9, got {precision}")


@dataclass(frozen=True, slots=True)
class TimeType(DataType):
    precision: int = 0
    type_root: ClassVar[str] = "TIME_WITHOUT_TIME_ZONE"

    def __post_init__(self) -> None:
        _check_time_precision("TIME", self.precision)


@dataclass(frozen=True, slots=True)
class TimestampType(DataType):
    precision: int = 6
    type_root: ClassVar[str] = "TIMESTAMP_WITHOUT_TIME_ZONE"

    def __post_init__(self) -> None:
        _check_time_precision("TIMESTAMP", self.precision)

    @property
    def is_compact(self) -> bool:
        """Whether only epoch millis are stored (no nano-of-millisecond)."""
        return self.precision <= TIMESTAMP_COMPACT_PRECISION_MAX


@dataclass(frozen=True, slots=True)
class TimestampLtzType(DataType):
    precision: int = 6
    type_root: ClassVar[str] = "TIMESTAMP_WITH_LOCAL_TIME_ZONE"

    def __post_init__(self) -> None:
        _check_time_precision("TIMESTAMP_LTZ", self.precision)

    @property
    def is_compact(self) -> bool:
        """Whether only epoch millis are stored (no nano-of-millisecond)."""
        return self.precision <= TIMESTAMP_COMPACT_PRECISION_MAX


@dataclass(frozen=True, slots=True)
class BytesType(DataType):
    type_root: ClassVar[str] = "BYTES"


@dataclass(frozen=True, slots=True)
class BinaryType(DataType):
    length: int = 1
    type_root: ClassVar[str] = "BINARY"

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"BINARY length must be at least 1, got {self.length}")


@dataclass(frozen=True, slots=True)
class ArrayType(DataType):
    element: DataType
    type_root: ClassVar[str] = "ARRAY"


@dataclass(frozen=True, slots=True)
class MapType(DataType):
    """MAP; the key type is always made non-nullable, as both Java and Rust do on construction."""

    key: DataType
    value: DataType
    type_root: ClassVar[str] = "MAP"

    def __post_init__(self) -> None:
        if self.key.nullable:
            object.__setattr__(self, "key", self.key.copy(False))


@dataclass(frozen=True, slots=True)
class DataField:
    """A named field of a ROW; ``field_id`` is the schema-wide id Fluss assigns (-1 if none)."""

    name: str
    type: DataType
    description: str | None = None
    field_id: int = FIELD_ID_UNASSIGNED


@dataclass(frozen=True, slots=True)
class RowType(DataType):
    fields: tuple[DataField, ...]
    type_root: ClassVar[str] = "ROW"

    def __post_init__(self) -> None:
        if not isinstance(self.fields, tuple):
            object.__setattr__(self, "fields", tuple(self.fields))
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"ROW field names must be unique, got {names}")

    @classmethod
    def of(cls, *fields: tuple[str, DataType], nullable: bool = True) -> RowType:
        """Shorthand: ``RowType.of(("id", IntType()), ("name", StringType()))``."""
        return cls(tuple(DataField(name, t) for name, t in fields), nullable=nullable)

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def field_types(self) -> list[DataType]:
        return [f.type for f in self.fields]

    @property
    def field_count(self) -> int:
        return len(self.fields)

    def field_index(self, name: str) -> int:
        for index, f in enumerate(self.fields):
            if f.name == name:
                return index
        raise KeyError(f"no field {name!r} in {self}")


# ---------------------------------------------------------------------------------------
# Visitor (Java DataTypeVisitor)
# ---------------------------------------------------------------------------------------

R = TypeVar("R")


class DataTypeVisitor(Generic[R]):
    """One method per type, chosen by ``visit`` from the type's class (Fluss's ``DataTypeVisitor``).

    Codecs and mappings subclass this rather than repeat ``isinstance`` ladders over the type
    classes: the dispatch is one dict lookup, built once here, and a codec names only the types
    it handles. A type it leaves out goes to ``default``, which raises TypeError unless the
    subclass overrides it.
    """

    __slots__ = ()

    def visit(self, t: DataType) -> R:
        cls = type(t)
        method = _VISIT_METHODS.get(cls) or _inherited_visit_method(cls)
        visit: Callable[[DataType], R] = getattr(self, method)
        return visit(t)

    def default(self, t: DataType) -> R:
        raise TypeError(f"unsupported type for {type(self).__name__}: {t!r}")

    def visit_boolean(self, t: BooleanType) -> R:
        return self.default(t)

    def visit_tinyint(self, t: TinyIntType) -> R:
        return self.default(t)

    def visit_smallint(self, t: SmallIntType) -> R:
        return self.default(t)

    def visit_int(self, t: IntType) -> R:
        return self.default(t)

    def visit_bigint(self, t: BigIntType) -> R:
        return self.default(t)

    def visit_float(self, t: FloatType) -> R:
        return self.default(t)

    def visit_double(self, t: DoubleType) -> R:
        return self.default(t)

    def visit_char(self, t: CharType) -> R:
        return self.default(t)

    def visit_string(self, t: StringType) -> R:
        return self.default(t)

    def visit_decimal(self, t: DecimalType) -> R:
        return self.default(t)

    def visit_date(self, t: DateType) -> R:
        return self.default(t)

    def visit_time(self, t: TimeType) -> R:
        return self.default(t)

    def visit_timestamp(self, t: TimestampType) -> R:
        return self.default(t)

    def visit_timestamp_ltz(self, t: TimestampLtzType) -> R:
        return self.default(t)

    def visit_bytes(self, t: BytesType) -> R:
        return self.default(t)

    def visit_binary(self, t: BinaryType) -> R:
        return self.default(t)

    def visit_array(self, t: ArrayType) -> R:
        return self.default(t)

    def visit_map(self, t: MapType) -> R:
        return self.default(t)

    def visit_row(self, t: RowType) -> R:
        return self.default(t)


_VISIT_METHODS: dict[type[DataType], str] = {
    BooleanType: "visit_boolean",
    TinyIntType: "visit_tinyint",
    SmallIntType: "visit_smallint",
    IntType: "visit_int",
    BigIntType: "visit_bigint",
    FloatType: "visit_float",
    DoubleType: "visit_double",
    CharType: "visit_char",
    StringType: "visit_string",
    DecimalType: "visit_decimal",
    DateType: "visit_date",
    TimeType: "visit_time",
    TimestampType: "visit_timestamp",
    TimestampLtzType: "visit_timestamp_ltz",
    BytesType: "visit_bytes",
    BinaryType: "visit_binary",
    ArrayType: "visit_array",
    MapType: "visit_map",
    RowType: "visit_row",
}


def _inherited_visit_method(cls: type[DataType]) -> str:
    """The method of the nearest type class ``cls`` derives from (as ``isinstance`` would pick)."""
    for base in cls.__mro__:
        method = _VISIT_METHODS.get(base)
        if method is not None:
            return method
    return "default"


def is_compact(t: DataType) -> bool:
    """False only for DECIMAL(p > 18) and TIMESTAMP[_LTZ](p > 3), which change encoding."""
    if isinstance(t, (DecimalType, TimestampType, TimestampLtzType)):
        return t.is_compact
    return True


# ---------------------------------------------------------------------------------------
# Summary strings (for messages; Java asSummaryString style)
# ---------------------------------------------------------------------------------------


class _Summary(DataTypeVisitor[str]):
    """The summary string of a type, without its nullability."""

    __slots__ = ()

    def default(self, t: DataType) -> str:
        return t.type_root

    def visit_int(self, t: IntType) -> str:
        return "INT"

    def visit_char(self, t: CharType) -> str:
        return f"{t.type_root}({t.length})"

    def visit_binary(self, t: BinaryType) -> str:
        return f"{t.type_root}({t.length})"

    def visit_decimal(self, t: DecimalType) -> str:
        return f"DECIMAL({t.precision}, {t.scale})"

    def visit_time(self, t: TimeType) -> str:
        return f"TIME({t.precision})"

    def visit_timestamp(self, t: TimestampType) -> str:
        return f"TIMESTAMP({t.precision})"

    def visit_timestamp_ltz(self, t: TimestampLtzType) -> str:
        return f"TIMESTAMP_LTZ({t.precision})"

    def visit_array(self, t: ArrayType) -> str:
        return f"ARRAY<{t.element}>"

    def visit_map(self, t: MapType) -> str:
        return f"MAP<{t.key}, {t.value}>"

    def visit_row(self, t: RowType) -> str:
        return "ROW<" + ", ".join(f"{f.name} {f.type}" for f in t.fields) + ">"


_SUMMARY = _Summary()


def type_to_string(t: DataType) -> str:
    """Human-readable form, e.g. ``MAP<STRING NOT NULL, INT>``."""
    text = _SUMMARY.visit(t)
    return text if t.nullable else text + " NOT NULL"


# ---------------------------------------------------------------------------------------
# JSON (Java DataTypeJsonSerde)
# ---------------------------------------------------------------------------------------

_SIMPLE_BY_ROOT: dict[str, type[DataType]] = {
    cls.type_root: cls
    for cls in (
        BooleanType,
        TinyIntType,
        SmallIntType,
        IntType,
        BigIntType,
        FloatType,
        DoubleType,
        StringType,
        DateType,
        BytesType,
    )
}


class _JsonParameters(DataTypeVisitor[dict[str, Any]]):
    """The keys after ``type`` and ``nullable`` in a type's JSON object, in Java's order."""

    __slots__ = ()

    def default(self, t: DataType) -> dict[str, Any]:
        return {}

    def visit_char(self, t: CharType) -> dict[str, Any]:
        return {"length": t.length}

    def visit_binary(self, t: BinaryType) -> dict[str, Any]:
        return {"length": t.length}

    def visit_decimal(self, t: DecimalType) -> dict[str, Any]:
        return {"precision": t.precision, "scale": t.scale}

    def visit_time(self, t: TimeType) -> dict[str, Any]:
        return {"precision": t.precision}

    def visit_timestamp(self, t: TimestampType) -> dict[str, Any]:
        return {"precision": t.precision}

    def visit_timestamp_ltz(self, t: TimestampLtzType) -> dict[str, Any]:
        return {"precision": t.precision}

    def visit_array(self, t: ArrayType) -> dict[str, Any]:
        return {"element_type": data_type_to_json(t.element)}

    def visit_map(self, t: MapType) -> dict[str, Any]:
        return {"key_type": data_type_to_json(t.key), "value_type": data_type_to_json(t.value)}

    def visit_row(self, t: RowType) -> dict[str, Any]:
        return {"fields": [_data_field_to_json(f) for f in t.fields]}


_JSON_PARAMETERS = _JsonParameters()


def data_type_to_json(t: DataType) -> dict[str, Any]:
    """The JSON object Fluss writes for a type; key order follows Java's serializer."""
    obj: dict[str, Any] = {"type": t.type_root}
    if not t.nullable:
        obj["nullable"] = False
    obj.update(_JSON_PARAMETERS.visit(t))
    return obj


def _data_field_to_json(f: DataField) -> dict[str, Any]:
    obj: dict[str, Any] = {"name": f.name, "field_type": data_type_to_json(f.type)}
    if f.description is not None:
        obj["description"] = f.description
    obj["field_id"] = f.field_id
    return obj


def _required(obj: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in obj:
        raise MetadataJsonError(f"{what}: missing required key {key!r} in {dict(obj)!r}")
    return obj[key]


def _int_param(obj: Mapping[str, Any], key: str, default: int | None, what: str) -> int:
    value = obj.get(key, default) if default is not None else _required(obj, key, what)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MetadataJsonError(f"{what}: {key!r} must be an integer, got {value!r}")
    return value


def data_type_from_json(obj: Mapping[str, Any]) -> DataType:
    """Parse a type object; defaults follow the clients (TIME 0, TIMESTAMP 6, scale 0).

    Raises:
        MetadataJsonError: the object is not a valid Fluss type (a ValueError).
    """
    if not isinstance(obj, Mapping):
        raise MetadataJsonError(f"data type must be a JSON object, got {obj!r}")
    root = _required(obj, "type", "data type")
    if not isinstance(root, str):
        raise MetadataJsonError(f"data type: 'type' must be a string, got {root!r}")
    nullable = obj.get("nullable", True)
    if not isinstance(nullable, bool):
        raise MetadataJsonError(f"data type: 'nullable' must be a boolean, got {nullable!r}")
    what = f"{root} type"
    simple = _SIMPLE_BY_ROOT.get(root)
    if simple is not None:
        return simple(nullable=nullable)
    if root == "CHAR":
        return CharType(_int_param(obj, "length", None, what), nullable=nullable)
    if root == "BINARY":
        return BinaryType(_int_param(obj, "length", 1, what), nullable=nullable)
    if root == "DECIMAL":
        precision = _int_param(obj, "precision", None, what)
        return DecimalType(precision, _int_param(obj, "scale", 0, what), nullable=nullable)
    if root == "TIME_WITHOUT_TIME_ZONE":
        return TimeType(_int_param(obj, "precision", 0, what), nullable=nullable)
    if root == "TIMESTAMP_WITHOUT_TIME_ZONE":
        return TimestampType(_int_param(obj, "precision", 6, what), nullable=nullable)
    if root == "TIMESTAMP_WITH_LOCAL_TIME_ZONE":
        return TimestampLtzType(_int_param(obj, "precision", 6, what), nullable=nullable)
    if root == "ARRAY":
        element = data_type_from_json(_required(obj, "element_type", what))
        return ArrayType(element, nullable=nullable)
    if root == "MAP":
        key = data_type_from_json(_required(obj, "key_type", what))
        value = data_type_from_json(_required(obj, "value_type", what))
        return MapType(key, value, nullable=nullable)
    if root == "ROW":
        fields = _required(obj, "fields", what)
        if not isinstance(fields, list):
            raise MetadataJsonError(f"ROW type: 'fields' must be an array, got {fields!r}")
        return RowType(tuple(_data_field_from_json(f) for f in fields), nullable=nullable)
    raise MetadataJsonError(f"unknown data type root {root!r}")


def _data_field_from_json(obj: Mapping[str, Any]) -> DataField:
    if not isinstance(obj, Mapping):
        raise MetadataJsonError(f"ROW field must be a JSON object, got {obj!r}")
    name = _required(obj, "name", "ROW field")
    if not isinstance(name, str):
        raise MetadataJsonError(f"ROW field: 'name' must be a string, got {name!r}")
    field_type = data_type_from_json(_required(obj, "field_type", f"ROW field {name!r}"))
    description = obj.get("description")
    field_id = _int_param(obj, "field_id", FIELD_ID_UNASSIGNED, f"ROW field {name!r}")
    return DataField(name, field_type, description, field_id)


# ---------------------------------------------------------------------------------------
# Arrow (Rust client record/arrow.rs `to_arrow_type` / `from_arrow_type`)
# ---------------------------------------------------------------------------------------

def time_unit(precision: int) -> str:
    """Arrow unit for a TIME/TIMESTAMP precision: s, ms, us or ns."""
    return TIME_UNIT_BY_PRECISION[precision]


class _ArrowTypes(DataTypeVisitor[pa.DataType]):
    """The Arrow type the client decodes each Fluss type with."""

    __slots__ = ()

    def default(self, t: DataType) -> pa.DataType:
        raise TypeError(f"no Arrow mapping for {t!r}")

    def visit_boolean(self, t: BooleanType) -> pa.DataType:
        return pa.bool_()

    def visit_tinyint(self, t: TinyIntType) -> pa.DataType:
        return pa.int8()

    def visit_smallint(self, t: SmallIntType) -> pa.DataType:
        return pa.int16()

    def visit_int(self, t: IntType) -> pa.DataType:
        return pa.int32()

    def visit_bigint(self, t: BigIntType) -> pa.DataType:
        return pa.int64()

    def visit_float(self, t: FloatType) -> pa.DataType:
        return pa.float32()

    def visit_double(self, t: DoubleType) -> pa.DataType:
        return pa.float64()

    def visit_char(self, t: CharType) -> pa.DataType:
        return pa.utf8()

    def visit_string(self, t: StringType) -> pa.DataType:
        return pa.utf8()

    def visit_bytes(self, t: BytesType) -> pa.DataType:
        return pa.binary()

    def visit_date(self, t: DateType) -> pa.DataType:
        return pa.date32()

    def visit_binary(self, t: BinaryType) -> pa.DataType:
        return pa.binary(t.length)

    def visit_decimal(self, t: DecimalType) -> pa.DataType:
        return pa.decimal128(t.precision, t.scale)

    def visit_time(self, t: TimeType) -> pa.DataType:
        unit = time_unit(t.precision)
        return pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit)

    def visit_timestamp(self, t: TimestampType) -> pa.DataType:
        return pa.timestamp(time_unit(t.precision))

    def visit_timestamp_ltz(self, t: TimestampLtzType) -> pa.DataType:
        return pa.timestamp(time_unit(t.precision), tz="UTC")

    def visit_array(self, t: ArrayType) -> pa.DataType:
        return pa.list_(to_arrow_field("item", t.element))

    def visit_map(self, t: MapType) -> pa.DataType:
        return pa.map_(to_arrow_field("key", t.key), to_arrow_field("value", t.value))

    def visit_row(self, t: RowType) -> pa.DataType:
        return pa.struct([to_arrow_field(f.name, f.type) for f in t.fields])


_ARROW_TYPES = _ArrowTypes()


def to_arrow_type(t: DataType) -> pa.DataType:
    """The Arrow type the client decodes this Fluss type with (physical layout must match)."""
    return _ARROW_TYPES.visit(t)


def to_arrow_field(name: str, t: DataType) -> pa.Field:
    """An Arrow field whose nullability follows the Fluss type."""
    return pa.field(name, to_arrow_type(t), nullable=t.nullable)


def to_arrow_schema(row_type: RowType) -> pa.Schema:
    return pa.schema([to_arrow_field(f.name, f.type) for f in row_type.fields])


_TIME_PRECISION_BY_UNIT = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def from_arrow_type(arrow_type: pa.DataType, nullable: bool = True) -> DataType:
    """The Fluss type for an Arrow type, as the client maps a DataFrame's schema.

    Unsigned integers map to the signed type of the same width; large variants, date64 and
    dictionary encodings are accepted.

    Raises:
        TypeError: Arrow type with no Fluss equivalent.
    """
    if pa.types.is_dictionary(arrow_type):  # e.g. a pandas categorical
        return from_arrow_type(arrow_type.value_type, nullable)
    if pa.types.is_boolean(arrow_type):
        return BooleanType(nullable=nullable)
    if pa.types.is_integer(arrow_type):
        by_width = {8: TinyIntType, 16: SmallIntType, 32: IntType, 64: BigIntType}
        return by_width[arrow_type.bit_width](nullable=nullable)
    if pa.types.is_float32(arrow_type):
        return FloatType(nullable=nullable)
    if pa.types.is_float64(arrow_type):
        return DoubleType(nullable=nullable)
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return StringType(nullable=nullable)
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return BytesType(nullable=nullable)
    if pa.types.is_fixed_size_binary(arrow_type):
        return BinaryType(arrow_type.byte_width, nullable=nullable)
    if pa.types.is_decimal(arrow_type) and arrow_type.precision <= DECIMAL_PRECISION_MAX:
        return DecimalType(arrow_type.precision, arrow_type.scale, nullable=nullable)
    if pa.types.is_date(arrow_type):
        return DateType(nullable=nullable)
    if pa.types.is_time(arrow_type):
        return TimeType(_TIME_PRECISION_BY_UNIT[arrow_type.unit], nullable=nullable)
    if pa.types.is_timestamp(arrow_type):
        precision = _TIME_PRECISION_BY_UNIT[arrow_type.unit]
        if arrow_type.tz is not None:
            return TimestampLtzType(precision, nullable=nullable)
        return TimestampType(precision, nullable=nullable)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return ArrayType(from_arrow_field(arrow_type.value_field), nullable=nullable)
    if pa.types.is_map(arrow_type):
        key = from_arrow_field(arrow_type.key_field)
        return MapType(key, from_arrow_field(arrow_type.item_field), nullable=nullable)
    if pa.types.is_struct(arrow_type):
        fields = tuple(
            DataField(arrow_type.field(i).name, from_arrow_field(arrow_type.field(i)))
            for i in range(arrow_type.num_fields)
        )
        return RowType(fields, nullable=nullable)
    raise TypeError(f"no Fluss type for Arrow type {arrow_type}")


def from_arrow_field(arrow_field: pa.Field) -> DataType:
    """Like ``from_arrow_type`` but nullability comes from the field."""
    return from_arrow_type(arrow_field.type, nullable=arrow_field.nullable)


# ---------------------------------------------------------------------------------------
# Internal value representation
#
# Codecs produce and accept values shaped to feed Arrow directly: DECIMAL is
# decimal.Decimal, DATE is days since epoch, TIME/TIMESTAMP/TIMESTAMP_LTZ are ints in the
# Arrow unit of their precision (``time_unit``). Fluss itself stores TIME as millis of day
# and timestamps as epoch millis plus nano-of-millisecond; these helpers convert.
# ---------------------------------------------------------------------------------------

_DECIMAL_CONTEXT = decimal.Context(prec=2 * DECIMAL_PRECISION_MAX + 2)
_NANOS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_POW10 = tuple(10**i for i in range(DECIMAL_PRECISION_MAX + 1))


def decimal_to_unscaled(value: decimal.Decimal | int, precision: int, scale: int) -> int:
    """The unscaled integer of ``value`` at ``scale``, rounded HALF_UP as Java's Decimal does.

    Raises:
        ValueError: not finite, or more than ``precision`` digits after rescaling.
    """
    if isinstance(value, int):
        unscaled = value * _POW10[scale]
    else:
        d = value if isinstance(value, decimal.Decimal) else decimal.Decimal(str(value))
        if not d.is_finite():
            raise ValueError(f"DECIMAL value must be finite, got {value!r}")
        scaled = d.scaleb(scale, _DECIMAL_CONTEXT)
        unscaled = int(scaled.to_integral_value(decimal.ROUND_HALF_UP, _DECIMAL_CONTEXT))
    if not -_POW10[precision] < unscaled < _POW10[precision]:
        raise ValueError(f"{value!r} does not fit DECIMAL({precision}, {scale})")
    return unscaled


def decimal_from_unscaled(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(unscaled).scaleb(-scale, _DECIMAL_CONTEXT)


def unscaled_to_bytes(unscaled: int) -> bytes:
    """Minimal big-endian two's complement, as Java ``BigInteger.toByteArray`` writes it."""
    magnitude_bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(magnitude_bits // 8 + 1, "big", signed=True)


def unscaled_from_bytes(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _truncating_div(value: int, divisor: int) -> int:
    # Java integer division truncates toward zero; Fluss's Arrow writers rely on it.
    return value // divisor if value >= 0 else -((-value) // divisor)


def timestamp_to_parts(value: int, precision: int) -> tuple[int, int]:
    """(epoch millis, nano-of-millisecond) for a timestamp in the unit of ``precision``."""
    nanos_per_unit = _NANOS_PER_UNIT[TIME_UNIT_BY_PRECISION[precision]]
    if nanos_per_unit >= 1_000_000:
        return value * (nanos_per_unit // 1_000_000), 0
    millis, remainder = divmod(value, 1_000_000 // nanos_per_unit)
    return millis, remainder * nanos_per_unit


def timestamp_from_parts(millis: int, nano_of_milli: int, precision: int) -> int:
    """Inverse of ``timestamp_to_parts``; seconds truncate toward zero like Fluss's writer."""
    nanos_per_unit = _NANOS_PER_UNIT[TIME_UNIT_BY_PRECISION[precision]]
    if nanos_per_unit == 1_000_000_000:
        return _truncating_div(millis, 1000)
    if nanos_per_unit == 1_000_000:
        return millis
    return millis * (1_000_000 // nanos_per_unit) + nano_of_milli // nanos_per_unit


def time_to_millis(value: int, precision: int) -> int:
    """Millis of day for a TIME value in the unit of ``precision`` (sub-millis dropped)."""
    nanos_per_unit = _NANOS_PER_UNIT[TIME_UNIT_BY_PRECISION[precision]]
    if nanos_per_unit >= 1_000_000:
        return value * (nanos_per_unit // 1_000_000)
    return value // (1_000_000 // nanos_per_unit)


def time_from_millis(millis: int, precision: int) -> int:
    nanos_per_unit = _NANOS_PER_UNIT[TIME_UNIT_BY_PRECISION[precision]]
    if nanos_per_unit == 1_000_000_000:
        return _truncating_div(millis, 1000)
    return millis * (1_000_000 // nanos_per_unit)
