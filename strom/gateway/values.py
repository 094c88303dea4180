"""JSON on the REST side, Fluss types and Arrow on strom's: type names, row values, and back.

A column's type is a Fluss type name as strom prints it (``INT``, ``BIGINT NOT NULL``, ``DECIMAL(10, 2)``,
``TIMESTAMP_LTZ(3)``, ``ARRAY<STRING>``, ``MAP<STRING, INT>``, ``ROW<a INT, b STRING>``) or Fluss's JSON
type object (``{"type": "INTEGER"}``). Row values follow one JSON form per type: numbers for the numeric
types, strings for DECIMAL (a number is accepted too), ISO-8601 strings for DATE, TIME and TIMESTAMP (an
integer is milliseconds since the epoch for the timestamps), base64 strings for BYTES and BINARY, arrays for
ARRAY, objects for ROW and MAP (a MAP whose keys are not strings takes ``[[key, value], ...]``).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from strom.records.types import (
    ArrayType,
    BigIntType,
    BinaryType,
    BooleanType,
    BytesType,
    CharType,
    DataField,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntType,
    MapType,
    RowType,
    SmallIntType,
    StringType,
    TimestampLtzType,
    TimestampType,
    TimeType,
    TinyIntType,
    data_type_from_json,
)


class ValueConversionError(ValueError):
    """A JSON value (or type name) that does not convert; the message names the column."""


# ---- type names ----

_SIMPLE: dict[str, type[DataType]] = {
    "BOOLEAN": BooleanType, "TINYINT": TinyIntType, "SMALLINT": SmallIntType, "INT": IntType,
    "INTEGER": IntType, "BIGINT": BigIntType, "FLOAT": FloatType, "DOUBLE": DoubleType, "STRING": StringType,
    "DATE": DateType, "BYTES": BytesType,
}
_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(\d+)|(`(?:[^`]|``)*`)|(.))")


class _TypeParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        for match in _TOKEN.finditer(text):
            word, number, quoted, other = match.groups()
            token = word or number or quoted or other
            if token and not token.isspace():
                self.tokens.append(token)
        self.position = 0

    def fail(self, why: str) -> ValueConversionError:
        return ValueConversionError(f"invalid type {self.text!r}: {why}")

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token.upper() != expected):
            raise self.fail(f"expected {expected or 'more'} at {token or 'the end'!r}")
        self.position += 1
        return token

    def number(self) -> int:
        token = self.take()
        if not token.isdigit():
            raise self.fail(f"expected a number, got {token!r}")
        return int(token)

    def parameters(self, count: int) -> list[int]:
        if self.peek() != "(":
            return []
        self.take("(")
        values = [self.number()]
        while len(values) < count and self.peek() == ",":
            self.take(",")
            values.append(self.number())
        self.take(")")
        return values

    def parse(self) -> DataType:
        data_type = self.data_type()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()!r}")
        return data_type

    def data_type(self) -> DataType:
        root = self.take().upper()
        result: DataType
        if root in _SIMPLE:
            result = _SIMPLE[root]()
        elif root == "CHAR":
            result = CharType(*self.parameters(1))
        elif root == "BINARY":
            result = BinaryType(*self.parameters(1))
        elif root == "DECIMAL":
            result = DecimalType(*self.parameters(2))
        elif root == "TIME":
            result = TimeType(*self.parameters(1))
        elif root in ("TIMESTAMP", "TIMESTAMP_LTZ"):
            precision = self.parameters(1)
            if root == "TIMESTAMP" and self.peek() is not None and self.peek().upper() == "WITH":  # type: ignore[union-attr]
                for word in ("WITH", "LOCAL", "TIME", "ZONE"):
                    self.take(word)
                root = "TIMESTAMP_LTZ"
            result = TimestampLtzType(*precision) if root == "TIMESTAMP_LTZ" else TimestampType(*precision)
        elif root == "ARRAY":
            self.take("<")
            element = self.data_type()
            self.take(">")
            result = ArrayType(element)
        elif root == "MAP":
            self.take("<")
            key = self.data_type()
            self.take(",")
            value = self.data_type()
            self.take(">")
            result = MapType(key, value)
        elif root == "ROW":
            self.take("<")
            fields = [self.row_field()]
            while self.peek() == ",":
                self.take(",")
                fields.append(self.row_field())
            self.take(">")
            result = RowType(tuple(fields))
        else:
            raise self.fail(f"unknown type {root!r}")
        if self.peek() is not None and self.peek().upper() == "NOT":  # type: ignore[union-attr]
            self.take("NOT")
            self.take("NULL")
            result = result.copy(False)
        elif self.peek() is not None and self.peek().upper() == "NULL":  # type: ignore[union-attr]
            self.take("NULL")
        return result

    def row_field(self) -> DataField:
        name = self.take()
        if name.startswith("`"):
            name = name[1:-1].replace("``", "`")
        return DataField(name, self.data_type())


def parse_type(spec: Any) -> DataType:
    """A column type from its name (``"DECIMAL(10, 2) NOT NULL"``) or Fluss's JSON type object.

    Raises:
        ValueConversionError: neither a known type name nor a valid type object.
    """
    if isinstance(spec, str):
        try:
            return _TypeParser(spec).parse()
        except ValueConversionError:
            raise
        except ValueError as exc:  # a type's own checks (precision out of range…)
            raise ValueConversionError(f"invalid type {spec!r}: {exc}") from None
    if isinstance(spec, Mapping):
        try:
            return data_type_from_json(spec)
        except ValueError as exc:
            raise ValueConversionError(f"invalid type {dict(spec)!r}: {exc}") from None
    raise ValueConversionError(f"a column type is a type name or a type object, got {spec!r}")


# ---- JSON values → Arrow ----

def _what(path: str) -> str:
    return f"column {path!r}"


def _from_json(value: Any, arrow_type: pa.DataType, path: str) -> Any:
    """The Python value pyarrow builds ``arrow_type`` from, checked strictly (no silent coercion)."""
    if value is None:
        return None
    if pa.types.is_boolean(arrow_type):
        if isinstance(value, bool):
            return value
    elif pa.types.is_integer(arrow_type):
        if isinstance(value, int) and not isinstance(value, bool):
            info = _INT_RANGES[arrow_type.bit_width]
            if not info[0] <= value <= info[1]:
                raise ValueConversionError(f"{_what(path)}: {value} is out of range for {arrow_type}")
            return value
    elif pa.types.is_floating(arrow_type):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
            return float(value.replace("Infinity", "inf"))
    elif pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        if isinstance(value, str):
            return value
    elif pa.types.is_decimal(arrow_type):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            try:
                number = decimal.Decimal(str(value))
            except decimal.InvalidOperation:
                raise ValueConversionError(f"{_what(path)}: {value!r} is not a decimal number") from None
            if not number.is_finite():
                raise ValueConversionError(f"{_what(path)}: {value!r} is not a finite decimal number")
            return number
    elif pa.types.is_date(arrow_type):
        if isinstance(value, str):
            try:
                return datetime.date.fromisoformat(value)
            except ValueError:
                raise ValueConversionError(f"{_what(path)}: {value!r} is not an ISO-8601 date") from None
    elif pa.types.is_time(arrow_type):
        if isinstance(value, str):
            try:
                return datetime.time.fromisoformat(value)
            except ValueError:
                raise ValueConversionError(f"{_what(path)}: {value!r} is not an ISO-8601 time") from None
    elif pa.types.is_timestamp(arrow_type):
        return _timestamp(value, arrow_type, path)
    elif pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) or pa.types.is_fixed_size_binary(
        arrow_type
    ):
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueConversionError(f"{_what(path)}: {value!r} is not base64") from None
    elif pa.types.is_map(arrow_type):
        return _map(value, arrow_type, path)
    elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        if isinstance(value, list):
            return [_from_json(item, arrow_type.value_type, f"{path}[{i}]") for i, item in enumerate(value)]
    elif pa.types.is_struct(arrow_type):
        if isinstance(value, Mapping):
            names = {arrow_type.field(i).name for i in range(arrow_type.num_fields)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise ValueConversionError(f"{_what(path)}: no fields {unknown}")
            return {
                field.name: _from_json(value.get(field.name), field.type, f"{path}.{field.name}")
                for field in (arrow_type.field(i) for i in range(arrow_type.num_fields))
            }
    else:
        return value
    raise ValueConversionError(f"{_what(path)}: {value!r} is not a valid {_json_form(arrow_type)}")


_INT_RANGES = {bits: (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) for bits in (8, 16, 32, 64)}


def _json_form(arrow_type: pa.DataType) -> str:
    if pa.types.is_boolean(arrow_type):
        return "boolean"
    if pa.types.is_integer(arrow_type):
        return "integer"
    if pa.types.is_floating(arrow_type):
        return "number"
    if pa.types.is_timestamp(arrow_type):
        return "timestamp (ISO-8601 string or epoch milliseconds)"
    if pa.types.is_binary(arrow_type) or pa.types.is_fixed_size_binary(arrow_type):
        return "base64 string"
    if pa.types.is_list(arrow_type):
        return "array"
    if pa.types.is_struct(arrow_type) or pa.types.is_map(arrow_type):
        return "object"
    if pa.types.is_decimal(arrow_type):
        return "decimal (string or number)"
    return "string"


def _timestamp(value: Any, arrow_type: pa.TimestampType, path: str) -> Any:
    with_zone = arrow_type.tz is not None
    if isinstance(value, int) and not isinstance(value, bool):
        moment = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=value)
        return moment if with_zone else moment.replace(tzinfo=None)
    if isinstance(value, str):
        try:
            moment = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise ValueConversionError(f"{_what(path)}: {value!r} is not an ISO-8601 timestamp") from None
        if with_zone:
            return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)
        if moment.tzinfo is not None:
            raise ValueConversionError(f"{_what(path)}: {value!r} has a time zone; the column's TIMESTAMP has none")
        return moment
    raise ValueConversionError(f"{_what(path)}: {value!r} is not a valid {_json_form(arrow_type)}")


def _map(value: Any, arrow_type: pa.MapType, path: str) -> Any:
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        pairs = [(p[0], p[1]) for p in value]
    else:
        raise ValueConversionError(f"{_what(path)}: {value!r} is not a valid map (an object or [[key, value], ...])")
    return [
        (_from_json(k, arrow_type.key_type, f"{path}.key"), _from_json(v, arrow_type.item_type, f"{path}[{k!r}]"))
        for k, v in pairs
    ]


def rows_to_arrow(schema: pa.Schema, rows: Any, what: str = "rows") -> pa.Table:
    """A table of ``schema`` from JSON objects (missing columns are null).

    Raises:
        ValueConversionError: not a list of objects, an unknown column, or a value of the wrong form.
    """
    if not isinstance(rows, list):
        raise ValueConversionError(f"{what!r} must be an array of objects")
    names = set(schema.names)
    converted = []
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueConversionError(f"{what}[{index}] must be an object, got {row!r}")
        unknown = sorted(set(row) - names)
        if unknown:
            raise ValueConversionError(f"{what}[{index}]: the table has no columns {unknown}")
        converted.append({
            field.name: _from_json(row.get(field.name), field.type, field.name) for field in schema if field.name in row
        })
    nullable = pa.schema([field.with_nullable(True) for field in schema])
    try:
        table = pa.Table.from_pylist(converted, schema=nullable)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise ValueConversionError(f"{what}: {exc}") from None
    for field in schema:
        if not field.nullable and table.column(field.name).null_count:
            raise ValueConversionError(f"{what}: column {field.name!r} is NOT NULL but a row leaves it null")
    return table


def keys_to_python(schema: pa.Schema, key_names: Sequence[str], keys: Any) -> list[dict[str, Any]]:
    """Key objects (or arrays in ``key_names`` order) with each value converted for its column.

    Raises:
        ValueConversionError: a missing or unknown key column, or a value of the wrong form.
    """
    if not isinstance(keys, list):
        raise ValueConversionError("'keys' must be an array")
    result = []
    for index, key in enumerate(keys):
        if isinstance(key, list):
            if len(key) != len(key_names):
                raise ValueConversionError(f"keys[{index}] must have {len(key_names)} values {list(key_names)}")
            key = dict(zip(key_names, key, strict=True))
        if not isinstance(key, Mapping):
            raise ValueConversionError(f"keys[{index}] must be an object or an array, got {key!r}")
        extra = sorted(set(key) - set(key_names))
        missing = [name for name in key_names if key.get(name) is None]
        if extra or missing:
            raise ValueConversionError(
                f"keys[{index}] must hold exactly the key columns {list(key_names)}"
                + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else "")
            )
        result.append({name: _from_json(key[name], schema.field(name).type, name) for name in key_names})
    return result


# ---- Python values (from strom's readers) → JSON ----

def to_json(value: Any) -> Any:
    """A JSON-ready value: ISO-8601 for dates and times, strings for decimals, base64 for bytes."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return [[to_json(k), to_json(v)] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        pairs = value and all(isinstance(p, tuple) and len(p) == 2 for p in value)  # an Arrow map's
        if pairs and all(isinstance(p[0], str) for p in value):
            return {p[0]: to_json(p[1]) for p in value}
        return [to_json(item) for item in value]
    return str(value)
