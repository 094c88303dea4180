"""Fluss types as Spark types, and Arrow batches converted between the two layouts.

Spark checks that a reader's Arrow batches match, field for field, the Arrow form of the declared Spark
schema (``pyspark.sql.pandas.types.to_arrow_schema``), nullability included; and its Arrow writer hands
over batches in that same form. Fluss's Arrow form differs in a few places (timestamp units, fixed-size
binary, TIME), so every batch crosses :func:`to_spark_batch` on the way out and :func:`to_fluss_batch` on
the way in.

The mapping (also in docs/spark.md):

=====================  ===================  =====================================================
Fluss                  Spark                note
=====================  ===================  =====================================================
BOOLEAN                BOOLEAN
TINYINT                TINYINT (byte)
SMALLINT               SMALLINT
INT                    INT
BIGINT                 BIGINT
FLOAT / DOUBLE         FLOAT / DOUBLE
CHAR(n) / STRING       STRING               Spark's CHAR padding rules are not applied
DECIMAL(p, s)          DECIMAL(p, s)
DATE                   DATE
TIME(p)                STRING               ``HH:MM:SS[.fff|.ffffff|.fffffffff]``; see below
TIMESTAMP(p)           TIMESTAMP_NTZ        microseconds: p > 6 is truncated
TIMESTAMP_LTZ(p)       TIMESTAMP            an instant; microseconds: p > 6 is truncated
BYTES / BINARY(n)      BINARY               writes into BINARY(n) need exactly n bytes
ARRAY<t>               ARRAY<t>
MAP<k, v>              MAP<k, v>
ROW<…>                 STRUCT<…>
=====================  ===================  =====================================================

TIME: Spark 4.3 has a TIME type, but Parquet, ORC and most sinks reject it (``UNSUPPORTED_TIME_TYPE``), so
a Fluss TIME column is a STRING that Spark casts to TIME on demand (``CAST(t AS TIME)``). Writes accept
that string form or a Spark TIME column. Fluss has no unsigned integer types, so none need mapping.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from strom.records import types as fluss
from strom.records.types import DataType, RowType, time_unit, to_arrow_type
from strom.spark.errors import FlussConnectorError

if TYPE_CHECKING:
    from pyspark.sql import types as st

    from strom.client.table import TableLayout

TIME_EPOCH_PREFIX = "1970-01-01 "
NANOS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


class _SparkTypes(fluss.DataTypeVisitor["st.DataType"]):
    """The Spark type each Fluss type reads as; pyspark is imported on first use, not with this module."""

    __slots__ = ("st",)

    def __init__(self) -> None:
        from pyspark.sql import types as st

        self.st = st

    def default(self, t: DataType) -> st.DataType:
        raise FlussConnectorError(f"the Fluss type {t} has no Spark mapping")

    def visit_boolean(self, t: fluss.BooleanType) -> st.DataType:
        return self.st.BooleanType()

    def visit_tinyint(self, t: fluss.TinyIntType) -> st.DataType:
        return self.st.ByteType()

    def visit_smallint(self, t: fluss.SmallIntType) -> st.DataType:
        return self.st.ShortType()

    def visit_int(self, t: fluss.IntType) -> st.DataType:
        return self.st.IntegerType()

    def visit_bigint(self, t: fluss.BigIntType) -> st.DataType:
        return self.st.LongType()

    def visit_float(self, t: fluss.FloatType) -> st.DataType:
        return self.st.FloatType()

    def visit_double(self, t: fluss.DoubleType) -> st.DataType:
        return self.st.DoubleType()

    def visit_char(self, t: fluss.CharType) -> st.DataType:
        return self.st.StringType()

    def visit_string(self, t: fluss.StringType) -> st.DataType:
        return self.st.StringType()

    def visit_bytes(self, t: fluss.BytesType) -> st.DataType:
        return self.st.BinaryType()

    def visit_binary(self, t: fluss.BinaryType) -> st.DataType:
        return self.st.BinaryType()

    def visit_date(self, t: fluss.DateType) -> st.DataType:
        return self.st.DateType()

    def visit_time(self, t: fluss.TimeType) -> st.DataType:
        return self.st.StringType()

    def visit_timestamp(self, t: fluss.TimestampType) -> st.DataType:
        return self.st.TimestampNTZType()

    def visit_timestamp_ltz(self, t: fluss.TimestampLtzType) -> st.DataType:
        return self.st.TimestampType()

    def visit_decimal(self, t: fluss.DecimalType) -> st.DataType:
        return self.st.DecimalType(t.precision, t.scale)

    def visit_array(self, t: fluss.ArrayType) -> st.DataType:
        return self.st.ArrayType(self.visit(t.element), containsNull=t.element.nullable)

    def visit_map(self, t: fluss.MapType) -> st.DataType:
        return self.st.MapType(self.visit(t.key), self.visit(t.value), valueContainsNull=t.value.nullable)

    def visit_row(self, t: RowType) -> st.DataType:
        return self.st.StructType([self.st.StructField(f.name, self.visit(f.type), f.type.nullable) for f in t.fields])


@functools.cache
def _spark_types() -> _SparkTypes:
    return _SparkTypes()


def to_spark_type(t: DataType) -> st.DataType:
    """The Spark type a Fluss type reads as (see the module docstring)."""
    return _spark_types().visit(t)


def to_spark_schema(row_type: RowType, change_type_column: str | None = None) -> st.StructType:
    """The table's columns (nullability kept), plus a STRING change-type column when asked for."""
    from pyspark.sql import types as st

    fields = [st.StructField(f.name, to_spark_type(f.type), f.type.nullable) for f in row_type.fields]
    if change_type_column:
        fields.append(st.StructField(change_type_column, st.StringType(), False))
    return st.StructType(fields)


def metadata_type(name: str) -> st.DataType:
    """Spark types of the metadata columns of option ``read.metadata-columns`` (all nullable: rows read from
a KV snapshot, a lake or a lookup have no log position)."""
    from pyspark.sql import types as st

    by_name: dict[str, st.DataType] = {
        "_log_offset": st.LongType(), "_commit_timestamp": st.TimestampType(), "_bucket": st.IntegerType()
    }
    return by_name[name]


def read_schema(
    row_type: RowType, change_type_column: str | None = None, metadata_columns: tuple[str, ...] = ()
) -> st.StructType:
    """What a read returns: the table's columns, the change type column, then the metadata columns."""
    from pyspark.sql import types as st

    schema = to_spark_schema(row_type, change_type_column)
    for name in metadata_columns:
        schema = schema.add(st.StructField(name, metadata_type(name), True))
    return schema


def spark_arrow_schema(schema: st.StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from a reader of ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class _ContainsTime(fluss.DataTypeVisitor[bool]):
    """Whether a type is TIME or holds one in an ARRAY, MAP or ROW."""

    __slots__ = ()

    def default(self, t: DataType) -> bool:
        return False

    def visit_time(self, t: fluss.TimeType) -> bool:
        return True

    def visit_array(self, t: fluss.ArrayType) -> bool:
        return self.visit(t.element)

    def visit_map(self, t: fluss.MapType) -> bool:
        return self.visit(t.key) or self.visit(t.value)

    def visit_row(self, t: RowType) -> bool:
        return any(self.visit(f.type) for f in t.fields)


_CONTAINS_TIME = _ContainsTime()


def _contains_time(t: DataType) -> bool:
    return _CONTAINS_TIME.visit(t)


def _time_to_string(array: pa.Array, t: fluss.TimeType) -> pa.Array:
    unit = time_unit(t.precision)
    as_int = array.cast(pa.int64() if unit in ("us", "ns") else pa.int32()).cast(pa.int64())
    return pc.strftime(as_int.cast(pa.timestamp(unit)), format="%H:%M:%S")


def _string_to_time(array: pa.Array, t: fluss.TimeType) -> pa.Array:
    target = to_arrow_type(t)
    unit = time_unit(t.precision)
    if pa.types.is_time(array.type):
        return array.cast(target, safe=False)
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise FlussConnectorError(f"a TIME column takes strings like '12:30:00.5' or Spark TIME values, got {array.type}")
    stamps = pc.binary_join_element_wise(TIME_EPOCH_PREFIX, array, "").cast(pa.timestamp("ns"))
    nanos = stamps.cast(pa.int64())
    scaled = pc.divide(nanos, NANOS_PER_UNIT[unit]) if unit != "ns" else nanos
    physical = pa.int64() if unit in ("us", "ns") else pa.int32()
    return scaled.cast(physical).cast(target)


class _NestedConversion(fluss.DataTypeVisitor[pa.Array]):
    """Converts ``array`` to ``target`` (to Spark's layout or from it), its type containing TIME."""

    __slots__ = ("array", "target", "to_spark")

    def __init__(self, array: pa.Array, target: pa.DataType, to_spark: bool) -> None:
        self.array = array
        self.target = target
        self.to_spark = to_spark

    def _combined(self) -> pa.Array:
        if isinstance(self.array, pa.ChunkedArray):
            self.array = self.array.combine_chunks()
        return self.array

    def default(self, t: DataType) -> pa.Array:
        array = self._combined()
        raise FlussConnectorError(f"cannot convert a {array.type} column to {self.target}")

    def visit_time(self, t: fluss.TimeType) -> pa.Array:
        return _time_to_string(self.array, t) if self.to_spark else _string_to_time(self.array, t)

    def visit_array(self, t: fluss.ArrayType) -> pa.Array:
        array, target, to_spark = self._combined(), self.target, self.to_spark
        if not isinstance(array, (pa.ListArray, pa.LargeListArray)):
            return self.default(t)
        values = _convert_nested(array.flatten(), t.element, target.value_type, to_spark)
        offsets = pc.subtract(array.offsets, array.offsets[0])
        return type(array).from_arrays(offsets, values, type=target, mask=array.is_null())

    def visit_map(self, t: fluss.MapType) -> pa.Array:
        array, target, to_spark = self._combined(), self.target, self.to_spark
        if not isinstance(array, pa.MapArray):
            return self.default(t)
        keys = _convert_nested(array.keys, t.key, target.key_type, to_spark)
        items = _convert_nested(array.items, t.value, target.item_type, to_spark)
        offsets = pc.subtract(array.offsets, array.offsets[0])
        return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=array.is_null())

    def visit_row(self, t: RowType) -> pa.Array:
        array, target, to_spark = self._combined(), self.target, self.to_spark
        if not isinstance(array, pa.StructArray):
            return self.default(t)
        children = []
        for index, f in enumerate(t.fields):
            child_target = target.field(index).type
            child = array.field(index)
            if _contains_time(f.type):
                children.append(_convert_nested(child, f.type, child_target, to_spark))
            else:
                children.append(child.cast(child_target, safe=not to_spark))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=array.is_null())


def _convert_nested(array: pa.Array, t: DataType, target: pa.DataType, to_spark: bool) -> pa.Array:
    """Convert an array whose type contains TIME, recursing through ARRAY, MAP and ROW."""
    return _NestedConversion(array, target, to_spark).visit(t)


def to_spark_batch(batch: pa.RecordBatch, row_type: RowType, target: pa.Schema) -> pa.RecordBatch:
    """A batch of the table's Arrow layout in Spark's layout ``target`` (first ``row_type`` columns)."""
    columns = []
    for index, f in enumerate(row_type.fields):
        array = batch.column(index)
        field_type = target.field(index).type
        if _contains_time(f.type):
            columns.append(_convert_nested(array, f.type, field_type, to_spark=True))
        elif array.type != field_type:
            columns.append(array.cast(field_type, safe=False))  # only unit and width changes; truncates ns
        else:
            columns.append(array)
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(list(target)[: len(columns)]))


def _truncating(t: DataType) -> bool:
    return isinstance(t, (fluss.TimestampType, fluss.TimestampLtzType, fluss.TimeType))


def to_fluss_batch(batch: pa.RecordBatch, layout: TableLayout, ignored: tuple[str, ...] = ()) -> pa.RecordBatch:
    """A Spark batch (columns matched by name) in the table's exact Arrow layout.

    Raises:
        FlussConnectorError: a table column is missing, an input column is unknown, a value does not fit
            the column's type, or a NOT NULL column holds nulls.
    """
    table = str(layout.info.path)
    names = batch.schema.names
    unknown = [name for name in names if name not in layout.column_names and name not in ignored]
    if unknown:
        raise FlussConnectorError(f"table '{table}' has no columns {unknown} (it has {layout.column_names})")
    assigned = layout.info.schema.auto_increment_columns  # the server fills them; the DataFrame may lack them
    missing = [name for name in layout.column_names if name not in names and name not in assigned]
    if missing:
        raise FlussConnectorError(f"the DataFrame lacks columns {missing} of table '{table}'")
    columns = []
    for f, arrow_field in zip(layout.row_type.fields, layout.arrow_schema, strict=True):
        if f.name in assigned:
            if f.name in names and batch.column(names.index(f.name)).null_count != batch.num_rows:
                raise FlussConnectorError(
                    f"column '{f.name}' of table '{table}' is auto-increment: the server assigns its values, so the "
                    "DataFrame must leave it out (or hold only nulls in it)"
                )
            columns.append(pa.nulls(batch.num_rows, arrow_field.type))
            continue
        array = batch.column(names.index(f.name))
        try:
            if _contains_time(f.type):
                array = _convert_nested(array, f.type, arrow_field.type, to_spark=False)
            elif array.type != arrow_field.type:
                array = array.cast(arrow_field.type, safe=not _truncating(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise FlussConnectorError(f"column '{f.name}' of table '{table}' ({f.type}) cannot take {array.type}: {exc}") from None
        if not f.type.nullable and array.null_count:
            raise FlussConnectorError(f"column '{f.name}' of table '{table}' is NOT NULL but the DataFrame has {array.null_count} null(s)")
        columns.append(array)
    return pa.RecordBatch.from_arrays(columns, schema=layout.arrow_schema)
