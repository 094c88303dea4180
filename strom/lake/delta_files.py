"""Data files of a Delta table as a Spark task writes them: rolling Parquet files and Delta statistics.

A :class:`DeltaFileSink` streams rows of one (partition, bucket) into Parquet files (zstd) in the
table's directory, a row group at a time, and starts a new file at a size or row limit, so a task's
memory stays bounded by one row group whatever the split's size. Each finished file is described with
the statistics Delta keeps per file (``numRecords``, ``minValues``, ``maxValues``, ``nullCount``) so
readers can skip files: the bounds are always true bounds, or left out. Timestamps are stored at
millisecond precision (what Delta readers expect), so minima round down and maxima up; strings keep a
prefix as minimum, and no maximum when longer than the prefix; floats with NaN get no bounds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

MIB = 1024 * 1024
STATS_STRING_PREFIX_LENGTH = 32
"""Characters of a string column kept in its statistics (Delta writers commonly keep 32)."""
_EPOCH = dt.datetime(1970, 1, 1)
_MICROS_PER_MILLI = 1000


@dataclass(frozen=True, slots=True)
class FileLimits:
    """When a writer cuts row groups and files. Memory per writer is about one row group."""

    file_bytes_target: int = 128 * MIB
    """A file is finished once it holds at least this many bytes (checked after each row group)."""
    file_rows_max: int = 8 * 1024 * 1024
    row_group_bytes_max: int = 64 * MIB
    """Arrow (uncompressed) bytes buffered before they are written as one row group."""
    row_group_rows_max: int = 1024 * 1024

    def __post_init__(self) -> None:
        assert 0 < self.row_group_rows_max <= self.file_rows_max, self
        assert self.row_group_bytes_max > 0, self
        assert self.file_bytes_target > 0, self


@dataclass(frozen=True, slots=True)
class WrittenFile:
    path: str
    """Relative to the table root (how Delta add actions name files)."""
    size: int
    record_count: int
    stats: str
    """Delta's per-file statistics, JSON."""


def _timestamp_text(micros: int, round_up: bool, utc: bool) -> str | None:
    """A timestamp bound at millisecond precision, rounded so it still bounds ``micros``."""
    millis = -(-micros // _MICROS_PER_MILLI) if round_up else micros // _MICROS_PER_MILLI
    try:
        value = _EPOCH + dt.timedelta(milliseconds=millis)
    except OverflowError:
        return None
    text = value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // _MICROS_PER_MILLI:03d}"
    return text + "Z" if utc else text


def _bound_json(kind: pa.DataType, value: Any, is_max: bool) -> str | None:
    """The JSON text of a min or max statistic, or None when no true bound can be written."""
    if pa.types.is_timestamp(kind):
        assert kind.unit == "us", kind  # every lake timestamp is in microseconds
        text = _timestamp_text(value, round_up=is_max, utc=kind.tz is not None)
        return None if text is None else json.dumps(text)
    if pa.types.is_string(kind):
        if len(value) > STATS_STRING_PREFIX_LENGTH:
            if is_max:
                return None  # a cut maximum would be below the value
            value = value[:STATS_STRING_PREFIX_LENGTH]  # a prefix is never above the value
        return json.dumps(value)
    if pa.types.is_date(kind):
        return json.dumps(value.isoformat())
    if pa.types.is_decimal(kind):
        return format(value, "f")  # exact: a float could round past the bound
    if pa.types.is_floating(kind) and value in (float("inf"), float("-inf")):
        return None  # JSON has no infinity
    return json.dumps(value)


def _has_bounds(kind: pa.DataType) -> bool:
    return (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
        or pa.types.is_string(kind) or pa.types.is_date32(kind) or pa.types.is_timestamp(kind)
    )


class FileStats:
    """Delta statistics of one file, gathered row group by row group. Top-level primitive columns only:
    Delta nests the statistics of struct fields, and lists and maps have none."""

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema
        self.record_count = 0
        self._null_counts = {f.name: 0 for f in schema if not pa.types.is_nested(f.type)}
        self._minimum: dict[str, Any] = {}
        self._maximum: dict[str, Any] = {}
        self._unbounded: set[str] = set()
        """Columns whose bounds cannot be stated (a NaN was seen, or a value out of range)."""

    def update(self, rows: pa.Table) -> None:
        self.record_count += rows.num_rows
        for field in self._schema:
            if field.name not in self._null_counts:
                continue
            column = rows.column(field.name)
            self._null_counts[field.name] += column.null_count
            if not _has_bounds(field.type) or field.name in self._unbounded:
                continue
            if pa.types.is_floating(field.type) and pc.any(pc.is_nan(column)).as_py():
                self._unbounded.add(field.name)
                continue
            if pa.types.is_timestamp(field.type):
                column = column.cast(pa.int64())
            low, high = pc.min_max(column).values()
            if not low.is_valid:
                continue  # all null
            try:
                low_value, high_value = low.as_py(), high.as_py()
            except (ValueError, OverflowError):  # e.g. a date past year 9999
                self._unbounded.add(field.name)
                continue
            if field.name in self._minimum:
                low_value = min(low_value, self._minimum[field.name])
                high_value = max(high_value, self._maximum[field.name])
            self._minimum[field.name], self._maximum[field.name] = low_value, high_value

    def to_json(self) -> str:
        minimum: list[str] = []
        maximum: list[str] = []
        for name, value in self._minimum.items():
            if name in self._unbounded:
                continue
            kind = self._schema.field(name).type
            for target, bound, is_max in ((minimum, value, False), (maximum, self._maximum[name], True)):
                text = _bound_json(kind, bound, is_max)
                if text is not None:
                    target.append(f"{json.dumps(name)}:{text}")
        return (
            f'{{"numRecords":{self.record_count},"minValues":{{{",".join(minimum)}}},'
            f'"maxValues":{{{",".join(maximum)}}},"nullCount":{json.dumps(self._null_counts, separators=(",", ":"))}}}'
        )


class DeltaFileSink:
    """Streams rows into Parquet files under one partition directory of a table; never commits.

    Not thread-safe: one per writer, in one Spark task.
    """

    def __init__(
        self, fs: pafs.FileSystem, root: str, directory: str, schema: pa.Schema, limits: FileLimits
    ) -> None:
        self._fs = fs
        self._root = root
        self._directory = directory
        self._schema = schema
        self._limits = limits
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._finished: list[WrittenFile] = []
        self._path: str | None = None
        self._stream: pa.NativeFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._stats: FileStats | None = None
        self._directory_made = False

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def write(self, rows: pa.Table) -> None:
        """Buffer rows (in :attr:`schema`); full row groups go to the current file."""
        assert rows.schema.names == self._schema.names, (rows.schema.names, self._schema.names)
        if rows.num_rows == 0:
            return
        self._pending.append(rows)
        self._pending_rows += rows.num_rows
        self._pending_bytes += rows.nbytes
        if self._pending_rows >= self._limits.row_group_rows_max or self._pending_bytes >= self._limits.row_group_bytes_max:
            self._write_row_groups()

    def finish(self) -> list[WrittenFile]:
        """Write what is buffered, finish the open file; every file this sink wrote."""
        self._write_row_groups()
        self._finish_file()
        return list(self._finished)

    def discard(self) -> None:
        """Delete every file this sink wrote (the split failed; none was committed)."""
        paths = [f.path for f in self._finished]
        if self._path is not None:
            paths.append(self._path)
            with contextlib.suppress(Exception):  # the file is deleted below whatever state it is in
                self._close_file()
        self._pending, self._finished, self._path = [], [], None
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                self._fs.delete_file(posixpath.join(self._root, path))

    def _write_row_groups(self) -> None:
        if not self._pending:
            return
        rows = pa.concat_tables(self._pending).cast(self._schema)
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        start = 0
        while start < rows.num_rows:
            writer, stats = self._open_file()
            room = self._limits.file_rows_max - stats.record_count
            assert room > 0, (room, stats.record_count)
            part = rows.slice(start, room)
            writer.write_table(part, row_group_size=self._limits.row_group_rows_max)
            stats.update(part)
            start += part.num_rows
            assert self._stream is not None
            if stats.record_count >= self._limits.file_rows_max or self._stream.tell() >= self._limits.file_bytes_target:
                self._finish_file()

    def _open_file(self) -> tuple[pq.ParquetWriter, FileStats]:
        if self._writer is not None:
            assert self._stats is not None
            return self._writer, self._stats
        if not self._directory_made:  # object stores have no directories; local file systems need them
            self._fs.create_dir(posixpath.join(self._root, self._directory), recursive=True)
            self._directory_made = True
        self._path = f"{self._directory}/part-{uuid.uuid4().hex}.zstd.parquet"
        self._stream = self._fs.open_output_stream(posixpath.join(self._root, self._path))
        self._writer = pq.ParquetWriter(self._stream, self._schema, compression="zstd", write_statistics=True)
        self._stats = FileStats(self._schema)
        return self._writer, self._stats

    def _close_file(self) -> int:
        """Close the open file; its size in bytes."""
        assert self._writer is not None and self._stream is not None
        writer, stream = self._writer, self._stream
        self._writer, self._stream = None, None
        writer.close()
        size = stream.tell()
        stream.close()
        return size

    def _finish_file(self) -> None:
        if self._writer is None:
            return
        assert self._path is not None and self._stats is not None
        size = self._close_file()
        self._finished.append(WrittenFile(self._path, size, self._stats.record_count, self._stats.to_json()))
        self._path, self._stats = None, None
