"""Copy-on-write of one bucket's lake files, shared by the formats' writers (Delta, Iceberg).

A round's changes for a bucket arrive as rows to append and keys to delete. The writer streams appended
rows into new files; at completion it rewrites the bucket's existing files that hold a deleted (or
updated) key: a file is skipped when its key bounds rule out every touched key, dropped when every row
is touched, and otherwise its remaining rows are copied into the new files. The format supplies how it
lists a bucket's files (with their bounds and what removing one records) and how it describes new files.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from strom.errors import InvalidTableError
from strom.ids import TableBucket
from strom.lake.delta_files import DeltaFileSink, WrittenFile
from strom.lake.format import LakeWriter, LakeWriteResult
from strom.lake.layout import LakeLayout, with_null_columns


@dataclass(frozen=True, slots=True)
class BucketFile:
    """An existing file of the bucket at the round's base snapshot."""

    read_path: str
    """Where the writer's file system reads it."""
    removal: Any
    """What the format records to remove it (JSON-serialisable)."""
    may_hold: Callable[[pa.Table], bool]
    """False if the file's key bounds rule out every one of these keys."""


def in_keys(rows: pa.Table, keys: pa.Table) -> np.ndarray:
    """A mask: which rows' key (the columns of ``keys``, same types) is one of ``keys``."""
    if keys.num_columns == 1:
        return pc.is_in(rows.column(0), value_set=keys.column(0).combine_chunks()).to_numpy(zero_copy_only=False)
    numbered = rows.append_column("__row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    matches = numbered.join(keys, keys=keys.column_names, join_type="left semi").column("__row")
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[matches.to_numpy()] = True
    return mask


def any_in_bounds(column: pa.ChunkedArray | pa.Array, low: pa.Scalar, high: pa.Scalar) -> bool:
    """Whether any value of ``column`` lies in ``[low, high]``."""
    inside = pc.and_(pc.greater_equal(column, low), pc.less_equal(column, high))
    return bool(pc.any(inside).as_py())


class CopyOnWriteWriter(LakeWriter):
    """One bucket's new files, copy-on-write. Runs in one Spark task; not thread-safe."""

    def __init__(
        self,
        layout: LakeLayout,
        bucket: TableBucket,
        partition_name: str | None,
        base: int | None,
        fs: pafs.FileSystem,
        sink: DeltaFileSink,
    ) -> None:
        self._layout = layout
        self._bucket = bucket
        self._partition_name = partition_name
        self._base = base
        self._fs = fs
        self._sink = sink
        self._touched: list[pa.Table] = []
        self._removed: list[Any] = []
        self._completed = False

    # ---- what a format supplies ----
    @abstractmethod
    def _file_rows(self, rows: pa.Table) -> pa.Table:
        """Rows in the lake's schema as the format's files store them (column selection, casts)."""

    @abstractmethod
    def _bucket_files(self, base: int) -> Iterable[BucketFile]:
        """The bucket's files at snapshot ``base``."""

    @abstractmethod
    def _added(self, files: Sequence[WrittenFile]) -> list[Any]:
        """How the format records the new files in its commit (JSON-serialisable)."""

    # ---- LakeWriter ----
    def append(self, rows: pa.RecordBatch, offsets: pa.Array, timestamps: pa.Array) -> None:
        assert not self._completed, "append after complete()"
        if rows.num_rows == 0:
            return
        self._sink.write(self._file_rows(self._layout.to_lake(rows, self._bucket.bucket, offsets, timestamps)))

    def delete_keys(self, keys: pa.Table) -> None:
        assert not self._completed, "delete_keys after complete()"
        if not self._layout.primary_key:
            raise InvalidTableError(f"'{self._layout.info.path}' is a log table: its lake rows are never deleted")
        if keys.num_rows:
            self._touched.append(self._layout.keys_to_lake(keys))

    def complete(self) -> LakeWriteResult:
        assert not self._completed, "complete() twice"
        self._rewrite_touched_files()
        files = self._sink.finish()
        self._completed = True
        payload = {"base": self._base, "add": self._added(files), "remove": self._removed}
        return LakeWriteResult(
            self._bucket, self._partition_name, json.dumps(payload, separators=(",", ":")).encode(),
            sum(f.record_count for f in files), sum(f.size for f in files), len(files),
        )

    def close(self) -> None:
        if not self._completed:  # a failed split: its files will never be committed
            self._sink.discard()
        self._touched = []

    # ---- copy-on-write ----
    def _rewrite_touched_files(self) -> None:
        if not self._touched or self._base is None:
            return
        key = self._layout.primary_key
        touched = pa.concat_tables(self._touched).group_by(key).aggregate([])
        self._touched = []
        for file in self._bucket_files(self._base):
            if not file.may_hold(touched):
                continue
            file_keys = pq.read_table(file.read_path, columns=key, filesystem=self._fs).cast(touched.schema)
            hit = in_keys(file_keys, touched)
            if not hit.any():
                continue
            self._removed.append(file.removal)
            if not hit.all():
                self._copy_rows(file.read_path, ~hit)

    def _copy_rows(self, path: str, keep: np.ndarray) -> None:
        """The kept rows of a file into this writer's new files, streamed batch by batch; columns the table
        gained after the file was written (ADD COLUMN) are null in them."""
        schema = self._sink.schema
        start = 0
        with self._fs.open_input_file(path) as source:
            parquet = pq.ParquetFile(source)
            present = [name for name in schema.names if name in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(columns=present):
                mask = pa.array(keep[start:start + batch.num_rows])
                start += batch.num_rows
                rows = with_null_columns(pa.Table.from_batches([batch]).filter(mask), schema)
                self._sink.write(self._file_rows(rows.select(schema.names)))
        assert start == len(keep), (path, start, len(keep))
