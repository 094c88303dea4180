"""Log batch statistics (Fluss's ``LogRecordBatchStatistics``): per-column null counts and min and max
values that a V1 or V2 log batch carries between its header and its records, so a reader can skip a batch
no row of which can match its filter without decoding it.

Layout (little-endian), for ``n`` statistics columns::

    version u8 (1) | column count i16 | n × column index i16 (into the table's row) | n × null count i32 |
    min row size i32 | min row (an AlignedRow of the n columns) | max row size i32 | max row

A column whose values are all null has null min and max. The columns are those ``table.statistics.columns``
names, in its order; ``*`` means every column of a supported type, in the table's order.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from strom.records import aligned_row, types
from strom.records.types import DataType, DataTypeVisitor, RowType

STATISTICS_VERSION = 1
STATISTICS_TYPE_ROOTS = frozenset({
    "BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "FLOAT", "DOUBLE", "STRING", "CHAR", "DECIMAL",
    "DATE", "TIME_WITHOUT_TIME_ZONE", "TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE",
})
"""Column types Fluss collects statistics for (``table.statistics.columns``)."""
_COUNT = struct.Struct("<h")
_INT = struct.Struct("<i")
_UNIT_MILLIS = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}
"""Arrow timestamp unit -> (millis per unit, units per milli)."""


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """The statistics of one batch: for each statistics column (by its index in the table's row), its
    null count and its min and max as Fluss's internal values (None when every value is null)."""

    column_indexes: tuple[int, ...]
    null_counts: tuple[int, ...]
    mins: tuple[Any, ...]
    maxes: tuple[Any, ...]


def named_columns(option: str) -> list[str] | None:
    """The column names a set ``table.statistics.columns`` lists, in its order; None for ``*`` (every
    column of a supported type)."""
    if option.strip() == "*":
        return None
    return [name.strip() for name in option.split(",") if name.strip()]


def statistics_columns(row_type: RowType, option: str | None) -> list[int]:
    """The row indexes of the columns ``table.statistics.columns`` names (empty: no statistics)."""
    if option is None:
        return []
    names = named_columns(option)
    if names is None:
        return [i for i, field in enumerate(row_type.fields) if field.type.type_root in STATISTICS_TYPE_ROOTS]
    columns = [field.name for field in row_type.fields]
    return [columns.index(name) for name in names]


class _Bound(DataTypeVisitor[Any]):
    """A column's min or max (an Arrow scalar of it) as Fluss's internal value of the visited type."""

    def __init__(self, scalar: pa.Scalar) -> None:
        self._scalar = scalar

    def default(self, t: DataType) -> Any:
        return self._scalar.as_py()

    def visit_date(self, t: types.DateType) -> Any:
        return self._scalar.cast(pa.int32()).as_py()  # days since the epoch

    def visit_time(self, t: types.TimeType) -> Any:
        arrow_type = self._scalar.type
        value = self._scalar.cast(pa.int32() if pa.types.is_time32(arrow_type) else pa.int64()).as_py()
        unit = arrow_type.unit
        return value * 1000 if unit == "s" else value // _UNIT_MILLIS[unit][1]  # millis of the day

    def visit_decimal(self, t: types.DecimalType) -> Any:
        return int(self._scalar.as_py().scaleb(t.scale))  # the unscaled value

    def _timestamp(self) -> tuple[int, int]:
        value = self._scalar.cast(pa.int64()).as_py()
        millis_per_unit, units_per_milli = _UNIT_MILLIS[self._scalar.type.unit]
        if units_per_milli == 1:
            return value * millis_per_unit, 0
        millis, rest = divmod(value, units_per_milli)
        return millis, rest * (1_000_000 // units_per_milli)

    def visit_timestamp(self, t: types.TimestampType) -> Any:
        return self._timestamp()

    def visit_timestamp_ltz(self, t: types.TimestampLtzType) -> Any:
        return self._timestamp()


def collect(batch: pa.RecordBatch, row_type: RowType, columns: Sequence[int]) -> bytes:
    """The statistics of ``batch`` (the table's columns, in order) for ``columns``; empty bytes when there
    are no columns or no rows (a batch without statistics)."""
    if not columns or batch.num_rows == 0:
        return b""
    field_types = [row_type.fields[i].type for i in columns]
    null_counts: list[int] = []
    mins: list[Any] = []
    maxes: list[Any] = []
    for index, field_type in zip(columns, field_types, strict=True):
        column = batch.column(index)
        null_counts.append(column.null_count)
        if column.null_count == len(column):
            mins.append(None)
            maxes.append(None)
            continue
        bounds = pc.min_max(column)
        mins.append(_Bound(bounds["min"]).visit(field_type))
        maxes.append(_Bound(bounds["max"]).visit(field_type))
    return encode(BatchStatistics(tuple(columns), tuple(null_counts), tuple(mins), tuple(maxes)), field_types)


def encode(statistics: BatchStatistics, field_types: Sequence[DataType]) -> bytes:
    """The statistics bytes of ``statistics``; ``field_types``: the types of its columns, in its order."""
    out = bytearray([STATISTICS_VERSION])
    out += _COUNT.pack(len(statistics.column_indexes))
    for index in statistics.column_indexes:
        out += _COUNT.pack(index)
    for count in statistics.null_counts:
        out += _INT.pack(count)
    for values in (statistics.mins, statistics.maxes):
        row = aligned_row.encode(field_types, values)
        out += _INT.pack(len(row)) + row
    return bytes(out)


def parse(data: bytes | memoryview, row_type: RowType) -> BatchStatistics:
    """The statistics in ``data`` (a batch's statistics bytes) for a table of ``row_type``.

    Raises:
        ValueError: an unknown version, a column outside the row, or sizes that do not fit ``data``.
    """
    if len(data) < 3 or data[0] != STATISTICS_VERSION:
        raise ValueError(f"unknown batch statistics version {data[0] if data else None}")
    (count,) = _COUNT.unpack_from(data, 1)
    if count <= 0 or count > len(row_type.fields):
        raise ValueError(f"batch statistics of {count} columns for a row of {len(row_type.fields)}")
    cursor = 3
    needed = cursor + 2 * count + 4 * count + 4
    if len(data) < needed:
        raise ValueError("batch statistics end inside their column list")
    indexes = struct.unpack_from(f"<{count}h", data, cursor)
    cursor += 2 * count
    null_counts = struct.unpack_from(f"<{count}i", data, cursor)
    cursor += 4 * count
    if any(not 0 <= i < len(row_type.fields) for i in indexes):
        raise ValueError(f"batch statistics name columns {indexes} outside a row of {len(row_type.fields)}")
    field_types = [row_type.fields[i].type for i in indexes]
    rows = []
    for _bound in ("min", "max"):
        if len(data) < cursor + 4:
            raise ValueError("batch statistics end before a row size")
        (size,) = _INT.unpack_from(data, cursor)
        cursor += 4
        if size < 0 or cursor + size > len(data):
            raise ValueError(f"a batch statistics row of {size} bytes does not fit")
        if size == 0:  # no row written: nothing known of the bound
            rows.append([None] * count)
        else:
            rows.append(aligned_row.decode(field_types, memoryview(data)[cursor : cursor + size]))
        cursor += size
    return BatchStatistics(tuple(indexes), tuple(null_counts), tuple(rows[0]), tuple(rows[1]))


__all__ = ["STATISTICS_TYPE_ROOTS", "STATISTICS_VERSION", "BatchStatistics", "collect", "encode", "named_columns",
           "parse", "statistics_columns"]
