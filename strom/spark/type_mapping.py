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

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from strom.records.types import (
    ArrayType,
    BigIntType,
    BinaryType,
    BooleanType,
    BytesType,
    CharType,
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
    time_unit,
    to_arrow_type,
)
from strom.spark.errors import FlussConnectorError

if TYPE_CHECKING:
    from pyspark.sql import types as st

    from strom.client.table import TableLayout

TIME_EPOCH_PREFIX = "1970-01-01 "
NANOS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def to_spark_type(t: DataType) -> st.DataType:
    """The Spark type a Fluss type reads as (see the module docstring)."""
    from pyspark.sql import types as st

    simple: dict[type[DataType], st.DataType] = {
        BooleanType: st.BooleanType(),
        TinyIntType: st.ByteType(),
        SmallIntType: st.ShortType(),
        IntType: st.IntegerType(),
        BigIntType: st.LongType(),
        FloatType: st.FloatType(),
        DoubleType: st.DoubleType(),
        CharType: st.StringType(),
        StringType: st.StringType(),
        BytesType: st.BinaryType(),
        BinaryType: st.BinaryType(),
        DateType: st.DateType(),
        TimeType: st.StringType(),
        TimestampType: st.TimestampNTZType(),
        TimestampLtzType: st.TimestampType(),
    }
    mapped = simple.get(type(t))
    if mapped is not None:
        return mapped
    if isinstance(t, DecimalType):
        return st.DecimalType(t.precision, t.scale)
    if isinstance(t, ArrayType):
        return st.ArrayType(to_spark_type(t.element), containsNull=t.element.nullable)
    if isinstance(t, MapType):
        return st.MapType(to_spark_type(t.key), to_spark_type(t.value), valueContainsNull=t.value.nullable)
    if isinstance(t, RowType):
        return st.StructType([st.StructField(f.name, to_spark_type(f.type), f.type.nullable) for f in t.fields])
    raise FlussConnectorError(f"the Fluss type {t} has no Spark mapping")


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

    types: dict[str, st.DataType] = {
        "_log_offset": st.LongType(), "_commit_timestamp": st.TimestampType(), "_bucket": st.IntegerType()
    }
    return types[name]


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


def _contains_time(t: DataType) -> bool:
    if isinstance(t, TimeType):
        return True
    if isinstance(t, ArrayType):
        return _contains_time(t.element)
    if isinstance(t, MapType):
        return _contains_time(t.key) or _contains_time(t.value)
    if isinstance(t, RowType):
        return any(_contains_time(f.type) for f in t.fields)
    return False


def _time_to_string(array: pa.Array, t: TimeType) -> pa.Array:
    unit = time_unit(t.precision)
    as_int = array.cast(pa.int64() if unit in ("us", "ns") else pa.int32()).cast(pa.int64())
    return pc.strftime(as_int.cast(pa.timestamp(unit)), format="%H:%M:%S")


def _string_to_time(array: pa.Array, t: TimeType) -> pa.Array:
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


def _convert_nested(array: pa.Array, t: DataType, target: pa.DataType, to_spark: bool) -> pa.Array:
    """Convert an array whose type contains TIME, recursing through ARRAY, MAP and ROW."""
    if isinstance(t, TimeType):
        return _time_to_string(array, t) if to_spark else _string_to_time(array, t)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(t, ArrayType) and isinstance(array, (pa.ListArray, pa.LargeListArray)):
        values = _convert_nested(array.flatten(), t.element, target.value_type, to_spark)
        offsets = pc.subtract(array.offsets, array.offsets[0])
        return type(array).from_arrays(offsets, values, type=target, mask=array.is_null())
    if isinstance(t, MapType) and isinstance(array, pa.MapArray):
        keys = _convert_nested(array.keys, t.key, target.key_type, to_spark)
        items = _convert_nested(array.items, t.value, target.item_type, to_spark)
        offsets = pc.subtract(array.offsets, array.offsets[0])
        return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=array.is_null())
    if isinstance(t, RowType) and isinstance(array, pa.StructArray):
        children = []
        for index, f in enumerate(t.fields):
            child_target = target.field(index).type
            child = array.field(index)
            if _contains_time(f.type):
                children.append(_convert_nested(child, f.type, child_target, to_spark))
            else:
                children.append(child.cast(child_target, safe=not to_spark))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=array.is_null())
    raise FlussConnectorError(f"cannot convert a {array.type} column to {target}")


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
    return isinstance(t, (TimestampType, TimestampLtzType, TimeType))


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
