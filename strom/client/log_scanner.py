"""Reading a table's log (a log table's records, a primary-key table's changelog) as Arrow batches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa

from strom.client.predicates import Predicate
from strom.client.rpc_client import LEADER_RETRY_MS, LEADERSHIP_MOVED
from strom.client.table_handle import TableHandle
from strom.errors import CorruptRecordError, error_for_code
from strom.ids import TableBucket
from strom.records import log_batch
from strom.records.batch_filter import BatchFilter
from strom.records.row_log import LogBatchDecoder
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb

EARLIEST_OFFSET = -2
FETCH_BYTES_MAX = 16 << 20
FETCH_BUCKET_BYTES_MAX = 4 << 20
REMOTE_READ_BYTES = 8 << 20
"""How much of a remote segment one poll reads per bucket (whole batches; at least one)."""


def read_remote_batches(location: str, position: int, max_bytes: int) -> tuple[bytes, int]:
    """Whole log batches of the remote segment file at ``location`` from byte ``position`` on, about
    ``max_bytes`` of them (at least one when there is one); returns them and the position after them.
    Blocks: run in a worker thread."""
    with fsspec.open(location, "rb") as file:
        file.seek(position)
        data = bytearray(file.read(max_bytes))
        end = 0
        while end + log_batch.MAGIC_OFFSET < len(data) and \
                end + log_batch.header_size(data[end + log_batch.MAGIC_OFFSET]) <= len(data):
            size = log_batch.read_header(data, end).size_bytes
            if end + size > len(data):
                if end:
                    break
                data += file.read(end + size - len(data))  # a first batch larger than max_bytes
                if end + size > len(data):
                    raise CorruptRecordError(f"remote log segment {location} ends inside a batch at {position}")
            end += size
    return bytes(data[:end]), position + end


@dataclass(slots=True)
class _RemoteCursor:
    """Where a bucket's read of a remote segment stopped: the next poll goes on from that byte."""

    segment_id: str
    offset: int
    position: int


@dataclass(frozen=True, slots=True)
class ScanBatch:
    """Consecutive records of one bucket: record ``i`` has offset ``base_offset + i``."""

    bucket: TableBucket
    base_offset: int
    change_types: bytes | None
    """One byte per record (see ``log_batch.ChangeType``); None for a log table (all append-only)."""
    batch: pa.RecordBatch
    commit_timestamp: int = -1
    """The server's commit time of the log batch these records came from (epoch ms; -1 unknown)."""

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.batch.num_rows


LEADERSHIP_WAIT_S = 35.0
"""How long a poll goes on without a bucket whose leader cannot be read (an election after a tablet server's
loss waits for its ZooKeeper session to time out) before it raises the bucket's error."""


class LogScanner:
    """Subscribe buckets at offsets, then :meth:`poll`. Not safe for concurrent polls."""

    def __init__(self, table: TableHandle, projection: list[int] | None = None,
                 predicate: Predicate | None = None) -> None:
        """``predicate``: pushed down with each fetch; the server (and this scanner, for remote segments)
        skips the batches whose statistics show no row matches. Returned batches are whole: rows of them
        may not match (:meth:`Predicate.filter`)."""
        self._table = table
        layout = table.layout
        self._projection = projection
        self._predicate = None if predicate is None else predicate.to_pb(layout.row_type)
        self._batch_filter = None if self._predicate is None else BatchFilter.from_pb(
            self._predicate, layout.row_type, layout.info.schema_id)
        self._decoder = layout.log_decoder
        # An INDEXED log cannot be projected on the server (as in Fluss): fetch whole rows and select here.
        self._pushdown = projection if self._decoder.supports_projection else None
        self.schema = (
            layout.arrow_schema if projection is None else pa.schema([layout.arrow_schema.field(i) for i in projection])
        )
        if self._pushdown is not None:
            self._decoder = LogBatchDecoder(layout.log_format, layout.row_type, self.schema)
        self._positions: dict[TableBucket, int] = {}
        self.high_watermarks: dict[TableBucket, int] = {}
        self._moving_since: dict[TableBucket, float] = {}
        """Since when (monotonic) each bucket's leader could not be read from, while its leadership moves."""
        self._remote_cursors: dict[TableBucket, _RemoteCursor] = {}

    def subscribe(self, bucket_id: int, offset: int, partition_id: int | None = None) -> None:
        """Read ``bucket_id`` (of ``partition_id``) from ``offset``; EARLIEST_OFFSET starts at the log start."""
        self.subscribe_bucket(self._table.bucket(bucket_id, partition_id), offset)

    def subscribe_buckets(self, offsets: Mapping[int, int]) -> None:
        for bucket_id, offset in offsets.items():
            self.subscribe(bucket_id, offset)

    def subscribe_bucket(self, bucket: TableBucket, offset: int) -> None:
        count = self._table.layout.bucket_count
        if not 0 <= bucket.bucket < count:
            raise ValueError(f"table {self._table.table_path} has buckets 0 to {count - 1}, not {bucket.bucket}")
        self._positions[bucket] = offset

    def unsubscribe(self, bucket_id: int, partition_id: int | None = None) -> None:
        self._positions.pop(self._table.bucket(bucket_id, partition_id), None)

    def position(self, bucket: TableBucket) -> int:
        return self._positions[bucket]

    async def poll(self, timeout_ms: int) -> list[ScanBatch]:
        """Whatever arrives within ``timeout_ms`` (long-polling the servers); may be empty."""
        if not self._positions:
            return []
        connection = self._table.connection
        by_leader: dict[str, list[TableBucket]] = {}
        moving: dict[TableBucket, Exception] = {}  # leadership moves: fetched again at a later poll
        for bucket in self._positions:
            try:
                by_leader.setdefault(await connection.metadata.leader_address(bucket), []).append(bucket)
            except LEADERSHIP_MOVED as exc:
                moving[bucket] = exc
        responses = await asyncio.gather(
            *(self._fetch(address, buckets, timeout_ms) for address, buckets in by_leader.items()),
            return_exceptions=True,
        )
        batches: list[ScanBatch] = []
        remote: dict[TableBucket, Any] = {}
        for buckets, response in zip(by_leader.values(), responses, strict=True):
            if isinstance(response, LEADERSHIP_MOVED):
                moving.update(dict.fromkeys(buckets, response))
            elif isinstance(response, BaseException):
                raise response
            else:
                batches.extend(self._absorb(response, moving, remote))
        if remote:  # read straight from remote storage, every bucket at once
            read = await asyncio.gather(*(self._read_remote(bucket, info) for bucket, info in remote.items()))
            for found in read:
                batches.extend(found)
        self._follow_leadership(moving)
        if moving and not batches:
            await asyncio.sleep(min(timeout_ms, LEADER_RETRY_MS) / 1000)  # an election is under way
        return batches

    def _follow_leadership(self, moving: dict[TableBucket, Exception]) -> None:
        """Forget the leaders of ``moving`` buckets so the next poll asks the metadata again; raise a
        bucket's error once its leadership has been moving for LEADERSHIP_WAIT_S."""
        now = time.monotonic()
        for bucket in [b for b in self._moving_since if b not in moving]:
            del self._moving_since[bucket]
        for bucket, error in moving.items():
            self._table.connection.metadata.invalidate(bucket)
            if now - self._moving_since.setdefault(bucket, now) > LEADERSHIP_WAIT_S:
                raise error

    async def _fetch(self, address: str, buckets: list[TableBucket], timeout_ms: int) -> Any:
        request = pb.FetchLogRequest(
            follower_server_id=-1, max_bytes=FETCH_BYTES_MAX, max_wait_ms=max(0, timeout_ms), min_bytes=1
        )
        table_request = request.tables_req.add(
            table_id=self._table.layout.info.table_id, projection_pushdown_enabled=self._pushdown is not None
        )
        if self._pushdown is not None:
            table_request.projected_fields.extend(self._pushdown)
        if self._predicate is not None:
            table_request.filter_predicate.CopyFrom(self._predicate)
            table_request.filter_schema_id = self._table.layout.info.schema_id
        for bucket in buckets:
            entry = table_request.buckets_req.add(
                bucket_id=bucket.bucket, fetch_offset=self._positions[bucket], max_fetch_bytes=FETCH_BUCKET_BYTES_MAX
            )
            if bucket.partition_id is not None:
                entry.partition_id = bucket.partition_id
        return await self._table.connection.request(address, ApiKey.FETCH_LOG, request)

    def _absorb(self, response: Any, moving: dict[TableBucket, Exception], remote: dict[TableBucket, Any]) -> list[ScanBatch]:
        """The batches of ``response``; buckets whose replica no longer leads are added to ``moving``, those
        answered with remote segments to read to ``remote``."""
        batches = []
        table_id = self._table.layout.info.table_id
        for table_response in response.tables_resp:
            for bucket_response in table_response.buckets_resp:
                partition_id = bucket_response.partition_id if bucket_response.HasField("partition_id") else None
                bucket = TableBucket(table_id, bucket_response.bucket_id, partition_id)
                if bucket not in self._positions:
                    continue
                if bucket_response.HasField("error_code") and bucket_response.error_code != 0:
                    error = error_for_code(bucket_response.error_code, bucket_response.error_message)
                    if not isinstance(error, LEADERSHIP_MOVED):
                        raise error
                    moving[bucket] = error
                    continue
                if bucket_response.HasField("high_watermark"):
                    self.high_watermarks[bucket] = bucket_response.high_watermark
                if bucket_response.HasField("remote_log_fetch_info"):
                    remote[bucket] = bucket_response.remote_log_fetch_info
                    continue
                batches.extend(self._decode(bucket, bucket_response.records))
                if bucket_response.HasField("filtered_end_offset"):  # the server skipped batches up to there
                    self._positions[bucket] = max(self._positions[bucket], bucket_response.filtered_end_offset)
        return batches

    async def _read_remote(self, bucket: TableBucket, info: Any) -> list[ScanBatch]:
        """Up to REMOTE_READ_BYTES of the remote segments ``info`` lists, from this bucket's position: the
        segment holding it is read from ``first_start_pos`` (or where the last poll stopped in it), then the
        next segments from their start. Whole rows are stored remotely: a projection is applied here."""
        decoded: list[ScanBatch] = []
        budget = REMOTE_READ_BYTES
        for index, segment in enumerate(info.remote_log_segments):
            start = self._positions[bucket]
            cursor = self._remote_cursors.get(bucket)
            if cursor is not None and cursor.segment_id == segment.remote_log_segment_id and cursor.offset == start:
                position = cursor.position
            else:
                position = info.first_start_pos if index == 0 and info.HasField("first_start_pos") else 0
            location = (f"{info.remote_log_tablet_dir}/{segment.remote_log_segment_id}/"
                        f"{segment.remote_log_start_offset:020d}.log")
            try:
                data, after = await asyncio.to_thread(read_remote_batches, location, position, budget)
            except FileNotFoundError:  # expired (TTL) since the server named it: the next poll asks again
                self._remote_cursors.pop(bucket, None)
                break
            decoded.extend(self._decode(bucket, data, remote=True))
            if after < segment.segment_size_in_bytes:
                self._remote_cursors[bucket] = _RemoteCursor(segment.remote_log_segment_id, self._positions[bucket], after)
                break  # the budget is spent: the next poll goes on
            self._remote_cursors.pop(bucket, None)
            budget -= len(data)
            if budget <= 0 or self._positions[bucket] != segment.remote_log_end_offset:
                break
        return decoded

    def _decode(self, bucket: TableBucket, records: bytes, *, remote: bool = False) -> list[ScanBatch]:
        """``remote``: whole rows as stored (the server projects only what it sends itself)."""
        position = self._positions[bucket]
        decoder = self._table.layout.log_decoder if remote else self._decoder
        select_here = self._projection is not None and (remote or self._pushdown is None)
        decoded = []
        for offset_in_buffer, header in log_batch.iter_batches(records):
            if position == EARLIEST_OFFSET:
                position = header.base_offset
            if header.next_offset <= position:
                continue
            if remote and self._batch_filter is not None and not self._batch_filter.may_match(
                    records, offset_in_buffer, header):
                position = header.next_offset  # no row of it matches: skipped, as the server skips them
                continue
            if remote or self._pushdown is None:  # projected columns exist in every later schema at the same place
                self._table.layout.check_schema_id(header.schema_id)
            change_types, batch = decoder.read(records, offset_in_buffer, header)
            if select_here:
                batch = batch.select(self._projection)
            skip = max(0, position - header.base_offset)
            if skip:
                batch = batch.slice(skip)
                change_types = change_types[skip:] if change_types is not None else None
            if batch.num_rows:
                decoded.append(ScanBatch(bucket, header.base_offset + skip, change_types, batch, header.commit_timestamp))
            position = header.next_offset
        self._positions[bucket] = position
        return decoded

    async def read_range(
        self, bucket: TableBucket, start_offset: int, end_offset: int, *, idle_timeout_ms: int = 30_000
    ) -> AsyncIterator[ScanBatch]:
        """Every record of ``bucket`` in ``[start_offset, end_offset)``, trimmed at ``end_offset``.

        Raises RequestTimeoutError-like ``TimeoutError`` if the log stops short of ``end_offset`` for
        ``idle_timeout_ms`` (the range must already be written).
        """
        if start_offset < 0:
            raise ValueError(f"read_range needs a concrete start offset, got {start_offset}")
        if start_offset >= end_offset:
            return
        saved = dict(self._positions)
        self._positions = {bucket: start_offset}
        try:
            deadline = time.monotonic() + idle_timeout_ms / 1000
            while self._positions[bucket] < end_offset:
                polled = await self.poll(500)
                if polled:
                    deadline = time.monotonic() + idle_timeout_ms / 1000
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"{bucket} did not reach offset {end_offset} within {idle_timeout_ms} ms")
                for scan_batch in polled:
                    if scan_batch.base_offset >= end_offset:
                        continue
                    if scan_batch.next_offset > end_offset:
                        keep = end_offset - scan_batch.base_offset
                        change_types = scan_batch.change_types[:keep] if scan_batch.change_types is not None else None
                        scan_batch = ScanBatch(
                            bucket, scan_batch.base_offset, change_types, scan_batch.batch.slice(0, keep),
                            scan_batch.commit_timestamp,
                        )
                    yield scan_batch
        finally:
            self._positions = saved
