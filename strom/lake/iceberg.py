"""Apache Iceberg through pyiceberg: the lake copy of a strom table as an Iceberg table, laid out as
Fluss's Iceberg lake tables are (see :mod:`strom.lake.iceberg_files` for the schema and partition spec).

What Fluss does, from its ``fluss-lake-iceberg`` module (facts this module follows):

- The catalog comes from the server's ``datalake.iceberg.*`` options with the prefix stripped, passed
  to Iceberg's catalog loader as catalog properties (``type``: hive, hadoop, rest, jdbc, ...; ``name``
  defaults to ``fluss-iceberg-catalog``). The Iceberg namespace is the Fluss database, the Iceberg table
  name the Fluss table name; a missing namespace is created.
- Table properties: every Fluss table property is copied as ``fluss.<key>`` (strom leaves out the
  catalog options ``table.datalake.<format>.<key>``, which may hold credentials) (keys starting with
  ``iceberg.`` lose that prefix and become Iceberg properties); primary-key tables get
  ``write.delete.mode``, ``write.update.mode`` and ``write.merge.mode`` = ``merge-on-read`` because
  Fluss writes equality deletes. The sort order is ``__offset`` ascending.
- A tiering commit is one Iceberg snapshot (a fast append, or a row delta with delete files) whose
  summary carries ``commit-user`` = ``__fluss_lake_tiering`` and the committer's properties (the
  ``fluss-offsets`` path). The missing-commit lookup walks the snapshots newest first for that commit
  user, comparing snapshots by sequence number (snapshot ids are not ordered).
- ``table.datalake.auto-expire-snapshot`` (default false; the tiering job's
  ``lake.tiering.auto-expire-snapshot`` forces it) expires snapshots after tiering commits, under the
  lake table's own retention settings.

Where strom differs: no Java catalog types, so ``warehouse`` alone gives an embedded pyiceberg SQL
catalog on SQLite inside the warehouse directory, ``type: rest`` + ``uri`` a REST catalog, and any
other pyiceberg catalog type works through ``type``. Primary-key tables are copy-on-write per bucket
(pyiceberg writes no equality deletes), so the table properties say ``copy-on-write``. Commits never
retry: a commit whose table moved past the round's base snapshot raises LakeCommitConflictError.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from types import EllipsisType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
    TableAlreadyExistsError,
    ValidationException,
)
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import (
    ArrowScan,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record

from strom.errors import InvalidConfigError
from strom.ids import TableBucket
from strom.lake.delta_files import FileLimits
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
    LakeWriteResult,
    commit_base,
)
from strom.lake.iceberg_files import (
    IcebergLakeWriter,
    file_paths,
    file_system,
    iceberg_schema,
    partition_record,
    partition_spec,
    record_partition,
)
from strom.lake.layout import (
    BUCKET_COLUMN,
    OFFSET_COLUMN,
    SYSTEM_COLUMNS,
    LakeLayout,
    added_columns,
    with_null_columns,
)
from strom.lake.locations import pin_warehouse
from strom.metadata.table_info import TableInfo
from strom.table_properties import DATALAKE_OPTION_PREFIX

__all__ = ["IcebergLakeFormat", "IcebergLakeTable", "IcebergLakeWriter"]

log = logging.getLogger(__name__)

TABLE_ID_PROPERTY = "strom.table-id"
"""Iceberg table property: which strom table this lake copy belongs to."""
FLUSS_PROPERTY_PREFIX = "fluss."
"""Fluss copies its table properties into the Iceberg table's under this prefix."""
ICEBERG_PROPERTY_PREFIX = "iceberg."
"""A strom table property ``iceberg.<key>`` becomes the Iceberg table property ``<key>`` (as in Fluss)."""
MAX_SNAPSHOT_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
MAX_SNAPSHOT_AGE_DEFAULT_MS = 5 * 24 * 3600 * 1000
MIN_SNAPSHOTS_PROPERTY = "history.expire.min-snapshots-to-keep"
MIN_SNAPSHOTS_DEFAULT = 1
DEFAULT_CATALOG_NAME = "fluss-iceberg-catalog"
SQLITE_CATALOG_FILE = "iceberg_catalog.sqlite"
_ROW_LEVEL_MODES = ("write.delete.mode", "write.update.mode", "write.merge.mode")


class IcebergLakeFormat(LakeFormat):
    """Options (``table.datalake.iceberg.<key>``): ``warehouse`` (a local directory or a URI) and, for
    a catalog other than the embedded SQLite one, ``type`` (e.g. ``rest``) with ``uri``; every key is
    passed to pyiceberg's ``load_catalog`` as a catalog property."""

    identifier = "iceberg"

    def __init__(self, options: Mapping[str, str], limits: FileLimits | None = None) -> None:
        properties = {key: value for key, value in options.items() if value is not None}
        warehouse = pin_warehouse(properties.get("warehouse", ""))
        if warehouse:
            properties["warehouse"] = warehouse
        if "type" not in properties and "uri" not in properties:
            if not warehouse:
                raise InvalidConfigError(
                    "the iceberg lake format needs 'table.datalake.iceberg.warehouse' (server option "
                    "datalake.iceberg.warehouse) or a catalog ('datalake.iceberg.type' and 'datalake.iceberg.uri')"
                )
            if "://" in warehouse:
                raise InvalidConfigError(
                    f"the embedded SQLite catalog needs a local warehouse, not {warehouse!r}: configure a catalog "
                    f"(datalake.iceberg.type, e.g. rest, and datalake.iceberg.uri)"
                )
            os.makedirs(warehouse, exist_ok=True)
            properties["type"] = "sql"
            properties["uri"] = f"sqlite:///{warehouse}/{SQLITE_CATALOG_FILE}"
        self.catalog_properties = properties
        self.limits = limits or FileLimits()

    def table(self, info: TableInfo) -> IcebergLakeTable:
        table = IcebergLakeTable(LakeLayout(info, native_time=True), self.catalog_properties, self.limits)
        table.ensure_created()
        return table


class IcebergLakeTable(LakeTable):
    """One strom table's Iceberg table. Loads the table from the catalog for every call (a stale
    metadata would hide other commits); pickles as its catalog properties and layout."""

    def __init__(self, layout: LakeLayout, catalog_properties: Mapping[str, str], limits: FileLimits | None = None) -> None:
        self.layout = layout
        self._catalog_properties = dict(catalog_properties)
        self.limits = limits or FileLimits()
        self.identifier = (layout.info.path.database_name, layout.info.path.table_name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (IcebergLakeTable, (self.layout, self._catalog_properties, self.limits))

    @cached_property
    def catalog(self) -> Catalog:
        properties = dict(self._catalog_properties)
        name = properties.pop("name", DEFAULT_CATALOG_NAME)
        try:
            return load_catalog(name, **properties)
        except (ValueError, ImportError) as exc:
            raise InvalidConfigError(f"cannot open the Iceberg catalog {name!r}: {exc}") from exc

    def iceberg(self) -> Table:
        return self.catalog.load_table(self.identifier)

    @property
    def uri(self) -> str:
        return self.iceberg().location()

    # ---- creating ----
    def expected_properties(self) -> dict[str, str]:
        info = self.layout.info
        properties: dict[str, str] = {}
        for key, value in info.properties.items():
            if key.startswith(DATALAKE_OPTION_PREFIX) and key.count(".") > 2:
                continue  # table.datalake.<format>.<key>: catalog options, credentials perhaps; not table data
            if key.startswith(ICEBERG_PROPERTY_PREFIX):
                properties[key[len(ICEBERG_PROPERTY_PREFIX):]] = value
            else:
                properties[FLUSS_PROPERTY_PREFIX + key] = value
        if self.layout.primary_key:
            properties.update(dict.fromkeys(_ROW_LEVEL_MODES, "copy-on-write"))
        properties["commit.retry.num-retries"] = "0"  # a lost race is a conflict, never a commit moved forward
        properties[TABLE_ID_PROPERTY] = str(info.table_id)
        return properties

    def ensure_created(self) -> None:
        """Create the Iceberg table (and its namespace) if absent, then check it is this strom table's copy.

        Raises:
            LakeTableMismatchError: another strom table id, or another schema, key or partition spec.
            InvalidTableError: the table has something the Iceberg layout cannot hold.
        """
        self.layout.validate()
        schema = iceberg_schema(self.layout)
        spec = partition_spec(self.layout, schema)
        try:
            table = self.iceberg()
        except NoSuchTableError:
            self._ensure_namespace()
            offset_id = schema.find_field(OFFSET_COLUMN).field_id
            try:
                table = self.catalog.create_table(
                    self.identifier, schema, partition_spec=spec,
                    sort_order=SortOrder(SortField(source_id=offset_id, transform=IdentityTransform())),
                    properties=self.expected_properties(),
                )
            except TableAlreadyExistsError:
                table = self.iceberg()  # another process created it first; checked below like any table
        self._check_is_ours(table, schema)

    def _ensure_namespace(self) -> None:
        namespace = self.identifier[0]
        try:
            self.catalog.create_namespace_if_not_exists(namespace)
        except Exception:
            # A racing creator: the SQL catalog reports the lost race as a database integrity error.
            if not self.catalog.namespace_exists(namespace):
                raise

    def _check_is_ours(self, table: Table, expected_schema: Any) -> None:
        info = self.layout.info
        owner = table.properties.get(TABLE_ID_PROPERTY)
        if owner != str(info.table_id):
            raise LakeTableMismatchError(
                f"the Iceberg table {'.'.join(self.identifier)} at {table.location()} belongs to strom table id "
                f"{owner}, not to '{info.path}' (id {info.table_id}): a table of that name was dropped and "
                f"re-created, or the catalog is shared; drop or rename the old lake table"
            )
        actual = _comparable(table.schema())
        expected = _comparable(expected_schema)
        added = added_columns([name for name, *_ in actual[0]], [name for name, *_ in expected[0]], self.layout)
        if added:
            # columns the strom table gained (ADD COLUMN): the lake table gains them, optional, placed before
            # the system columns as the strom table has them (its files keep positions and field ids apart)
            try:
                with table.update_schema() as update:
                    for name in added:
                        update.add_column(name, expected_schema.find_field(name).field_type, required=False)
                        update.move_before(name, BUCKET_COLUMN)
            except (CommitFailedException, ValidationException, ValueError) as exc:
                log.info("another process added %s to %s first (%s)", added, table.location(), exc)
            table = self.iceberg()
            actual = _comparable(table.schema())
        actual_spec = _comparable_spec(table.spec(), table.schema())
        expected_spec = _comparable_spec(partition_spec(self.layout, expected_schema), expected_schema)
        if actual != expected or actual_spec != expected_spec:
            raise LakeTableMismatchError(
                f"the Iceberg table {'.'.join(self.identifier)} has columns {actual[0]} (key {actual[1]}) partitioned "
                f"by {actual_spec}; '{info.path}' needs {expected[0]} (key {expected[1]}) partitioned by {expected_spec}"
            )

    # ---- writing ----
    def writer(self, bucket: TableBucket, partition_name: str | None, base_snapshot_id: int | None) -> IcebergLakeWriter:
        return IcebergLakeWriter(self, bucket, partition_name, base_snapshot_id)

    def latest_snapshot_id(self) -> int | None:
        snapshot = self.iceberg().current_snapshot()
        return None if snapshot is None else snapshot.snapshot_id

    def commit(
        self, results: Sequence[LakeWriteResult], properties: Mapping[str, str],
        base_snapshot_id: int | EllipsisType | None = CURRENT,
    ) -> int:
        """One Iceberg snapshot of every result: a fast append when no file is removed, else an overwrite
        that removes the rewritten files and adds the new ones; ``properties`` and the commit user go in
        the snapshot summary. Expires old snapshots afterwards if the table asks for it.

        Raises:
            LakeCommitConflictError: the table's current snapshot is not the base snapshot (see
                :func:`~strom.lake.format.commit_base`), or another commit landed first; nothing of this
                commit is visible.
        """
        table_id = self.layout.info.table_id
        bases = set()
        for result in results:
            assert result.bucket.table_id == table_id, (result.bucket, table_id)
            bases.add(json.loads(result.payload)["base"])
        resolved = commit_base(bases, base_snapshot_id)
        table = self.iceberg()
        current = table.current_snapshot()
        current_id = None if current is None else current.snapshot_id
        base = current_id if resolved is CURRENT else resolved
        if current_id != base:
            raise LakeCommitConflictError(
                f"lake commit to {table.location()} refused: the table is at snapshot {current_id}, the round was "
                f"written against {base}"
            )
        added = [
            self._data_file(table, entry, partition_record(self.layout, result.bucket.bucket, result.partition_name))
            for result in results for entry in json.loads(result.payload)["add"]
        ]
        removed_paths = set(file_paths(results, "remove"))
        summary = {**properties, COMMIT_USER_PROPERTY: COMMIT_USER}
        transaction = table.transaction()
        update = transaction.update_snapshot(snapshot_properties=summary)
        if removed_paths:
            producer: Any = update.overwrite()
            producer.delete_by_predicate(AlwaysTrue())  # every manifest is looked at; only these files go
            live = {task.file.file_path: task.file for task in table.scan(snapshot_id=base).plan_files()}
            missing = removed_paths - live.keys()
            if missing:
                raise LakeCommitConflictError(f"lake commit refused: files {sorted(missing)} are no longer in the table")
            for path in removed_paths:
                producer.delete_data_file(live[path])
        else:
            producer = update.fast_append()
        for data_file in added:
            producer.append_data_file(data_file)
        snapshot_id: int = producer.snapshot_id
        try:
            producer.commit()
            transaction.commit_transaction()
        except (CommitFailedException, ValidationException) as exc:
            raise LakeCommitConflictError(f"lake commit to {table.location()} (base {base}) refused: {exc}") from exc
        if self.layout.info.options.datalake_auto_expire_snapshot:
            self.expire_snapshots()
        return snapshot_id

    def _data_file(self, table: Table, entry: Mapping[str, Any], partition: Record) -> DataFile:
        """The DataFile of a written file, with statistics from its Parquet footer."""
        fs, path = file_system(table.io, entry["path"])
        with fs.open_input_file(path) as source:
            metadata = pq.ParquetFile(source).metadata
        schema = table.schema()
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=metadata,
            stats_columns=compute_statistics_plan(schema, table.metadata.properties),
            parquet_column_mapping=parquet_path_to_id_mapping(schema),
        )
        return DataFile.from_args(
            content=DataFileContent.DATA, file_path=entry["path"], file_format=FileFormat.PARQUET,
            partition=partition, file_size_in_bytes=entry["size"], sort_order_id=None,
            spec_id=table.metadata.default_spec_id, equality_ids=None, key_metadata=None,
            **statistics.to_serialized_dict(),
        )

    def expire_snapshots(self, now: dt.datetime | None = None) -> list[int]:
        """Remove snapshots older than the table's ``history.expire.max-snapshot-age-ms`` (Iceberg's
        default: 5 days) beyond the newest ``history.expire.min-snapshots-to-keep`` (default 1) of the
        current history, as Iceberg's expire-snapshots does by default. Metadata only: pyiceberg deletes
        no data files. Returns the expired ids."""
        table = self.iceberg()
        current = table.current_snapshot()
        if current is None:
            return []
        properties = table.properties
        max_age_ms = int(properties.get(MAX_SNAPSHOT_AGE_PROPERTY, MAX_SNAPSHOT_AGE_DEFAULT_MS))
        keep = int(properties.get(MIN_SNAPSHOTS_PROPERTY, MIN_SNAPSHOTS_DEFAULT))
        now_ms = int((now or dt.datetime.now(dt.UTC)).timestamp() * 1000)
        retained = {s.snapshot_id for s in list(ancestors_of(current, table.metadata))[:max(keep, 1)]}
        expired = [
            s.snapshot_id for s in table.metadata.snapshots
            if s.snapshot_id not in retained and s.timestamp_ms < now_ms - max_age_ms
        ]
        if expired:
            with contextlib.suppress(CommitFailedException):  # a racing commit: the next round expires them
                table.maintenance.expire_snapshots().by_ids(expired).commit()
        return expired

    def abort(self, results: Sequence[LakeWriteResult]) -> None:
        """Delete the files the results added, except any the latest snapshot references (a commit that
        did land must never lose its files)."""
        paths = [entry["path"] for entry in file_paths(results, "add")]
        if not paths:
            return
        table = self.iceberg()
        live = set()
        if table.current_snapshot() is not None:
            live = {task.file.file_path for task in table.scan().plan_files()}
        for path in paths:
            if path not in live:
                with contextlib.suppress(FileNotFoundError):
                    table.io.delete(path)

    # ---- reading ----
    def last_strom_commit(self, after_snapshot_id: int | None) -> CommittedLakeSnapshot | None:
        table = self.iceberg()
        current = table.current_snapshot()
        if current is None:
            return None
        for snapshot in ancestors_of(current, table.metadata):  # newest first
            if snapshot.snapshot_id == after_snapshot_id:
                return None
            summary = _summary(snapshot)
            if summary.get(COMMIT_USER_PROPERTY) == COMMIT_USER:
                return CommittedLakeSnapshot(snapshot.snapshot_id, summary)
        return None

    def stats(self, snapshot_id: int | None = None) -> LakeStats:
        table = self.iceberg()
        snapshot = table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
        if snapshot is None:
            if snapshot_id is not None:
                raise ValueError(f"no snapshot {snapshot_id} in {table.location()}")
            return LakeStats(0, 0)
        summary = _summary(snapshot)
        return LakeStats(int(summary.get("total-files-size", 0)), int(summary.get("total-records", 0)))

    def bucket_files(self, snapshot_id: int, partition: Record) -> list[DataFile]:
        """The data files of one (partition, bucket) at a snapshot."""
        return [task.file for task in self.iceberg().scan(snapshot_id=snapshot_id).plan_files()
                if task.file.partition == partition]

    def read_bucket(
        self,
        snapshot_id: int,
        bucket: int,
        partition_name: str | None,
        columns: Sequence[str] | None = None,
        with_system_columns: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        partition = partition_record(self.layout, bucket, partition_name)
        names = list(columns) if columns is not None else self.layout.row_type.field_names
        wanted = names + list(SYSTEM_COLUMNS) if with_system_columns else names
        table = self.iceberg()
        # a snapshot from before an ADD COLUMN lacks the column: its rows read it as null
        snapshot = table.snapshot_by_id(snapshot_id)
        schema_id = snapshot.schema_id if snapshot is not None else None
        known = table.schemas().get(schema_id, table.schema()) if schema_id is not None else table.schema()
        present = [name for name in wanted if _has_field(known, name)]
        scan = table.scan(snapshot_id=snapshot_id, selected_fields=tuple(present))
        tasks = [task for task in scan.plan_files() if task.file.partition == partition]
        if not tasks:
            return
        arrow_scan = ArrowScan(table.metadata, table.io, scan.projection(), AlwaysTrue())
        for batch in arrow_scan.to_record_batches(tasks):
            if batch.num_rows:
                batch = with_null_columns(batch, pa.schema([self.layout.schema.field(name) for name in wanted]))
                yield from self.layout.from_lake(batch, names, with_system_columns).to_batches()

    def buckets(self, snapshot_id: int) -> list[tuple[str | None, int]]:
        found = {record_partition(self.layout, task.file.partition)
                 for task in self.iceberg().scan(snapshot_id=snapshot_id).plan_files() if task.file.record_count}
        return sorted(found, key=lambda pair: (pair[0] or "", pair[1]))

    def read(self, snapshot_id: int | None = None) -> pa.Table:
        table = self.iceberg()
        if snapshot_id is None and table.current_snapshot() is None:
            return table.schema().as_arrow().empty_table()
        return table.scan(snapshot_id=snapshot_id).to_arrow()


def _has_field(schema: Any, name: str) -> bool:
    try:
        schema.find_field(name)
    except ValueError:
        return False
    return True


def _summary(snapshot: Snapshot) -> dict[str, str]:
    if snapshot.summary is None:
        return {}
    return {key: value for key, value in snapshot.summary.additional_properties.items() if isinstance(value, str)}


def _comparable(schema: Any) -> tuple[list[tuple[str, str, bool]], list[str]]:
    """(name, type, required) of each top-level column, and the identifier columns; field ids aside."""
    columns = [(f.name, str(f.field_type), f.required) for f in schema.fields]
    key = sorted(schema.find_column_name(i) or str(i) for i in schema.identifier_field_ids)
    return columns, key


def _comparable_spec(spec: Any, schema: Any) -> list[tuple[str, str, str]]:
    return [(schema.find_column_name(f.source_id) or "?", str(f.transform), f.name) for f in spec.fields]

