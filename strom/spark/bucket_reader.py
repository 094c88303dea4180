"""Executor-side reading of one planned partition into Arrow batches in Spark's layout.

Each function opens its own connection (see :mod:`strom.spark.runtime`), checks that the table is still
the one planned (same id: not dropped and re-created), and yields ``pyarrow.RecordBatch``es of at most
``READ_BATCH_ROWS_MAX`` rows, converted with :func:`strom.spark.type_mapping.to_spark_batch`.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pyarrow as pa

from strom.client import Connection
from strom.client.changelog import ChangelogFold, KeyEncoder, change_type_column, merge_snapshot
from strom.client.log_scanner import LogScanner
from strom.client.snapshots import KvSnapshotReader
from strom.client.table import Table, TableLayout
from strom.errors import KvSnapshotNotExistError
from strom.ids import TableBucket
from strom.lake.format import lake_format
from strom.records.log_batch import ChangeType
from strom.spark import runtime
from strom.spark.errors import FlussConnectorError
from strom.spark.options import TEST_WAIT_FOR_FILE, ConnectionOptions
from strom.spark.partitions import (
    KeyLookupPartition,
    KvStatePartition,
    LakeBucketPartition,
    LogRangePartition,
    ServerScanPartition,
)
from strom.spark.type_mapping import to_spark_batch

READ_BATCH_ROWS_MAX = 65_536
"""Rows per batch handed to Spark: large enough to amortise Spark's per-batch cost, small enough to stream."""
GATE_WAIT_S_MAX = 120.0
GATE_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class ReadContext:
    """What every read task shares: where the table is and the shape Spark expects."""

    connection: ConnectionOptions
    table_id: int
    target: pa.Schema
    """Spark's Arrow schema of the output (the table's columns, then the change-type column if any)."""
    with_change_type: bool
    wait_for_file: str | None = None


class _Output:
    """Converts table-layout batches to Spark's layout, coalescing small ones up to READ_BATCH_ROWS_MAX."""

    def __init__(self, layout: TableLayout, context: ReadContext) -> None:
        self._row_type = layout.row_type
        self._context = context
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0

    def convert(self, batch: pa.RecordBatch, change_types: bytes | ChangeType) -> pa.RecordBatch:
        converted = to_spark_batch(batch, self._row_type, self._context.target)
        if self._context.with_change_type:
            column = change_type_column(change_types, batch.num_rows)
            converted = converted.append_column(self._context.target.field(converted.num_columns), column)
        return converted

    def add(self, batch: pa.RecordBatch, change_types: bytes | ChangeType) -> Iterator[pa.RecordBatch]:
        if batch.num_rows == 0:
            return
        self._pending.append(self.convert(batch, change_types))
        self._pending_rows += batch.num_rows
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


async def _changes(table: Table, bucket: TableBucket, start: int, end: int) -> AsyncIterator[tuple[pa.RecordBatch, bytes | None]]:
    scanner: LogScanner = table.new_scan().create_log_scanner()
    async for scan_batch in scanner.read_range(bucket, start, end):
        yield scan_batch.batch, scan_batch.change_types


def _fold(table: Table, bucket: TableBucket, start: int, end: int) -> ChangelogFold:
    """A primary-key bucket's changelog ``[start, end)`` folded by key."""
    fold = ChangelogFold(table.layout)
    for batch, change_types in runtime.iterate(_changes(table, bucket, start, end)):
        assert change_types is not None, "a primary-key table's log carries change types"
        fold.add(batch, change_types)
    return fold


def read_log_range(context: ReadContext, partition: LogRangePartition) -> Iterator[pa.RecordBatch]:
    """A log table's records, or a primary-key table's change rows, in ``[start, end)``."""
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)
        output = _Output(table.layout, context)
        changes = _changes(table, partition.bucket, partition.start_offset, partition.end_offset)
        for batch, change_types in runtime.iterate(changes):
            yield from output.add(batch, ChangeType.APPEND_ONLY if change_types is None else change_types)
        yield from output.drain()


def read_kv_state(context: ReadContext, partition: KvStatePartition) -> Iterator[pa.RecordBatch]:
    """A primary-key bucket's rows at ``log_end_offset``, every row typed ``+I``.

    The leased snapshot is released once it has been read through, or when Spark stops consuming early;
    after a failure it stays pinned, so a retried task still finds it (the lease expires otherwise).
    """
    _wait_for_gate(context.wait_for_file)
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)
        layout = table.layout
        output = _Output(layout, context)
        fold = _fold(table, partition.bucket, partition.log_start_offset, partition.log_end_offset)
        if partition.snapshot_id is not None:
            yield from _read_snapshot(connection, layout, partition, fold, output)
        for batch in fold.live_rows(READ_BATCH_ROWS_MAX):
            yield from output.add(batch, ChangeType.INSERT)
        yield from output.drain()


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
    lease = admin.create_kv_snapshot_lease(partition.lease_id, partition.lease_duration_ms)
    completed = False
    try:
        with KvSnapshotReader(layout, metadata) as reader:
            # keys are only needed to drop rows the changelog after the snapshot replaced or deleted
            if len(fold):
                batches = merge_snapshot(reader.iter_keyed_batches(READ_BATCH_ROWS_MAX), fold)
            else:
                batches = reader.iter_batches(READ_BATCH_ROWS_MAX)
            for batch in batches:
                yield from output.add(batch, ChangeType.INSERT)
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
        output = _Output(layout, context)
        lake_rows = lake_format(layout.info).table(layout.info).read_bucket(
            partition.lake_snapshot_id, partition.bucket.bucket, partition.partition_name
        )
        if not layout.primary_key:
            for batch in lake_rows:
                yield from output.add(batch, ChangeType.APPEND_ONLY)
            yield from output.drain()
            return
        fold = _fold(table, partition.bucket, partition.log_start_offset, partition.log_end_offset)
        if len(fold):
            keys = KeyEncoder(layout)
            lake_rows = merge_snapshot(((keys.keys(batch), batch) for batch in lake_rows), fold)
        for batch in lake_rows:
            yield from output.add(batch, ChangeType.INSERT)
        for batch in fold.live_rows(READ_BATCH_ROWS_MAX):
            yield from output.add(batch, ChangeType.INSERT)
        yield from output.drain()


def read_server_scan(context: ReadContext, partition: ServerScanPartition) -> Iterator[pa.RecordBatch]:
    """A primary-key bucket's rows as its leader holds them now (ScanKv), every row typed ``+I``."""
    with runtime.connected(context.connection) as connection:
        table = _open_table(connection, context)
        output = _Output(table.layout, context)
        scanner = table.new_scan().create_bucket_batch_scanner(partition.bucket)
        for batch in runtime.iterate(aiter(scanner)):
            yield from output.add(batch, ChangeType.INSERT)
        yield from output.drain()


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
            yield from output.add(batch, ChangeType.INSERT)
        yield from output.drain()
