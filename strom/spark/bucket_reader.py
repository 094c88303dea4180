"""Executor-side reading of one planned partition into Arrow batches in Spark's layout.

Each function opens its own connection (see :mod:`strom.spark.runtime`), checks that the table is still
the one planned (same id: not dropped and re-created), and yields ``pyarrow.RecordBatch``es of at most
``READ_BATCH_ROWS_MAX`` rows, converted with :func:`strom.spark.type_mapping.to_spark_batch`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from strom.client import Connection, OffsetSpec
from strom.client.changelog import ChangelogFold, KeyEncoder, change_type_column, merge_snapshot
from strom.client.log_scanner import LogScanner, ScanBatch
from strom.client.predicates import Predicate
from strom.client.snapshots import KvSnapshotReader
from strom.client.table import Table, TableLayout
from strom.errors import KvSnapshotNotExistError
from strom.ids import TableBucket
from strom.lake.formats import lake_format
from strom.records.log_batch import ChangeType
from strom.records.types import RowType
from strom.spark import runtime
from strom.spark.binlog import BinlogAssembler
from strom.spark.errors import FlussConnectorError
from strom.spark.options import (
    METADATA_BUCKET,
    METADATA_COMMIT_TIMESTAMP,
    METADATA_LOG_OFFSET,
    TEST_WAIT_FOR_FILE,
    ConnectionOptions,
)
from strom.spark.partitions import (
    KeyLookupPartition,
    KvStatePartition,
    LakeBucketPartition,
    LogRangePartition,
    LogTailPartition,
    ServerScanPartition,
)
from strom.spark.type_mapping import to_spark_batch

READ_BATCH_ROWS_MAX = 65_536
"""Rows per batch handed to Spark: large enough to amortise Spark's per-batch cost, small enough to stream."""
GATE_WAIT_S_MAX = 120.0
GATE_POLL_S = 0.05
METRICS_LOGGER = "strom.spark.read"
"""Each read task logs one INFO record here with its rows and bytes (see docs/spark.md, Metrics)."""

_metrics_log = logging.getLogger(METRICS_LOGGER)
_metrics_log.setLevel(logging.INFO)

LOG, SNAPSHOT, LAKE, LOOKUP = "log", "snapshot", "lake", "lookup"
"""Where a task's rows came from: the log (or changelog fold), a KV snapshot or server scan, the lake, lookups."""


@dataclass(frozen=True, slots=True)
class ReadContext:
    """What every read task shares: where the table is and the shape Spark expects."""

    connection: ConnectionOptions
    table_id: int
    target: pa.Schema
    """Spark's Arrow schema of the output (the table's columns, then the change-type column if any)."""
    with_change_type: bool
    wait_for_file: str | None = None
    metadata_columns: tuple[str, ...] = ()
    """``read.metadata-columns``, in the order they follow the table's (and the change type) columns."""
    binlog: bool = False
    """Log ranges are read in the ``$binlog`` form (:mod:`strom.spark.binlog`)."""
    log_predicate: Predicate | None = None
    """Spark's filters a log table's reads push into FetchLog (batches that cannot match are skipped)."""


@dataclass(frozen=True, slots=True)
class LogPosition:
    """Where rows sit in the log: per row its offset and its log batch's commit time (epoch ms)."""

    offsets: pa.Array
    timestamps_ms: pa.Array

    @classmethod
    def of(cls, scan_batch: ScanBatch) -> LogPosition:
        rows = scan_batch.batch.num_rows
        offsets = np.arange(scan_batch.base_offset, scan_batch.base_offset + rows, dtype=np.int64)
        return cls(pa.array(offsets), pa.array(np.full(rows, scan_batch.commit_timestamp, np.int64)))


@dataclass(slots=True)
class ReadMetrics:
    """What one task handed to Spark."""

    rows: int = 0
    bytes: int = 0
    rows_by_source: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        sources = ", ".join(f"{name} rows={count}" for name, count in sorted(self.rows_by_source.items()))
        return f"rows={self.rows} bytes={self.bytes}" + (f" ({sources})" if sources else "")


class _Output:
    """Converts table-layout batches to Spark's layout (adding the change type and metadata columns),
    coalescing small ones up to READ_BATCH_ROWS_MAX, and counts what it hands over."""

    def __init__(self, layout: TableLayout, context: ReadContext, bucket: TableBucket | None = None) -> None:
        # The table may have gained columns since the query was planned (ALTER TABLE ADD COLUMN appends
        # them): Spark gets the columns it planned with, the first ones of every later schema.
        planned = len(context.target) - int(context.with_change_type) - len(context.metadata_columns)
        self._planned_columns = planned if planned < len(layout.row_type.fields) else None
        self._row_type = layout.row_type if self._planned_columns is None else RowType(layout.row_type.fields[:planned])
        self._context = context
        self._bucket = bucket
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self.metrics = ReadMetrics()

    @property
    def wants_position(self) -> bool:
        """Whether the reader should pass log positions (offsets and commit times) along with rows."""
        columns = self._context.metadata_columns
        return METADATA_LOG_OFFSET in columns or METADATA_COMMIT_TIMESTAMP in columns

    def convert(
        self, batch: pa.RecordBatch, change_types: bytes | ChangeType, position: LogPosition | None = None
    ) -> pa.RecordBatch:
        target = self._context.target
        if self._planned_columns is not None:
            batch = batch.select(range(self._planned_columns))
        converted = to_spark_batch(batch, self._row_type, target)
        rows = batch.num_rows
        if self._context.with_change_type:
            column = change_type_column(change_types, rows)
            converted = converted.append_column(target.field(converted.num_columns), column)
        for name in self._context.metadata_columns:
            target_field = target.field(converted.num_columns)
            if name == METADATA_BUCKET:
                bucket = self._bucket.bucket if self._bucket is not None else None
                column = pa.nulls(rows, pa.int32()) if bucket is None else pa.repeat(pa.scalar(bucket, pa.int32()), rows)
            elif position is None:
                column = pa.nulls(rows, target_field.type)
            elif name == METADATA_LOG_OFFSET:
                column = position.offsets
            else:
                assert name == METADATA_COMMIT_TIMESTAMP, name
                column = pc.multiply(position.timestamps_ms, 1000).cast(pa.timestamp("us"))
            converted = converted.append_column(target_field, column.cast(target_field.type))
        return converted

    def add(
        self, batch: pa.RecordBatch, change_types: bytes | ChangeType, source: str = LOG, position: LogPosition | None = None
    ) -> Iterator[pa.RecordBatch]:
        if batch.num_rows == 0:
            return
        converted = self.convert(batch, change_types, position)
        self._pending.append(converted)
        self._pending_rows += batch.num_rows
        metrics = self.metrics
        metrics.rows += batch.num_rows
        metrics.bytes += converted.nbytes
        metrics.rows_by_source[source] = metrics.rows_by_source.get(source, 0) + batch.num_rows
        if self._pending_rows >= READ_BATCH_ROWS_MAX:
            yield from self.drain()

    def drain(self) -> Iterator[pa.RecordBatch]:
        if not self._pending:
            return
        batch = self._pending[0] if len(self._pending) == 1 else pa.concat_batches(self._pending)
        self._pending, self._pending_rows = [], 0
        yield batch


def _open_table(connection: Connection, context: ReadContext) -> Table:
    path = context.connection.table_path
    table = runtime.run(connection.get_table(path))
    if table.layout.info.table_id != context.table_id:
        raise FlussConnectorError(
            f"table '{path}' was dropped and re-created since the read was planned (id {context.table_id} is now "
            f"{table.layout.info.table_id}); run the query again"
        )
    return table


def _wait_for_gate(path: str | None) -> None:
    """The test aid of option ``testing.read.wait-for-file``: act between planning and reading."""
    if path is None:
        return
    deadline = time.monotonic() + GATE_WAIT_S_MAX
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise FlussConnectorError(f"option '{TEST_WAIT_FOR_FILE.key}': {path} did not appear within {GATE_WAIT_S_MAX:.0f} s")
        time.sleep(GATE_POLL_S)


def _log_metrics(context: ReadContext, what: str, output: _Output) -> None:
    _metrics_log.info("fluss read of %s, %s: %s", context.connection.table, what, output.metrics.describe())


async def _changes(
    table: Table, bucket: TableBucket, start: int, end: int, predicate: Predicate | None = None,
) -> AsyncIterator[ScanBatch]:
    scan = table.new_scan()
    scanner: LogScanner = (scan.filter(predicate) if predicate is not None else scan).create_log_scanner()
    async for scan_batch in scanner.read_range(bucket, start, end):
        yield scan_batch


def _fold(table: Table, bucket: TableBucket, start: int, end: int) -> ChangelogFold:
    """A primary-key bucket's changelog ``[start, end)`` folded by key (offsets and commit times kept)."""
    fold = ChangelogFold(table.layout)
    for scan_batch in runtime.iterate(_changes(table, bucket, start, end)):
        assert scan_batch.change_types is not None, "a primary-key table's log carries change types"
        fold.add(scan_batch.batch, scan_batch.change_types, scan_batch.base_offset, scan_batch.commit_timestamp)
    return fold


def _folded_rows(fold: ChangelogFold, output: _Output) -> Iterator[pa.RecordBatch]:
    """The fold's live rows typed ``+I``, with their log positions when the output wants them."""
    if not output.wants_position:
        for batch in fold.live_rows(READ_BATCH_ROWS_MAX):
            yield from output.add(batch, ChangeType.INSERT, LOG)
        return
    changes = fold.changes()
    rows = changes.rows
    for start in range(0, rows.num_rows, READ_BATCH_ROWS_MAX):
        length = min(READ_BATCH_ROWS_MAX, rows.num_rows - start)
        position = LogPosition(changes.offsets.slice(start, length), changes.timestamps.slice(start, length))
        [batch] = rows.slice(start, length).combine_chunks().to_batches()
        yield from output.add(batch, ChangeType.INSERT, LOG, position)


def read_log_range(context: ReadContext, partition: LogRangePartition) -> Iterator[pa.RecordBatch]:
    """A log table's records, or a primary-key table's change rows, in ``[start, end)`` (those committed
    in the partition's time window, when it has one)."""
    if context.binlog:
        yield from _read_binlog_range(context, partition)
        return
    with runtime.connected(context.connection) as connection:
        yield from _read_log(context, _open_table(connection, context), partition)


def read_log_tail(context: ReadContext, partition: LogTailPartition) -> Iterator[pa.RecordBatch]:
    """A log table bucket's records from the partition's start to the bucket's high watermark now."""
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)  # the same table as planned (not dropped and re-created since)
        bucket = partition.bucket
        listed = connection.get_admin().list_bucket_offsets(
            bucket.table_id, bucket.partition_id, [bucket.bucket], OffsetSpec.latest()
        )
        end = runtime.run(listed)[bucket.bucket]
        if end > partition.start_offset:
            yield from _read_log(context, table, LogRangePartition(bucket, partition.start_offset, end))


def _read_log(context: ReadContext, table: Table, partition: LogRangePartition) -> Iterator[pa.RecordBatch]:
    output = _Output(table.layout, context, partition.bucket)
    changes = _changes(table, partition.bucket, partition.start_offset, partition.end_offset, context.log_predicate)
    for scan_batch in runtime.iterate(changes):
        if not partition.in_window(scan_batch.commit_timestamp):
            continue
        change_types = scan_batch.change_types
        position = LogPosition.of(scan_batch) if output.wants_position else None
        yield from output.add(
            scan_batch.batch, ChangeType.APPEND_ONLY if change_types is None else change_types, LOG, position
        )
    yield from output.drain()
    _log_metrics(context, f"{partition.bucket} offsets [{partition.start_offset}, {partition.end_offset})", output)


def _read_binlog_range(context: ReadContext, partition: LogRangePartition) -> Iterator[pa.RecordBatch]:
    """The range's changes in ``$binlog`` form: the pairs whose ``-U`` lies in it (one record past the end
    when the range ends between a pair's ``-U`` and ``+U``)."""
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)
        bucket = partition.bucket
        assembler = BinlogAssembler(table.layout, context.target, bucket.bucket, partition.start_offset)
        metrics = ReadMetrics()
        ranges = ((partition.start_offset, partition.end_offset), (partition.end_offset, partition.end_offset + 1))
        for start, end in ranges:
            if start > partition.start_offset and not assembler.awaiting_update_after:
                break
            for scan_batch in runtime.iterate(_changes(table, bucket, start, end)):
                if not partition.in_window(scan_batch.commit_timestamp):
                    continue
                batch = assembler.add(scan_batch)
                if batch is not None:
                    metrics.rows += batch.num_rows
                    metrics.bytes += batch.nbytes
                    yield batch
        if assembler.awaiting_update_after:
            raise FlussConnectorError(f"{bucket}: the -U at offset {partition.end_offset - 1} has no +U after it")
        metrics.rows_by_source[LOG] = metrics.rows
        _metrics_log.info(
            "fluss read of %s, %s binlog [%d, %d): %s", context.connection.table, bucket, partition.start_offset,
            partition.end_offset, metrics.describe(),
        )


def read_kv_state(context: ReadContext, partition: KvStatePartition) -> Iterator[pa.RecordBatch]:
    """A primary-key bucket's rows at ``log_end_offset``, every row typed ``+I``.

    The leased snapshot is released once it has been read through, or when Spark stops consuming early;
    after a failure it stays pinned, so a retried task still finds it (the lease expires otherwise).
    """
    _wait_for_gate(context.wait_for_file)
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)
        layout = table.layout
        output = _Output(layout, context, partition.bucket)
        fold = _fold(table, partition.bucket, partition.log_start_offset, partition.log_end_offset)
        if partition.snapshot_id is not None:
            yield from _read_snapshot(connection, layout, partition, fold, output)
        yield from _folded_rows(fold, output)
        yield from output.drain()
        _log_metrics(
            context, f"{partition.bucket} snapshot {partition.snapshot_id} + changelog "
            f"[{partition.log_start_offset}, {partition.log_end_offset})", output,
        )


def _read_snapshot(
    connection: Connection, layout: TableLayout, partition: KvStatePartition, fold: ChangelogFold, output: _Output
) -> Iterator[pa.RecordBatch]:
    assert partition.snapshot_id is not None and partition.lease_id is not None
    admin = connection.get_admin()
    try:
        metadata = runtime.run(admin.get_kv_snapshot_metadata(partition.bucket, partition.snapshot_id))
    except KvSnapshotNotExistError:
        raise FlussConnectorError(
            f"KV snapshot {partition.snapshot_id} of {partition.bucket} is gone although lease "
            f"'{partition.lease_id}' pinned it (expired, or released by an earlier attempt); run the query again"
        ) from None
    schemas = runtime.run(admin.get_table_schemas(layout.info))  # rows keep the schema they were written in
    lease = admin.create_kv_snapshot_lease(partition.lease_id, partition.lease_duration_ms)
    completed = False
    try:
        with KvSnapshotReader(layout, metadata, schemas=schemas) as reader:
            # keys are only needed to drop rows the changelog after the snapshot replaced or deleted
            if len(fold):
                batches = merge_snapshot(reader.iter_keyed_batches(READ_BATCH_ROWS_MAX), fold)
            else:
                batches = reader.iter_batches(READ_BATCH_ROWS_MAX)
            for batch in batches:
                yield from output.add(batch, ChangeType.INSERT, SNAPSHOT)
        completed = True
    except GeneratorExit:
        completed = True  # Spark needs no more rows (e.g. a LIMIT): no retry will come for this snapshot
        raise
    finally:
        if completed:
            runtime.run(lease.release_snapshots([partition.bucket]))


def read_lake_bucket(context: ReadContext, partition: LakeBucketPartition) -> Iterator[pa.RecordBatch]:
    """A tiered bucket's rows in the lake snapshot; for a primary-key table merged with its changelog after
    the lake's offset (keys the changelog touched come from the changelog, deleted ones not at all)."""
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)
        layout = table.layout
        output = _Output(layout, context, partition.bucket)
        lake_rows = lake_format(layout.info).table(layout.info).read_bucket(
            partition.lake_snapshot_id, partition.bucket.bucket, partition.partition_name
        )
        what = f"{partition.bucket} lake snapshot {partition.lake_snapshot_id}"
        if not layout.primary_key:
            for batch in lake_rows:
                yield from output.add(batch, ChangeType.APPEND_ONLY, LAKE)
            yield from output.drain()
            _log_metrics(context, what, output)
            return
        fold = _fold(table, partition.bucket, partition.log_start_offset, partition.log_end_offset)
        if len(fold):
            keys = KeyEncoder(layout)
            lake_rows = merge_snapshot(((keys.keys(batch), batch) for batch in lake_rows), fold)
        for batch in lake_rows:
            yield from output.add(batch, ChangeType.INSERT, LAKE)
        yield from _folded_rows(fold, output)
        yield from output.drain()
        _log_metrics(context, f"{what} + changelog [{partition.log_start_offset}, {partition.log_end_offset})", output)


def read_server_scan(context: ReadContext, partition: ServerScanPartition) -> Iterator[pa.RecordBatch]:
    """A primary-key bucket's rows as its leader holds them now (ScanKv), every row typed ``+I``."""
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)
        output = _Output(table.layout, context, partition.bucket)
        scanner = table.new_scan().create_bucket_batch_scanner(partition.bucket)
        for batch in runtime.iterate(aiter(scanner)):
            yield from output.add(batch, ChangeType.INSERT, SNAPSHOT)
        yield from output.drain()
        _log_metrics(context, f"{partition.bucket} server scan", output)


def read_key_lookup(context: ReadContext, partition: KeyLookupPartition) -> Iterator[pa.RecordBatch]:
    """The rows of the partition's primary keys that exist (point lookups, one request per bucket leader),
    every row typed ``+I``."""
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)
        layout = table.layout
        columns = list(zip(*partition.keys, strict=True)) if partition.keys else [() for _ in layout.primary_key]
        keys = pa.table(
            [pa.array(list(values), layout.arrow_schema.field(name).type) for name, values in zip(layout.primary_key, columns, strict=True)],
            names=list(layout.primary_key),
        )
        lookuper = table.new_lookup().create_lookuper()
        found = runtime.run(lookuper.lookup_arrow(keys))  # type: ignore[union-attr]
        output = _Output(layout, context)
        for batch in found.to_batches(max_chunksize=READ_BATCH_ROWS_MAX):
            yield from output.add(batch, ChangeType.INSERT, LOOKUP)
        yield from output.drain()
        _log_metrics(context, f"lookup of {len(partition.keys)} keys", output)
