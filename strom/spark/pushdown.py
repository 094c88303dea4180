"""Filter pushdown for batch reads: which of Spark's filters the connector applies itself, and how.

Spark (4.1+, with ``spark.sql.python.filterPushdown.enabled=true``) hands the reader the conjuncts of a
query's ``WHERE`` it can express as :class:`pyspark.sql.datasource.Filter`\\ s; the reader returns those
Spark must still evaluate. Two kinds are used:

* **Key lookups.** On a primary-key table, when every primary-key column (partition keys included) is
  bound by ``=`` or ``IN`` to values of exactly the column's type, the read becomes point lookups of the
  cartesian product of those values (at most ``LOOKUP_KEYS_MAX`` keys) instead of a scan. Those filters
  are then fully applied and are not returned to Spark.
* **Partition pruning.** ``=`` / ``IN`` on a partition key column of type STRING keeps only the partitions
  whose value matches. The filters are still returned to Spark, which re-checks them row by row.
* **Batch skipping.** On a log table, comparisons (``=``, ``<``, ``<=``, ``>``, ``>=``), ``IN``, ``IS [NOT]
  NULL`` and ``LIKE 'prefix%'`` on top-level columns, with values exactly of the column's type, become one
  predicate pushed into each FetchLog: the server skips log batches whose statistics
  (``table.statistics.columns``) show no row can match. Spark still re-checks every row.

Everything else (ranges, ``NOT``, string patterns, null tests, values that would need a conversion,
``NULL`` literals) is returned to Spark unchanged. The result is plain data and pickles with the reader.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from strom.client.predicates import Predicate, col
from strom.client.table import TableLayout
from strom.records import types

LOOKUP_KEYS_MAX = 10_000
"""Largest number of keys a filter is turned into; beyond it the table is scanned and Spark filters."""
LOOKUP_KEYS_PER_TASK = 2_048
"""Keys one lookup task reads (one lookup request per bucket leader)."""

_INT_RANGES: Mapping[type, tuple[int, int]] = {
    types.TinyIntType: (-(2**7), 2**7 - 1),
    types.SmallIntType: (-(2**15), 2**15 - 1),
    types.IntType: (-(2**31), 2**31 - 1),
    types.BigIntType: (-(2**63), 2**63 - 1),
}


@dataclass(frozen=True)
class PushedFilters:
    """What the reader applies: lookup keys (None: scan) and the allowed values of partition keys."""

    lookup_keys: tuple[tuple[Any, ...], ...] | None = None
    """Primary-key values in ``TableLayout.primary_key`` order, or None when the read is not a lookup."""
    partition_values: tuple[tuple[str, frozenset[str]], ...] = field(default=())
    """Per pruned partition key column, the partition values a matching row can have."""
    log_predicate: Predicate | None = None
    """What a log table's FetchLogs carry to skip batches (None: nothing to push)."""

    def keeps_partition(self, spec: Mapping[str, str], unknown: bool = False) -> bool:
        """Whether a partition with these key values can hold matching rows (``unknown`` when the values
        of a pruned column are not known)."""
        return all(
            spec[column] in allowed if column in spec else unknown for column, allowed in self.partition_values
        )


def exact_value(column_type: types.DataType, value: Any) -> tuple[bool, Any]:
    """``(True, value)`` when ``value`` is a non-null literal that is exactly a value of ``column_type``
    (no rounding, widening of strings or time zones involved); ``(False, None)`` otherwise."""
    if value is None:
        return False, None
    kind = type(column_type)
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        if type(value) is int and low <= value <= high:
            return True, value
        return False, None
    if kind is types.StringType and type(value) is str:
        return True, value
    if kind is types.BooleanType and type(value) is bool:
        return True, value
    if kind is types.DateType and type(value) is datetime.date:
        return True, value
    if kind is types.DoubleType and type(value) is float:
        return True, value
    return False, None


_COMPARISONS: Mapping[type, str] = {
    EqualTo: "__eq__", LessThan: "__lt__", LessThanOrEqual: "__le__", GreaterThan: "__gt__",
    GreaterThanOrEqual: "__ge__",
}


def _log_predicate(flt: Filter, column_types: Mapping[str, types.DataType]) -> Predicate | None:
    """``flt`` as a predicate a FetchLog can carry, None when it cannot be one exactly."""
    attribute: tuple[str, ...] = tuple(getattr(flt, "attribute", ()))
    if len(attribute) != 1 or attribute[0] not in column_types:
        return None
    column = attribute[0]
    column_type = column_types[column]
    if isinstance(flt, IsNull):
        return col(column).is_null()
    if isinstance(flt, IsNotNull):
        return col(column).is_not_null()
    if isinstance(flt, StringStartsWith) and isinstance(column_type, types.StringType):
        return col(column).starts_with(flt.value)
    if isinstance(flt, In):
        converted = [exact_value(column_type, value) for value in flt.value]
        if converted and all(ok for ok, _ in converted):
            return col(column).isin([value for _, value in converted])
        return None
    method = _COMPARISONS.get(type(flt))
    if method is not None:
        ok, value = exact_value(column_type, getattr(flt, "value", None))
        if ok:
            predicate: Predicate = getattr(col(column), method)(value)
            return predicate
    return None


def _bound_values(flt: Filter) -> tuple[str, tuple[Any, ...]] | None:
    """The column and the values an ``=`` / ``IN`` filter on a top-level column allows."""
    if isinstance(flt, EqualTo) and len(flt.attribute) == 1:
        return flt.attribute[0], (flt.value,)
    if isinstance(flt, In) and len(flt.attribute) == 1:
        return flt.attribute[0], tuple(flt.value)
    return None


def push(layout: TableLayout, filters: Sequence[Filter], allow_lookup: bool) -> tuple[PushedFilters, list[Filter]]:
    """Split ``filters`` into what the read applies and what Spark keeps (the same objects it passed)."""
    column_types = {f.name: f.type for f in layout.row_type.fields}
    allowed: dict[str, set[Any]] = {}
    equality: dict[str, list[Filter]] = {}
    for flt in filters:
        bound = _bound_values(flt)
        if bound is None or bound[0] not in column_types:
            continue
        column, values = bound
        converted = [exact_value(column_types[column], value) for value in values]
        if not values or not all(ok for ok, _ in converted):
            continue  # a NULL literal or a value needing a conversion: Spark evaluates it
        distinct = {value for _, value in converted}
        allowed[column] = allowed[column] & distinct if column in allowed else distinct
        equality.setdefault(column, []).append(flt)

    handled: set[int] = set()
    lookup_keys: tuple[tuple[Any, ...], ...] | None = None
    key_columns = list(layout.primary_key)
    if allow_lookup and key_columns and all(column in allowed for column in key_columns):
        count = 1
        for column in key_columns:
            count *= len(allowed[column])
        if count <= LOOKUP_KEYS_MAX:
            ordered = [sorted(allowed[column], key=repr) for column in key_columns]
            lookup_keys = tuple(itertools.product(*ordered))
            handled = {id(flt) for column in key_columns for flt in equality[column]}

    partition_values = tuple(
        (column, frozenset(allowed[column]))
        for column in layout.partition_keys
        if column in allowed and isinstance(column_types[column], types.StringType)
    )
    kept = [flt for flt in filters if id(flt) not in handled]
    log_predicate: Predicate | None = None
    if not key_columns:  # a log table: its batches may carry statistics
        for flt in filters:
            found = _log_predicate(flt, column_types)
            if found is not None:
                log_predicate = found if log_predicate is None else log_predicate & found
    return PushedFilters(lookup_keys, partition_values, log_predicate), kept


def key_chunks(keys: Iterable[tuple[Any, ...]]) -> list[tuple[tuple[Any, ...], ...]]:
    """Keys split into task-sized groups."""
    keys = list(keys)
    return [tuple(keys[i : i + LOOKUP_KEYS_PER_TASK]) for i in range(0, len(keys), LOOKUP_KEYS_PER_TASK)]
