"""The Iceberg layout of a strom table and the data files a Spark task writes into it.

Schema (as Fluss's Iceberg lake catalog builds it): the table's columns, required where the column is
NOT NULL, then the required system columns ``__bucket`` (int), ``__offset`` (long) and ``__timestamp``
(timestamptz); the identifier fields are the primary key (partition keys included). Types as Fluss maps
them: TINYINT and SMALLINT widen to int, CHAR is string, BINARY(n) and BYTES are binary, TIME is time,
TIMESTAMP timestamp, TIMESTAMP_LTZ timestamptz (both microseconds; nanoseconds are truncated).

Fluss's Iceberg tables keep these system columns: FIP-27 ("clean" lake tables without them) is built for
Paimon only so far. strom's union read and tiering need them too.

Partition spec: identity on each partition key (newer Fluss accepts only STRING partition keys; strom also
takes the other types its partition names can express), then the bucket: ``bucket[N]`` of the bucket key when the
table has one (every primary-key table; Fluss allows one bucket-key column), else identity on ``__bucket``.
With the bucket transform, one Iceberg partition is one strom bucket only because strom's clients assign
buckets with Iceberg's bucket hash for Iceberg tables; the writer puts the strom bucket id in the
partition value as it is, so a file's partition always names the bucket its rows came from.

A writer streams rows into rolling Parquet files whose schema carries the Iceberg field ids
(``PARQUET:field_id``), under ``<table location>/data/<partition path>/``. Nothing is committed here.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.conversions import from_bytes
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

from strom.errors import InvalidConfigError, InvalidTableError
from strom.ids import TableBucket
from strom.lake.copy_on_write import BucketFile, CopyOnWriteWriter, any_in_bounds
from strom.lake.delta_files import DeltaFileSink, FileLimits, WrittenFile
from strom.lake.format import LakeWriteResult
from strom.lake.layout import BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN, LakeLayout
from strom.records import types as fluss

PARTITION_FIELD_ID_START = 1000
"""Iceberg's first partition field id."""
_EPOCH_DAY = dt.date(1970, 1, 1)


class _Ids:
    """Field ids in Fluss's order: the top-level columns first (1..n), nested fields after them."""

    def __init__(self, top_level: int) -> None:
        self._next = top_level + 1

    def next(self) -> int:
        value = self._next
        self._next += 1
        return value


def iceberg_type(t: fluss.DataType, ids: _Ids) -> IcebergType:
    """The Iceberg type Fluss maps a Fluss type to."""
    if isinstance(t, fluss.BooleanType):
        return BooleanType()
    if isinstance(t, (fluss.TinyIntType, fluss.SmallIntType, fluss.IntType)):
        return IntegerType()
    if isinstance(t, fluss.BigIntType):
        return LongType()
    if isinstance(t, fluss.FloatType):
        return FloatType()
    if isinstance(t, fluss.DoubleType):
        return DoubleType()
    if isinstance(t, fluss.DecimalType):
        return DecimalType(t.precision, t.scale)
    if isinstance(t, (fluss.CharType, fluss.StringType)):
        return StringType()
    if isinstance(t, (fluss.BinaryType, fluss.BytesType)):
        return BinaryType()
    if isinstance(t, fluss.DateType):
        return DateType()
    if isinstance(t, fluss.TimeType):
        return TimeType()
    if isinstance(t, fluss.TimestampType):
        return TimestampType()
    if isinstance(t, fluss.TimestampLtzType):
        return TimestamptzType()
    if isinstance(t, fluss.ArrayType):
        element_id = ids.next()
        return ListType(element_id, iceberg_type(t.element, ids), element_required=not t.element.nullable)
    if isinstance(t, fluss.MapType):
        key_id, value_id = ids.next(), ids.next()  # consecutive, as the Iceberg spec asks
        return MapType(key_id, iceberg_type(t.key, ids), value_id, iceberg_type(t.value, ids),
                       value_required=not t.value.nullable)
    if isinstance(t, fluss.RowType):
        fields = []
        for f in t.fields:
            kind = iceberg_type(f.type, ids)
            fields.append(NestedField(ids.next(), f.name, kind, required=not f.type.nullable))
        return StructType(*fields)
    raise InvalidTableError(f"type {t} has no Iceberg type")


def iceberg_schema(layout: LakeLayout) -> Schema:
    """The Iceberg schema of a strom table (see the module docstring)."""
    columns = layout.row_type.fields
    ids = _Ids(len(columns) + 3)
    fields = [
        NestedField(index + 1, f.name, iceberg_type(f.type, ids), required=not f.type.nullable)
        for index, f in enumerate(columns)
    ]
    system = [(BUCKET_COLUMN, IntegerType()), (OFFSET_COLUMN, LongType()), (TIMESTAMP_COLUMN, TimestamptzType())]
    fields += [NestedField(len(columns) + 1 + i, name, kind, required=True) for i, (name, kind) in enumerate(system)]
    primary_key = layout.info.schema.primary_key or ()
    identifiers = [index + 1 for index, f in enumerate(columns) if f.name in primary_key]
    try:
        return Schema(*fields, identifier_field_ids=identifiers)
    except ValueError as exc:  # e.g. a FLOAT or DOUBLE key column: Iceberg refuses it as an identifier field
        raise InvalidTableError(f"table '{layout.info.path}' cannot be an Iceberg table: {exc}") from exc


def bucket_key(layout: LakeLayout) -> str | None:
    """The column Fluss's partition spec buckets by; None: partitioned by ``__bucket`` itself.

    Raises:
        InvalidTableError: more than one bucket-key column (Fluss's Iceberg tables allow one).
    """
    keys = list(layout.info.descriptor.bucket_keys)
    if len(keys) > 1:
        raise InvalidTableError(
            f"table '{layout.info.path}' has bucket keys {keys}: an Iceberg lake table buckets by one column "
            f"(as in Fluss); set 'bucket.key' to one column"
        )
    return keys[0] if keys else None


def partition_spec(layout: LakeLayout, schema: Schema) -> PartitionSpec:
    """Identity on each partition key, then ``bucket[N]`` of the bucket key or identity on ``__bucket``."""
    fields = []
    for key in layout.info.partition_keys:
        fields.append(PartitionField(schema.find_field(key).field_id, 0, IdentityTransform(), key))
    by = bucket_key(layout)
    if by is None:
        fields.append(PartitionField(schema.find_field(BUCKET_COLUMN).field_id, 0, IdentityTransform(), BUCKET_COLUMN))
    else:
        transform: BucketTransform[Any] = BucketTransform(layout.info.bucket_count)
        source = schema.find_field(by)
        if not transform.can_transform(source.field_type):
            raise InvalidTableError(
                f"table '{layout.info.path}': bucket key '{by}' of type {source.field_type} cannot be an Iceberg "
                f"bucket partition"
            )
        fields.append(PartitionField(source.field_id, 0, transform, f"{by}_bucket"))
    return PartitionSpec(*[
        PartitionField(f.source_id, PARTITION_FIELD_ID_START + i, f.transform, f.name) for i, f in enumerate(fields)
    ])


def partition_record(layout: LakeLayout, bucket: int, partition_name: str | None) -> Record:
    """The partition tuple of one strom (partition, bucket): typed partition values, then the bucket id."""
    values: list[Any] = []
    types = {f.name: f.type for f in layout.row_type.fields}
    for key, text in layout.partition_values(bucket, partition_name).items():
        if key == BUCKET_COLUMN:
            continue
        kind = types[key]
        if isinstance(kind, fluss.BooleanType):
            values.append(text == "true")
        elif isinstance(kind, (fluss.TinyIntType, fluss.SmallIntType, fluss.IntType, fluss.BigIntType)):
            values.append(int(text))
        elif isinstance(kind, fluss.DateType):
            values.append((dt.date.fromisoformat(text) - _EPOCH_DAY).days)
        else:
            values.append(text)
    values.append(bucket)
    return Record(*values)


def record_partition(layout: LakeLayout, record: Record) -> tuple[str | None, int]:
    """(strom partition name, bucket) of a file's partition tuple (the inverse of :func:`partition_record`)."""
    keys = layout.info.partition_keys
    types = {f.name: f.type for f in layout.row_type.fields}
    values: dict[str, str | None] = {}
    for index, key in enumerate(keys):
        value = record[index]
        if isinstance(types[key], fluss.BooleanType):
            values[key] = "true" if value else "false"
        elif isinstance(types[key], fluss.DateType):
            values[key] = (_EPOCH_DAY + dt.timedelta(days=value)).isoformat()
        else:
            values[key] = str(value)
    return layout.partition_name(values), int(record[len(keys)])


def file_system(io: FileIO, location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system and path of a location, through the table's FileIO (its credentials)."""
    if not isinstance(io, PyArrowFileIO):
        raise InvalidConfigError(f"strom writes Iceberg tables through pyarrow's file systems, not {type(io).__name__}")
    scheme, netloc, path = io.parse_location(location)
    return io.fs_by_scheme(scheme, netloc), path


def file_location(root: str, relative: str) -> str:
    return f"{root.rstrip('/')}/{relative}"


class IcebergTableFiles(Protocol):
    """What a writer needs of its table (``strom.lake.iceberg.IcebergLakeTable``)."""

    layout: LakeLayout
    limits: FileLimits

    def iceberg(self) -> Table: ...

    def bucket_files(self, snapshot_id: int, partition: Record) -> list[DataFile]: ...


class IcebergLakeWriter(CopyOnWriteWriter):
    """One bucket's new files. Primary-key tables: copy-on-write of the files of this bucket that hold a
    deleted key, as the Delta writer does (files whose key bounds rule out every touched key are not
    read). Runs in one Spark task; not thread-safe."""

    def __init__(
        self, table: IcebergTableFiles, bucket: TableBucket, partition_name: str | None, base: int | None
    ) -> None:
        layout = table.layout
        self._table = table
        self._partition = partition_record(layout, bucket.bucket, partition_name)
        iceberg = table.iceberg()
        self._io = iceberg.io
        self._data_root = f"{iceberg.location().rstrip('/')}/data"
        fs, root = file_system(self._io, self._data_root)
        self._schema = iceberg.schema()
        self._file_schema = schema_to_pyarrow(self._schema, include_field_ids=True)
        directory = iceberg.spec().partition_to_path(self._partition, self._schema)
        sink = DeltaFileSink(fs, root, directory, self._file_schema, table.limits)
        super().__init__(layout, bucket, partition_name, base, fs, sink)

    def _file_rows(self, rows: pa.Table) -> pa.Table:
        return rows.cast(self._file_schema)  # Iceberg's field ids travel in the Parquet schema

    def _added(self, files: Sequence[WrittenFile]) -> list[Any]:
        return [{"path": file_location(self._data_root, f.path), "size": f.size, "records": f.record_count} for f in files]

    def _bucket_files(self, base: int) -> Iterator[BucketFile]:
        for data_file in self._table.bucket_files(base, self._partition):
            _, path = file_system(self._io, data_file.file_path)
            yield BucketFile(path, data_file.file_path, functools.partial(self._may_hold, data_file))

    def _may_hold(self, data_file: DataFile, touched: pa.Table) -> bool:
        """False if the file's lower and upper bounds rule out every touched key (each key column on its
        own). Iceberg's bounds are true bounds (a truncated string's upper bound is rounded up)."""
        lower, upper = data_file.lower_bounds or {}, data_file.upper_bounds or {}
        for name in touched.column_names:
            field = self._schema.find_field(name)
            kind = field.field_type
            if field.field_id not in lower or field.field_id not in upper or not isinstance(kind, PrimitiveType):
                continue
            column = touched.column(name)
            try:
                if pa.types.is_temporal(column.type):
                    column = column.cast(pa.int32() if pa.types.is_date32(column.type) else pa.int64())
                low = pa.scalar(from_bytes(kind, lower[field.field_id]), column.type)
                high = pa.scalar(from_bytes(kind, upper[field.field_id]), column.type)
                if not any_in_bounds(column, low, high):
                    return False
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError, ValueError):
                continue  # bounds of a type we cannot compare: read the file
        return True


def file_paths(results: Sequence[LakeWriteResult], kind: str) -> list[Any]:
    """The ``add`` entries or ``remove`` paths of results' payloads."""
    return [entry for result in results for entry in json.loads(result.payload)[kind]]
