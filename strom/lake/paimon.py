"""Apache Paimon through pypaimon-rust: the lake copy of a strom table as a Paimon table, laid out as
Fluss's Paimon tiering lays out its tables.

What Fluss does, from its ``fluss-lake-paimon`` module (facts this module follows):

- The catalog comes from the server's ``datalake.paimon.*`` options with the prefix stripped
  (``metastore``: filesystem by default, ``warehouse``); the Paimon database is the Fluss database, the
  Paimon table the Fluss table (``<warehouse>/<database>.db/<table>`` in a filesystem catalog).
- Columns: the table's columns, then ``__bucket`` (INT), ``__offset`` (BIGINT) and ``__timestamp``
  (TIMESTAMP_LTZ(3)): the layout of the tables Fluss created before FIP-27, which Fluss still reads (its
  newer tables leave the three out). A primary-key table is a Paimon primary-key table (the same key,
  ``changelog-producer = input``); a log table an append table. Partition keys are Paimon partition keys.
- Options: ``bucket`` = the bucket count and ``bucket-key`` = the bucket key when the table has one (every
  primary-key table), else Paimon's dynamic bucket (-1); ``partition.legacy-name = false``; every table
  property as ``fluss.<key>``, a property ``paimon.<key>`` as the Paimon option ``<key>``. Keys of such a
  table are Paimon ``BinaryRow`` bytes bucketed as Paimon buckets them (:mod:`strom.records.paimon_key`),
  so a strom bucket is the Paimon bucket its rows are written to.
- A round is one Paimon commit under the commit user ``__fluss_lake_tiering``; each writer writes its
  bucket's rows (primary-key tables: each change with its row kind) and hands its commit messages to the
  committer.

Where strom differs: Fluss keeps the coordinator's offsets file in the Paimon snapshot's properties
(``fluss-offsets``); pypaimon-rust 0.4 commits take no snapshot properties, so strom writes them, before the
commit, to ``<table>/strom-commits/<commit identifier>.json`` and finds them from the snapshot's
``commitIdentifier`` (a Fluss coordinator would not find them there). The commit is a compare-and-set on the
snapshot the round was planned on (Paimon would commit on top of anything that landed). TIME and MAP
columns are refused: pypaimon-rust's SQL DDL, through which the table is created, has neither.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from types import EllipsisType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pypaimon_rust.datafusion import CommitMessage, PaimonCatalog, SQLContext

from strom.errors import InvalidConfigError, InvalidTableError
from strom.ids import TableBucket
from strom.lake.commit_lock import exclusive
from strom.lake.format import (
    COMMIT_USER,
    COMMIT_USER_PROPERTY,
    CURRENT,
    CommittedLakeSnapshot,
    LakeCommitConflictError,
    LakeFormat,
    LakeStats,
    LakeTable,
    LakeTableMismatchError,
    LakeWriter,
    LakeWriteResult,
    commit_base,
)
from strom.lake.layout import (
    BUCKET_COLUMN,
    OFFSET_COLUMN,
    SYSTEM_COLUMNS,
    TIMESTAMP_COLUMN,
    LakeLayout,
    added_columns,
    with_null_columns,
)
from strom.lake.locations import filesystem, pin_warehouse
from strom.metadata.table_info import TableInfo
from strom.records import types as fluss
from strom.table_properties import DATALAKE_OPTION_PREFIX

__all__ = ["PaimonLakeFormat", "PaimonLakeTable", "PaimonLakeWriter"]

log = logging.getLogger(__name__)

TABLE_ID_OPTION = "strom.table-id"
"""Paimon table option: which strom table this lake copy belongs to."""
FLUSS_PROPERTY_PREFIX = "fluss."
PAIMON_PROPERTY_PREFIX = "paimon."
COMMITS_DIRECTORY = "strom-commits"
"""Beside the table's ``snapshot`` directory: one file of commit properties per commit identifier."""
VALUE_KIND_COLUMN = "_VALUE_KIND"
"""pypaimon-rust's per-row change kind of a write to a primary-key table (Paimon's RowKind byte)."""
INSERT, DELETE = 0, 3
_SYSTEM_DDL = f"`{BUCKET_COLUMN}` INT, `{OFFSET_COLUMN}` BIGINT, `{TIMESTAMP_COLUMN}` TIMESTAMP(3) WITH TIME ZONE"
_TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")


class _Ddl(fluss.DataTypeVisitor[str]):
    """A column's type in pypaimon-rust's SQL DDL (which maps ``TIMESTAMP(p) WITH TIME ZONE`` to Paimon's
    TIMESTAMP_LTZ and has no TIME or MAP)."""

    __slots__ = ()

    def default(self, t: fluss.DataType) -> str:
        raise InvalidTableError(
            f"a {t!r} column cannot be tiered into Paimon here: pypaimon-rust's DDL has no such type (TIME and MAP)"
        )

    def visit_boolean(self, t: fluss.BooleanType) -> str:
        return "BOOLEAN"

    def visit_tinyint(self, t: fluss.TinyIntType) -> str:
        return "TINYINT"

    def visit_smallint(self, t: fluss.SmallIntType) -> str:
        return "SMALLINT"

    def visit_int(self, t: fluss.IntType) -> str:
        return "INT"

    def visit_bigint(self, t: fluss.BigIntType) -> str:
        return "BIGINT"

    def visit_float(self, t: fluss.FloatType) -> str:
        return "FLOAT"

    def visit_double(self, t: fluss.DoubleType) -> str:
        return "DOUBLE"

    def visit_char(self, t: fluss.CharType) -> str:
        return f"CHAR({t.length})"

    def visit_string(self, t: fluss.StringType) -> str:
        return "STRING"

    def visit_decimal(self, t: fluss.DecimalType) -> str:
        return f"DECIMAL({t.precision},{t.scale})"

    def visit_date(self, t: fluss.DateType) -> str:
        return "DATE"

    def visit_timestamp(self, t: fluss.TimestampType) -> str:
        return f"TIMESTAMP({t.precision})"

    def visit_timestamp_ltz(self, t: fluss.TimestampLtzType) -> str:
        return f"TIMESTAMP({t.precision}) WITH TIME ZONE"

    def visit_binary(self, t: fluss.BinaryType) -> str:
        return f"BINARY({t.length})"

    def visit_bytes(self, t: fluss.BytesType) -> str:
        return "BYTES"

    def visit_array(self, t: fluss.ArrayType) -> str:
        return f"ARRAY<{self.column(t.element)}>"

    def visit_row(self, t: fluss.RowType) -> str:
        return "STRUCT<" + ", ".join(f"{_quoted(f.name)} {self.column(f.type)}" for f in t.fields) + ">"

    def column(self, t: fluss.DataType) -> str:
        return self.visit(t) + ("" if t.nullable else " NOT NULL")


_DDL = _Ddl()


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class PaimonLakeFormat(LakeFormat):
    """Options (``table.datalake.paimon.<key>``): ``warehouse`` (a local directory or a URI) and any other
    Paimon catalog option (``metastore``, ``uri``, ...), passed to pypaimon-rust's catalog."""

    identifier = "paimon"

    def __init__(self, options: Mapping[str, str]) -> None:
        properties = {key: value for key, value in options.items() if value is not None}
        warehouse = pin_warehouse(properties.get("warehouse", ""), local_scheme="file://")  # pypaimon-rust wants a URL
        if not warehouse and properties.get("metastore", "filesystem") == "filesystem":
            raise InvalidConfigError(
                "the paimon lake format needs 'table.datalake.paimon.warehouse' (server option "
                "datalake.paimon.warehouse) or another metastore ('datalake.paimon.metastore' and its options)"
            )
        if warehouse:
            properties["warehouse"] = warehouse
        self.catalog_options = properties

    def table(self, info: TableInfo) -> PaimonLakeTable:
        table = PaimonLakeTable(LakeLayout(info, native_time=True), self.catalog_options)
        table.ensure_created()
        return table


class PaimonLakeTable(LakeTable):
    """One strom table's Paimon table. Loads the table from the catalog for every call (a loaded one does
    not see later commits); pickles as its layout and catalog options."""

    def __init__(self, layout: LakeLayout, catalog_options: Mapping[str, str]) -> None:
        self.layout = layout
        self.catalog_options = dict(catalog_options)
        path = layout.info.path
        self.identifier = f"{path.database_name}.{path.table_name}"

    def paimon(self) -> Any:
        return PaimonCatalog(self.catalog_options).get_table(self.identifier)

    @property
    def uri(self) -> str:
        return str(self.paimon().location())

    @property
    def buckets_fixed(self) -> bool:
        """Whether Paimon's buckets are strom's (a bucket key), else Paimon's dynamic bucket (-1)."""
        return bool(self.layout.info.descriptor.bucket_keys)

    # ---- creating ----
    def expected_options(self) -> dict[str, str]:
        info = self.layout.info
        options: dict[str, str] = {"partition.legacy-name": "false", TABLE_ID_OPTION: str(info.table_id)}
        if self.buckets_fixed:
            options["bucket"] = str(info.bucket_count)
            options["bucket-key"] = ",".join(info.descriptor.bucket_keys)
        if info.has_primary_key:
            options["changelog-producer"] = "input"
        for key, value in info.properties.items():
            if key.startswith(DATALAKE_OPTION_PREFIX) and key.count(".") > 2:
                continue  # table.datalake.<format>.<key>: catalog options, credentials perhaps; not table data
            if key.startswith(PAIMON_PROPERTY_PREFIX):
                options[key[len(PAIMON_PROPERTY_PREFIX):]] = value
            else:
                options[FLUSS_PROPERTY_PREFIX + key] = value
        return options

    def _ddl(self) -> str:
        info = self.layout.info
        parts = [f"{_quoted(f.name)} {_DDL.column(f.type)}" for f in self.layout.row_type.fields]
        parts.append(_SYSTEM_DDL)
        if info.has_primary_key:
            parts.append(f"PRIMARY KEY ({', '.join(_quoted(k) for k in info.schema.primary_key or ())})")
        partitioned = f" PARTITIONED BY ({', '.join(_quoted(k) for k in info.partition_keys)})" if info.partition_keys else ""
        options = ", ".join(f"'{k}'='{v.replace(chr(39), chr(39) * 2)}'" for k, v in self.expected_options().items())
        path = info.path
        return (f"CREATE TABLE IF NOT EXISTS {_quoted(path.database_name)}.{_quoted(path.table_name)} "
                f"({', '.join(parts)}){partitioned} WITH ({options})")

    def ensure_created(self) -> None:
        """Create the Paimon table (and its database) if absent, then check it is this strom table's copy.

        Raises:
            LakeTableMismatchError: another strom table id, or other columns, keys or partitioning.
            InvalidTableError: a column type pypaimon-rust cannot create, or a reserved column name.
        """
        self.layout.validate()
        ddl = self._ddl()
        warehouse = self.catalog_options.get("warehouse", "")
        lock = exclusive(f"{warehouse}/{self.identifier}") if warehouse else contextlib.nullcontext()
        with lock:  # two creators: the second "IF NOT EXISTS" may still race the first one's schema file
            try:
                table = self.paimon()
            except (ValueError, OSError):
                context = self._sql()
                context.sql(f"CREATE DATABASE IF NOT EXISTS {_quoted(self.layout.info.path.database_name)}")
                context.sql(ddl)
                table = self.paimon()
        self._check_is_ours(table)

    def _sql(self) -> Any:
        """A pypaimon-rust SQL context on the lake's catalog (its DDL creates and alters the table)."""
        context = SQLContext()
        context.register_catalog("lake", self.catalog_options, default_database="")
        context.set_current_catalog("lake")
        return context

    def _check_is_ours(self, table: Any) -> None:
        info = self.layout.info
        schema = table.schema()
        owner = schema.options().get(TABLE_ID_OPTION)
        if owner != str(info.table_id):
            raise LakeTableMismatchError(
                f"the Paimon table {self.identifier} at {table.location()} belongs to strom table id {owner}, not to "
                f"'{info.path}' (id {info.table_id}): a table of that name was dropped and re-created; drop or "
                f"rename the old lake table"
            )
        expected_names = [*self.layout.row_type.field_names, *SYSTEM_COLUMNS]
        added = added_columns([f.name() for f in schema.fields()], expected_names, self.layout)
        if added:
            # columns the strom table gained (ADD COLUMN): Paimon appends them after the system columns
            # (it resolves columns by field id; Fluss's own catalog moves them before the system columns)
            types = {f.name: f.type for f in self.layout.row_type.fields}
            context = self._sql()
            for name in added:
                try:
                    context.sql(f"ALTER TABLE {_quoted(info.path.database_name)}.{_quoted(info.path.table_name)} "
                                f"ADD COLUMN {_quoted(name)} {_DDL.visit(types[name])}")
                except Exception as exc:  # pypaimon-rust's errors: most likely another process added it first
                    log.info("adding %s to %s: %s", name, self.identifier, exc)
            schema = self.paimon().schema()
        actual = (sorted(f.name() for f in schema.fields()), list(schema.primary_keys()), list(schema.partition_keys()))
        expected = (sorted(expected_names), list(info.schema.primary_key or ()), list(info.partition_keys))
        if actual != expected:
            raise LakeTableMismatchError(
                f"the Paimon table {self.identifier} has columns, key and partitioning {actual}; '{info.path}' needs "
                f"{expected}"
            )

    # ---- writing ----
    def writer(self, bucket: TableBucket, partition_name: str | None, base_snapshot_id: int | None) -> PaimonLakeWriter:
        return PaimonLakeWriter(self, bucket, partition_name, base_snapshot_id)

    def latest_snapshot_id(self) -> int | None:
        snapshot = self.paimon().latest_snapshot()
        return None if snapshot is None else int(snapshot.id())

    def commit(
        self, results: Sequence[LakeWriteResult], properties: Mapping[str, str],
        base_snapshot_id: int | EllipsisType | None = CURRENT,
    ) -> int:
        """One Paimon commit of every result's messages under Fluss's commit user, its properties written
        first to the commit's file under ``strom-commits``, applied only to the base snapshot.

        Raises:
            LakeCommitConflictError: the table moved past the base (nothing of this commit is visible).
        """
        bases, messages = set(), []
        for result in results:
            assert result.bucket.table_id == self.layout.info.table_id, (result.bucket, self.layout.info.table_id)
            payload = json.loads(result.payload)
            bases.add(payload["base"])
            messages += [CommitMessage.deserialize(base64.b64decode(m)) for m in payload["messages"]]
        resolved = commit_base(bases, base_snapshot_id)
        table = self.paimon()
        location = str(table.location())
        with exclusive(location):
            current = self.latest_snapshot_id()
            base = current if resolved is CURRENT else resolved
            if current != base:
                raise LakeCommitConflictError(
                    f"lake commit to {location} refused: the table is at snapshot {current}, the round was written "
                    f"against {base}"
                )
            identifier = time.time_ns()  # unique per attempt: it names the attempt's properties file
            self._write_properties(location, identifier, {**properties, COMMIT_USER_PROPERTY: COMMIT_USER})
            committer = table.new_stream_write_builder().with_commit_user(COMMIT_USER).new_commit()
            try:
                committer.commit(identifier, messages)
            finally:
                committer.close()
        snapshot_id = self.latest_snapshot_id()
        assert snapshot_id is not None
        if snapshot_id != (base or 0) + 1:
            log.error("lake commit to %s landed as snapshot %d over another commit since %s (an object store "
                      "without the local commit lock)", location, snapshot_id, base)
        return snapshot_id

    def _write_properties(self, location: str, identifier: int, properties: Mapping[str, str]) -> None:
        fs, root = filesystem(location)
        directory = f"{root}/{COMMITS_DIRECTORY}"
        fs.create_dir(directory, recursive=True)
        with fs.open_output_stream(f"{directory}/{identifier}.json") as out:
            out.write(json.dumps(dict(properties), sort_keys=True).encode())

    def _read_properties(self, location: str, identifier: int) -> dict[str, str] | None:
        fs, root = filesystem(location)
        try:
            with fs.open_input_stream(f"{root}/{COMMITS_DIRECTORY}/{identifier}.json") as source:
                return dict(json.loads(source.read()))
        except (FileNotFoundError, OSError):
            return None

    def abort(self, results: Sequence[LakeWriteResult]) -> None:
        """Delete the files of results that were never committed (pypaimon-rust's abort of their messages;
        the caller knows their commit did not land)."""
        messages = [CommitMessage.deserialize(base64.b64decode(m))
                    for result in results for m in json.loads(result.payload)["messages"]]
        if not messages:
            return
        committer = self.paimon().new_stream_write_builder().with_commit_user(COMMIT_USER).new_commit()
        try:
            committer.abort(messages)
        finally:
            committer.close()

    # ---- reading ----
    def _snapshot_document(self, location: str, snapshot_id: int) -> dict[str, Any] | None:
        fs, root = filesystem(location)
        try:
            with fs.open_input_stream(f"{root}/snapshot/snapshot-{snapshot_id}") as source:
                return dict(json.loads(source.read()))
        except (FileNotFoundError, OSError):
            return None

    def last_strom_commit(self, after_snapshot_id: int | None) -> CommittedLakeSnapshot | None:
        table = self.paimon()
        location = str(table.location())
        for snapshot in sorted(table.list_snapshots(), key=lambda s: s.id(), reverse=True):
            snapshot_id = int(snapshot.id())
            if after_snapshot_id is not None and snapshot_id <= after_snapshot_id:
                return None
            document = self._snapshot_document(location, snapshot_id)
            if document is None or document.get("commitUser") != COMMIT_USER:
                continue
            properties = self._read_properties(location, int(document["commitIdentifier"]))
            if properties is not None:
                return CommittedLakeSnapshot(snapshot_id, properties)
        return None

    def stats(self, snapshot_id: int | None = None) -> LakeStats:
        table = self.paimon()
        snapshots = {int(s.id()): s for s in table.list_snapshots()}
        if not snapshots:
            return LakeStats(0, 0)
        latest = max(snapshots)
        wanted = latest if snapshot_id is None else snapshot_id
        if wanted not in snapshots:
            raise ValueError(f"no snapshot {snapshot_id} in {table.location()}")
        size = sum(int(p.total_size_bytes()) for p in table.partition_stats()) if wanted == latest else 0
        return LakeStats(size, int(snapshots[wanted].total_record_count() or 0))

    def _scan(self, snapshot_id: int, columns: Sequence[str], conditions: Sequence[tuple[str, Any]]) -> Iterator[pa.RecordBatch]:
        builder = self.paimon().new_read_builder({"scan.snapshot-id": str(snapshot_id)})
        predicates = [{"method": "equal", "field": name, "literals": [value]} for name, value in conditions]
        if len(predicates) == 1:
            builder = builder.with_filter(predicates[0])
        elif predicates:
            builder = builder.with_filter({"method": "and", "children": predicates})
        builder = builder.with_projection(list(columns))
        read = builder.new_read()
        yield from read.read_arrow(builder.new_scan().plan().splits())

    def _bucket_conditions(self, bucket: int, partition_name: str | None) -> list[tuple[str, Any]]:
        conditions: list[tuple[str, Any]] = []
        for key, value in self.layout.partition_values(bucket, partition_name).items():
            arrow_type = self.layout.schema.field(key).type
            conditions.append((key, pa.scalar(value).cast(arrow_type).as_py()))
        return conditions

    def read_bucket(
        self,
        snapshot_id: int,
        bucket: int,
        partition_name: str | None,
        columns: Sequence[str] | None = None,
        with_system_columns: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        names = list(columns) if columns is not None else self.layout.row_type.field_names
        wanted = list(dict.fromkeys([*names, *(SYSTEM_COLUMNS if with_system_columns else (BUCKET_COLUMN,))]))
        # a snapshot from before an ADD COLUMN lacks the column: its rows read it as null
        known = self._snapshot_columns(snapshot_id)
        present = [name for name in wanted if known is None or name in known]
        for batch in self._scan(snapshot_id, present, self._bucket_conditions(bucket, partition_name)):
            # the filter prunes files; rows of a dynamic-bucket table share files across buckets
            batch = batch.filter(pc.equal(batch.column(BUCKET_COLUMN), bucket))
            if batch.num_rows:
                missing = pa.schema([self.layout.table_schema.field(name) for name in wanted if name not in present])
                batch = with_null_columns(batch, missing)
                yield from self._from_paimon(batch, names, with_system_columns).to_batches()

    def _snapshot_columns(self, snapshot_id: int) -> set[str] | None:
        """The column names of the schema a snapshot was written with (None: not found, assume all)."""
        location = str(self.paimon().location())
        document = self._snapshot_document(location, snapshot_id)
        if document is None or "schemaId" not in document:
            return None
        fs, root = filesystem(location)
        try:
            with fs.open_input_stream(f"{root}/schema/schema-{int(document['schemaId'])}") as source:
                schema = json.loads(source.read())
        except (FileNotFoundError, OSError, ValueError):
            return None
        return {field["name"] for field in schema.get("fields", [])}

    def _from_paimon(self, rows: pa.RecordBatch, names: Sequence[str], with_system_columns: bool) -> pa.Table:
        arrays, fields = [], []
        for name in names:
            target = self.layout.table_schema.field(name)
            arrays.append(rows.column(name).cast(target.type))
            fields.append(target)
        if with_system_columns:
            for name in SYSTEM_COLUMNS:
                target = self.layout.schema.field(name)
                arrays.append(rows.column(name).cast(target.type))
                fields.append(target)
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def buckets(self, snapshot_id: int) -> list[tuple[str | None, int]]:
        keys = self.layout.partition_columns
        found = set()
        for batch in self._scan(snapshot_id, keys, []):
            found.update(self.layout.buckets_in(pa.Table.from_batches([batch])))
        return sorted(found, key=lambda pair: (pair[0] or "", pair[1]))

    def read(self, snapshot_id: int | None = None) -> pa.Table:
        table = self.paimon()
        builder = table.new_read_builder({} if snapshot_id is None else {"scan.snapshot-id": str(snapshot_id)})
        batches = builder.new_read().read(builder.new_scan().plan().splits())
        if not batches:
            return pa.Table.from_batches([], schema=self._paimon_schema())
        return pa.Table.from_batches(batches)

    def _paimon_schema(self) -> pa.Schema:
        return pa.schema([*self.layout.table_schema, pa.field(BUCKET_COLUMN, pa.int32()),
                          pa.field(OFFSET_COLUMN, pa.int64()), pa.field(TIMESTAMP_COLUMN, _TIMESTAMP_TYPE)])


def _placeholder(arrow_type: pa.DataType, count: int) -> pa.Array:
    """Values for a NOT NULL column of a delete row, whose values Paimon ignores (the key decides)."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return pa.array([""] * count, arrow_type)
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return pa.array([b""] * count, arrow_type)
    if pa.types.is_fixed_size_binary(arrow_type):
        return pa.array([bytes(arrow_type.byte_width)] * count, arrow_type)
    if pa.types.is_boolean(arrow_type):
        return pa.array([False] * count, arrow_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return pa.array([[]] * count, arrow_type)
    if pa.types.is_struct(arrow_type):
        children = [_placeholder(field.type, count) for field in arrow_type]
        return pa.StructArray.from_arrays(children, fields=list(arrow_type))
    if pa.types.is_date32(arrow_type) or pa.types.is_time32(arrow_type):
        return pa.array([0] * count, pa.int32()).cast(arrow_type)
    return pa.array([0] * count, pa.int64()).cast(arrow_type)


class PaimonLakeWriter(LakeWriter):
    """Writes one (partition, bucket) split through a pypaimon-rust stream writer into the Paimon bucket
    of the same number (a dynamic-bucket table: Paimon's own); its commit messages are the result."""

    def __init__(self, table: PaimonLakeTable, bucket: TableBucket, partition_name: str | None,
                 base_snapshot_id: int | None) -> None:
        table.layout.partition_values(bucket.bucket, partition_name)  # the partition name fits the table
        self.table = table
        self.bucket = bucket
        self.partition_name = partition_name
        self.base_snapshot_id = base_snapshot_id
        self._keyed = bool(table.layout.primary_key)
        self._paimon_bucket = bucket.bucket if table.buckets_fixed else None
        paimon = table.paimon()
        self._order = [f.name() for f in paimon.schema().fields()]
        """The lake table's column order, which a write must follow (columns added later come last)."""
        self._write = paimon.new_stream_write_builder().with_commit_user(COMMIT_USER).new_write()
        self._rows = 0
        self._done = False

    def _system_columns(self, count: int, offsets: pa.Array, timestamps: pa.Array) -> list[pa.Array]:
        millis = pc.max_element_wise(timestamps.cast(pa.int64()), pa.scalar(-1, pa.int64()))
        return [pa.repeat(pa.scalar(self.bucket.bucket, pa.int32()), count), offsets.cast(pa.int64()),
                millis.cast(_TIMESTAMP_TYPE)]

    def _put(self, columns: list[pa.Array], kind: int) -> None:
        count = len(columns[0])
        by_name = dict(zip([*self.table.layout.row_type.field_names, *SYSTEM_COLUMNS], columns, strict=True))
        names = list(self._order)
        ordered = [by_name[name] for name in names]
        if self._keyed:
            ordered.append(pa.repeat(pa.scalar(kind, pa.int8()), count))
            names.append(VALUE_KIND_COLUMN)
        self._write.write_arrow(pa.RecordBatch.from_arrays(ordered, names=names), bucket=self._paimon_bucket)

    def append(self, rows: pa.RecordBatch, offsets: pa.Array, timestamps: pa.Array) -> None:
        if not rows.num_rows:
            return
        columns = [rows.column(name) for name in self.table.layout.row_type.field_names]
        self._put([*columns, *self._system_columns(rows.num_rows, offsets, timestamps)], INSERT)
        self._rows += rows.num_rows

    def delete_keys(self, keys: pa.Table) -> None:
        if not self._keyed:
            raise InvalidTableError(f"table '{self.table.layout.info.path}' is a log table: it has no keys to delete")
        count = keys.num_rows
        if not count:
            return
        layout = self.table.layout
        partition = {key: value for key, value in layout.partition_values(self.bucket.bucket, self.partition_name).items()
                     if key != BUCKET_COLUMN}
        columns = []
        for field in layout.table_schema:
            if field.name in keys.column_names:
                columns.append(keys.column(field.name).combine_chunks().cast(field.type))
            elif field.name in partition:
                columns.append(pa.repeat(pa.scalar(partition[field.name]).cast(field.type), count))
            elif field.nullable:
                columns.append(pa.nulls(count, field.type))
            else:
                columns.append(_placeholder(field.type, count))
        minus_one = pa.array([-1] * count, pa.int64())
        self._put([*columns, *self._system_columns(count, minus_one, minus_one)], DELETE)

    def complete(self) -> LakeWriteResult:
        messages = self._write.prepare_commit(False, (self.base_snapshot_id or 0) + 1)
        self._done = True
        payload = {"base": self.base_snapshot_id,
                   "messages": [base64.b64encode(m.serialize()).decode() for m in messages]}
        return LakeWriteResult(bucket=self.bucket, partition_name=self.partition_name,
                               payload=json.dumps(payload).encode(), record_count=self._rows, file_size=0,
                               file_count=len(messages))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a writer that failed mid-write may refuse to close
            self._write.close()
