"""What one Spark task does with one split: read it from strom, write it into lake files, report back.

A task never commits: it returns the lake writer's result (files written), the log offset the lake will
be at for its bucket once the round commits, and the newest commit timestamp it wrote. A retried task
writes its split again from scratch; the first attempt's files are never committed (orphans).

A log split stops early, after the log batch during which the round's deadline passed (so every split
moves its bucket forward): the result is then *forced*, and the coordinator schedules the table again at
once to tier the rest. Snapshot splits always finish.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from strom.client import Connection
from strom.client.changelog import ChangelogFold
from strom.client.log_scanner import ScanBatch
from strom.client.snapshots import KvSnapshotReader
from strom.client.table import Table
from strom.errors import TableNotExistError
from strom.lake.format import LakeWriter, LakeWriteResult
from strom.lake.formats import lake_format
from strom.metadata.table_info import TableInfo
from strom.tiering.gates import pass_gate
from strom.tiering.splits import SplitKind, TieringSplit

RESULT_SCHEMA = pa.schema(
    [
        ("split_index", pa.int32()),
        ("write_result", pa.binary()),
        ("log_end_offset", pa.int64()),
        ("max_timestamp", pa.int64()),
        ("forced", pa.bool_()),
    ]
)
"""One row per split; ``write_result`` is the pickled LakeWriteResult (null when the split wrote nothing)."""


@dataclass(frozen=True, slots=True)
class RoundContext:
    """What every task of a round shares; pickled into the Spark job's closure."""

    bootstrap_servers: str
    table: TableInfo
    lake_base_snapshot_id: int | None
    """The lake snapshot the round was planned on: primary-key writers rewrite files of this snapshot."""
    deadline_ms: int
    gate_dir: str | None = None
    client_options: tuple[tuple[str, str], ...] = ()
    """``client.*`` options (credentials) for the task's connection."""

    @property
    def client_config(self) -> dict[str, str]:
        return {**dict(self.client_options), "bootstrap.servers": self.bootstrap_servers}


@dataclass(frozen=True, slots=True)
class SplitResult:
    split_index: int
    write_result: LakeWriteResult | None
    log_end_offset: int
    """The offset the lake reaches for this bucket (-1: the split was skipped and moves nothing)."""
    max_timestamp: int
    forced: bool


def split_runner(context: RoundContext, splits: Sequence[TieringSplit]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function ``mapInArrow`` runs: each input row is the index of a split to tier."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                result = asyncio.run(run_split(context, index, splits[index]))
                yield pa.RecordBatch.from_pylist(
                    [{
                        "split_index": result.split_index,
                        "write_result": pickle.dumps(result.write_result) if result.write_result else None,
                        "log_end_offset": result.log_end_offset,
                        "max_timestamp": result.max_timestamp,
                        "forced": result.forced,
                    }],
                    schema=RESULT_SCHEMA,
                )

    return run


def decode_results(table: pa.Table) -> list[SplitResult]:
    return [
        SplitResult(
            row["split_index"],
            pickle.loads(row["write_result"]) if row["write_result"] is not None else None,
            row["log_end_offset"],
            row["max_timestamp"],
            row["forced"],
        )
        for row in table.to_pylist()
    ]


def _now_ms() -> int:
    return int(time.time() * 1000)


async def run_split(context: RoundContext, index: int, split: TieringSplit) -> SplitResult:
    pass_gate(context.gate_dir, "task")
    async with await Connection.create(context.client_config) as connection:
        table = await connection.get_table(context.table.path)
        if table.table_info.table_id != context.table.table_id:
            raise TableNotExistError(
                f"table '{context.table.path}' was dropped and re-created during the round "
                f"(id {context.table.table_id} is now {table.table_info.table_id})"
            )
        lake_table = lake_format(context.table).table(context.table)
        writer = lake_table.writer(split.bucket, split.partition_name, context.lake_base_snapshot_id)
        try:
            if split.kind is SplitKind.SNAPSHOT:
                end, max_timestamp, forced = await _write_snapshot(connection, table, split, writer)
            elif table.layout.primary_key:
                end, max_timestamp, forced = await _write_changelog(table, split, writer, context.deadline_ms)
            else:
                end, max_timestamp, forced = await _write_log(table, split, writer, context.deadline_ms)
            result = writer.complete()
        finally:
            writer.close()
    return SplitResult(index, result, end, max_timestamp, forced)


async def _write_snapshot(connection: Connection, table: Table, split: TieringSplit, writer: LakeWriter) -> tuple[int, int, bool]:
    """A never-tiered primary-key bucket's leased KV snapshot; the lake then stands at its log offset."""
    assert split.snapshot_id is not None
    metadata = await connection.get_admin().get_kv_snapshot_metadata(split.bucket, split.snapshot_id)
    schemas = await connection.get_admin().get_table_schemas(table.layout.info)
    with KvSnapshotReader(table.layout, metadata, schemas=schemas) as reader:
        for batch in reader.iter_batches():
            unknown = pa.array(np.full(batch.num_rows, -1, np.int64))
            writer.append(batch, unknown, unknown)
    return split.stop_offset, -1, False


class _LogRange:
    """Reads a log split's range in offset order, stopping after the batch during which the round's
    deadline passed; then says where it stopped, whether early, and the newest commit timestamp read."""

    def __init__(self, table: Table, split: TieringSplit, deadline_ms: int) -> None:
        self._table = table
        self._split = split
        self._deadline_ms = deadline_ms
        self.end = split.start_offset
        self.max_timestamp = -1
        self.forced = False

    async def batches(self) -> AsyncIterator[ScanBatch]:
        split = self._split
        scanner = self._table.new_scan().create_log_scanner()
        async for scan_batch in scanner.read_range(split.bucket, split.start_offset, split.stop_offset):
            yield scan_batch
            self.end = scan_batch.next_offset
            self.max_timestamp = max(self.max_timestamp, scan_batch.commit_timestamp)
            if self.end < split.stop_offset and _now_ms() >= self._deadline_ms:
                self.forced = True
                return
        self.end = split.stop_offset

    @property
    def outcome(self) -> tuple[int, int, bool]:
        return self.end, self.max_timestamp, self.forced


async def _write_log(table: Table, split: TieringSplit, writer: LakeWriter, deadline_ms: int) -> tuple[int, int, bool]:
    """A log table's records, each once, in offset order."""
    log_range = _LogRange(table, split, deadline_ms)
    async for scan_batch in log_range.batches():
        rows = scan_batch.batch.num_rows
        offsets = pa.array(np.arange(scan_batch.base_offset, scan_batch.base_offset + rows, dtype=np.int64))
        writer.append(scan_batch.batch, offsets, pa.array(np.full(rows, scan_batch.commit_timestamp, np.int64)))
    return log_range.outcome


async def _write_changelog(table: Table, split: TieringSplit, writer: LakeWriter, deadline_ms: int) -> tuple[int, int, bool]:
    """A primary-key bucket's changelog folded by key: the last change wins, deletes stay deletes."""
    fold = ChangelogFold(table.layout)
    log_range = _LogRange(table, split, deadline_ms)
    async for scan_batch in log_range.batches():
        assert scan_batch.change_types is not None, "a primary-key table's log carries change types"
        fold.add(scan_batch.batch, scan_batch.change_types, scan_batch.base_offset, scan_batch.commit_timestamp)
    if len(fold):
        changes = fold.changes()
        writer.delete_keys(changes.touched.select(table.layout.physical_primary_key))
        position = 0
        for batch in changes.rows.to_batches():
            count = batch.num_rows
            writer.append(
                batch, changes.offsets.slice(position, count), changes.timestamps.slice(position, count)
            )
            position += count
    return log_range.outcome
