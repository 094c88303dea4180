"""Delta Lake through delta-rs (``deltalake``): the lake copy of a strom table as a Delta table.

Spark tasks write Parquet files straight into the table's directory (``<partition path>/part-<uuid>.parquet``)
and describe them as Delta add/remove actions; the driver commits all of a round's actions in one Delta
transaction whose commit info carries the tiering properties. Nothing a task writes is visible before
that commit, and a round that never commits leaves only unreferenced files.

Primary-key tables are kept as their current state by copy-on-write per bucket: a writer reads the key
columns of each of its bucket's files in the base snapshot, rewrites the files that hold a changed or
deleted key without those rows, and adds the new rows as new files. Files without a touched key stay.
The transaction is read at the base snapshot, so a concurrent commit that removed the same files makes
delta-rs refuse this one.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from strom.errors import InvalidConfigError, InvalidTableError, StromError
from strom.ids import TableBucket
from strom.lake.format import (
    COMMIT_USER,
    COMMIT_USER_PROPERTY,
    CommittedLakeSnapshot,
    LakeFormat,
    LakeStats,
    LakeTable,
    LakeWriter,
    LakeWriteResult,
)
from strom.lake.layout import LakeLayout
from strom.metadata.table_info import TableInfo

TABLE_ID_KEY = "strom.table-id"
"""Kept in the Delta table's description: which strom table this lake copy belongs to."""
FILE_ROWS_MAX = 1_000_000
"""Rows per Parquet file a writer produces before it starts the next one."""
HISTORY_SCAN_MAX = 1000


class LakeCommitConflictError(StromError):
    """The lake changed under a round in a way its commit cannot be applied to (retry the round)."""


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    return pafs.FileSystem.from_uri(uri)


def _file_stats(table: pa.Table) -> str:
    """Delta's per-file statistics: row count, null counts, and min/max of numeric columns (for pruning)."""
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if pa.types.is_nested(kind):
            continue  # Delta nests the statistics of nested columns; none are kept for them
        nulls[name] = column.null_count
        if (pa.types.is_integer(kind) or pa.types.is_floating(kind)) and column.null_count < len(column):
            low, high = pc.min_max(column).values()
            if pa.types.is_floating(kind) and (np.isnan(low.as_py()) or np.isnan(high.as_py())):
                continue
            minimum[name], maximum[name] = low.as_py(), high.as_py()
    return json.dumps({"numRecords": table.num_rows, "minValues": minimum, "maxValues": maximum, "nullCount": nulls})


class DeltaLakeFormat(LakeFormat):
    """Options (``table.datalake.delta.<key>``): ``warehouse`` (required; a local directory or any URL
    delta-rs and pyarrow understand); every other key is passed to delta-rs as a storage option."""

    identifier = "delta"

    def __init__(self, options: Mapping[str, str]) -> None:
        warehouse = options.get("warehouse", "").strip()
        if not warehouse:
            raise InvalidConfigError("the delta lake format needs 'table.datalake.delta.warehouse' (datalake.delta.warehouse)")
        self.warehouse = warehouse.rstrip("/")
        self.storage_options = {k: v for k, v in options.items() if k != "warehouse"}

    def table(self, info: TableInfo) -> DeltaLakeTable:
        uri = f"{self.warehouse}/{info.path.database_name}/{info.path.table_name}"
        return DeltaLakeTable(uri, LakeLayout(info), self.storage_options).ensure_created()


class DeltaLakeTable(LakeTable):
    def __init__(self, uri: str, layout: LakeLayout, storage_options: Mapping[str, str]) -> None:
        self._uri = uri
        self.layout = layout
        self._storage_options = dict(storage_options) or None

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeltaLakeTable, (self._uri, self.layout, self._storage_options or {}))

    @property
    def uri(self) -> str:
        return self._uri

    @cached_property
    def _fs(self) -> tuple[pafs.FileSystem, str]:
        return _filesystem(self._uri)

    def delta(self, version: int | None = None) -> DeltaTable:
        return DeltaTable(self._uri, version=version, storage_options=self._storage_options)

    def ensure_created(self) -> DeltaLakeTable:
        info = self.layout.info
        description = json.dumps({TABLE_ID_KEY: info.table_id})
        try:
            table = self.delta()
        except TableNotFoundError:
            DeltaTable.create(
                self._uri, schema=self.layout.schema, mode="ignore", partition_by=self.layout.partition_columns,
                name=str(info.path), description=description, storage_options=self._storage_options,
            )
            table = self.delta()
        try:
            owner = json.loads(table.metadata().description or "{}").get(TABLE_ID_KEY)
        except ValueError:
            owner = None
        if owner != info.table_id:
            raise InvalidTableError(
                f"the lake table at {self._uri} belongs to strom table id {owner}, not to '{info.path}' (id "
                f"{info.table_id}): a table of the same name was dropped and re-created; move the old lake table away"
            )
        expected = self.layout.schema.names
        actual = [field.name for field in table.schema().fields]
        if actual != expected:
            raise InvalidTableError(f"the lake table at {self._uri} has columns {actual}, expected {expected}")
        return self

    # ---- writing ----
    def writer(self, bucket: TableBucket, partition_name: str | None, base_snapshot_id: int | None) -> DeltaLakeWriter:
        return DeltaLakeWriter(self, bucket, partition_name, base_snapshot_id)

    def latest_snapshot_id(self) -> int | None:
        return self.delta().version()

    def commit(self, results: Sequence[LakeWriteResult], properties: Mapping[str, str]) -> int:
        actions: list[AddAction | RemoveAction] = []
        bases = set()
        for result in results:
            payload = json.loads(result.payload)
            bases.add(payload["base"])
            actions += [AddAction(**add) for add in payload["add"]]
            actions += [
                RemoveAction(r["path"], True, int(time.time() * 1000), r["size"], r["partition_values"])
                for r in payload["remove"]
            ]
        if len(bases) > 1:
            raise LakeCommitConflictError(f"the results were written against different lake snapshots {sorted(bases)}")
        base = bases.pop() if bases else None
        table = self.delta(base) if base is not None else self.delta()
        metadata = {**properties, COMMIT_USER_PROPERTY: COMMIT_USER}
        try:
            table.create_write_transaction(
                actions, mode="append", schema=self.layout.schema, partition_by=self.layout.partition_columns,
                commit_properties=CommitProperties(custom_metadata=metadata),
            )
        except Exception as exc:
            if type(exc).__name__ == "CommitFailedError":
                raise LakeCommitConflictError(f"lake commit to {self._uri} refused: {exc}") from exc
            raise
        return self._version_of(metadata)

    def _version_of(self, metadata: Mapping[str, str]) -> int:
        """The version our commit got (another commit may have followed it already)."""
        for entry in self.delta().history(HISTORY_SCAN_MAX):
            if all(str(entry.get(key)) == str(value) for key, value in metadata.items()):
                return int(entry["version"])
        raise LakeCommitConflictError(f"the commit to {self._uri} is not in the table's history")

    def abort(self, results: Sequence[LakeWriteResult]) -> None:
        fs, root = self._fs
        for result in results:
            for add in json.loads(result.payload)["add"]:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(posixpath.join(root, add["path"]))

    # ---- reading ----
    def last_strom_commit(self, after_snapshot_id: int | None) -> CommittedLakeSnapshot | None:
        for entry in self.delta().history(HISTORY_SCAN_MAX):
            version = int(entry["version"])
            if after_snapshot_id is not None and version <= after_snapshot_id:
                return None
            if entry.get(COMMIT_USER_PROPERTY) == COMMIT_USER:
                properties = {k: str(v) for k, v in entry.items() if isinstance(v, str)}
                return CommittedLakeSnapshot(version, properties)
        return None

    def stats(self, snapshot_id: int | None = None) -> LakeStats:
        actions = pa.table(self.delta(snapshot_id).get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return LakeStats(0, 0)
        records = pc.sum(actions.column("num_records")).as_py() or 0
        return LakeStats(int(pc.sum(actions.column("size_bytes")).as_py()), int(records))

    def read_bucket(
        self, snapshot_id: int, bucket: int, partition_name: str | None, with_system_columns: bool = False
    ) -> Iterator[pa.RecordBatch]:
        values = self.layout.partition_values(bucket, partition_name)
        filters = [(key, "=", value) for key, value in values.items()]
        dataset = self.delta(snapshot_id).to_pyarrow_dataset(file_pruning_predicate=filters)
        for batch in dataset.to_batches():
            if batch.num_rows:
                yield from self.layout.from_lake(batch, with_system_columns).to_batches()

    def read(self, snapshot_id: int | None = None) -> pa.Table:
        return self.delta(snapshot_id).to_pyarrow_table()

    def files_of(self, snapshot_id: int, partition_values: Mapping[str, str]) -> list[dict[str, Any]]:
        """``path`` and ``size`` of every file of one (partition, bucket) at a snapshot."""
        actions = pa.table(self.delta(snapshot_id).get_add_actions(flatten=False))
        files = []
        for row in actions.to_pylist():
            values = {k: (str(v) if v is not None else None) for k, v in (row.get("partition") or {}).items()}
            if all(values.get(k) == v for k, v in partition_values.items()):
                files.append({"path": row["path"], "size": row["size_bytes"]})
        return files

    def write_file(self, directory: str, rows: pa.Table) -> dict[str, Any]:
        """Write one Parquet file (partition columns left out, as Delta stores them) and describe it."""
        fs, root = self._fs
        relative = f"{directory}/part-{uuid.uuid4().hex}.zstd.parquet"
        data = rows.drop_columns([c for c in self.layout.partition_columns if c in rows.column_names])
        fs.create_dir(posixpath.join(root, directory), recursive=True)
        pq.write_table(data, posixpath.join(root, relative), filesystem=fs, compression="zstd")
        size = fs.get_file_info(posixpath.join(root, relative)).size
        return {"path": relative, "size": size, "stats": _file_stats(data), "rows": rows.num_rows}

    def read_file(self, path: str, columns: Sequence[str] | None = None) -> pa.Table:
        fs, root = self._fs
        return pq.read_table(posixpath.join(root, path), columns=list(columns) if columns else None, filesystem=fs)


class DeltaLakeWriter(LakeWriter):
    """One bucket's new files; see the module docstring for the copy-on-write of primary-key tables."""

    def __init__(self, table: DeltaLakeTable, bucket: TableBucket, partition_name: str | None, base: int | None) -> None:
        self._table = table
        self._layout = table.layout
        self._bucket = bucket
        self._partition_name = partition_name
        self._base = base
        self._values = self._layout.partition_values(bucket.bucket, partition_name)
        self._directory = "/".join(f"{key}={value}" for key, value in self._values.items())
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._added: list[dict[str, Any]] = []
        self._removed: list[dict[str, Any]] = []
        self._touched: list[pa.Table] = []
        self._completed = False

    def append(self, rows: pa.RecordBatch, offsets: pa.Array, timestamps: pa.Array) -> None:
        if rows.num_rows == 0:
            return
        self._pending.append(self._layout.to_lake(rows, self._bucket.bucket, offsets, timestamps))
        self._pending_rows += rows.num_rows
        if self._pending_rows >= FILE_ROWS_MAX:
            self._flush()

    def delete_keys(self, keys: pa.Table) -> None:
        if not self._layout.primary_key:
            raise InvalidTableError(f"'{self._layout.info.path}' is a log table: its lake rows are never deleted")
        if keys.num_rows:
            self._touched.append(keys.select(self._layout.primary_key))

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        self._added.append(self._table.write_file(self._directory, rows))

    def _rewrite_touched_files(self) -> None:
        if not self._touched or self._base is None:
            return
        key = self._layout.primary_key
        touched = pa.concat_tables(self._touched).group_by(key).aggregate([])
        for file in self._table.files_of(self._base, self._values):
            keys = self._table.read_file(file["path"], key)
            keys = keys.append_column("__row", pa.array(np.arange(keys.num_rows, dtype=np.int64)))
            kept = keys.join(touched, keys=key, join_type="left anti").column("__row")
            if len(kept) == keys.num_rows:
                continue  # no touched key in this file: it stays
            self._removed.append({"path": file["path"], "size": file["size"], "partition_values": self._values})
            if len(kept):  # the file's other rows, in their order, into a new file
                rows = self._table.read_file(file["path"]).take(pa.array(np.sort(kept.to_numpy())))
                self._added.append(self._table.write_file(self._directory, rows))

    def complete(self) -> LakeWriteResult:
        self._rewrite_touched_files()
        self._flush()
        self._completed = True
        now = int(time.time() * 1000)
        adds = [
            {"path": f["path"], "size": f["size"], "partition_values": self._values, "modification_time": now,
             "data_change": True, "stats": f["stats"]}
            for f in self._added
        ]
        payload = json.dumps({"base": self._base, "add": adds, "remove": self._removed}).encode()
        return LakeWriteResult(
            self._bucket, self._partition_name, payload,
            sum(f["rows"] for f in self._added), sum(f["size"] for f in self._added), len(self._added),
        )

    def close(self) -> None:
        if not self._completed:  # a failed split: its files will never be committed
            fs, root = self._table._fs
            for file in self._added:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(posixpath.join(root, file["path"]))
        self._pending = []
