"""Row predicates a log scan pushes down to the server (Fluss's filter pushdown, FIP-10).

Build them from columns: ``col("amount") > 100``, ``col("region").isin(["eu", "us"])``,
``col("note").is_null()``, ``col("name").starts_with("a")``, combined with ``&`` and ``|``. A scanner
given one (``table.new_scan().filter(p)``) sends it with each fetch; the server skips the log batches whose
statistics show no row can match (a table with ``table.statistics.columns``) and returns the others whole,
so the rows of a returned batch may not all match: :meth:`Predicate.filter` keeps those that do (the
result equals filtering every row client side).
"""

from __future__ import annotations

import datetime
import decimal
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from strom.records import batch_filter as codes
from strom.records import types
from strom.records.types import DataTypeVisitor, RowType
from strom.rpc.messages import pb

_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_DATE = datetime.date(1970, 1, 1)


class Predicate(ABC):
    def __and__(self, other: Predicate) -> Predicate:
        return _Compound(codes.AND, (self, other))

    def __or__(self, other: Predicate) -> Predicate:
        return _Compound(codes.OR, (self, other))

    @abstractmethod
    def to_pb(self, row_type: RowType) -> Any:
        """The ``PbPredicate`` of this predicate over rows of ``row_type`` (columns named by field id)."""

    @abstractmethod
    def expression(self) -> pc.Expression:
        """The same predicate as an Arrow compute expression (SQL semantics: a null never matches)."""

    def filter(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` that match."""
        return batch.filter(self.expression())


def col(name: str) -> Column:
    return Column(name)


@dataclass(frozen=True, slots=True)
class Column:
    name: str

    def _leaf(self, function: int, *literals: Any) -> Predicate:
        return _Leaf(self.name, function, literals)

    def __eq__(self, value: object) -> Predicate:  # type: ignore[override]
        return self._leaf(codes.EQUAL, value)

    def __ne__(self, value: object) -> Predicate:  # type: ignore[override]
        return self._leaf(codes.NOT_EQUAL, value)

    def __lt__(self, value: Any) -> Predicate:
        return self._leaf(codes.LESS_THAN, value)

    def __le__(self, value: Any) -> Predicate:
        return self._leaf(codes.LESS_OR_EQUAL, value)

    def __gt__(self, value: Any) -> Predicate:
        return self._leaf(codes.GREATER_THAN, value)

    def __ge__(self, value: Any) -> Predicate:
        return self._leaf(codes.GREATER_OR_EQUAL, value)

    def __hash__(self) -> int:
        return hash(self.name)

    def is_null(self) -> Predicate:
        return self._leaf(codes.IS_NULL)

    def is_not_null(self) -> Predicate:
        return self._leaf(codes.IS_NOT_NULL)

    def isin(self, values: Iterable[Any]) -> Predicate:
        return self._leaf(codes.IN, *values)

    def starts_with(self, prefix: str) -> Predicate:
        return self._leaf(codes.STARTS_WITH, prefix)


@dataclass(frozen=True, slots=True)
class _Leaf(Predicate):
    column: str
    function: int
    literals: tuple[Any, ...]

    def to_pb(self, row_type: RowType) -> Any:
        names = [field.name for field in row_type.fields]
        if self.column not in names:
            raise ValueError(f"no column {self.column!r} to filter on; the columns are {names}")
        field = row_type.fields[names.index(self.column)]
        predicate = pb.PbPredicate(type=codes.LEAF)
        predicate.leaf.function = self.function
        predicate.leaf.field_id = field.field_id
        for value in self.literals:
            literal = predicate.leaf.literals.add()
            literal.is_null = value is None
            literal.literal_type = _Literal(literal, value).visit(field.type)
        return predicate

    def expression(self) -> pc.Expression:
        field = pc.field(self.column)
        function, values = self.function, self.literals
        if function == codes.IS_NULL:
            return field.is_null()
        if function == codes.IS_NOT_NULL:
            return field.is_valid()
        if function == codes.IN:
            return field.isin([v for v in values if v is not None])
        if function == codes.STARTS_WITH:
            return pc.starts_with(field, values[0])
        comparisons = {codes.EQUAL: "__eq__", codes.NOT_EQUAL: "__ne__", codes.LESS_THAN: "__lt__",
                       codes.LESS_OR_EQUAL: "__le__", codes.GREATER_THAN: "__gt__", codes.GREATER_OR_EQUAL: "__ge__"}
        expression: pc.Expression = getattr(field, comparisons[function])(pc.scalar(values[0]))
        return expression


@dataclass(frozen=True, slots=True)
class _Compound(Predicate):
    function: int
    children: tuple[Predicate, ...]

    def to_pb(self, row_type: RowType) -> Any:
        predicate = pb.PbPredicate(type=codes.COMPOUND)
        predicate.compound.function = self.function
        for child in self.children:
            predicate.compound.children.append(child.to_pb(row_type))
        return predicate

    def expression(self) -> pc.Expression:
        first, *rest = (child.expression() for child in self.children)
        for other in rest:
            first = (first & other) if self.function == codes.AND else (first | other)
        return first


class _Literal(DataTypeVisitor[int]):
    """Fills a ``PbLiteralValue`` with a Python value for a column of the visited type; returns the
    literal type code (Fluss's data type root)."""

    def __init__(self, literal: Any, value: Any) -> None:
        self._literal = literal
        self._value = value

    def _set(self, name: str, convert: Any = None) -> None:
        """The literal's ``name`` field, ``convert(value)`` (the value itself without it); a null literal
        has none."""
        if self._value is not None:
            setattr(self._literal, name, self._value if convert is None else convert(self._value))

    def default(self, t: types.DataType) -> int:
        raise ValueError(f"a filter on a column of type {t} is not supported")

    def visit_boolean(self, t: types.BooleanType) -> int:
        self._set("boolean_value", bool)
        return codes.LITERAL_BOOLEAN

    def visit_tinyint(self, t: types.TinyIntType) -> int:
        self._set("int_value", int)
        return codes.LITERAL_TINYINT

    def visit_smallint(self, t: types.SmallIntType) -> int:
        self._set("int_value", int)
        return codes.LITERAL_SMALLINT

    def visit_int(self, t: types.IntType) -> int:
        self._set("int_value", int)
        return codes.LITERAL_INT

    def visit_bigint(self, t: types.BigIntType) -> int:
        self._set("bigint_value", int)
        return codes.LITERAL_BIGINT

    def visit_float(self, t: types.FloatType) -> int:
        self._set("float_value", float)
        return codes.LITERAL_FLOAT

    def visit_double(self, t: types.DoubleType) -> int:
        self._set("double_value", float)
        return codes.LITERAL_DOUBLE

    def visit_char(self, t: types.CharType) -> int:
        self._set("string_value", str)
        return codes.LITERAL_CHAR

    def visit_string(self, t: types.StringType) -> int:
        self._set("string_value", str)
        return codes.LITERAL_STRING

    def visit_decimal(self, t: types.DecimalType) -> int:
        if self._value is not None:
            unscaled = int(decimal.Decimal(self._value).scaleb(t.scale).to_integral_value())
            if t.precision <= 18:
                self._literal.decimal_value = unscaled
            else:
                self._literal.decimal_bytes = unscaled.to_bytes(max(1, (unscaled.bit_length() + 8) // 8), "big",
                                                                signed=True)
        return codes.LITERAL_DECIMAL

    def visit_date(self, t: types.DateType) -> int:
        if self._value is not None:
            self._literal.bigint_value = (self._value - _EPOCH_DATE).days
        return codes.LITERAL_DATE

    def visit_time(self, t: types.TimeType) -> int:
        if self._value is not None:
            v = self._value
            self._literal.int_value = ((v.hour * 60 + v.minute) * 60 + v.second) * 1000 + v.microsecond // 1000
        return codes.LITERAL_TIME

    def _timestamp(self) -> None:
        if self._value is None:
            return
        value: datetime.datetime = self._value
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        micros = (value - _EPOCH) // datetime.timedelta(microseconds=1)
        millis, rest = divmod(micros, 1000)
        self._literal.timestamp_millis_value = millis
        self._literal.timestamp_nano_of_millis_value = rest * 1000

    def visit_timestamp(self, t: types.TimestampType) -> int:
        self._timestamp()
        return codes.LITERAL_TIMESTAMP

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> int:
        self._timestamp()
        return codes.LITERAL_TIMESTAMP_LTZ


__all__ = ["Column", "Predicate", "col"]
