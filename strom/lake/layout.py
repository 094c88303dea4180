"""How a strom table lays out in the lake: columns, Fluss's system columns, types, partitioning.

The lake table has the strom table's columns, then ``__bucket`` (int32), ``__offset`` (int64: the log
offset of the row's last change, -1 for rows from a KV snapshot) and ``__timestamp`` (timestamp UTC: the
commit time of that change, epoch -1 ms when unknown, as Fluss writes it). It is partitioned by the
table's partition keys, then ``__bucket``, so a bucket's files are found from partition values alone
(Fluss lays Iceberg tables out the same way).

Lake formats know fewer types than Fluss: TIME becomes int64 microseconds of the day in Delta, which
has no time type (also inside ARRAY, MAP and ROW; Iceberg keeps a time in microseconds), every timestamp keeps microseconds (nanoseconds are truncated), CHAR becomes
string and fixed-size BINARY(n) variable binary. Reading back converts to the strom table's Arrow types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from strom.errors import InvalidTableError
from strom.metadata.table_info import PARTITION_NAME_SEPARATOR, TableInfo
from strom.records import types as fluss

BUCKET_COLUMN = "__bucket"
OFFSET_COLUMN = "__offset"
TIMESTAMP_COLUMN = "__timestamp"
SYSTEM_COLUMNS = (BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN)
MICROS_PER_MILLI = 1000

_PARTITION_KEY_TYPES = (
    fluss.StringType, fluss.CharType, fluss.BooleanType, fluss.TinyIntType, fluss.SmallIntType, fluss.IntType,
    fluss.BigIntType, fluss.DateType,
)
"""Types whose partition-name form (Python ``str`` of the value) is also a valid lake partition value."""


class _ArrowTypes(fluss.DataTypeVisitor[pa.DataType]):
    """Arrow types that differ from strom's own (``to_arrow_type``) for TIME and timestamps and are
    rebuilt inside ARRAY, MAP and ROW; ``list_item`` names an ARRAY's element field."""

    __slots__ = ("list_item",)

    def __init__(self, list_item: str) -> None:
        self.list_item = list_item

    def default(self, t: fluss.DataType) -> pa.DataType:
        return fluss.to_arrow_type(t)

    def visit_time(self, t: fluss.TimeType) -> pa.DataType:
        return pa.time64("us")

    def visit_timestamp(self, t: fluss.TimestampType) -> pa.DataType:
        return pa.timestamp("us")

    def visit_timestamp_ltz(self, t: fluss.TimestampLtzType) -> pa.DataType:
        return pa.timestamp("us", tz="UTC")

    def visit_array(self, t: fluss.ArrayType) -> pa.DataType:
        return pa.list_(pa.field(self.list_item, self.visit(t.element), nullable=t.element.nullable))

    def visit_map(self, t: fluss.MapType) -> pa.DataType:
        return pa.map_(
            pa.field("key", self.visit(t.key), nullable=False),
            pa.field("value", self.visit(t.value), nullable=t.value.nullable),
        )

    def visit_row(self, t: fluss.RowType) -> pa.DataType:
        return pa.struct([pa.field(f.name, self.visit(f.type), nullable=f.type.nullable) for f in t.fields])


class _LakeTypes(_ArrowTypes):
    """The lake's types: also CHAR as string and BINARY(n) as variable binary; TIME as int64 unless
    ``native_time``."""

    __slots__ = ("native_time",)

    def __init__(self, native_time: bool) -> None:
        super().__init__("element")
        self.native_time = native_time

    def visit_time(self, t: fluss.TimeType) -> pa.DataType:
        return pa.time64("us") if self.native_time else pa.int64()

    def visit_binary(self, t: fluss.BinaryType) -> pa.DataType:
        return pa.binary()

    def visit_bytes(self, t: fluss.BytesType) -> pa.DataType:
        return pa.binary()

    def visit_char(self, t: fluss.CharType) -> pa.DataType:
        return pa.string()

    def visit_string(self, t: fluss.StringType) -> pa.DataType:
        return pa.string()


_LAKE_TYPES = _LakeTypes(native_time=False)
_LAKE_TYPES_NATIVE_TIME = _LakeTypes(native_time=True)
_MICROS_TYPES = _ArrowTypes("item")


def lake_type(t: fluss.DataType, native_time: bool = False) -> pa.DataType:
    """The lake's Arrow type for a Fluss type (see the module docstring for what changes); with
    ``native_time`` (formats with a TIME type, such as Iceberg) TIME stays time64 microseconds."""
    return (_LAKE_TYPES_NATIVE_TIME if native_time else _LAKE_TYPES).visit(t)


def _micros_type(t: fluss.DataType) -> pa.DataType:
    """The strom Arrow type with every TIME and timestamp at microseconds: the step between strom's
    types and the lake's that Arrow can cast to and from both (time64[us] <-> int64 keeps the value)."""
    return _MICROS_TYPES.visit(t)


def _cast(array: pa.Array | pa.ChunkedArray, *steps: pa.DataType) -> pa.Array | pa.ChunkedArray:
    for step in steps:
        if array.type != step:
            array = array.cast(step, safe=False)  # unsafe: sub-microsecond digits are dropped on purpose
    return array


Rows = TypeVar("Rows", pa.RecordBatch, pa.Table)


def with_null_columns(rows: Rows, schema: pa.Schema) -> Rows:
    """``rows`` with every column of ``schema`` they lack appended as nulls of its type: rows written
    before an ADD COLUMN, read with the table's newer schema."""
    for name in schema.names:
        if name not in rows.schema.names:
            rows = rows.append_column(schema.field(name), pa.nulls(rows.num_rows, schema.field(name).type))
    return rows


def added_columns(actual: Sequence[str], expected: Sequence[str], layout: LakeLayout) -> list[str]:
    """The columns a lake table lacks because its strom table gained them since (ADD COLUMN: nullable
    columns after the existing ones): what the lake table must add. Empty when the lake table has every
    column, or when it lacks others too (then it is another table's and the caller refuses it).

    A lake format may append them after the system columns (Delta does): order is not compared.
    """
    missing = [name for name in expected if name not in actual]
    if not missing or any(name not in expected for name in actual):
        return []
    strom_columns = layout.row_type.field_names
    types = {f.name: f.type for f in layout.row_type.fields}
    kept = [name for name in strom_columns if name not in missing]
    if strom_columns[:len(kept)] != kept or not all(name in types and types[name].nullable for name in missing):
        return []  # only nullable columns at the end are ever added
    return missing


@dataclass(frozen=True)
class LakeLayout:
    """The lake schema of one strom table and the conversions between its rows and lake rows."""

    info: TableInfo
    native_time: bool = False
    """TIME stays a time type in the lake (Iceberg has one; Delta has not: there it is int64)."""

    @cached_property
    def row_type(self) -> fluss.RowType:
        return self.info.schema.row_type

    @cached_property
    def _types(self) -> dict[str, fluss.DataType]:
        return {f.name: f.type for f in self.row_type.fields}

    @cached_property
    def table_schema(self) -> pa.Schema:
        """The strom table's Arrow schema (what writers get and readers return)."""
        return fluss.to_arrow_schema(self.row_type)

    @cached_property
    def schema(self) -> pa.Schema:
        """The lake table's Arrow schema: the table's columns in lake types, then the system columns."""
        fields = [
            pa.field(f.name, lake_type(f.type, self.native_time), nullable=f.type.nullable) for f in self.row_type.fields
        ]
        fields += [
            pa.field(BUCKET_COLUMN, pa.int32(), nullable=False),
            pa.field(OFFSET_COLUMN, pa.int64(), nullable=False),
            pa.field(TIMESTAMP_COLUMN, pa.timestamp("us", tz="UTC"), nullable=False),
        ]
        return pa.schema(fields)

    @property
    def partition_columns(self) -> list[str]:
        return [*self.info.partition_keys, BUCKET_COLUMN]

    @cached_property
    def primary_key(self) -> list[str]:
        """The physical primary key: within one (partition, bucket) it identifies a row. Empty for log
        tables."""
        return list(self.info.descriptor.physical_primary_key)

    def validate(self) -> None:
        """Refuse what the lake cannot hold.

        Raises:
            InvalidTableError: a column named like a system column, or a partition key of a type whose
                partition name is no lake partition value.
        """
        clash = [name for name in self.row_type.field_names if name in SYSTEM_COLUMNS]
        if clash:
            raise InvalidTableError(
                f"table '{self.info.path}' has columns {clash}: the lake reserves {list(SYSTEM_COLUMNS)}"
            )
        for key in self.info.partition_keys:
            if not isinstance(self._types[key], _PARTITION_KEY_TYPES):
                raise InvalidTableError(
                    f"table '{self.info.path}': partition key '{key}' of type {self._types[key]} cannot be a lake "
                    f"partition column (STRING, CHAR, BOOLEAN, integers and DATE can)"
                )

    def partition_values(self, bucket: int, partition_name: str | None) -> dict[str, str]:
        """Partition column -> value string, as the lake's file actions store them."""
        values: dict[str, str] = {}
        keys = self.info.partition_keys
        if keys:
            if partition_name is None:
                raise ValueError(f"table '{self.info.path}' is partitioned: a partition name is required")
            parts = partition_name.split(PARTITION_NAME_SEPARATOR)
            if len(parts) != len(keys):
                raise ValueError(f"partition name {partition_name!r} does not match the partition keys {keys}")
            for key, part in zip(keys, parts, strict=True):
                # the partition name holds Python's str() of the value: "True" where the lake says "true"
                values[key] = part.lower() if isinstance(self._types[key], fluss.BooleanType) else part
        elif partition_name is not None:
            raise ValueError(f"table '{self.info.path}' is not partitioned, got partition {partition_name!r}")
        values[BUCKET_COLUMN] = str(bucket)
        return values

    def partition_name(self, values: Mapping[str, str | None]) -> str | None:
        """The strom partition name of lake partition values (the inverse of :meth:`partition_values`)."""
        keys = self.info.partition_keys
        if not keys:
            return None
        parts = []
        for key in keys:
            value = values[key]
            assert value is not None, f"partition column '{key}' without a value"
            parts.append(value.capitalize() if isinstance(self._types[key], fluss.BooleanType) else value)
        return PARTITION_NAME_SEPARATOR.join(parts)

    def _column_to_lake(self, name: str, array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        t = self._types[name]
        return _cast(array, _micros_type(t), lake_type(t, self.native_time))

    def to_lake(self, rows: pa.RecordBatch, bucket: int, offsets: pa.Array, timestamps: pa.Array) -> pa.Table:
        """Strom rows (the table's Arrow schema) as lake rows with the system columns added."""
        assert len(offsets) == rows.num_rows, f"{len(offsets)} offsets for {rows.num_rows} rows"
        assert len(timestamps) == rows.num_rows, f"{len(timestamps)} timestamps for {rows.num_rows} rows"
        columns = [self._column_to_lake(f.name, rows.column(f.name)) for f in self.row_type.fields]
        columns.append(pa.array(np.full(rows.num_rows, bucket, np.int32)))
        columns.append(offsets.cast(pa.int64()))
        millis = pc.max_element_wise(timestamps.cast(pa.int64()), pa.scalar(-1, pa.int64()))
        columns.append(pc.multiply(millis, MICROS_PER_MILLI).cast(pa.timestamp("us", tz="UTC")))
        return pa.Table.from_arrays(columns, schema=self.schema)

    def buckets_in(self, rows: pa.Table) -> list[tuple[str | None, int]]:
        """(partition name, bucket) of every distinct value of :attr:`partition_columns` in ``rows``,
        sorted (what :meth:`~strom.lake.format.LakeTable.buckets` lists)."""
        keys = self.partition_columns
        found = set()
        for row in rows.select(keys).group_by(keys).aggregate([]).to_pylist():
            values = {key: str(row[key]).lower() if isinstance(row[key], bool) else str(row[key]) for key in keys}
            found.add((self.partition_name(values), row[BUCKET_COLUMN]))
        return sorted(found, key=lambda pair: (pair[0] or "", pair[1]))

    def keys_to_lake(self, keys: pa.Table) -> pa.Table:
        """Primary-key columns of ``keys`` (strom types) in lake types, to compare with stored keys."""
        columns = [self._column_to_lake(name, keys.column(name)) for name in self.primary_key]
        return pa.Table.from_arrays(columns, schema=pa.schema([self.schema.field(name) for name in self.primary_key]))

    def from_lake(
        self,
        rows: pa.RecordBatch | pa.Table,
        columns: Sequence[str] | None = None,
        with_system_columns: bool = False,
    ) -> pa.Table:
        """Lake rows back in the strom table's Arrow schema (only ``columns`` if given; system columns
        appended if asked)."""
        arrays, fields = [], []
        for name in columns if columns is not None else self.row_type.field_names:
            target = self.table_schema.field(name)
            arrays.append(_cast(rows.column(name), _micros_type(self._types[name]), target.type))
            fields.append(target)
        if with_system_columns:
            for name in SYSTEM_COLUMNS:
                arrays.append(rows.column(name))
                fields.append(self.schema.field(name))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
