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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

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


class _IcebergTypes(fluss.DataTypeVisitor[IcebergType]):
    """The Iceberg type Fluss maps each Fluss type to; nested fields take their ids from ``ids``."""

    __slots__ = ("ids",)

    def __init__(self, ids: _Ids) -> None:
        self.ids = ids

    def default(self, t: fluss.DataType) -> IcebergType:
        raise InvalidTableError(f"type {t} has no Iceberg type")

    def visit_boolean(self, t: fluss.BooleanType) -> IcebergType:
        return BooleanType()

    def visit_tinyint(self, t: fluss.TinyIntType) -> IcebergType:
        return IntegerType()

    def visit_smallint(self, t: fluss.SmallIntType) -> IcebergType:
        return IntegerType()

    def visit_int(self, t: fluss.IntType) -> IcebergType:
        return IntegerType()

    def visit_bigint(self, t: fluss.BigIntType) -> IcebergType:
        return LongType()

    def visit_float(self, t: fluss.FloatType) -> IcebergType:
        return FloatType()

    def visit_double(self, t: fluss.DoubleType) -> IcebergType:
        return DoubleType()

    def visit_decimal(self, t: fluss.DecimalType) -> IcebergType:
        return DecimalType(t.precision, t.scale)

    def visit_char(self, t: fluss.CharType) -> IcebergType:
        return StringType()

    def visit_string(self, t: fluss.StringType) -> IcebergType:
        return StringType()

    def visit_binary(self, t: fluss.BinaryType) -> IcebergType:
        return BinaryType()

    def visit_bytes(self, t: fluss.BytesType) -> IcebergType:
        return BinaryType()

    def visit_date(self, t: fluss.DateType) -> IcebergType:
        return DateType()

    def visit_time(self, t: fluss.TimeType) -> IcebergType:
        return TimeType()

    def visit_timestamp(self, t: fluss.TimestampType) -> IcebergType:
        return TimestampType()

    def visit_timestamp_ltz(self, t: fluss.TimestampLtzType) -> IcebergType:
        return TimestamptzType()

    def visit_array(self, t: fluss.ArrayType) -> IcebergType:
        element_id = self.ids.next()
        return ListType(element_id, self.visit(t.element), element_required=not t.element.nullable)

    def visit_map(self, t: fluss.MapType) -> IcebergType:
        key_id, value_id = self.ids.next(), self.ids.next()  # consecutive, as the Iceberg spec asks
        return MapType(key_id, self.visit(t.key), value_id, self.visit(t.value),
                       value_required=not t.value.nullable)

    def visit_row(self, t: fluss.RowType) -> IcebergType:
        fields = []
        for f in t.fields:
            kind = self.visit(f.type)
            fields.append(NestedField(self.ids.next(), f.name, kind, required=not f.type.nullable))
        return StructType(*fields)


def iceberg_type(t: fluss.DataType, ids: _Ids) -> IcebergType:
    """The Iceberg type Fluss maps a Fluss type to."""
    return _IcebergTypes(ids).visit(t)


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


class _PartitionValue(NamedTuple):
    """Between a partition key's value as the lake's partition text and as Iceberg's partition tuple holds it."""

    parse: Callable[[str], Any]
    format: Callable[[Any], str]


_TEXT = _PartitionValue(str, str)
_BOOLEAN = _PartitionValue(lambda text: text == "true", lambda value: "true" if value else "false")
_INTEGER = _PartitionValue(int, str)
_DATE = _PartitionValue(
    lambda text: (dt.date.fromisoformat(text) - _EPOCH_DAY).days,
    lambda days: (_EPOCH_DAY + dt.timedelta(days=days)).isoformat(),
)


class _PartitionValues(fluss.DataTypeVisitor[_PartitionValue]):
    """The partition value conversion of each partition key type (text for the rest)."""

    __slots__ = ()

    def default(self, t: fluss.DataType) -> _PartitionValue:
        return _TEXT

    def visit_boolean(self, t: fluss.BooleanType) -> _PartitionValue:
        return _BOOLEAN

    def visit_tinyint(self, t: fluss.TinyIntType) -> _PartitionValue:
        return _INTEGER

    def visit_smallint(self, t: fluss.SmallIntType) -> _PartitionValue:
        return _INTEGER

    def visit_int(self, t: fluss.IntType) -> _PartitionValue:
        return _INTEGER

    def visit_bigint(self, t: fluss.BigIntType) -> _PartitionValue:
        return _INTEGER

    def visit_date(self, t: fluss.DateType) -> _PartitionValue:
        return _DATE


_PARTITION_VALUES = _PartitionValues()


def partition_record(layout: LakeLayout, bucket: int, partition_name: str | None) -> Record:
    """The partition tuple of one strom (partition, bucket): typed partition values, then the bucket id."""
    values: list[Any] = []
    types = {f.name: f.type for f in layout.row_type.fields}
    for key, text in layout.partition_values(bucket, partition_name).items():
        if key == BUCKET_COLUMN:
            continue
        values.append(_PARTITION_VALUES.visit(types[key]).parse(text))
    values.append(bucket)
    return Record(*values)


def record_partition(layout: LakeLayout, record: Record) -> tuple[str | None, int]:
    """(strom partition name, bucket) of a file's partition tuple (the inverse of :func:`partition_record`)."""
    keys = layout.info.partition_keys
    types = {f.name: f.type for f in layout.row_type.fields}
    values: dict[str, str | None] = {}
    for index, key in enumerate(keys):
        values[key] = _PARTITION_VALUES.visit(types[key]).format(record[index])
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
