"""Creating a table from a DataFrame's schema, and checking an existing table against one.

``df.write.format("fluss")`` creates its table when it does not exist: the columns are the DataFrame's (less
the change-type column), their types mapped back from Spark (:func:`from_spark_type`), the layout from the
write's options (``primary.key``, ``bucket.num``, ``bucket.key``, ``partition.key``, ``table.*``,
``comment``). When the table exists and the write declares a layout, the table must match it: the same
columns with the same Spark types (compared through the read mapping, so CHAR(n) and STRING both match a
Spark STRING), the same primary key and partition keys, and the bucket count and key where given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strom.client import Connection
from strom.client.table import TableLayout
from strom.ids import TablePath
from strom.records import types as fluss
from strom.records.schema import Column, Schema, TableDescriptor
from strom.spark.errors import FlussConnectorError
from strom.spark.options import BUCKET_NUMBER, PRIMARY_KEY, TableCreation
from strom.spark.type_mapping import to_spark_type

if TYPE_CHECKING:
    from pyspark.sql import types as st

TIMESTAMP_PRECISION = 6
"""Spark keeps microseconds: tables created from Spark get TIMESTAMP(6) / TIMESTAMP_LTZ(6)."""


def from_spark_type(t: st.DataType, nullable: bool = True) -> fluss.DataType:
    """The Fluss type a Spark type is created as (the inverse of the read mapping where one exists).

    Raises:
        FlussConnectorError: a Spark type Fluss cannot hold (intervals, VARIANT, NULL, …).
    """
    from pyspark.sql import types as st

    simple: dict[type[st.DataType], type[fluss.DataType]] = {
        st.BooleanType: fluss.BooleanType, st.ByteType: fluss.TinyIntType, st.ShortType: fluss.SmallIntType,
        st.IntegerType: fluss.IntType, st.LongType: fluss.BigIntType, st.FloatType: fluss.FloatType,
        st.DoubleType: fluss.DoubleType, st.StringType: fluss.StringType, st.CharType: fluss.StringType,
        st.VarcharType: fluss.StringType, st.BinaryType: fluss.BytesType, st.DateType: fluss.DateType,
    }
    mapped = simple.get(type(t))
    if mapped is not None:
        return mapped(nullable=nullable)
    if isinstance(t, st.TimestampType):
        return fluss.TimestampLtzType(TIMESTAMP_PRECISION, nullable=nullable)
    if isinstance(t, st.TimestampNTZType):
        return fluss.TimestampType(TIMESTAMP_PRECISION, nullable=nullable)
    if isinstance(t, st.DecimalType):
        return fluss.DecimalType(t.precision, t.scale, nullable=nullable)
    if type(t).__name__ == "TimeType":  # Spark 4.1+
        return fluss.TimeType(getattr(t, "precision", 6), nullable=nullable)
    if isinstance(t, st.ArrayType):
        return fluss.ArrayType(from_spark_type(t.elementType, t.containsNull), nullable=nullable)
    if isinstance(t, st.MapType):
        return fluss.MapType(from_spark_type(t.keyType, False), from_spark_type(t.valueType, t.valueContainsNull), nullable=nullable)
    if isinstance(t, st.StructType):
        fields = tuple(fluss.DataField(f.name, from_spark_type(f.dataType, f.nullable)) for f in t.fields)
        return fluss.RowType(fields, nullable=nullable)
    raise FlussConnectorError(f"the Spark type {t.simpleString()} has no Fluss type to create a column with")


def table_descriptor(schema: st.StructType, creation: TableCreation, change_type_column: str | None) -> TableDescriptor:
    """The table a write of ``schema`` creates.

    Raises:
        FlussConnectorError: a key names no column, or a type has no Fluss equivalent.
    """
    fields = [f for f in schema.fields if f.name != change_type_column]
    names = [f.name for f in fields]
    for option, keys in (("primary.key", creation.primary_key), ("bucket.key", creation.bucket_key),
                         ("partition.key", creation.partition_keys), ("auto-increment.fields", creation.auto_increment)):
        unknown = [key for key in keys if key not in names]
        if unknown:
            raise FlussConnectorError(f"option '{option}' names {unknown}, which the DataFrame lacks (it has {names})")
    key = set(creation.primary_key)
    columns = tuple(
        Column(f.name, from_spark_type(f.dataType, f.nullable and f.name not in key)) for f in fields
    )
    table_options = {k: v for k, v in creation.properties}
    try:
        return TableDescriptor(
            Schema(columns, creation.primary_key or None, auto_increment_columns=creation.auto_increment),
            partition_keys=creation.partition_keys,
            bucket_keys=creation.bucket_key, bucket_count=creation.bucket_count, properties=table_options,
            comment=creation.comment,
        )
    except ValueError as exc:
        raise FlussConnectorError(f"cannot create a table from the DataFrame: {exc}") from None


def mismatches(layout: TableLayout, schema: st.StructType, creation: TableCreation, change_type_column: str | None) -> list[str]:
    """How an existing table differs from what the write declares (empty: it matches)."""
    found: list[str] = []
    wanted = {f.name: f.dataType for f in schema.fields if f.name != change_type_column}
    columns = {f.name: f.type for f in layout.row_type.fields}
    if set(wanted) != set(columns):
        found.append(f"columns {list(columns)}, the DataFrame has {list(wanted)}")
    for name, spark_type in wanted.items():
        fluss_type = columns.get(name)
        if fluss_type is not None and to_spark_type(fluss_type).simpleString() != spark_type.simpleString():
            found.append(f"column '{name}' is {fluss_type} (read as {to_spark_type(fluss_type).simpleString()}), "
                         f"the DataFrame's is {spark_type.simpleString()}")
    if tuple(layout.primary_key) != creation.primary_key:
        found.append(f"primary key {list(layout.primary_key)}, option '{PRIMARY_KEY.key}' says {list(creation.primary_key)}")
    if creation.bucket_count is not None and layout.info.bucket_count != creation.bucket_count:
        found.append(f"{layout.info.bucket_count} buckets, option '{BUCKET_NUMBER.key}' says {creation.bucket_count}")
    bucket_key = tuple(layout.column_names[i] for i in layout.bucket_key_indexes)
    if creation.bucket_key and bucket_key != creation.bucket_key:
        found.append(f"bucket key {list(bucket_key)}, option 'bucket.key' says {list(creation.bucket_key)}")
    if tuple(layout.partition_keys) != creation.partition_keys:
        found.append(f"partition keys {list(layout.partition_keys)}, option 'partition.key' says {list(creation.partition_keys)}")
    return found


async def load_or_create(
    connection: Connection, path: TablePath, schema: st.StructType, creation: TableCreation, change_type_column: str | None
) -> tuple[TableLayout, bool]:
    """The table at ``path``, created from ``schema`` first if it does not exist; and whether it was created.

    Raises:
        FlussConnectorError: the table exists, the write declares a layout, and the table differs from it.
    """
    admin = connection.get_admin()
    created = False
    if not await admin.table_exists(path):
        await admin.create_table(path, table_descriptor(schema, creation, change_type_column), ignore_if_exists=True)
        created = True
    layout = (await connection.get_table(path)).layout
    if creation.declared and not created:
        differences = mismatches(layout, schema, creation, change_type_column)
        if differences:
            raise FlussConnectorError(
                f"table '{path}' exists and differs from the DataFrame and the write's options: {'; '.join(differences)}"
            )
    return layout, created
