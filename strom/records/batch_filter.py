"""Filter pushdown into FetchLog (Fluss's FIP-10): a row predicate, decided per log batch from the batch's
statistics — may any row of this batch match? A batch that cannot match is skipped without being read;
one that may is returned whole (the reader filters its rows). Whatever the statistics cannot settle (a
column without statistics, a V0 batch, another schema, a function statistics cannot bound, statistics that
do not parse) counts as "may match": a skipped batch is always one no row of which matches.

The predicate arrives as Fluss's ``PbPredicate``: a tree of compound nodes (AND 0, OR 1) over leaves, each a
function code on one column (named by its field id in the request's ``filter_schema_id``) and literals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strom.records import batch_statistics, log_batch
from strom.records.types import RowType

LEAF, COMPOUND = 0, 1
AND, OR = 0, 1
(EQUAL, NOT_EQUAL, LESS_THAN, LESS_OR_EQUAL, GREATER_THAN, GREATER_OR_EQUAL, IS_NULL, IS_NOT_NULL, STARTS_WITH,
 CONTAINS, ENDS_WITH, IN, NOT_IN) = range(13)
"""Fluss's leaf function codes."""
LITERAL_BOOLEAN, LITERAL_TINYINT, LITERAL_SMALLINT, LITERAL_INT, LITERAL_BIGINT, LITERAL_FLOAT, LITERAL_DOUBLE = range(7)
(LITERAL_CHAR, LITERAL_STRING, LITERAL_DECIMAL, LITERAL_DATE, LITERAL_TIME, LITERAL_TIMESTAMP, LITERAL_TIMESTAMP_LTZ,
 LITERAL_BINARY, LITERAL_BYTES) = range(7, 16)
"""Fluss's ``PbLiteralValue.literal_type`` codes (its data type roots)."""
_TYPE_ROOT_LITERALS = {
    "BOOLEAN": {LITERAL_BOOLEAN}, "TINYINT": {LITERAL_TINYINT}, "SMALLINT": {LITERAL_SMALLINT},
    "INTEGER": {LITERAL_INT}, "BIGINT": {LITERAL_BIGINT}, "FLOAT": {LITERAL_FLOAT}, "DOUBLE": {LITERAL_DOUBLE},
    "CHAR": {LITERAL_CHAR, LITERAL_STRING}, "STRING": {LITERAL_CHAR, LITERAL_STRING}, "DECIMAL": {LITERAL_DECIMAL},
    "DATE": {LITERAL_DATE}, "TIME_WITHOUT_TIME_ZONE": {LITERAL_TIME},
    "TIMESTAMP_WITHOUT_TIME_ZONE": {LITERAL_TIMESTAMP}, "TIMESTAMP_WITH_LOCAL_TIME_ZONE": {LITERAL_TIMESTAMP_LTZ},
    "BINARY": {LITERAL_BINARY, LITERAL_BYTES}, "BYTES": {LITERAL_BINARY, LITERAL_BYTES},
}
_COMPARISONS = {EQUAL, NOT_EQUAL, LESS_THAN, LESS_OR_EQUAL, GREATER_THAN, GREATER_OR_EQUAL, STARTS_WITH, CONTAINS,
                ENDS_WITH, IN, NOT_IN}


class InvalidPredicateError(ValueError):
    """A predicate that does not fit the table: an unknown field id, function or literal type."""


def literal_value(literal: Any) -> Any:
    """A ``PbLiteralValue`` as the internal value statistics hold (None for a null literal)."""
    if literal.is_null:
        return None
    kind = literal.literal_type
    if kind == LITERAL_BOOLEAN:
        return literal.boolean_value
    if kind in (LITERAL_TINYINT, LITERAL_SMALLINT, LITERAL_INT, LITERAL_TIME):
        return literal.int_value
    if kind in (LITERAL_BIGINT, LITERAL_DATE):  # Fluss sends a DATE's days as a bigint
        return literal.bigint_value
    if kind == LITERAL_FLOAT:
        return literal.float_value
    if kind == LITERAL_DOUBLE:
        return literal.double_value
    if kind in (LITERAL_CHAR, LITERAL_STRING):
        return literal.string_value
    if kind == LITERAL_DECIMAL:  # the unscaled value, at the column's scale
        if literal.HasField("decimal_bytes"):
            return int.from_bytes(literal.decimal_bytes, "big", signed=True)
        return literal.decimal_value
    if kind in (LITERAL_TIMESTAMP, LITERAL_TIMESTAMP_LTZ):
        return literal.timestamp_millis_value, literal.timestamp_nano_of_millis_value
    if kind in (LITERAL_BINARY, LITERAL_BYTES):
        return bytes(literal.binary_value)
    raise InvalidPredicateError(f"unknown literal type {kind}")


@dataclass(frozen=True, slots=True)
class _Leaf:
    function: int
    column: int
    literals: tuple[Any, ...]

    def may_match(self, record_count: int, statistics: batch_statistics.BatchStatistics) -> bool:
        if self.column not in statistics.column_indexes:
            return True
        position = statistics.column_indexes.index(self.column)
        nulls = statistics.null_counts[position]
        if self.function == IS_NULL:
            return nulls > 0
        if self.function == IS_NOT_NULL:
            return nulls < record_count
        low, high = statistics.mins[position], statistics.maxes[position]
        if low is None or high is None:
            return nulls < record_count  # all null: no comparison holds; else bounds unknown
        values = [v for v in self.literals if v is not None]
        function = self.function
        if function == EQUAL:
            return bool(values) and low <= values[0] <= high
        if function == NOT_EQUAL:
            return bool(values) and not low == high == values[0]
        if function == LESS_THAN:
            return bool(values) and low < values[0]
        if function == LESS_OR_EQUAL:
            return bool(values) and low <= values[0]
        if function == GREATER_THAN:
            return bool(values) and high > values[0]
        if function == GREATER_OR_EQUAL:
            return bool(values) and high >= values[0]
        if function == IN:
            return any(low <= v <= high for v in values)
        if function == NOT_IN:
            return len(values) < len(self.literals) or not (low == high and low in values)
        if function == STARTS_WITH and values and isinstance(values[0], str):
            prefix = values[0]  # strings with it form an interval from the prefix on
            return not high < prefix and (low <= prefix or low.startswith(prefix))
        return True  # CONTAINS, ENDS_WITH: statistics cannot bound them


@dataclass(frozen=True, slots=True)
class _Compound:
    function: int
    children: tuple[_Leaf | _Compound, ...]

    def may_match(self, record_count: int, statistics: batch_statistics.BatchStatistics) -> bool:
        found = (child.may_match(record_count, statistics) for child in self.children)
        return all(found) if self.function == AND else any(found)


class BatchFilter:
    """A FetchLog filter: which batches of a table may hold a matching row."""

    def __init__(self, root: _Leaf | _Compound, row_type: RowType, schema_id: int) -> None:
        self._root = root
        self._row_type = row_type
        self.schema_id = schema_id

    @classmethod
    def from_pb(cls, predicate: Any, row_type: RowType, schema_id: int) -> BatchFilter:
        """The filter of a ``PbPredicate`` over rows of ``row_type`` (the schema ``schema_id``).

        Raises:
            InvalidPredicateError: a field id the schema lacks, an unknown function, or a literal of
                another type than its column's.
        """
        return cls(_node(predicate, row_type, 0), row_type, schema_id)

    def may_match(self, data: bytes | memoryview, position: int, header: log_batch.LogBatchHeader) -> bool:
        """Whether a row of the batch at ``position`` may match (True whenever its statistics cannot say)."""
        if header.statistics_length == 0 or header.schema_id != self.schema_id or header.record_count == 0:
            return True
        start = position + header.header_size
        try:
            statistics = batch_statistics.parse(memoryview(data)[start : start + header.statistics_length],
                                                self._row_type)
            return self._root.may_match(header.record_count, statistics)
        except (ValueError, TypeError, IndexError):  # unreadable statistics, incomparable values
            return True

    def select(self, data: bytes) -> tuple[list[memoryview], int | None]:
        """The batches of ``data`` that may match, and the offset after the last batch of ``data`` (None
        when ``data`` has none)."""
        kept: list[memoryview] = []
        end: int | None = None
        view = memoryview(data)
        for position, header in log_batch.iter_batches(data, verify_crc=False):
            if self.may_match(data, position, header):
                kept.append(view[position : position + header.size_bytes])
            end = header.next_offset
        return kept, end


_MAX_DEPTH = 64


def _node(predicate: Any, row_type: RowType, depth: int) -> _Leaf | _Compound:
    if depth > _MAX_DEPTH:
        raise InvalidPredicateError(f"a predicate nested deeper than {_MAX_DEPTH} levels")
    if predicate.type == COMPOUND:
        compound = predicate.compound
        if compound.function not in (AND, OR) or not compound.children:
            raise InvalidPredicateError(f"compound predicate function {compound.function} over "
                                        f"{len(compound.children)} children")
        return _Compound(compound.function, tuple(_node(child, row_type, depth + 1) for child in compound.children))
    if predicate.type != LEAF:
        raise InvalidPredicateError(f"unknown predicate type {predicate.type}")
    leaf = predicate.leaf
    if not 0 <= leaf.function <= NOT_IN:
        raise InvalidPredicateError(f"unknown predicate function {leaf.function}")
    column = _column(row_type, leaf.field_id)
    root = row_type.fields[column].type.type_root
    for literal in leaf.literals:
        if not literal.is_null and literal.literal_type not in _TYPE_ROOT_LITERALS.get(root, set()):
            raise InvalidPredicateError(
                f"Literal type {literal.literal_type} does not match the type {root} of column "
                f"'{row_type.fields[column].name}'."
            )
    if leaf.function in _COMPARISONS and not leaf.literals:
        raise InvalidPredicateError(f"predicate function {leaf.function} needs a literal")
    return _Leaf(leaf.function, column, tuple(literal_value(literal) for literal in leaf.literals))


def _column(row_type: RowType, field_id: int) -> int:
    for index, field in enumerate(row_type.fields):
        if field.field_id == field_id:
            return index
    raise InvalidPredicateError(f"Cannot resolve field id {field_id} from the row type.")


__all__ = ["BatchFilter", "InvalidPredicateError", "literal_value"]
