"""How a strom table lays out in the lake: columns, Fluss's system columns, types, partitioning.

The lake table has the strom table's columns, then ``__bucket`` (int32), ``__offset`` (int64: the log
offset of the row's last change, -1 for rows from a KV snapshot) and ``__timestamp`` (timestamp UTC: the
commit time of that change). It is partitioned by the table's partition keys, then ``__bucket``, so a
bucket's files are found from partition values alone (Fluss lays Iceberg tables out the same way).

Lake formats know fewer types than Fluss: TIME becomes int64 microseconds of the day, every timestamp
keeps microseconds (nanoseconds are truncated), fixed-size BINARY(n) becomes variable binary. Reading
back converts to the strom table's Arrow types.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from strom.metadata.table_info import TableInfo
from strom.records import types as fluss
from strom.records.types import to_arrow_schema

BUCKET_COLUMN = "__bucket"
OFFSET_COLUMN = "__offset"
TIMESTAMP_COLUMN = "__timestamp"
SYSTEM_COLUMNS = (BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN)
_MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}


def lake_type(t: fluss.DataType) -> pa.DataType:
    """The lake's Arrow type for a Fluss type (see the module docstring for what changes)."""
    if isinstance(t, fluss.TimeType):
        return pa.int64()
    if isinstance(t, fluss.TimestampType):
        return pa.timestamp("us")
    if isinstance(t, fluss.TimestampLtzType):
        return pa.timestamp("us", tz="UTC")
    if isinstance(t, (fluss.BinaryType, fluss.BytesType)):
        return pa.binary()
    if isinstance(t, (fluss.CharType, fluss.StringType)):
        return pa.string()
    if isinstance(t, fluss.ArrayType):
        return pa.list_(pa.field("element", lake_type(t.element), nullable=t.element.nullable))
    if isinstance(t, fluss.MapType):
        return pa.map_(pa.field("key", lake_type(t.key), nullable=False), pa.field("value", lake_type(t.value), nullable=t.value.nullable))
    if isinstance(t, fluss.RowType):
        return pa.struct([pa.field(f.name, lake_type(f.type), nullable=f.type.nullable) for f in t.fields])
    return fluss.to_arrow_type(t)


def _contains_time(t: fluss.DataType) -> bool:
    if isinstance(t, fluss.TimeType):
        return True
    if isinstance(t, fluss.ArrayType):
        return _contains_time(t.element)
    if isinstance(t, fluss.MapType):
        return _contains_time(t.key) or _contains_time(t.value)
    if isinstance(t, fluss.RowType):
        return any(_contains_time(f.type) for f in t.fields)
    return False


def _time_to_micros(array: pa.Array, unit: str) -> pa.Array:
    raw = array.cast(pa.int32() if unit in ("s", "ms") else pa.int64()).cast(pa.int64())
    if unit == "ns":
        return pc.divide(raw, 1000)
    return pc.multiply(raw, _MICROS_PER_UNIT[unit])


def _micros_to_time(array: pa.Array, target: pa.DataType) -> pa.Array:
    unit = target.unit
    scaled = pc.multiply(array, 1000) if unit == "ns" else pc.divide(array, _MICROS_PER_UNIT[unit])
    return scaled.cast(pa.int32() if unit in ("s", "ms") else pa.int64()).cast(target)


@dataclass(frozen=True)
class LakeLayout:
    """The lake schema of one strom table and the conversions between its rows and lake rows."""

    info: TableInfo

    @cached_property
    def row_type(self) -> fluss.RowType:
        return self.info.schema.row_type

    @cached_property
    def table_schema(self) -> pa.Schema:
        """The strom table's Arrow schema (what writers get and readers return)."""
        return to_arrow_schema(self.row_type)

    @cached_property
    def schema(self) -> pa.Schema:
        fields = [pa.field(f.name, lake_type(f.type), nullable=f.type.nullable) for f in self.row_type.fields]
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
        """The physical primary key: within one (partition, bucket) it identifies a row."""
        key = list(self.info.schema.primary_key or [])
        return [k for k in key if k not in self.info.partition_keys]

    def partition_values(self, bucket: int, partition_name: str | None) -> dict[str, str]:
        """Partition column -> value string, as the lake's file actions store them."""
        values: dict[str, str] = {}
        keys = self.info.partition_keys
        if keys:
            if partition_name is None:
                raise ValueError(f"table '{self.info.path}' is partitioned: a partition name is required")
            parts = partition_name.split("$")
            if len(parts) != len(keys):
                raise ValueError(f"partition name {partition_name!r} does not match the partition keys {keys}")
            values.update(zip(keys, parts, strict=True))
        values[BUCKET_COLUMN] = str(bucket)
        return values

    def to_lake(self, rows: pa.RecordBatch, bucket: int, offsets: pa.Array, timestamps: pa.Array) -> pa.Table:
        """Strom rows (the table's Arrow schema) as lake rows with the system columns added."""
        columns = []
        for field, lake_field in zip(self.row_type.fields, self.schema, strict=False):
            array = rows.column(field.name)
            if isinstance(field.type, fluss.TimeType):
                array = _time_to_micros(array, array.type.unit)
            elif _contains_time(field.type):
                raise TypeError(f"column '{field.name}': TIME inside a nested type is not supported in the lake")
            else:
                array = array.cast(lake_field.type, safe=False)
            columns.append(array)
        count = rows.num_rows
        columns.append(pa.array(np.full(count, bucket, np.int32)))
        columns.append(offsets.cast(pa.int64()))
        millis = pc.max_element_wise(timestamps.cast(pa.int64()), pa.scalar(-1, pa.int64()))
        columns.append(pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC")))
        return pa.Table.from_arrays(columns, schema=self.schema)

    def from_lake(self, rows: pa.RecordBatch | pa.Table, with_system_columns: bool = False) -> pa.Table:
        """Lake rows back in the strom table's Arrow schema (system columns dropped unless asked)."""
        columns, fields = [], []
        for field, target in zip(self.row_type.fields, self.table_schema, strict=True):
            array = rows.column(field.name)
            if isinstance(field.type, fluss.TimeType):
                array = _micros_to_time(array, target.type)
            else:
                array = array.cast(target.type)
            columns.append(array)
            fields.append(target)
        if with_system_columns:
            for name in SYSTEM_COLUMNS:
                columns.append(rows.column(name))
                fields.append(self.schema.field(name))
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))
