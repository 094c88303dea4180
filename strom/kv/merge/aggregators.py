"""Fluss's field aggregate functions for the ``aggregation`` merge engine, one small function each.

An aggregator folds a new input into a column's accumulator: ``aggregate(accumulator, value) -> value``,
on the Python values the row codecs produce (int, float, Decimal, str, bytes, bool). Except for
``last_value`` they ignore nulls: a null input keeps the accumulator, a null accumulator takes the input.
Arithmetic follows Java's, as Fluss computes it: integer sums and products wrap around at the column's
width, FLOAT is rounded to 32 bits after each step, a DECIMAL result is rounded half-up to the column's
scale and becomes null if it no longer fits the precision.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyroaring

from strom.errors import BitmapFormatError, InvalidConfigError
from strom.records.types import DataType, DecimalType

Aggregator = Callable[[Any, Any], Any]

DELIMITER_PARAMETER = "delimiter"
DEFAULT_DELIMITER = ","
_INTEGER_BITS = {"TINYINT": 8, "SMALLINT": 16, "INTEGER": 32, "BIGINT": 64}
NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "FLOAT", "DOUBLE", "DECIMAL")
ORDERED_TYPES = (
    "CHAR", "STRING", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "FLOAT", "DOUBLE", "DECIMAL", "DATE",
    "TIME_WITHOUT_TIME_ZONE", "TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE",
)
ANY_TYPE = None
"""Marks a function that accepts every column type."""


def _wrap(bits: int) -> Callable[[int], int]:
    """Two's-complement wrap-around, as Java's byte/short/int/long arithmetic overflows."""
    half, full = 1 << (bits - 1), 1 << bits
    return lambda value: (value + half) % full - half


def _fit_decimal(t: DecimalType) -> Callable[[decimal.Decimal], decimal.Decimal | None]:
    exponent = decimal.Decimal(1).scaleb(-t.scale)
    context = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_UP)
    limit = decimal.Decimal(10) ** (t.precision - t.scale)

    def fit(value: decimal.Decimal) -> decimal.Decimal | None:
        rounded = value.quantize(exponent, context=context)
        return rounded if abs(rounded) < limit else None

    return fit


def _arithmetic(t: DataType, operation: Callable[[Any, Any], Any]) -> Aggregator:
    """``operation`` in the column type's own arithmetic."""
    root = t.type_root
    if root in _INTEGER_BITS:
        wrap = _wrap(_INTEGER_BITS[root])
        return lambda a, b: wrap(operation(a, b))
    if root == "FLOAT":
        return lambda a, b: float(operation(np.float32(a), np.float32(b)))
    if root == "DECIMAL":
        assert isinstance(t, DecimalType)
        fit = _fit_decimal(t)
        context = decimal.Context(prec=80)
        return lambda a, b: fit(context.create_decimal(operation(a, b)))
    assert root == "DOUBLE", root
    return operation


def _sum(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return _arithmetic(t, lambda a, b: a + b)


def _product(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return _arithmetic(t, lambda a, b: a * b)


def _max(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return lambda a, b: b if a < b else a


def _min(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return lambda a, b: a if a < b else b


def _listagg(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    delimiter = parameters.get(DELIMITER_PARAMETER, DEFAULT_DELIMITER)
    return lambda a, b: f"{a}{delimiter}{b}"


def _bool_and(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return lambda a, b: a and b


def _bool_or(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return lambda a, b: a or b


def _bitmap_union(bitmap_class: Any, width: int) -> Aggregator:
    def union(a: bytes, b: bytes) -> bytes:
        try:
            merged = bitmap_class.deserialize(a) | bitmap_class.deserialize(b)
        except Exception as exc:  # pyroaring raises ValueError/RuntimeError/MemoryError on foreign bytes
            raise BitmapFormatError(f"rbm{width}: a value is not a serialized {width}-bit roaring bitmap: {exc}") from exc
        merged.run_optimize()  # as Fluss serializes: run containers where they are smaller
        return bytes(merged.serialize())

    return union


def _rbm32(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return _bitmap_union(pyroaring.BitMap, 32)


def _rbm64(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return _bitmap_union(pyroaring.BitMap64, 64)


def _ignoring_nulls(combine: Aggregator) -> Aggregator:
    """A null on either side yields the other side; only two non-nulls are combined."""

    def aggregate(accumulator: Any, value: Any) -> Any:
        if accumulator is None:
            return value
        if value is None:
            return accumulator
        return combine(accumulator, value)

    return aggregate


def _last_value(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return lambda accumulator, value: value


def _keep_first(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    """first_value and first_value_ignore_nulls alike: Fluss's server keeps the accumulator unless it is
    null, so a null first value is replaced by the next non-null one in both (its docs say otherwise)."""
    return lambda accumulator, value: value if accumulator is None else accumulator


def _last_non_null(t: DataType, parameters: Mapping[str, str]) -> Aggregator:
    return lambda accumulator, value: accumulator if value is None else value


_Factory = Callable[[DataType, Mapping[str, str]], Aggregator]
FUNCTIONS: dict[str, tuple[_Factory, tuple[str, ...] | None, tuple[str, ...]]] = {
    # name: (factory, the column type roots it accepts (None: all), the parameters it takes)
    "sum": (lambda t, p: _ignoring_nulls(_sum(t, p)), NUMERIC_TYPES, ()),
    "product": (lambda t, p: _ignoring_nulls(_product(t, p)), NUMERIC_TYPES, ()),
    "max": (lambda t, p: _ignoring_nulls(_max(t, p)), ORDERED_TYPES, ()),
    "min": (lambda t, p: _ignoring_nulls(_min(t, p)), ORDERED_TYPES, ()),
    "last_value": (_last_value, ANY_TYPE, ()),
    "last_value_ignore_nulls": (_last_non_null, ANY_TYPE, ()),
    "first_value": (_keep_first, ANY_TYPE, ()),
    "first_value_ignore_nulls": (_keep_first, ANY_TYPE, ()),
    "listagg": (lambda t, p: _ignoring_nulls(_listagg(t, p)), ("STRING", "CHAR"), (DELIMITER_PARAMETER,)),
    "string_agg": (lambda t, p: _ignoring_nulls(_listagg(t, p)), ("STRING", "CHAR"), (DELIMITER_PARAMETER,)),
    "bool_and": (lambda t, p: _ignoring_nulls(_bool_and(t, p)), ("BOOLEAN",), ()),
    "bool_or": (lambda t, p: _ignoring_nulls(_bool_or(t, p)), ("BOOLEAN",), ()),
    "rbm32": (lambda t, p: _ignoring_nulls(_rbm32(t, p)), ("BYTES",), ()),
    "rbm64": (lambda t, p: _ignoring_nulls(_rbm64(t, p)), ("BYTES",), ()),
}
DEFAULT_FUNCTION = "last_value_ignore_nulls"
"""What a non-key column without a function does (Fluss's default)."""
KEY_FUNCTION = "last_value"
"""Primary-key columns never aggregate: the key of the new row is the key of the old one."""


def normalize_name(name: str) -> str:
    """Fluss accepts any case and '-' for '_' (``Last-Value``)."""
    return name.strip().replace("-", "_").lower()


def check_function(name: str, column_type: DataType, parameters: Mapping[str, str]) -> None:
    """Raise InvalidConfigError (Fluss's words) unless ``name`` may aggregate a column of this type with
    these parameters. ``name`` must be normalized and known."""
    _factory, type_roots, allowed = FUNCTIONS[name]
    for parameter, value in parameters.items():
        if parameter not in allowed:
            supported = f"[{', '.join(allowed)}]" if allowed else "none"
            raise InvalidConfigError(
                f"Parameter '{parameter}' is not supported for aggregation function '{name}'. "
                f"Supported parameters: {supported}"
            )
        if parameter == DELIMITER_PARAMETER and not value:
            raise InvalidConfigError(
                f"Parameter '{parameter}' for aggregation function '{name}' must be a non-empty string"
            )
    if type_roots is not None and column_type.type_root not in type_roots:
        raise InvalidConfigError(
            f"Data type for {name} column must be part of [{', '.join(type_roots)}] but was '{column_type}'."
        )


def create(name: str, column_type: DataType, parameters: Mapping[str, str]) -> Aggregator:
    """The aggregator of a validated function for one column."""
    factory, _type_roots, _allowed = FUNCTIONS[name]
    return factory(column_type, parameters)
