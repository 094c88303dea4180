"""The streaming reader: ``spark.readStream.format("fluss")``.

An offset is ``{"table_id": 7, "buckets": {"b0": 42, "p12-b0": 17}}``: per bucket, the log offset up to
which everything has been emitted. ``-1`` (``STATE_PENDING``) means the bucket's initial state has not been
emitted yet (``scan.startup.mode=full`` on a primary-key table): the micro-batch that moves it to offset E
emits the bucket's state at E as ``+I`` rows (snapshot merged with changelog, exactly as a batch read), and
later batches emit the change rows after E. A bucket missing from a start offset (a partition created since)
is read from its log start.

Spark's checkpoint is the source of truth: a restarted query re-plans its last batch from the same start and
end offsets, and a log range or a state at a fixed offset reads the same rows again, so nothing is lost or
repeated. ``commit()`` has nothing to release (Spark calls it one batch late anyway).

``trigger(availableNow=True)``: ``prepareForTriggerAvailableNow`` pins the high watermarks of that moment,
and ``latestOffset`` never goes past them, so the query drains to them in batches of at most
``scan.max-rows-per-trigger`` records and stops.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from strom.client import Connection, OffsetSpec
from strom.client.table import TableLayout
from strom.ids import TableBucket
from strom.spark import planning, runtime
from strom.spark.bucket_reader import ReadContext
from strom.spark.errors import FlussConnectorError
from strom.spark.options import (
    READ_OPTIMIZED,
    SCAN_INCREMENTAL_START,
    SCAN_STARTUP_TIMESTAMP,
    ConnectionOptions,
    ReadOptions,
    StartupMode,
)
from strom.spark.partitions import LogRangePartition, bucket_key, parse_bucket_key
from strom.spark.reader import read_partition

STATE_PENDING = -1

Offsets = dict[TableBucket, int]


def share_budget(pending: dict[TableBucket, int], budget: int) -> dict[TableBucket, int]:
    """Split ``budget`` records over buckets with ``pending`` records, fairly: small backlogs take all they
    have, the rest is divided evenly (water-filling). Returns the records to take per bucket."""
    taken: dict[TableBucket, int] = {}
    remaining = budget
    ordered = sorted(pending.items(), key=lambda item: (item[1], item[0]))
    for position, (bucket, backlog) in enumerate(ordered):
        share = remaining // (len(ordered) - position)
        taken[bucket] = min(backlog, max(share, 0))
        remaining -= taken[bucket]
    assert sum(taken.values()) <= budget
    return taken


class FlussStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver-side offsets and planning; ``read`` runs in the executors like the batch reader's."""

    def __init__(self, connection: ConnectionOptions, options: ReadOptions, context: ReadContext, has_primary_key: bool) -> None:
        if options.time_range is not None and options.startup_mode is not StartupMode.TIMESTAMP:
            raise FlussConnectorError(
                f"option '{SCAN_INCREMENTAL_START.key}' applies to batch reads; a streaming read starts at a time with "
                f"scan.startup.mode=timestamp and '{SCAN_STARTUP_TIMESTAMP.key}'"
            )
        if options.read_optimized:
            raise FlussConnectorError(f"option '{READ_OPTIMIZED.key}' applies to batch reads only")
        self._connection = connection
        self._options = options
        self._context = context
        self._has_primary_key = has_primary_key
        self._target: Offsets | None = None
        """The high watermarks pinned by prepareForTriggerAvailableNow (None: follow the live log)."""

    # ---- offsets ----
    def _encode(self, offsets: Offsets) -> dict[str, Any]:
        return {
            "table_id": self._context.table_id,
            "buckets": {bucket_key(b): offsets[b] for b in sorted(offsets)},
        }

    def _decode(self, offset: dict[str, Any]) -> Offsets:
        table_id = offset.get("table_id")
        if table_id != self._context.table_id:
            raise FlussConnectorError(
                f"the checkpoint's offsets belong to table id {table_id}, but '{self._connection.table}' now has id "
                f"{self._context.table_id} (dropped and re-created?); start the query with a new checkpoint location"
            )
        return {parse_bucket_key(table_id, key): int(value) for key, value in offset["buckets"].items()}

    def _list(self, spec: OffsetSpec, buckets: Sequence[TableBucket] | None = None) -> Offsets:
        async def offsets(connection: Connection) -> Offsets:
            layout = await self._layout(connection)
            admin = connection.get_admin()
            wanted = buckets if buckets is not None else await planning.table_buckets(admin, layout)
            return await planning.bucket_offsets(admin, layout, wanted, spec) if wanted else {}

        return runtime.call(self._connection, offsets)

    def _offsets_at_startup_time(self) -> Offsets:
        """Per bucket the first offset committed at or after ``scan.startup.timestamp``."""
        timestamp_ms = self._options.startup_timestamp_ms
        assert timestamp_ms is not None

        async def offsets(connection: Connection) -> Offsets:
            layout = await self._layout(connection)
            admin = connection.get_admin()
            buckets = await planning.table_buckets(admin, layout)
            return await planning.offsets_at_time(admin, layout, buckets, timestamp_ms, SCAN_STARTUP_TIMESTAMP)

        return runtime.call(self._connection, offsets)

    async def _layout(self, connection: Connection) -> TableLayout:
        table = await connection.get_table(self._connection.table_path)
        if table.layout.info.table_id != self._context.table_id:
            raise FlussConnectorError(
                f"table '{self._connection.table}' was dropped and re-created while the query ran; restart it with a "
                "new checkpoint location"
            )
        return table.layout

    # ---- the DataSourceStreamReader contract ----
    def initialOffset(self) -> dict[str, Any]:
        mode = self._options.startup_mode
        if mode is StartupMode.LATEST:
            return self._encode(self._list(OffsetSpec.latest()))
        if mode is StartupMode.TIMESTAMP:
            return self._encode(self._offsets_at_startup_time())
        if mode is StartupMode.EARLIEST or not self._has_primary_key or self._context.binlog:
            # a $binlog read has no state to start from: full reads the changes from the log start, as in Fluss
            return self._encode(self._list(OffsetSpec.earliest()))
        assert mode is StartupMode.FULL
        latest = self._list(OffsetSpec.latest())
        return self._encode(dict.fromkeys(latest, STATE_PENDING))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._options.max_rows_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._list(OffsetSpec.latest())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = self._decode(start)
        available = dict(self._target) if self._target is not None else self._list(OffsetSpec.latest())
        fresh = [bucket for bucket in available if bucket not in begin]
        if fresh:  # buckets of partitions created since: read from their log start
            begin.update(self._list(OffsetSpec.earliest(), fresh))
        end: Offsets = {}
        pending: dict[TableBucket, int] = {}
        for bucket, position in begin.items():
            high = available.get(bucket)
            if high is None:
                continue  # its partition was dropped
            if position == STATE_PENDING:
                end[bucket] = high  # the whole state at `high`, whatever the limit
            else:
                end[bucket] = max(position, high)
                if high > position:
                    pending[bucket] = high - position
        if isinstance(limit, ReadMaxRows) and pending:
            taken = share_budget(pending, limit.max_rows)
            for bucket, count in taken.items():
                end[bucket] = begin[bucket] + count
        return self._encode(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = self._decode(start)
        finish = self._decode(end)
        missing = [bucket for bucket in finish if bucket not in begin]
        if missing:
            begin.update(self._list(OffsetSpec.earliest(), missing))
        states = {b: e for b, e in finish.items() if begin[b] == STATE_PENDING and e > 0}
        partitions: list[InputPartition] = planning.split_ranges(
            [LogRangePartition(b, begin[b], e) for b, e in sorted(finish.items()) if 0 <= begin[b] < e], self._options
        )
        if states:

            async def plan(connection: Connection) -> list[InputPartition]:
                layout = await self._layout(connection)
                return list(await planning.plan_states_at(connection, layout, self._options, states))

            partitions = runtime.call(self._connection, plan) + partitions
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self._context, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: leases are released by the tasks, and Spark's checkpoint holds the offsets."""
