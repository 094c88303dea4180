"""Writing DataFrames: ``df.write.format("fluss").mode("append").save()`` and streaming writes.

Each Spark task converts its Arrow batches to the table's layout and sends them through strom's writers:
appends for a log table, upserts (and deletes) for a primary-key table. Fluss commits on write, so the
job-level ``commit`` has nothing to do. By default a retried task writes its rows again (at-least-once).
With ``write.exactly-once`` each task writes under a replayable writer identity derived from what Spark
replays it as — a streaming query's id, micro-batch and partition, or a batch write's id and partition —
and the server acknowledges, without writing them again, the batches a previous attempt already wrote
(``strom.client.writer.ReplayableWriterId``). That is exact when a task gets the same rows in the same
order each time it runs (docs/spark.md says when that holds).

With a change-type column (option ``write.change-type-column``, used when the DataFrame has it), ``+I`` and
``+U`` rows upsert, ``-D`` rows delete by primary key and ``-U`` rows are skipped. Rows are applied in their
order within the task: runs of upserts and runs of deletes go out one after another.
"""

from __future__ import annotations

import hashlib
import os
import signal
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from strom.client.table import Table
from strom.client.writer import AppendWriter, ReplayableWriterId, UpsertWriter, WriteResultHandle
from strom.records.log_batch import REPLAYABLE_RUNS_MAX, REPLAYABLE_WRITER_ID_MIN
from strom.spark import runtime
from strom.spark.errors import FlussConnectorError
from strom.spark.options import WRITE_CHANGE_TYPE_COLUMN, ConnectionOptions, WriteOptions
from strom.spark.type_mapping import to_fluss_batch

UPSERT, DELETE, SKIP = 1, 2, 0
_OPERATIONS = {"+I": UPSERT, "+U": UPSERT, "-U": SKIP, "-D": DELETE}
_APPEND_TYPES = ("+I", "+A")


@dataclass(frozen=True)
class FlussCommitMessage(WriterCommitMessage):
    """What one task wrote (Spark collects these on the driver)."""

    rows_written: int
    rows_deleted: int
    rows_skipped: int


PENDING_BATCHES_MAX = 3
"""Requests queued but not yet acknowledged per task. The client pipelines them (the server works on one
while the task converts the next); the bound keeps a task's memory at a few requests' rows."""


class TableSink:
    """Sends a task's rows to one table, in order, in requests of about ``batch_rows`` rows, with up to
    PENDING_BATCHES_MAX unacknowledged.

    Spark hands a writer Arrow batches of ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10 000 by
    default); each request costs the server a changelog sync and its handling, so consecutive upserts (or
    appends) are gathered into larger requests. A run of deletes first sends the upserts gathered before it.

    The client's loop only runs while a call into it is in progress, so waiting for the oldest request once
    the bound is reached is also what keeps the newer ones moving.
    """

    def __init__(
        self, table: Table, change_type_column: str | None, batch_rows: int = 32_768,
        identity: ReplayableWriterId | None = None, crash_after: tuple[int, str] | None = None,
    ) -> None:
        self._crash_after = crash_after
        self._table = table
        self._layout = table.layout
        self._change_type_column = change_type_column
        self._batch_rows = batch_rows
        self._writer: UpsertWriter | AppendWriter = (
            table.new_upsert().create_writer(identity) if self._layout.primary_key
            else table.new_append().create_writer(identity)
        )
        self._pending: deque[WriteResultHandle] = deque()
        self._acknowledged = 0
        self._gathered: list[pa.RecordBatch] = []
        self._gathered_rows = 0
        self.rows_written = 0
        self.rows_deleted = 0
        self.rows_skipped = 0

    async def write(self, batch: pa.RecordBatch) -> None:
        operations = self._operations(batch)
        ignored = (self._change_type_column,) if self._change_type_column else ()
        rows = to_fluss_batch(batch, self._layout, ignored)
        if operations is None:
            await self._send(rows, UPSERT)
            return
        changes = np.flatnonzero(np.diff(operations)) + 1
        for start, stop in zip(np.concatenate(([0], changes)), np.concatenate((changes, [len(operations)])), strict=True):
            await self._send(rows.slice(int(start), int(stop - start)), int(operations[start]))

    def _operations(self, batch: pa.RecordBatch) -> np.ndarray | None:
        """Per row UPSERT/DELETE/SKIP from the change-type column; None when every row is an upsert/append."""
        column = self._change_type_column
        if not column or column not in batch.schema.names:
            return None
        values = batch.column(column)
        table = str(self._layout.info.path)
        if values.null_count:
            raise FlussConnectorError(f"column '{column}' (option '{WRITE_CHANGE_TYPE_COLUMN.key}') has nulls")
        allowed = _APPEND_TYPES if not self._layout.primary_key else tuple(_OPERATIONS)
        valid = pc.is_in(values, value_set=pa.array(allowed))
        if not pc.all(valid).as_py():
            bad = sorted(set(values.filter(pc.invert(valid)).to_pylist()))
            kind = "a log table accepts only appends" if not self._layout.primary_key else "expected +I, +U, -U or -D"
            raise FlussConnectorError(
                f"column '{column}' (option '{WRITE_CHANGE_TYPE_COLUMN.key}') has {bad} for table '{table}': {kind}"
            )
        if not self._layout.primary_key:
            return None
        codes = np.full(len(values), UPSERT, dtype=np.int8)
        codes[pc.equal(values, "-D").to_numpy(zero_copy_only=False)] = DELETE
        codes[pc.equal(values, "-U").to_numpy(zero_copy_only=False)] = SKIP
        return None if (codes == UPSERT).all() else codes

    async def _send(self, rows: pa.RecordBatch, operation: int) -> None:
        if rows.num_rows == 0:
            return
        if operation == SKIP:
            self.rows_skipped += rows.num_rows
            return
        if operation == UPSERT:  # also a log table's append
            self._gathered.append(rows)
            self._gathered_rows += rows.num_rows
            if self._gathered_rows >= self._batch_rows:
                await self._send_gathered()
            return
        await self._send_gathered()  # upserts before these deletes go first
        writer = self._writer
        assert isinstance(writer, UpsertWriter)
        keys = rows.select(self._layout.primary_key).to_pylist()
        self._pending.extend(writer.delete(key) for key in keys)
        await writer.flush()  # buffered deletes go out now: after earlier batches, before later ones
        await self._settle(0)
        self.rows_deleted += rows.num_rows

    async def _send_gathered(self) -> None:
        if not self._gathered:
            return
        rows = self._gathered[0] if len(self._gathered) == 1 else pa.concat_batches(self._gathered)
        self._gathered, self._gathered_rows = [], 0
        writer = self._writer
        if isinstance(writer, AppendWriter):
            self._pending.append(writer.append_arrow_batch(rows))
        else:
            self._pending.append(writer.upsert_arrow_batch(rows))
        self.rows_written += rows.num_rows
        await self._settle(PENDING_BATCHES_MAX)

    async def _settle(self, pending_max: int) -> None:
        """Wait for the oldest writes until at most ``pending_max`` remain; raises the first write error."""
        while len(self._pending) > pending_max:
            await self._pending.popleft().wait()
            self._acknowledged += 1
            if self._crash_after is not None and self._acknowledged >= self._crash_after[0]:
                _crash_once(self._crash_after[1])

    async def finish(self) -> None:
        await self._send_gathered()
        await self._writer.flush()
        await self._settle(0)


def _crash_once(marker: str) -> None:
    """The test aid ``testing.write.crash-once-after-requests``: kill this Python worker, once."""
    try:
        with open(marker, "x"):
            pass
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""Local properties Spark sets on a streaming query's micro-batch jobs (and so on their tasks): the query's id
(kept in its checkpoint, so the same after a restart) and the micro-batch id."""


def task_identity(table_id: int, write_id: str | None) -> ReplayableWriterId:
    """The replayable writer identity of the running Spark task: the same each time Spark runs this task
    again (a retry, or the micro-batch replayed after a restart from the checkpoint).

    A micro-batch's task writes run ``batch id`` of a writer per (query, table, partition); runs advance with
    the micro-batches, and every REPLAYABLE_RUNS_MAX + 1 of them the writer id changes. A batch write's task
    writes run 0 of a writer per (write, table, partition), ``write_id`` being drawn once per write.
    """
    context = TaskContext.get()
    if context is None:
        raise FlussConnectorError("an exactly-once write runs in a Spark task")
    partition = context.partitionId()
    query_id, batch_id = context.getLocalProperty(QUERY_ID_PROPERTY), context.getLocalProperty(BATCH_ID_PROPERTY)
    if query_id is not None and batch_id is not None:
        epoch, run = divmod(int(batch_id), REPLAYABLE_RUNS_MAX + 1)
        key = f"stream/{query_id}/{table_id}/{partition}/{epoch}"
    elif write_id is not None:
        key, run = f"write/{write_id}/{table_id}/{partition}", 0
    else:
        raise FlussConnectorError(
            "an exactly-once streaming write needs the micro-batch's query and batch ids, which Spark did not pass "
            "to this task (continuous processing is not supported)"
        )
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return ReplayableWriterId(REPLAYABLE_WRITER_ID_MIN + digest % REPLAYABLE_WRITER_ID_MIN, run)


def write_task(
    connection: ConnectionOptions, options: WriteOptions, table_id: int, batches: Iterator[pa.RecordBatch],
    write_id: str | None = None,
) -> FlussCommitMessage:
    """One Spark task's write: everything acknowledged by the server before it returns."""
    identity = task_identity(table_id, write_id) if options.exactly_once else None
    with runtime.connected(connection) as client:
        table = runtime.run(client.get_table(connection.table_path))
        if table.layout.info.table_id != table_id:
            raise FlussConnectorError(f"table '{connection.table}' was dropped and re-created since the write was planned")
        sink = TableSink(table, options.change_type_column_for(table.layout.column_names), options.batch_rows, identity,
                         options.crash_after_requests)
        for batch in batches:
            runtime.run(sink.write(batch))
        runtime.run(sink.finish())
        return FlussCommitMessage(sink.rows_written, sink.rows_deleted, sink.rows_skipped)


class _TaskWriter:
    """What batch and streaming writers share: the picklable plan (options and the planned table id only)
    and the per-task write."""

    def __init__(self, connection: ConnectionOptions, options: WriteOptions, table_id: int) -> None:
        self._connection = connection
        self._options = options
        self._table_id = table_id
        self._write_id: str | None = None
        """A batch write's id, drawn on the driver once per write (exactly-once writes' identities derive from it)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FlussCommitMessage:
        return write_task(self._connection, self._options, self._table_id, iterator, self._write_id)


class FlussArrowWriter(_TaskWriter, DataSourceArrowWriter):
    """Batch writes."""

    def __init__(self, connection: ConnectionOptions, options: WriteOptions, table_id: int) -> None:
        super().__init__(connection, options, table_id)
        self._write_id = uuid.uuid4().hex

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: every row was committed by the server when the task wrote it."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: rows acknowledged before the failure stay (running the write again writes them
        again: a new write has a new id)."""


class FlussStreamArrowWriter(_TaskWriter, DataSourceStreamArrowWriter):
    """Streaming writes: each micro-batch's tasks write like a batch job; commit/abort have nothing to do."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: rows are committed by the server as the tasks write them."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a replayed micro-batch writes its rows again, or with ``write.exactly-once`` only
        what its earlier attempt did not."""
