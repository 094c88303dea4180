"""Upsert and append writers.

Rows are buffered and sent in *chunks* (on :meth:`flush`, or when ``batch_rows_max`` rows are waiting).
A chunk is encoded in one pass (Arrow → rows, keys, buckets), split per bucket, and sent as one request
per leader. Chunks go out strictly one after another, so per-bucket order and the idempotent writer's
batch sequences stay in order; retriable per-bucket errors are retried with the same sequence number, and
a DUPLICATE_SEQUENCE answer (the server already has that batch) counts as success.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from strom.client import encoding
from strom.client.table_handle import TableHandle
from strom.errors import (
    DuplicateSequenceError,
    LeaderNotAvailableError,
    OutOfOrderSequenceError,
    RetriableError,
    StorageBackpressureError,
    StromError,
    error_for_code,
)
from strom.ids import TableBucket
from strom.records import batch_statistics, log_batch, row_log
from strom.records.kv_batch import build_kv_batch
from strom.records.log_batch import REPLAYABLE_RUNS_MAX, REPLAYABLE_WRITER_ID_MIN, RUN_SEQUENCE_SPAN
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.table_properties import MERGE_ENGINE

BATCH_ROWS_MAX = 10_000
RETRIES_MAX = 40
"""Retriable failures (a leader that moved, an election under way) are retried for about 35 s."""
RETRY_BACKOFF_MS = 100
CHUNKS_IN_FLIGHT_MAX = 4
OUT_OF_ORDER_RETRIES_MAX = 3
ACKS_ALL = -1
REQUEST_TIMEOUT_MS = 30_000
STORAGE_BACKPRESSURE = StorageBackpressureError.code
AGG_MODE_OVERWRITE = 1
MERGE_MODES = ("default", "overwrite")
"""How an upsert writer's rows meet the stored ones (Fluss's MergeMode): through the table's merge engine,
or replacing them (``overwrite``: PutKv ``agg_mode`` 1, to undo what an earlier write merged)."""


class WriteResultHandle:
    """Await :meth:`wait` to know the row was acknowledged (or to get its error)."""

    def __init__(self, future: asyncio.Future[None], send: Callable[[], None] | None = None) -> None:
        self._future = future
        self._send = send

    async def wait(self) -> None:
        """Waiting on a row still buffered sends the buffer (rows wait for a full batch or ``flush`` otherwise)."""
        if self._send is not None and not self._future.done():
            self._send()
        await asyncio.shield(self._future)


@dataclass(slots=True)
class _BucketBatch:
    bucket: TableBucket
    records: bytes
    futures: list[asyncio.Future[None]] = field(default_factory=list)
    """Per-row handles of the row API; empty for whole-batch writes, which read ``error`` instead."""
    error: StromError | None = None


@dataclass(slots=True)
class _EncodedRows:
    """Encoded rows column by column (a list per field, no tuple per row), so that grouping them by bucket
    and building each bucket's KvRecordBatch costs no Python step per row."""

    partition_ids: list[int | None] | None
    """None: the table is not partitioned."""
    buckets: list[int]
    keys: list[bytes]
    values: list[bytes | None]
    """None deletes."""
    futures: Sequence[asyncio.Future[None] | None] | None
    """Per-row handles of the row API; None for whole-batch writes."""

    @classmethod
    def concat(cls, parts: list[_EncodedRows]) -> _EncodedRows:
        if len(parts) == 1:
            return parts[0]
        partitioned = any(part.partition_ids is not None for part in parts)
        with_futures = any(part.futures is not None for part in parts)
        rows = cls([] if partitioned else None, [], [], [], [] if with_futures else None)
        for part in parts:
            count = len(part.keys)
            if rows.partition_ids is not None:
                rows.partition_ids += part.partition_ids if part.partition_ids is not None else [None] * count
            rows.buckets += part.buckets
            rows.keys += part.keys
            rows.values += part.values
            if rows.futures is not None:
                rows.futures += part.futures if part.futures is not None else [None] * count  # type: ignore[operator]
        return rows

    @classmethod
    def interleave(cls, upserts: _EncodedRows, deletes: _EncodedRows, order: list[bool]) -> _EncodedRows:
        """Rows of both in ``order`` (True: the next upsert, False: the next delete)."""
        positions: list[tuple[_EncodedRows, int]] = []
        taken = [0, 0]
        for is_upsert in order:
            positions.append((upserts, taken[0]) if is_upsert else (deletes, taken[1]))
            taken[0 if is_upsert else 1] += 1
        partitioned = upserts.partition_ids is not None or deletes.partition_ids is not None
        return cls(
            [r.partition_ids[i] if r.partition_ids is not None else None for r, i in positions] if partitioned else None,
            [r.buckets[i] for r, i in positions],
            [r.keys[i] for r, i in positions],
            [r.values[i] for r, i in positions],
            [r.futures[i] if r.futures is not None else None for r, i in positions],
        )

    def by_bucket(
        self,
    ) -> list[tuple[tuple[int | None, int], list[bytes], list[bytes | None], list[asyncio.Future[None]]]]:
        """The rows of each (partition id, bucket id), in their original order within it (a key written
        twice in a batch: the later write wins), with the row API's handles."""
        count = len(self.keys)
        if not count:
            return []
        if self.partition_ids is None:
            codes = np.asarray(self.buckets, dtype=np.int64)
            groups: list[tuple[int | None, int]] | None = None
        else:
            numbered: dict[tuple[int | None, int], int] = {}
            codes = np.fromiter(
                (numbered.setdefault(pair, len(numbered)) for pair in zip(self.partition_ids, self.buckets, strict=True)),
                dtype=np.int64, count=count,
            )
            groups = list(numbered)
        futures = self.futures
        if (codes == codes[0]).all():  # one bucket (common for small and partitioned batches): keep the lists
            group = groups[0] if groups is not None else (None, int(codes[0]))
            return [(group, self.keys, self.values, [f for f in futures or () if f is not None])]
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = [0, *(np.flatnonzero(np.diff(sorted_codes)) + 1).tolist(), count]
        keys = _object_array(self.keys)[order]
        values = _object_array(self.values)[order]
        sorted_futures = _object_array(futures)[order] if futures is not None else None
        result = []
        for start, end in itertools.pairwise(bounds):
            code = int(sorted_codes[start])
            group = groups[code] if groups is not None else (None, code)
            handles = [] if sorted_futures is None else [f for f in sorted_futures[start:end].tolist() if f is not None]
            result.append((group, keys[start:end].tolist(), values[start:end].tolist(), handles))
        return result


def _object_array(items: Sequence[Any]) -> np.ndarray[Any, Any]:
    """A 1-d object array of ``items`` (bytes stay whole: never a 2-d array of characters)."""
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


@dataclass(frozen=True, slots=True)
class ReplayableWriterId:
    """A writer identity chosen by the caller, so that running the same writes again (a retried Spark task,
    a micro-batch replayed after a crash) sends the same batches under the same ids and sequences, and the
    server acknowledges the ones it already has instead of writing them twice (a strom extension: see
    ``strom/log/writer_state.py``). The writes must be the same rows in the same order each time.

    ``writer_id`` must be at least ``REPLAYABLE_WRITER_ID_MIN``; ``run`` numbers the successive runs of one
    writer (micro-batches): each starts its sequences at ``run * RUN_SEQUENCE_SPAN`` in every bucket."""

    writer_id: int
    run: int = 0

    def __post_init__(self) -> None:
        if not REPLAYABLE_WRITER_ID_MIN <= self.writer_id < 1 << 63:
            raise ValueError(f"a replayable writer id must be in [2^62, 2^63), got {self.writer_id}")
        if not 0 <= self.run <= REPLAYABLE_RUNS_MAX:
            raise ValueError(f"run must be in [0, {REPLAYABLE_RUNS_MAX}], got {self.run}")

    @property
    def first_sequence(self) -> int:
        return self.run * RUN_SEQUENCE_SPAN


class _Writer:
    """The chunking, sequencing and retry logic shared by both writers."""

    def __init__(self, table: TableHandle, replayable: ReplayableWriterId | None = None) -> None:
        self._table = table
        self._connection = table.connection
        self._replayable = replayable
        self._writer_id: int | None = replayable.writer_id if replayable is not None else None
        self._sequences: dict[TableBucket, int] = {}
        self._last_chunk: asyncio.Future[None] | None = None
        self._last_sent: asyncio.Event | None = None
        self._chunks: set[asyncio.Future[None]] = set()
        self._in_flight = asyncio.Semaphore(CHUNKS_IN_FLIGHT_MAX)

    async def _ensure_writer_id(self) -> int:
        if self._writer_id is None:
            request = pb.InitWriterRequest()
            path = self._table.table_path
            request.table_path.add(database_name=path.database_name, table_name=path.table_name)
            response = await self._connection.bootstrap_request(ApiKey.INIT_WRITER, request)
            self._writer_id = int(response.writer_id)
        return self._writer_id

    def _forget_writer_id(self) -> None:
        """A batch failed for good, so the server's sequence for this writer stops before it: later batches
        go out under a new writer id from sequence 0 (Fluss's client resets its writer id likewise), or
        every write after one failure would be refused as out of order. A replayable writer keeps its id:
        its caller fails and runs again from the start."""
        if self._replayable is not None:
            return
        self._writer_id = None
        self._sequences.clear()

    def _next_sequence(self, bucket: TableBucket) -> int:
        first = self._replayable.first_sequence if self._replayable is not None else 0
        sequence = self._sequences.get(bucket, first)
        if self._replayable is not None and sequence - first >= RUN_SEQUENCE_SPAN:
            raise ValueError(f"a replayable writer's run may send at most {RUN_SEQUENCE_SPAN} batches per bucket")
        self._sequences[bucket] = sequence + 1
        return sequence

    def _enqueue_chunk(self, build: Any) -> asyncio.Future[None]:
        """Build and send a chunk (``build()`` produces its bucket batches) in order after earlier chunks.

        Chunks are pipelined: a chunk's requests are written to the connection right after the previous
        chunk's (the server handles one connection's requests in arrival order, so per-bucket order and
        batch sequences hold), without waiting for the previous chunk's acknowledgement; at most
        ``CHUNKS_IN_FLIGHT_MAX`` chunks are unacknowledged at once.
        """
        previous_sent = self._last_sent
        previous_done = self._last_chunk
        sent = asyncio.Event()

        async def run() -> None:
            async with self._in_flight:
                try:
                    if previous_sent is not None:
                        await previous_sent.wait()
                    batches: list[_BucketBatch] = await build()
                    await self._send(batches, sent, previous_done)
                finally:
                    sent.set()
                failed = next((batch.error for batch in batches if batch.error is not None), None)
                if failed is not None:
                    raise failed  # so flush() raises it too

        chunk = asyncio.ensure_future(run())
        self._last_sent = sent
        self._last_chunk = chunk
        self._chunks.add(chunk)
        chunk.add_done_callback(_forget_chunk(self._chunks))
        return chunk

    async def _send(
        self, batches: list[_BucketBatch], sent: asyncio.Event, previous_done: asyncio.Future[None] | None
    ) -> None:
        pending = list(batches)
        for attempt in range(RETRIES_MAX + 1):
            await self._connection.write_throttle.wait(batch.bucket for batch in pending)
            by_leader: dict[str, list[_BucketBatch]] = {}
            failures: list[tuple[_BucketBatch, StromError]] = []
            for batch in pending:
                try:
                    address = await self._connection.metadata.leader_address(batch.bucket)
                except StromError as exc:
                    failures.append((batch, exc))
                    continue
                by_leader.setdefault(address, []).append(batch)
            # tasks start in creation order, so this chunk's frames are written before the next chunk's
            tasks = [asyncio.ensure_future(self._send_to_leader(a, g)) for a, g in by_leader.items()]
            sent.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for group, result in zip(by_leader.values(), results, strict=True):
                if isinstance(result, BaseException):
                    error = result if isinstance(result, StromError) else StromError(repr(result))
                    failures.extend((batch, error) for batch in group)
                else:
                    failures.extend(result)
            pending = []
            for batch, error in failures:
                # OUT_OF_ORDER_SEQUENCE here means an earlier chunk's batch for the bucket failed and is
                # being retried: once that chunk is done, sending again succeeds (or fails for real).
                retry = isinstance(error, RetriableError) or (
                    isinstance(error, OutOfOrderSequenceError) and attempt < OUT_OF_ORDER_RETRIES_MAX
                )
                if retry and attempt < RETRIES_MAX:
                    if not isinstance(error, StorageBackpressureError):  # the leader is right, only busy
                        self._connection.metadata.invalidate(batch.bucket)
                    pending.append(batch)
                else:
                    _resolve_batch(batch, error)
                    self._forget_writer_id()
            if not pending:
                return
            if previous_done is not None:
                await asyncio.gather(previous_done, return_exceptions=True)  # earlier batches go first
            await asyncio.sleep(RETRY_BACKOFF_MS / 1000 * min(attempt + 1, 10))

    def _enqueue_batch(self, build_batches: Any, row_count: int) -> WriteResultHandle:
        """Queue a whole-batch write; the handle fails with the first bucket error."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if row_count == 0:
            done.set_result(None)
            return WriteResultHandle(done)
        built: list[_BucketBatch] = []

        async def build() -> list[_BucketBatch]:
            built.extend(await build_batches())
            return built

        def finished(chunk: asyncio.Future[None]) -> None:
            if done.done():
                return
            error = chunk.exception() if not chunk.cancelled() else asyncio.CancelledError()
            error = error or next((b.error for b in built if b.error is not None), None)
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)
                done.exception()  # the caller may never wait on it; don't warn

        self._enqueue_chunk(build).add_done_callback(finished)
        return WriteResultHandle(done)

    async def _send_to_leader(self, address: str, group: list[_BucketBatch]) -> list[tuple[_BucketBatch, StromError]]:
        raise NotImplementedError

    async def _exchange(
        self, address: str, key: ApiKey, request: Any, group: list[_BucketBatch]
    ) -> list[tuple[_BucketBatch, StromError]]:
        """Add one ``buckets_req`` entry per batch, send, and match the per-bucket answers."""
        by_bucket = {}
        for batch in group:
            entry = request.buckets_req.add(bucket_id=batch.bucket.bucket, records=batch.records)
            if batch.bucket.partition_id is not None:
                entry.partition_id = batch.bucket.partition_id
            by_bucket[(batch.bucket.partition_id, batch.bucket.bucket)] = batch
        response = await self._connection.request(address, key, request)
        if key == ApiKey.PUT_KV:
            self._report_pressure(response.buckets_resp)
        return _collect(response.buckets_resp, by_bucket)

    def _report_pressure(self, responses: Any) -> None:
        """Each answered bucket's back-pressure (strom/client/backpressure.py)."""
        throttle = self._connection.write_throttle
        table_id = self._table.layout.info.table_id
        for entry in responses:
            bucket = TableBucket(table_id, entry.bucket_id, entry.partition_id if entry.HasField("partition_id") else None)
            if entry.HasField("error_code") and entry.error_code == STORAGE_BACKPRESSURE:
                throttle.refused(bucket)
            else:
                throttle.report(bucket, entry.pressure if entry.HasField("pressure") else 0.0)

    async def flush(self) -> None:
        """Send everything buffered and wait until all of it is acknowledged; raises the first error."""
        self._flush_buffer()
        chunks = list(self._chunks)
        if chunks:
            await asyncio.gather(*(asyncio.shield(chunk) for chunk in chunks))

    def _flush_buffer(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> _Writer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush()


def _forget_chunk(chunks: set[asyncio.Future[None]]) -> Any:
    def forget(chunk: asyncio.Future[None]) -> None:
        chunks.discard(chunk)
        if not chunk.cancelled():
            chunk.exception()  # its error reaches callers through flush() and the handles; don't warn
    return forget


def _resolve_batch(batch: _BucketBatch, error: StromError | None) -> None:
    batch.error = error
    _resolve(batch.futures, error)


def _resolve(futures: list[asyncio.Future[None]], error: StromError | None) -> None:
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
            future.exception()  # the handle's owner may never await it; don't warn


def _bucket_error(response: Any) -> StromError | None:
    if response.HasField("error_code") and response.error_code != 0:
        error = error_for_code(response.error_code, response.error_message or None)
        return None if isinstance(error, DuplicateSequenceError) else error
    return None


class UpsertWriter(_Writer):
    """Upserts and deletes on a primary-key table; ``partial_update`` writers touch only their columns."""

    def __init__(
        self, table: TableHandle, target_columns: list[int] | None = None, replayable: ReplayableWriterId | None = None,
        merge_mode: str = "default",
    ) -> None:
        super().__init__(table, replayable)
        layout = table.layout
        if not layout.primary_key:
            raise ValueError(f"table {layout.info.path} has no primary key; use an append writer")
        if merge_mode not in MERGE_MODES:
            raise ValueError(f"merge_mode must be one of {', '.join(MERGE_MODES)}, got {merge_mode!r}")
        if merge_mode == "overwrite" and MERGE_ENGINE not in layout.info.properties:
            raise ValueError(f"merge mode overwrite is only for tables with a merge engine; {layout.info.path} has none")
        self._overwrite = merge_mode == "overwrite"
        if target_columns is not None:
            missing = [i for i in layout.key_indexes if i not in target_columns]
            if missing:
                raise ValueError("a partial update must include every primary key column")
        for name in layout.info.schema.auto_increment_columns:  # the server assigns it: never written
            index = layout.column_names.index(name)
            if target_columns is None:
                target_columns = [i for i in range(len(layout.column_names)) if i != index]
            elif index in target_columns:
                raise ValueError(
                    f"column {name!r} of table {layout.info.path} is auto-increment: the server assigns its values, "
                    "so a partial update must leave it out"
                )
        self._targets = target_columns
        self._ops: list[tuple[bool, Mapping[str, Any] | Sequence[Any], asyncio.Future[None]]] = []
        self.batch_rows_max = BATCH_ROWS_MAX

    def upsert(self, row: Mapping[str, Any] | Sequence[Any]) -> WriteResultHandle:
        return self._add(True, row)

    def delete(self, key: Mapping[str, Any] | Sequence[Any]) -> WriteResultHandle:
        """Delete by primary key: a dict of the key columns, or their values in key order."""
        return self._add(False, key)

    def _add(self, is_upsert: bool, row: Mapping[str, Any] | Sequence[Any]) -> WriteResultHandle:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ops.append((is_upsert, row, future))
        if len(self._ops) >= self.batch_rows_max:
            self._flush_buffer()
        return WriteResultHandle(future, self._flush_buffer)

    def upsert_arrow_batch(self, data: pa.RecordBatch | pa.Table) -> WriteResultHandle:
        """Queue every row of an Arrow batch (columns by name) for upsert; returns at once.

        Consecutive batches are pipelined. ``await handle.wait()`` (or :meth:`flush`) for the
        acknowledgement; it raises the first error of the batch. A partial update's batch may leave out
        the columns it does not write.
        """
        layout = self._table.layout
        targets = self._targets
        unwritten = () if targets is None else [n for i, n in enumerate(layout.column_names) if i not in targets]
        batch = encoding.conform(layout, data, unwritten)
        ops: list[tuple[pa.RecordBatch, Sequence[asyncio.Future[None] | None] | None]] = [(batch, None)]
        return self._enqueue_batch(lambda: self._build(ops, []), batch.num_rows)

    async def upsert_batch(self, data: pa.RecordBatch | pa.Table) -> None:
        """Upsert every row of an Arrow batch and wait for the acknowledgement."""
        await self.upsert_arrow_batch(data).wait()

    def _flush_buffer(self) -> None:
        if not self._ops:
            return
        ops = self._ops
        self._ops = []
        upserts = [(row, future) for is_upsert, row, future in ops if is_upsert]
        order = [is_upsert for is_upsert, _row, _future in ops]
        deletes = [(row, future) for is_upsert, row, future in ops if not is_upsert]
        layout = self._table.layout

        async def build() -> list[_BucketBatch]:
            try:
                batch = encoding.to_record_batch(layout, [row for row, _f in upserts]) if upserts else None
                delete_batch = self._key_batch([row for row, _f in deletes]) if deletes else None
            except (ValueError, TypeError, pa.ArrowException) as exc:
                error = StromError(f"cannot encode rows for {layout.info.path}: {exc}")
                _resolve([f for _r, f in upserts] + [f for _r, f in deletes], error)
                return []
            parts: list[tuple[pa.RecordBatch, Sequence[asyncio.Future[None] | None] | None]] = []
            if batch is not None:
                parts.append((batch, [f for _r, f in upserts]))
            delete_parts: list[tuple[pa.RecordBatch, Sequence[asyncio.Future[None] | None] | None]] = []
            if delete_batch is not None:
                delete_parts.append((delete_batch, [f for _r, f in deletes]))
            return await self._build(parts, delete_parts, order)

        self._enqueue_chunk(build)

    def _key_batch(self, keys: list[Mapping[str, Any] | Sequence[Any]]) -> pa.RecordBatch:
        """A full-schema batch holding only the key columns (everything else null)."""
        layout = self._table.layout
        key_names = layout.primary_key
        rows = []
        for key in keys:
            values = dict(key) if isinstance(key, Mapping) else dict(zip(key_names, key, strict=True))
            missing = [name for name in key_names if values.get(name) is None]
            if missing:
                raise ValueError(f"delete needs the primary key columns {missing}")
            rows.append({name: values[name] for name in key_names})
        nullable = pa.schema([f.with_nullable(True) for f in layout.arrow_schema])
        batch = pa.RecordBatch.from_pylist(rows, schema=nullable)
        return batch

    async def _build(
        self,
        upserts: list[tuple[pa.RecordBatch, Sequence[asyncio.Future[None] | None] | None]],
        deletes: list[tuple[pa.RecordBatch, Sequence[asyncio.Future[None] | None] | None]],
        order: list[bool] | None = None,
    ) -> list[_BucketBatch]:
        layout = self._table.layout
        writer_id = await self._ensure_writer_id()
        upsert_rows = [await self._encode(batch, futures, with_values=True) for batch, futures in upserts]
        delete_rows = [await self._encode(batch, futures, with_values=False) for batch, futures in deletes]
        if order is None:
            rows = _EncodedRows.concat(upsert_rows + delete_rows)
        else:  # the row API: upserts and deletes in the order they were made
            rows = _EncodedRows.interleave(_EncodedRows.concat(upsert_rows), _EncodedRows.concat(delete_rows), order)
        batches = []
        schema_id = layout.info.schema_id
        for (partition_id, bucket_id), keys, values, futures in rows.by_bucket():
            bucket = TableBucket(layout.info.table_id, bucket_id, partition_id)
            records = build_kv_batch(
                schema_id, keys, values, writer_id=writer_id, batch_sequence=self._next_sequence(bucket)
            )
            batches.append(_BucketBatch(bucket, records, futures))
        return batches

    async def _encode(
        self, batch: pa.RecordBatch, futures: Sequence[asyncio.Future[None] | None] | None, *, with_values: bool
    ) -> _EncodedRows:
        layout = self._table.layout
        encoded = encoding.encode(layout, batch, with_rows=with_values, with_keys=True)
        partitions = encoding.partition_names(layout, batch)
        partition_ids: list[int | None] | None = None
        if partitions is not None:
            ids: dict[str, int] = {}
            for name in set(partitions):
                ids[name] = await self._connection.metadata.partition_id(layout.info, name)
            partition_ids = [ids[name] for name in partitions]
        assert encoded.keys is not None and encoded.buckets is not None
        values: list[bytes | None] = encoded.rows if with_values else [None] * batch.num_rows  # type: ignore[assignment]
        return _EncodedRows(partition_ids, encoded.buckets, encoded.keys, values, futures)

    async def _send_to_leader(self, address: str, group: list[_BucketBatch]) -> list[tuple[_BucketBatch, StromError]]:
        request = pb.PutKvRequest(acks=ACKS_ALL, table_id=self._table.layout.info.table_id, timeout_ms=REQUEST_TIMEOUT_MS)
        if self._targets is not None:
            request.target_columns.extend(self._targets)
        if self._overwrite:
            request.agg_mode = AGG_MODE_OVERWRITE
        return await self._exchange(address, ApiKey.PUT_KV, request, group)


def _collect(responses: Any, by_bucket: dict[tuple[int | None, int], _BucketBatch]) -> list[tuple[_BucketBatch, StromError]]:
    failures = []
    answered = set()
    for bucket_response in responses:
        partition_id = bucket_response.partition_id if bucket_response.HasField("partition_id") else None
        batch = by_bucket.get((partition_id, bucket_response.bucket_id))
        if batch is None:
            continue
        answered.add((partition_id, bucket_response.bucket_id))
        error = _bucket_error(bucket_response)
        if error is None:
            _resolve_batch(batch, None)
        else:
            failures.append((batch, error))
    for key, batch in by_bucket.items():
        if key not in answered:
            failures.append((batch, LeaderNotAvailableError(f"no response for {batch.bucket}")))
    return failures


class AppendWriter(_Writer):
    """Appends rows to a log table."""

    def __init__(self, table: TableHandle, replayable: ReplayableWriterId | None = None) -> None:
        super().__init__(table, replayable)
        layout = table.layout
        if layout.primary_key:
            raise ValueError(f"table {layout.info.path} has a primary key; use an upsert writer")
        self._rows: list[tuple[Mapping[str, Any] | Sequence[Any], asyncio.Future[None]]] = []
        self._next_bucket = 0
        self.batch_rows_max = BATCH_ROWS_MAX

    def append(self, row: Mapping[str, Any] | Sequence[Any]) -> WriteResultHandle:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rows.append((row, future))
        if len(self._rows) >= self.batch_rows_max:
            self._flush_buffer()
        return WriteResultHandle(future, self._flush_buffer)

    def append_arrow_batch(self, data: pa.RecordBatch | pa.Table) -> WriteResultHandle:
        """Queue an Arrow batch (columns by name) for appending; returns at once (pipelined).
        ``await handle.wait()`` (or :meth:`flush`) for the acknowledgement."""
        batch = encoding.conform(self._table.layout, data)
        return self._enqueue_batch(lambda: self._build(batch, [None] * batch.num_rows), batch.num_rows)

    async def write_arrow_batch(self, data: pa.RecordBatch | pa.Table) -> None:
        """Append an Arrow batch and wait for the acknowledgement."""
        await self.append_arrow_batch(data).wait()

    def _flush_buffer(self) -> None:
        if not self._rows:
            return
        rows = self._rows
        self._rows = []
        layout = self._table.layout

        async def build() -> list[_BucketBatch]:
            futures = [future for _row, future in rows]
            try:
                batch = encoding.to_record_batch(layout, [row for row, _f in rows])
            except (ValueError, TypeError, pa.ArrowException) as exc:
                _resolve(futures, StromError(f"cannot encode rows for {layout.info.path}: {exc}"))
                return []
            return await self._build(batch, futures)

        self._enqueue_chunk(build)

    async def _build(self, batch: pa.RecordBatch, futures: Sequence[asyncio.Future[None] | None]) -> list[_BucketBatch]:
        layout = self._table.layout
        writer_id = await self._ensure_writer_id()
        partitions = encoding.partition_names(layout, batch)
        if layout.bucket_key_indexes:
            buckets = encoding.encode(layout, batch, with_rows=False, with_keys=False).buckets
        else:
            buckets = [self._next_bucket % layout.bucket_count] * batch.num_rows
            self._next_bucket += 1
        partition_ids: list[int | None] = [None] * batch.num_rows
        if partitions is not None:
            ids = {name: await self._connection.metadata.partition_id(layout.info, name) for name in set(partitions)}
            partition_ids = [ids[name] for name in partitions]
        groups: dict[TableBucket, list[int]] = {}
        for index, (partition_id, bucket_id) in enumerate(zip(partition_ids, buckets, strict=True)):
            groups.setdefault(TableBucket(layout.info.table_id, bucket_id, partition_id), []).append(index)
        result = []
        for bucket, indexes in groups.items():
            part = batch if len(indexes) == batch.num_rows else batch.take(pa.array(indexes, pa.int32()))
            if layout.log_format in row_log.ROW_FORMATS:
                records = row_log.encode_row_batch(
                    part,
                    layout.log_row_encoder,
                    schema_id=layout.info.schema_id,
                    writer_id=writer_id,
                    batch_sequence=self._next_sequence(bucket),
                )
            else:
                records = log_batch.build_arrow_batch(
                    part,
                    schema_id=layout.info.schema_id,
                    compression=layout.log_compression,
                    writer_id=writer_id,
                    batch_sequence=self._next_sequence(bucket),
                    statistics=batch_statistics.collect(part, layout.row_type, layout.statistics_columns),
                )
            result.append(_BucketBatch(bucket, records, [f for i in indexes if (f := futures[i]) is not None]))
        return result

    async def _send_to_leader(self, address: str, group: list[_BucketBatch]) -> list[tuple[_BucketBatch, StromError]]:
        request = pb.ProduceLogRequest(acks=ACKS_ALL, table_id=self._table.layout.info.table_id, timeout_ms=REQUEST_TIMEOUT_MS)
        return await self._exchange(address, ApiKey.PRODUCE_LOG, request, group)
