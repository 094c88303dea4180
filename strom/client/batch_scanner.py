"""Reading a primary-key table's current rows with server-side scans (ScanKv, Fluss FIP-17).

Each bucket is scanned from one point-in-time view on its leader; ``log_offset`` (exclusive) says which
changelog offsets the view already contains, so a reader can continue with the changelog from there
(:class:`StateThenChanges`) and miss nothing and see nothing twice.

The scanner never loses its place: if a continuation's response is lost to a transport error it sends the
same ``call_seq_id`` again, which strom answers with the same batch (a strom extension; a Fluss server
would reject it, so against Fluss the error surfaces). Opening backs off on TOO_MANY_SCANNERS.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pyarrow as pa

from strom.client.log_scanner import LogScanner
from strom.client.table_handle import TableHandle
from strom.errors import (
    ConnectionFailedError,
    NetworkError,
    RequestTimeoutError,
    StromError,
    TooManyScannersError,
    error_for_code,
)
from strom.ids import TableBucket
from strom.records import row_arrow
from strom.records.kv_batch import parse_value_batch
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb

BATCH_SIZE_BYTES = 4 << 20
OPEN_RETRIES = 3
OPEN_BACKOFF_MS = 100
CONTINUE_RETRIES = 5
SCHEMA_ID_SIZE_BYTES = 2
DEFAULT_PARALLELISM = 4


def _scan_error(response: Any) -> StromError | None:
    if response.HasField("error_code") and response.error_code != 0:
        return error_for_code(response.error_code, response.error_message or None)
    return None


class BucketBatchScanner:
    """Scan one bucket: ``async for batch in scanner`` yields ``pyarrow.RecordBatch``es."""

    def __init__(
        self,
        table: TableHandle,
        bucket: TableBucket,
        *,
        projection: Sequence[int] | None = None,
        limit: int | None = None,
        batch_size_bytes: int = BATCH_SIZE_BYTES,
    ) -> None:
        if not table.layout.primary_key:
            raise ValueError(f"table {table.table_path} has no primary key: read it with a log scanner")
        self._table = table
        self.bucket = bucket
        self._projection = list(projection) if projection is not None else None
        self._limit = limit
        self._batch_size_bytes = max(1, batch_size_bytes)
        self._scanner_id: bytes | None = None
        self._address: str | None = None
        """The server holding the scan session."""
        self._call_seq_id = 0
        self._done = False
        self._prefetch: asyncio.Future[Any] | None = None
        self.log_offset: int | None = None
        """Exclusive changelog offset the scanned view covers; set once the first response arrived."""
        self.rows_read = 0

    @property
    def schema(self) -> pa.Schema:
        schema = self._table.layout.arrow_schema
        if self._projection is None:
            return schema
        return pa.schema([schema.field(i) for i in self._projection])

    async def _request(self, request: Any) -> Any:
        """A continuation goes to the server that opened the session, wherever the bucket's leadership is
        now: if that server no longer leads, it closed the session and answers SCANNER_EXPIRED."""
        assert self._address is not None
        response = await self._table.connection.request(self._address, ApiKey.SCAN_KV, request)
        error = _scan_error(response)
        if error is not None:
            raise error
        return response

    async def _open(self) -> Any:
        request = pb.ScanKvRequest(call_seq_id=0, batch_size_bytes=self._batch_size_bytes)
        scan = request.bucket_scan_req
        scan.table_id = self.bucket.table_id
        scan.bucket_id = self.bucket.bucket
        if self.bucket.partition_id is not None:
            scan.partition_id = self.bucket.partition_id
        if self._limit is not None:
            scan.limit = self._limit
        connection = self._table.connection
        for attempt in range(OPEN_RETRIES + 1):
            try:  # opening may go to whichever replica leads now, again while leadership moves
                response, self._address = await connection.read_from_leader(
                    self.bucket, ApiKey.SCAN_KV, request, _scan_error
                )
                return response
            except TooManyScannersError:
                if attempt == OPEN_RETRIES:
                    raise
                await asyncio.sleep(OPEN_BACKOFF_MS * (2**attempt) / 1000)
        raise AssertionError("unreachable")

    async def _continue(self) -> Any:
        assert self._scanner_id is not None
        request = pb.ScanKvRequest(
            scanner_id=self._scanner_id, call_seq_id=self._call_seq_id, batch_size_bytes=self._batch_size_bytes
        )
        for attempt in range(CONTINUE_RETRIES + 1):
            try:
                return await self._request(request)
            except (ConnectionFailedError, NetworkError, RequestTimeoutError):
                if attempt == CONTINUE_RETRIES:
                    raise
                await asyncio.sleep(OPEN_BACKOFF_MS * (attempt + 1) / 1000)  # then ask for the same batch again
        raise AssertionError("unreachable")

    def _decode(self, records: bytes) -> pa.RecordBatch:
        layout = self._table.layout
        values = layout.present_rows(parse_value_batch(records))  # every value holds a row: checked in C
        batch = row_arrow.rows_to_record_batch(
            values, layout.row_decoder, layout.arrow_schema, offset=SCHEMA_ID_SIZE_BYTES
        )
        return batch if self._projection is None else batch.select(self._projection)

    async def next_batch(self) -> pa.RecordBatch | None:
        """The next batch of rows, or None once the bucket is exhausted.

        The next continuation is sent as soon as a response arrives, before this batch is decoded, so
        the server reads the next batch while the client decodes this one (one request in flight).
        """
        while not self._done:
            if self._prefetch is not None:
                prefetch, self._prefetch = self._prefetch, None
                response = await prefetch
            elif self._scanner_id is None and self.log_offset is None:
                response = await self._open()
                self.log_offset = response.log_offset
            else:
                response = await self._continue()
            if response.HasField("scanner_id"):
                self._scanner_id = response.scanner_id
            self._call_seq_id += 1
            self._done = not response.has_more_results
            if not self._done:
                self._prefetch = asyncio.ensure_future(self._continue())
            if response.HasField("records") and response.records:
                batch = self._decode(response.records)
                if batch.num_rows:
                    self.rows_read += batch.num_rows
                    return batch
        return None

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[pa.RecordBatch]:
        try:
            while (batch := await self.next_batch()) is not None:
                yield batch
        finally:
            await self.close()

    async def close(self) -> None:
        """Release the server session early (not needed after the scan is exhausted). Idempotent."""
        if self._prefetch is not None:
            prefetch, self._prefetch = self._prefetch, None
            await asyncio.gather(prefetch, return_exceptions=True)  # its batch is dropped with the session
        if self._done or self._scanner_id is None:
            self._done = True
            return
        self._done = True
        with contextlib.suppress(StromError):  # if this fails, the server's idle timeout reclaims it
            await self._request(pb.ScanKvRequest(scanner_id=self._scanner_id, close_scanner=True))


class BatchScanner:
    """Scan every bucket of a primary-key table, ``parallelism`` buckets at a time.

    ``async for batch in scanner`` yields batches as they arrive (bucket order is not defined). ``limit``
    caps the total number of rows. ``log_offsets`` holds each scanned bucket's view offset.
    """

    def __init__(
        self,
        table: TableHandle,
        buckets: Sequence[TableBucket],
        *,
        projection: Sequence[int] | None = None,
        limit: int | None = None,
        parallelism: int = DEFAULT_PARALLELISM,
        batch_size_bytes: int = BATCH_SIZE_BYTES,
    ) -> None:
        self._table = table
        self._buckets = list(buckets)
        self._projection = projection
        self._limit = limit
        self._parallelism = max(1, parallelism)
        self._batch_size_bytes = batch_size_bytes
        self.log_offsets: dict[TableBucket, int] = {}

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[pa.RecordBatch]:
        queue: asyncio.Queue[pa.RecordBatch | BaseException | None] = asyncio.Queue(maxsize=self._parallelism * 2)
        pending = list(reversed(self._buckets))
        remaining = [self._limit if self._limit is not None else -1]

        async def worker() -> None:
            while pending and remaining[0] != 0:
                bucket = pending.pop()
                scanner = BucketBatchScanner(
                    self._table, bucket, projection=self._projection,
                    limit=remaining[0] if remaining[0] > 0 else None, batch_size_bytes=self._batch_size_bytes,
                )
                try:
                    while remaining[0] != 0 and (batch := await scanner.next_batch()) is not None:
                        if self._limit is not None:
                            if remaining[0] <= 0:
                                break  # another bucket filled the limit while this one was fetching
                            batch = batch.slice(0, min(batch.num_rows, remaining[0]))
                            remaining[0] -= batch.num_rows
                        await queue.put(batch)
                finally:
                    await scanner.close()
                    if scanner.log_offset is not None:
                        self.log_offsets[bucket] = scanner.log_offset

        async def run_workers() -> None:
            try:
                await asyncio.gather(*(worker() for _ in range(min(self._parallelism, len(self._buckets)) or 1)))
                await queue.put(None)
            except BaseException as exc:
                await queue.put(exc)

        runner = asyncio.ensure_future(run_workers())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    async def to_arrow(self) -> pa.Table:
        batches = [batch async for batch in self]
        schema = self._table.layout.arrow_schema
        if self._projection is not None:
            schema = pa.schema([schema.field(i) for i in self._projection])
        return pa.Table.from_batches(batches, schema=schema)


class StateThenChanges:
    """A bucket's current rows, then every change after them: the scan's ``log_offset`` is exactly where
    the changelog continues, so nothing is missed or repeated."""

    def __init__(self, table: TableHandle, bucket: TableBucket) -> None:
        self._table = table
        self.bucket = bucket
        self._scanner = BucketBatchScanner(table, bucket)

    async def state(self) -> AsyncIterator[pa.RecordBatch]:
        async for batch in self._scanner:
            yield batch

    @property
    def log_offset(self) -> int:
        if self._scanner.log_offset is None:
            raise RuntimeError("read state() first: the changelog continues from the scan's log offset")
        return self._scanner.log_offset

    def changes(self) -> LogScanner:
        """A log scanner subscribed to the bucket's changelog at the scan's log offset."""
        scanner = LogScanner(self._table)
        scanner.subscribe_bucket(self.bucket, self.log_offset)
        return scanner
