"""Delta Lake through delta-rs (``deltalake``): the lake copy of a strom table as a Delta table.

Spark tasks write Parquet files straight into the table's directory (``<partition path>/part-<uuid>...``)
and describe them as Delta add and remove actions; the driver commits all of a round's actions in one
Delta transaction whose commit info carries the tiering properties. Nothing a task writes is visible
before that commit, and a round that never commits leaves only unreferenced files.

Primary-key tables are kept as their current state by copy-on-write per bucket: a writer reads the key
columns of its bucket's files in the base snapshot (skipping files whose key statistics rule out every
touched key), rewrites the files that hold a changed or deleted key without those rows, and adds the new
rows as new files. Files without a touched key stay.

Two committers racing: the transaction is read at the base snapshot and carries a Delta transaction
identifier (``txn``) per strom table, so delta-rs refuses the second of two strom commits made from the
same snapshot (and any commit whose removed files another commit removed first). Commits of other
writers (compaction, say) that do not touch this round's files are not conflicts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import posixpath
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from types import EllipsisType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from strom.errors import InvalidConfigError, InvalidTableError
from strom.ids import TableBucket
from strom.lake.copy_on_write import BucketFile, CopyOnWriteWriter, any_in_bounds
from strom.lake.delta_files import DeltaFileSink, FileLimits, WrittenFile
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
from strom.lake.layout import BUCKET_COLUMN, SYSTEM_COLUMNS, LakeLayout, added_columns, with_null_columns
from strom.lake.locations import filesystem, pin_warehouse
from strom.metadata.table_info import TableInfo

__all__ = ["DeltaLakeFormat", "DeltaLakeTable", "DeltaLakeWriter", "LakeCommitConflictError"]

log = logging.getLogger(__name__)

TABLE_ID_CONFIGURATION = "strom.table-id"
"""Key in the Delta table's configuration: which strom table this lake copy belongs to."""
TRANSACTION_APP_ID_PREFIX = "strom-tiering-"
"""``txn`` application id of a strom table's commits (prefix + table id); its version counts them."""
_LOG_DIRECTORY = "_delta_log"


def _comparable_fields(schema: DeltaSchema) -> list[tuple[str, Any]]:
    """Name and type of each top-level field; nullability and field metadata may differ."""
    return [(field.name, json.loads(field.to_json())["type"]) for field in schema.fields]


class DeltaLakeFormat(LakeFormat):
    """Options (``table.datalake.delta.<key>``): ``warehouse`` (required; a local directory or a URL
    delta-rs and pyarrow understand); every other key is passed to delta-rs as a storage option."""

    identifier = "delta"

    def __init__(self, options: Mapping[str, str], limits: FileLimits | None = None) -> None:
        self.warehouse = pin_warehouse(options.get("warehouse", ""))
        if not self.warehouse:
            raise InvalidConfigError(
                "the delta lake format needs 'table.datalake.delta.warehouse' (server option datalake.delta.warehouse)"
            )
        self.storage_options = {k: v for k, v in options.items() if k != "warehouse"}
        self.limits = limits or FileLimits()

    def table(self, info: TableInfo) -> DeltaLakeTable:
        uri = f"{self.warehouse}/{info.path.database_name}/{info.path.table_name}"
        table = DeltaLakeTable(uri, LakeLayout(info), self.storage_options, self.limits)
        table.ensure_created()
        return table


class DeltaLakeTable(LakeTable):
    """One strom table's Delta table. Opens delta-rs afresh for every call (it is cheap, and a stale
    table state would hide other commits); pickles as its location and layout."""

    def __init__(
        self, uri: str, layout: LakeLayout, storage_options: Mapping[str, str], limits: FileLimits | None = None
    ) -> None:
        self._uri = uri
        self.layout = layout
        self._storage_options = dict(storage_options)
        self.limits = limits or FileLimits()

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeltaLakeTable, (self._uri, self.layout, self._storage_options, self.limits))

    @property
    def uri(self) -> str:
        return self._uri

    @cached_property
    def _files(self) -> tuple[pafs.FileSystem, str]:
        return filesystem(self._uri)

    @property
    def app_id(self) -> str:
        return f"{TRANSACTION_APP_ID_PREFIX}{self.layout.info.table_id}"

    def delta(self, version: int | None = None) -> DeltaTable:
        return DeltaTable(self._uri, version=version, storage_options=self._storage_options or None)

    # ---- creating ----
    def ensure_created(self) -> None:
        """Create the Delta table if absent, then check it is this strom table's copy.

        Raises:
            LakeTableMismatchError: another strom table id, or another schema or partitioning.
            InvalidTableError: the table has something Delta cannot hold.
        """
        layout, info = self.layout, self.layout.info
        layout.validate()
        try:
            table = self.delta()
        except TableNotFoundError:
            try:
                DeltaTable.create(
                    self._uri, schema=layout.schema, mode="ignore", partition_by=layout.partition_columns,
                    name=str(info.path), configuration={TABLE_ID_CONFIGURATION: str(info.table_id)},
                    storage_options=self._storage_options or None, raise_if_key_not_exists=False,
                    # A racing creator must fail rather than retry: delta-rs would retry a lost
                    # version 0 as a second CREATE TABLE at version 1.
                    commit_properties=CommitProperties(max_commit_retries=0),
                )
            except CommitFailedError:
                pass  # another process created it first; checked below like any existing table
            except DeltaError as exc:
                raise InvalidTableError(f"cannot create the Delta table of '{info.path}' at {self._uri}: {exc}") from exc
            table = self.delta()
        self._check_is_ours(table)

    def _check_is_ours(self, table: DeltaTable) -> None:
        info = self.layout.info
        metadata = table.metadata()
        owner = metadata.configuration.get(TABLE_ID_CONFIGURATION)
        if owner != str(info.table_id):
            raise LakeTableMismatchError(
                f"the Delta table at {self._uri} belongs to strom table id {owner}, not to '{info.path}' "
                f"(id {info.table_id}): a table of that name was dropped and re-created, or the warehouse is "
                f"shared; move the old lake table away"
            )
        expected_schema = DeltaSchema.from_arrow(self.layout.schema)
        expected = _comparable_fields(expected_schema)
        actual = _comparable_fields(table.schema())
        added = added_columns([name for name, _ in actual], [name for name, _ in expected], self.layout)
        if added and list(metadata.partition_columns) == self.layout.partition_columns:
            # columns the strom table gained (ADD COLUMN): the lake table gains them, nullable, at its end
            fields = [field for field in expected_schema.fields if field.name in added]
            try:
                table.alter.add_columns(fields, commit_properties=CommitProperties(max_commit_retries=0))
            except (CommitFailedError, DeltaError) as exc:
                log.info("another process added %s to %s first (%s)", added, self._uri, exc)
            table = self.delta()
            actual = _comparable_fields(table.schema())
        actual_by_name = dict(actual)
        if sorted(actual) != sorted(expected) or len(actual_by_name) != len(actual) or \
                list(metadata.partition_columns) != self.layout.partition_columns:
            raise LakeTableMismatchError(
                f"the Delta table at {self._uri} has columns {actual} partitioned by {metadata.partition_columns}; "
                f"'{info.path}' needs {expected} partitioned by {self.layout.partition_columns}"
            )

    # ---- writing ----
    def writer(self, bucket: TableBucket, partition_name: str | None, base_snapshot_id: int | None) -> DeltaLakeWriter:
        return DeltaLakeWriter(self, bucket, partition_name, base_snapshot_id)

    def latest_snapshot_id(self) -> int | None:
        try:
            return self.delta().version()
        except TableNotFoundError:
            return None

    def commit(
        self, results: Sequence[LakeWriteResult], properties: Mapping[str, str],
        base_snapshot_id: int | EllipsisType | None = CURRENT,
    ) -> int:
        """One Delta transaction of every result's actions, read at the base snapshot (so a strom commit
        since then conflicts through this table's ``txn``), with ``properties`` and the commit user in its
        commit info.

        Raises:
            LakeCommitConflictError: another strom commit since the base snapshot, or another commit
                removed a file this one removes; nothing of this commit is visible.
        """
        table_id = self.layout.info.table_id
        actions: list[AddAction | RemoveAction] = []
        bases = set()
        now_ms = int(time.time() * 1000)
        for result in results:
            assert result.bucket.table_id == table_id, (result.bucket, table_id)
            payload = json.loads(result.payload)
            bases.add(payload["base"])
            actions += [AddAction(**add) for add in payload["add"]]
            actions += [
                RemoveAction(r["path"], True, now_ms, r["size"], r["partition_values"]) for r in payload["remove"]
            ]
        base = commit_base(bases, base_snapshot_id)
        table = self.delta(None if base is CURRENT else base)
        read_version = table.version()
        sequence = (table.transaction_version(self.app_id) or 0) + 1
        metadata = {**properties, COMMIT_USER_PROPERTY: COMMIT_USER}
        try:
            table.create_write_transaction(
                actions, mode="append", schema=self.layout.schema, partition_by=self.layout.partition_columns,
                commit_properties=CommitProperties(
                    custom_metadata=metadata, app_transactions=[Transaction(self.app_id, sequence)]
                ),
            )
        except CommitFailedError as exc:
            raise LakeCommitConflictError(
                f"lake commit to {self._uri} (read at version {read_version}) refused: {exc}"
            ) from exc
        return self._version_of_transaction(sequence, read_version)

    def _version_of_transaction(self, sequence: int, read_version: int) -> int:
        """The version our commit landed at: delta-rs may have moved it past commits of other writers
        and does not say where."""
        latest = self.delta().version()
        for version in range(read_version + 1, latest + 1):
            for action in self._commit_actions(version) or ():
                txn = action.get("txn")
                if txn and txn.get("appId") == self.app_id and txn.get("version") == sequence:
                    return version
        raise AssertionError(f"the commit of txn {self.app_id}/{sequence} is not in {self._uri} after version {read_version}")

    def abort(self, results: Sequence[LakeWriteResult]) -> None:
        """Delete the files the results added, except any the latest snapshot references (a commit that
        did land must never lose its files)."""
        paths = [add["path"] for result in results for add in json.loads(result.payload)["add"]]
        if not paths:
            return
        live = set(pa.table(self.delta().get_add_actions()).column("path").to_pylist())
        fs, root = self._files
        for path in paths:
            if path not in live:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(posixpath.join(root, path))

    # ---- reading ----
    def _commit_actions(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of one commit, read from the Delta log; None once log cleanup removed it.

        Read directly because ``DeltaTable.history()`` skips commits without commit info and then
        numbers the rest wrongly."""
        fs, root = self._files
        try:
            with fs.open_input_stream(posixpath.join(root, _LOG_DIRECTORY, f"{version:020d}.json")) as stream:
                data = stream.read()
        except FileNotFoundError:
            return None
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def last_strom_commit(self, after_snapshot_id: int | None) -> CommittedLakeSnapshot | None:
        latest = self.latest_snapshot_id()
        if latest is None:
            return None
        stop = -1 if after_snapshot_id is None else after_snapshot_id
        for version in range(latest, stop, -1):  # newest first: at most latest - stop commits
            actions = self._commit_actions(version)
            if actions is None:
                return None  # older commits are gone with the log
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            if info.get(COMMIT_USER_PROPERTY) == COMMIT_USER:
                return CommittedLakeSnapshot(version, {k: v for k, v in info.items() if isinstance(v, str)})
        return None

    def stats(self, snapshot_id: int | None = None) -> LakeStats:
        actions = pa.table(self.delta(snapshot_id).get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return LakeStats(0, 0)
        records = pc.sum(actions.column("num_records")).as_py() or 0
        return LakeStats(int(pc.sum(actions.column("size_bytes")).as_py()), int(records))

    def read_bucket(
        self,
        snapshot_id: int,
        bucket: int,
        partition_name: str | None,
        columns: Sequence[str] | None = None,
        with_system_columns: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        values = self.layout.partition_values(bucket, partition_name)
        dataset = self.delta(snapshot_id).to_pyarrow_dataset(
            file_pruning_predicate=[(key, "=", value) for key, value in values.items()]
        )
        names = list(columns) if columns is not None else self.layout.row_type.field_names
        wanted = names + list(SYSTEM_COLUMNS) if with_system_columns else names
        # a snapshot from before an ADD COLUMN lacks the column: its rows read it as null
        present = [name for name in wanted if name in dataset.schema.names]
        for batch in dataset.to_batches(columns=present):
            if batch.num_rows:
                batch = with_null_columns(batch, pa.schema([self.layout.schema.field(name) for name in wanted]))
                yield from self.layout.from_lake(batch, names, with_system_columns).to_batches()

    def buckets(self, snapshot_id: int) -> list[tuple[str | None, int]]:
        actions = pa.table(self.delta(snapshot_id).get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return []
        columns = [f"partition.{name}" for name in self.layout.partition_columns]
        found = set()
        for values in actions.select(columns).cast(pa.schema([(c, pa.string()) for c in columns])).to_pylist():
            plain = {name[len("partition."):]: value for name, value in values.items()}
            found.add((self.layout.partition_name(plain), int(plain[BUCKET_COLUMN])))
        return sorted(found, key=lambda pair: (pair[0] or "", pair[1]))

    def read(self, snapshot_id: int | None = None) -> pa.Table:
        return self.delta(snapshot_id).to_pyarrow_table()

    # ---- what writers use ----
    @property
    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        return self._files

    def bucket_files(self, snapshot_id: int, partition_values: Mapping[str, str]) -> pa.Table:
        """The add actions (flattened: ``path``, ``size_bytes``, ``min.<column>``, ...) of one
        (partition, bucket) at a snapshot."""
        actions = pa.table(self.delta(snapshot_id).get_add_actions(flatten=True))
        for key, value in partition_values.items():
            if actions.num_rows == 0:
                break
            actions = actions.filter(pc.equal(actions.column(f"partition.{key}").cast(pa.string()), value))
        return actions


class DeltaLakeWriter(CopyOnWriteWriter):
    """One bucket's new files; see the module docstring for the copy-on-write of primary-key tables.
    Runs in one Spark task; not thread-safe."""

    def __init__(self, table: DeltaLakeTable, bucket: TableBucket, partition_name: str | None, base: int | None) -> None:
        layout = table.layout
        self._table = table
        self._values = layout.partition_values(bucket.bucket, partition_name)
        fs, self._root = table.filesystem
        file_schema = pa.schema([f for f in layout.schema if f.name not in self._values])
        directory = "/".join(f"{key}={value}" for key, value in self._values.items())
        sink = DeltaFileSink(fs, self._root, directory, file_schema, table.limits)
        super().__init__(layout, bucket, partition_name, base, fs, sink)

    def _file_rows(self, rows: pa.Table) -> pa.Table:
        return rows.select(self._sink.schema.names)  # partition columns live in the path

    def _added(self, files: Sequence[WrittenFile]) -> list[Any]:
        now_ms = int(time.time() * 1000)
        return [
            {"path": f.path, "size": f.size, "partition_values": self._values, "modification_time": now_ms,
             "data_change": True, "stats": f.stats}
            for f in files
        ]

    def _bucket_files(self, base: int) -> Iterator[BucketFile]:
        files = self._table.bucket_files(base, self._values)
        for index in range(files.num_rows):
            path = files.column("path")[index].as_py()
            removal = {"path": path, "size": files.column("size_bytes")[index].as_py(), "partition_values": self._values}
            yield BucketFile(posixpath.join(self._root, path), removal, functools.partial(_may_hold, files, index))


def _may_hold(files: pa.Table, index: int, touched: pa.Table) -> bool:
    """False if a file's key statistics rule out every touched key (each key column on its own)."""
    for name in touched.column_names:
        if f"min.{name}" not in files.column_names or f"max.{name}" not in files.column_names:
            continue
        low, high = files.column(f"min.{name}")[index], files.column(f"max.{name}")[index]
        if not (low.is_valid and high.is_valid):
            continue
        column = touched.column(name)
        try:
            if not any_in_bounds(column, low.cast(column.type), high.cast(column.type)):
                return False
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue  # statistics of a type we cannot compare: read the file
    return True
