"""The tablet-server role: produce, fetch, put, lookup and list offsets on the buckets it leads.

Write and read failures are reported per bucket (a request-level error makes the official client retry a
write forever), and every bucket of a request gets exactly one response entry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from strom.clock import Clock
from strom.config import LOG_FETCH_WAIT_MAX, LOG_REPLICA_MIN_IN_SYNC_REPLICAS_NUMBER, Configuration
from strom.errors import (
    CorruptRecordError,
    InvalidScanRequestError,
    InvalidTableError,
    InvalidTimestampError,
    KvStorageError,
    NonPrimaryKeyTableError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    PartitionSpecInvalidError,
    StorageBackpressureError,
    StromError,
    code_for_exception,
)
from strom.ids import TableBucket
from strom.kv.kv_tablet import KvTablet, StagedPut
from strom.kv.read_ahead import ReadAhead
from strom.log.log_tablet import EARLIEST_OFFSET, AppendResult, LogTablet, ReadResult
from strom.metadata.table_info import TableInfo
from strom.records import log_batch
from strom.records.batch_filter import BatchFilter
from strom.records.kv_batch import KvBatch, build_value_batch, parse_kv_batches
from strom.remote.s3_credentials import S3TokenProvider
from strom.rpc import lookup_wire
from strom.rpc.messages import pb
from strom.table_properties import HISTORICAL_PARTITION_VALUE
from strom.tablet.arrival_order import ArrivalOrder
from strom.tablet.disk_guard import DiskWriteGuard
from strom.tablet.historical_lookups import HistoricalLookups
from strom.tablet.remote_log_manager import RemoteLogManager
from strom.tablet.replica import Replica, ReplicaManager

log = logging.getLogger(__name__)
_T = TypeVar("_T")

FILTERED_SCAN_READS_MAX = 16
"""How many reads of ``max_fetch_bytes`` a filtered fetch of one bucket scans at most while the batches it
finds are skipped: the server's work per request stays bounded, and ``filtered_end_offset`` tells the
reader where to go on."""

OFFSET_EARLIEST = 0
OFFSET_LATEST = 1
OFFSET_TIMESTAMP = 2
PREFIX_LOOKUP_ROWS_MAX = 100_000
LIMIT_SCAN_BYTES_MAX = 64 << 20
"""LimitScan is answered in one response, inline: its size is bounded (clients read whole small tables
with a large limit, so the row count is not), and a client that does not read its answers is paced by the
connection's write buffer."""


_new_bucket = tuple.__new__
"""``_new_bucket(TableBucket, (table_id, bucket_id, partition_id))``: a bucket without the named tuple's
Python-level ``__new__`` (half the cost, on every lookup)."""


def _bucket(table_id: int, request: Any) -> TableBucket:
    partition_id = request.partition_id if request.HasField("partition_id") else None
    return TableBucket(table_id, request.bucket_id, partition_id)


def _set_error(response: Any, exc: BaseException) -> None:
    code, message = code_for_exception(exc)
    response.error_code = code
    response.error_message = message[:4096]
    if not isinstance(exc, StromError):
        log.error("unexpected failure: %s", message, exc_info=exc)


def _lookup_error_entry(bucket: TableBucket, exc: BaseException) -> bytes:
    """A LookupResponse entry (tag included, as lookup_wire writes them) carrying ``bucket``'s error."""
    response = pb.LookupResponse()
    _set_error(_bucket_entry(response, bucket), exc)
    return response.SerializeToString()  # type: ignore[no-any-return]


def _joined(entries: list[bytes | Awaitable[bytes]]) -> bytes | Awaitable[bytes]:
    """A LookupResponse body of its bucket entries: the bytes now when every entry is, else a coroutine."""
    if all(isinstance(entry, bytes) for entry in entries):
        return b"".join(entries)  # type: ignore[arg-type]
    return _joined_once_read(entries)


async def _joined_once_read(entries: list[bytes | Awaitable[bytes]]) -> bytes:
    return b"".join([entry if isinstance(entry, bytes) else await entry for entry in entries])


async def _both(first: Awaitable[Any] | None, second: Awaitable[Any]) -> None:
    if first is not None:
        await first
    await second


async def _entry_once_read(bucket: TableBucket, found: Awaitable[list[bytes | None]]) -> bytes:
    """One bucket's LookupResponse entry once its read off the loop is done (or its error)."""
    try:
        values = await found
    except Exception as exc:
        return _lookup_error_entry(bucket, exc)
    return lookup_wire.lookup_bucket_entry(bucket.bucket, bucket.partition_id, values)


def _bucket_response(response: Any, table_id: int, bucket_request: Any) -> tuple[TableBucket, Any]:
    """The bucket a per-bucket request names, and its entry in ``response``, partition id echoed."""
    bucket = _bucket(table_id, bucket_request)
    return bucket, _bucket_entry(response, bucket)


def _bucket_entry(response: Any, bucket: TableBucket) -> Any:
    """``bucket``'s new entry in ``response.buckets_resp``, partition id echoed."""
    bucket_response = response.buckets_resp.add(bucket_id=bucket.bucket)
    _echo_partition(bucket_response, bucket)
    return bucket_response


def _echo_partition(response: Any, bucket: TableBucket) -> None:
    if bucket.partition_id is not None:
        response.partition_id = bucket.partition_id


FollowerFetch = Callable[[TableBucket, int, int], bool]
"""A follower's fetch seen by the leader: (bucket, follower id, fetch offset) -> answer at once."""
InSyncCount = Callable[[TableBucket], int]
"""How many replicas of a bucket this server leads are in sync, itself included."""
ACKS_ALL = -1
AGG_MODE_OVERWRITE = 1
"""PutKv ``agg_mode``: bypass the merge engine (Fluss's MergeMode.OVERWRITE; 0 and the reserved 2 are
the default)."""
PUT_KV_VERSION_WITH_BACKPRESSURE = 2
"""The PutKv version from which a client understands StorageBackpressure (72)."""


def _alone(_bucket: TableBucket) -> int:
    return 1  # without replication a bucket's one replica is its whole ISR


class TabletService:
    """Data-path RPCs. Runs on the event loop."""

    def __init__(self, replicas: ReplicaManager, config: Configuration, clock: Clock) -> None:
        self._replicas = replicas
        self._clock = clock
        self._append_order = ArrivalOrder()
        self._fetch_wait_ms_max = config.get_ms(LOG_FETCH_WAIT_MAX)
        self._on_follower_fetch: FollowerFetch | None = None
        self._in_sync: InSyncCount = _alone
        self._min_in_sync = config.get(LOG_REPLICA_MIN_IN_SYNC_REPLICAS_NUMBER)
        self._tokens: S3TokenProvider | None = None
        self._disk: DiskWriteGuard | None = None
        self._historical: HistoricalLookups | None = None
        self._partition_name: Callable[[int], str | None] = lambda _partition_id: None
        self.remote_logs: RemoteLogManager | None = None
        """Set when remote log storage is on (:meth:`read_remote_logs`)."""

    def serve_followers(self, on_follower_fetch: FollowerFetch, in_sync: InSyncCount) -> None:
        """In a cluster, once replication runs (it needs this server's replicas, made with this service):
        ``on_follower_fetch(bucket, follower id, fetch offset)`` records a follower's fetch on the leader and
        says whether the follower must be answered at once (it has not heard of the current high watermark);
        ``in_sync(bucket)`` counts a led bucket's in-sync replicas. Without it a follower's fetch is refused."""
        assert self._on_follower_fetch is None, "replication is attached once"
        self._on_follower_fetch = on_follower_fetch
        self._in_sync = in_sync

    def guard_disk(self, disk: DiskWriteGuard) -> None:
        """Client writes are refused while ``disk`` is locked (followers' replication is not)."""
        self._disk = disk

    def _check_writable(self, bucket: TableBucket, acks: int) -> None:
        """What a client write must pass before it is appended: the data disk, then the in-sync replicas."""
        if self._disk is not None:
            self._disk.ensure_writable()
        self._check_in_sync(bucket, acks)

    def _pressure(self, kv: KvTablet) -> float:
        """The back-pressure signal of a put answered now: the bucket's debt (its tablet as the put staged
        it, not looked up again), or its data disk nearing the write limit, whichever is higher."""
        return max(kv.pressure(), self._disk.pressure() if self._disk is not None else 0.0)

    def set_min_in_sync(self, count: int) -> None:
        """``log.replica.min-in-sync-replicas-number`` changed at run time (AlterClusterConfigs)."""
        self._min_in_sync = count

    def _check_in_sync(self, bucket: TableBucket, acks: int, appended: bool = False) -> None:
        """Fluss's min-ISR rule for a write with acks = all: refused before the append while the bucket has
        fewer in-sync replicas than ``log.replica.min-in-sync-replicas-number``, failed after it if they
        shrank below that before the write was acknowledged."""
        if acks != ACKS_ALL or self._min_in_sync <= 1:
            return
        in_sync = self._in_sync(bucket)
        if in_sync >= self._min_in_sync:
            return
        if appended:
            raise NotEnoughReplicasAfterAppendError(
                f"The size of the current ISR ({in_sync}) of {bucket} fell below the required "
                f"{self._min_in_sync} (log.replica.min-in-sync-replicas-number) before the write was acknowledged."
            )
        raise NotEnoughReplicasError(
            f"The size of the current ISR ({in_sync}) is insufficient to satisfy the required acks {acks} for table "
            f"bucket {bucket}: log.replica.min-in-sync-replicas-number is {self._min_in_sync}."
        )

    def read_remote_logs(self, remote_logs: RemoteLogManager) -> None:
        """Remote log storage is on: reads below the local log start go to its segments."""
        self.remote_logs = remote_logs

    def serve_historical(self, lookups: HistoricalLookups, partition_name: Callable[[int], str | None]) -> None:
        """Answer lookups of expired partitions from the lake (``partition_name(partition id)``: a hosted
        partition's name, to tell the ``__historical__`` one)."""
        self._historical = lookups
        self._partition_name = partition_name

    # ---- log tables ----
    async def produce_log(self, request: Any, _context: object) -> Any:
        """Every bucket's batches are appended in the loop turn the request arrives in (or, while buckets
        open, in its turn: :meth:`_appended_in_order`), then their fsyncs are awaited together."""
        buckets = [_bucket(request.table_id, b) for b in request.buckets_req]
        appended = await self._appended_in_order(buckets, lambda: [
            self._append_bucket(bucket, bucket_request, request.acks)
            for bucket, bucket_request in zip(buckets, request.buckets_req, strict=True)
        ])
        results = await asyncio.gather(*(self._produced(*entry, request.acks) for entry in appended))
        return pb.ProduceLogResponse(buckets_resp=results)

    async def _appended_in_order(self, buckets: list[TableBucket], append: Callable[[], _T],
                                 reading: Awaitable[Any] | None = None) -> _T:
        """``append()`` now, or, while any of ``buckets`` opens or waits for a request that arrived before,
        once the buckets are open and the requests before have appended (:mod:`strom.tablet.arrival_order`);
        ``reading``: the request's reads ahead (:meth:`KvTablet.read_ahead`), awaited in its turn too.
        Unopened buckets open on threads meanwhile, and the event loop serves the server's other clients."""
        opening = self._replicas.open_soon(buckets)
        if reading is not None:
            opening = asyncio.ensure_future(_both(opening, reading))
        if not self._append_order.must_wait(buckets, opening):
            return append()
        async with self._append_order.turn(buckets, opening):
            return append()

    def _append_bucket(
        self, bucket: TableBucket, bucket_request: Any, acks: int
    ) -> tuple[Any, Replica | None, AppendResult | BaseException]:
        """One bucket's answer-to-be, its replica, and its append (or why it was refused)."""
        response = pb.PbProduceLogRespForBucket(bucket_id=bucket.bucket)
        _echo_partition(response, bucket)
        try:
            replica = self._replicas.get(bucket)
            if replica.is_kv:
                raise InvalidTableError(
                    f"Table '{replica.table.path}' has a primary key: write it with PutKv (an upsert writer)."
                )
            data = bytearray(bucket_request.records)
            batches = list(log_batch.iter_batches(data))
            if not batches:
                raise CorruptRecordError("ProduceLog carried no record batch")
            replica.check_produced(data, batches)  # reject batches that do not decode in the table's format
            self._check_writable(bucket, acks)
            return response, replica, replica.log.append(data, batches, self._clock.now_ms())
        except Exception as exc:
            return response, None, exc

    async def _produced(self, response: Any, replica: Replica | None, appended: AppendResult | BaseException,
                        acks: int) -> Any:
        try:
            if isinstance(appended, BaseException):
                raise appended
            assert replica is not None
            await replica.log.wait_durable(appended.next_offset)
            self._check_in_sync(replica.bucket, acks, appended=True)
            response.base_offset = appended.base_offset
        except Exception as exc:
            _set_error(response, exc)
        return response

    async def fetch_log(self, request: Any, _context: object) -> Any:
        wait_ms = min(max(request.max_wait_ms if request.HasField("max_wait_ms") else 0, 0), self._fetch_wait_ms_max)
        min_bytes = request.min_bytes if request.HasField("min_bytes") else 1
        deadline = time.monotonic() + wait_ms / 1000
        if self.remote_logs is not None and request.follower_server_id < 0:
            await self._know_remote_logs(request)
        while True:
            response, total_bytes, events = self._read_fetch(request)
            remaining = deadline - time.monotonic()
            if total_bytes >= min_bytes or remaining <= 0 or not events:
                return response
            waiters = [asyncio.ensure_future(event.wait()) for event in events]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    def _read_fetch(self, request: Any) -> tuple[Any, int, list[asyncio.Event]]:
        response = pb.FetchLogResponse()
        total_bytes = 0
        budget = max(request.max_bytes, 1)
        events: list[asyncio.Event] = []
        follower = request.follower_server_id if request.follower_server_id >= 0 else None
        for table_request in request.tables_req:
            table_response = response.tables_resp.add(table_id=table_request.table_id)
            projection = list(table_request.projected_fields) if table_request.projection_pushdown_enabled else None
            batch_filter: BatchFilter | None = None
            wants_filter = follower is None and table_request.HasField("filter_predicate")
            for bucket_request in table_request.buckets_req:
                bucket = _bucket(table_request.table_id, bucket_request)
                bucket_response = table_response.buckets_resp.add(bucket_id=bucket.bucket)
                _echo_partition(bucket_response, bucket)
                try:
                    replica = self._replicas.get(bucket)
                    if projection is not None:
                        replica.log_decoder().check_projection(str(replica.table.path))
                    log_tablet = replica.log
                    max_bytes = max(1, min(bucket_request.max_fetch_bytes, budget)) if total_bytes else max(
                        1, bucket_request.max_fetch_bytes
                    )
                    moved = False
                    if follower is not None:
                        if self._on_follower_fetch is None:
                            raise NotLeaderOrFollowerError("this server has no followers")
                        # a new high watermark goes back at once: the follower must know what is committed
                        moved = self._on_follower_fetch(bucket, follower, bucket_request.fetch_offset)
                    if follower is None:
                        remote = self._remote_read(bucket, log_tablet, bucket_request.fetch_offset)
                        if remote is not None:  # the client reads these segments from remote storage itself
                            bucket_response.high_watermark = log_tablet.high_watermark
                            bucket_response.log_start_offset = remote.remote_log_segments[0].remote_log_start_offset
                            bucket_response.remote_log_fetch_info.CopyFrom(remote)
                            total_bytes += 1
                            continue
                    if wants_filter:  # built with the table's first hosted bucket, once per table
                        batch_filter = _batch_filter(table_request, replica.table)
                        wants_filter = False
                    if batch_filter is not None:
                        read, filtered_end = _filtered_read(log_tablet, bucket_request.fetch_offset, max_bytes,
                                                            batch_filter)
                        if filtered_end is not None:
                            bucket_response.filtered_end_offset = filtered_end
                            total_bytes += 1  # progress, even with no batch to send
                    else:
                        read = log_tablet.read(bucket_request.fetch_offset, max_bytes,
                                               for_follower=follower is not None)
                    records = read.records
                    if records and follower is None:  # a follower stores the batches as they are
                        records = replica.upgrade_log(records)
                    if records and projection is not None:
                        records = replica.project_records(records, projection)
                    bucket_response.high_watermark = read.high_watermark
                    bucket_response.log_start_offset = self._log_start(bucket, read.log_start_offset)
                    bucket_response.records = records
                    total_bytes += len(records)
                    budget -= len(records)
                    if moved:
                        total_bytes += 1
                    if not records and not bucket_response.HasField("filtered_end_offset"):
                        events.append(log_tablet.high_watermark_event())
                        if follower is not None:
                            events.append(log_tablet.durable_event())
                except Exception as exc:
                    _set_error(bucket_response, exc)
        return response, total_bytes, events

    async def _know_remote_logs(self, request: Any) -> None:
        """Load the remote log state of the buckets this fetch reads below their local logs."""
        assert self.remote_logs is not None
        for table_request in request.tables_req:
            for bucket_request in table_request.buckets_req:
                try:
                    replica = self._replicas.get(_bucket(table_request.table_id, bucket_request))
                    if bucket_request.fetch_offset < replica.log.log_start_offset:
                        await self.remote_logs.ensure_loaded(replica)
                except Exception:  # the read reports the bucket's error
                    continue

    def _remote_read(self, bucket: TableBucket, log_tablet: LogTablet, offset: int) -> Any | None:
        """The remote segments a client reads for ``offset`` when it is below the local log (EARLIEST:
        the remote start), else None."""
        if self.remote_logs is None:
            return None
        if offset == EARLIEST_OFFSET:
            offset = self._log_start(bucket, log_tablet.log_start_offset)
        if offset >= log_tablet.log_start_offset:
            return None
        return self.remote_logs.fetch_info(bucket, offset)

    def _log_start(self, bucket: TableBucket, local_start: int) -> int:
        """Where a client can start reading: the remote log's start when it reaches below the local one."""
        remote = None if self.remote_logs is None else self.remote_logs.start_offset(bucket)
        return local_start if remote is None else min(remote, local_start)

    def list_offsets(self, request: Any, _context: object) -> Any:
        response = pb.ListOffsetsResponse()
        partition_id = request.partition_id if request.HasField("partition_id") else None
        for bucket_id in request.bucket_id:
            bucket_response = response.buckets_resp.add(bucket_id=bucket_id)
            try:
                replica = self._replicas.get(TableBucket(request.table_id, bucket_id, partition_id))
                log_tablet = replica.log
                if request.offset_type == OFFSET_EARLIEST:
                    local_start = log_tablet.log_start_offset
                    client = not request.HasField("follower_server_id") or request.follower_server_id < 0
                    bucket_response.offset = self._log_start(replica.bucket, local_start) if client else local_start
                elif request.offset_type == OFFSET_LATEST:
                    bucket_response.offset = log_tablet.high_watermark
                elif request.offset_type == OFFSET_TIMESTAMP:
                    if not request.HasField("startTimestamp"):
                        raise CorruptRecordError("ListOffsets by timestamp needs startTimestamp")
                    bucket_response.offset = self._offset_for_timestamp(log_tablet, request.startTimestamp)
                else:
                    bucket_response.offset = log_tablet.high_watermark
            except Exception as exc:
                _set_error(bucket_response, exc)
        return response

    def get_table_stats(self, request: Any, _context: object) -> Any:
        """Fluss's GetTableStats: each bucket's row count — a primary-key bucket's live keys (absent with
        a WAL changelog image, which cannot count them), a log bucket's records from its earliest offset
        (remote segments included) to its high watermark. Column statistics (``target_columns``) are
        reserved in Fluss and not collected."""
        buckets = [_bucket(request.table_id, bucket_request) for bucket_request in request.buckets_req]
        return self._replicas.once_open(buckets, lambda: self._table_stats(request))

    def _table_stats(self, request: Any) -> Any:
        response = pb.GetTableStatsResponse()
        for bucket_request in request.buckets_req:
            bucket, bucket_response = _bucket_response(response, request.table_id, bucket_request)
            try:
                replica = self._replicas.get(bucket)
                if replica.is_kv:
                    count = replica.kv.row_count
                    if count >= 0:
                        bucket_response.row_count = count
                    bucket_response.kv_size_bytes = replica.kv.size_bytes
                else:
                    log_tablet = replica.log
                    start = self._log_start(bucket, log_tablet.log_start_offset)
                    bucket_response.row_count = max(0, log_tablet.high_watermark - start)
                bucket_response.log_size_bytes = replica.log.size_bytes
            except Exception as exc:
                _set_error(bucket_response, exc)
        return response

    def _offset_for_timestamp(self, log_tablet: LogTablet, timestamp_ms: int) -> int:
        """The first offset committed at or after ``timestamp_ms`` (the high watermark if none yet).

        Like Fluss, only past timestamps have an answer: appends still to come may be stamped before a
        future timestamp, so answering with today's high watermark would be wrong later. Raises
        InvalidTimestampError (38) for a timestamp ahead of the server's clock.
        """
        now_ms = self._clock.now_ms()
        if timestamp_ms > now_ms:
            raise InvalidTimestampError(
                f"Timestamp {timestamp_ms} is later than the server's current time {now_ms}."
            )
        return log_tablet.offset_for_timestamp(timestamp_ms)

    # ---- primary-key tables ----
    async def put_kv(self, request: Any, context: Any) -> Any:
        """Every bucket's records are appended and its fsync started before any is awaited, in this one
        task: no task per bucket, and the answer goes out on the loop turn after the last fsync ends.
        Buckets to open first are opened on threads meanwhile, the request waiting in arrival order
        (:meth:`_appended_in_order`).

        ``agg_mode`` OVERWRITE (1) bypasses the table's merge engine (Fluss's MergeMode; any other value is
        the default). A bucket over its write budget refuses its batches with StorageBackpressure (72) — to
        a client of PutKv version 2 or later; older clients get KvStorage (11), which they know (Fluss's
        rolling-upgrade rule) — and each answered bucket carries its ``pressure`` when above 0."""
        target_columns = list(request.target_columns)
        overwrite = request.HasField("agg_mode") and request.agg_mode == AGG_MODE_OVERWRITE
        knows_backpressure = getattr(context, "api_version", PUT_KV_VERSION_WITH_BACKPRESSURE) >= \
            PUT_KV_VERSION_WITH_BACKPRESSURE
        buckets = [_bucket(request.table_id, b) for b in request.buckets_req]
        aheads = [self._read_ahead(bucket, b, target_columns, overwrite)
                  for bucket, b in zip(buckets, request.buckets_req, strict=True)]
        readings = [ahead.reading for _batches, ahead in filter(None, aheads) if ahead is not None]
        try:
            staged = await self._appended_in_order(buckets, lambda: [
                self._stage_put(request.table_id, b, target_columns, request.acks, overwrite, knows_backpressure,
                                ahead)
                for b, ahead in zip(request.buckets_req, aheads, strict=True)
            ], asyncio.gather(*readings) if readings else None)
        finally:
            for entry in aheads:
                if entry is not None and entry[1] is not None:
                    entry[1].release()
        return pb.PutKvResponse(buckets_resp=[await self._finish_put(*entry, request.acks) for entry in staged])

    def _read_ahead(self, bucket: TableBucket, bucket_request: Any, target_columns: list[int], overwrite: bool,
                    ) -> tuple[list[KvBatch], ReadAhead | None] | None:
        """A bucket's batch, parsed, and its old values being read (:meth:`KvTablet.read_ahead`; None where
        the put reads none ahead), where the bucket is open and its request holds one batch; None otherwise,
        and wherever something is wrong: :meth:`_stage_put` meets it and answers it."""
        try:
            replica = self._replicas.replica(bucket)  # opens nothing: a bucket still to open reads as it opens
            kv = replica.kv_if_open
            if kv is None or not replica.writable_open or not replica.is_leader:
                return None
            batches = parse_kv_batches(bucket_request.records)
            if len(batches) != 1:
                return None
            ahead = kv.read_ahead(batches[0].keys, batches[0].values, target_columns, overwrite=overwrite)
        except Exception:
            return None
        return batches, ahead

    def _stage_put(
        self, table_id: int, bucket_request: Any, target_columns: list[int], acks: int = ACKS_ALL,
        overwrite: bool = False, knows_backpressure: bool = True,
        ahead: tuple[list[KvBatch], ReadAhead | None] | None = None,
    ) -> tuple[Any, StagedPut, TableBucket, KvTablet | None]:
        """One bucket's answer-to-be, its batches handed to the tablet (which appends them and drives their
        commit and apply), and the tablet (None when the put was refused before it). ``ahead``: the batches
        parsed, and their old values read (if any), before the request's turn (:meth:`_read_ahead`)."""
        bucket = _bucket(table_id, bucket_request)
        response = pb.PbPutKvRespForBucket(bucket_id=bucket.bucket)
        _echo_partition(response, bucket)
        try:
            replica = self._replicas.get(bucket)
            kv = replica.kv
            if target_columns:
                replica.validate_target_columns(target_columns)
            batches = parse_kv_batches(bucket_request.records) if ahead is None else ahead[0]
            if not batches:
                raise CorruptRecordError("PutKv carried no kv record batch")
            self._check_writable(bucket, acks)
            kv.check_write_budget(len(bucket_request.records))
        except StorageBackpressureError as exc:
            refusal = exc if knows_backpressure else KvStorageError(str(exc))
            return response, StagedPut(None, None, refusal), bucket, None
        except Exception as exc:
            return response, StagedPut(None, None, exc), bucket, None
        staged = kv.stage_put(batches, target_columns, self._clock.now_ms(), overwrite=overwrite,
                              ahead=None if ahead is None else ahead[1])
        return response, staged, bucket, kv

    async def _finish_put(
        self, response: Any, staged: StagedPut, bucket: TableBucket, kv: KvTablet | None, acks: int = ACKS_ALL
    ) -> Any:
        try:
            response.log_end_offset = (await staged.finish()).next_offset
            self._check_in_sync(bucket, acks, appended=True)
            pressure = self._pressure(kv) if kv is not None else 0.0
            if pressure > 0:
                response.pressure = pressure
        except Exception as exc:
            _set_error(response, exc)
        return response

    def lookup(self, request: Any, _context: object) -> Any:
        """Answered inline, as the response's bytes (lookup_wire.py), or a coroutine of them where a bucket
        reads RocksDB off the loop (:meth:`KvTablet.lookup_soon`); with ``insert_if_not_exists`` a coroutine
        that first inserts the missing keys."""
        historical = any(b.HasField("original_partition_name") for b in request.buckets_req)
        if request.HasField("insert_if_not_exists") and request.insert_if_not_exists:
            if historical:
                raise InvalidTableError("insert_if_not_exists is not supported for lookups of historical partitions")
            return self._lookup_inserting(request)
        if historical:
            return self._lookup_historical(request)
        wanted = [(_bucket(request.table_id, b), b.keys) for b in request.buckets_req]
        return self._looked_up(wanted)

    def answer_plain_lookup(self, body: bytes) -> bytes | Awaitable[bytes] | None:
        """The response body of a Lookup that only reads, from the request's bytes (the server's short path,
        ``WithBodyPath``), or a coroutine of it where a bucket reads RocksDB off the loop; None for any
        other Lookup, which :meth:`lookup` answers."""
        plain = lookup_wire.plain_lookup_request(body)
        if plain is None:
            return None
        table_id, buckets = plain
        if len(buckets) == 1:  # a single lookup's: one bucket, usually open and led here
            bucket_id, partition_id, keys = buckets[0]
            bucket = _new_bucket(TableBucket, (table_id, bucket_id, partition_id))
            kv = self._replicas.serving_kv(bucket)
            if kv is not None:
                return self._lookup_entry(bucket, keys, kv)
            return self._looked_up([(bucket, keys)])
        return self._looked_up([(_new_bucket(TableBucket, (table_id, bucket_id, partition_id)), keys)
                                for bucket_id, partition_id, keys in buckets])

    def _looked_up(self, wanted: list[tuple[TableBucket, Any]]) -> bytes | Awaitable[bytes]:
        """The entries of each bucket's keys, joined; once its buckets are open where some open on threads
        first (``ReplicaManager.open_soon``), the event loop serving other requests meanwhile."""
        if len(wanted) == 1:  # a single lookup's: its bucket's entry is the body, no list of entries to join
            bucket, keys = wanted[0]
            opening = self._replicas.open_soon((bucket,))
            if opening is None:
                return self._lookup_entry(bucket, keys)  # its bytes, or a task of them
        else:
            opening = self._replicas.open_soon(bucket for bucket, _keys in wanted)
            if opening is None:
                return _joined([self._lookup_entry(bucket, keys) for bucket, keys in wanted])
        return self._looked_up_once_open(opening, wanted)

    async def _looked_up_once_open(self, opening: Awaitable[Any], wanted: list[tuple[TableBucket, Any]]) -> bytes:
        await opening
        entries = _joined([self._lookup_entry(bucket, keys) for bucket, keys in wanted])
        return entries if isinstance(entries, bytes) else await entries

    def _lookup_entry(self, bucket: TableBucket, keys: Any, kv: KvTablet | None = None) -> bytes | Awaitable[bytes]:
        """One bucket's LookupResponse entry: the values of ``keys`` this server leads, or the error; a
        coroutine of it while the bucket reads RocksDB off the loop. ``kv``: the bucket's, already found
        serving (:meth:`ReplicaManager.serving_kv`)."""
        try:
            found = (kv if kv is not None else self._replicas.get(bucket).kv).lookup_soon(keys)
        except Exception as exc:
            return _lookup_error_entry(bucket, exc)
        if isinstance(found, list):
            return lookup_wire.lookup_bucket_entry(bucket.bucket, bucket.partition_id, found)
        return asyncio.ensure_future(_entry_once_read(bucket, found))  # a task: if the answer is cancelled, it still ends

    async def _lookup_inserting(self, request: Any) -> bytes:
        """Look the keys up; insert a key-only row for each missing key (durably, as a PutKv with acks=-1)
        and answer the rows as stored then (with an auto-increment column's new id)."""
        entries = []
        for bucket_request in request.buckets_req:
            bucket = _bucket(request.table_id, bucket_request)
            try:
                kv = self._replicas.get(bucket).kv
                keys = list(bucket_request.keys)
                found = kv.lookup_soon(keys)  # off the loop where many keys miss the row cache
                values = found if isinstance(found, list) else await found
                missing = list(dict.fromkeys(key for key, value in zip(keys, values, strict=True) if value is None))
                if missing:
                    self._check_writable(bucket, ACKS_ALL)
                    result = kv.prepare_insert_missing(missing, self._clock.now_ms())
                    await kv.acknowledgement(result)
                    self._check_in_sync(bucket, ACKS_ALL, appended=True)
                    inserted = dict(zip(missing, kv.lookup(missing), strict=True))
                    values = [inserted[key] if value is None else value for key, value in zip(keys, values, strict=True)]
            except Exception as exc:
                entries.append(_lookup_error_entry(bucket, exc))
            else:
                entries.append(lookup_wire.lookup_bucket_entry(bucket.bucket, bucket.partition_id, values))
        return b"".join(entries)

    async def _lookup_historical(self, request: Any) -> bytes:
        """Lookups some of whose buckets name an expired partition (``original_partition_name``): those are
        read from the lake by the leader of the same bucket of the table's ``__historical__`` partition
        (strom/tablet/historical_lookups.py); the others as usual."""
        entries = []
        for bucket_request in request.buckets_req:
            bucket = _bucket(request.table_id, bucket_request)
            if not bucket_request.HasField("original_partition_name"):
                entry_or_read = self._lookup_entry(bucket, bucket_request.keys)
                entries.append(entry_or_read if isinstance(entry_or_read, bytes) else await entry_or_read)
                continue
            original = bucket_request.original_partition_name
            response = pb.LookupResponse()
            entry = _bucket_entry(response, bucket)
            entry.original_partition_name = original
            try:
                replica = self._replicas.get(bucket)
                if not replica.table.has_primary_key:
                    raise NonPrimaryKeyTableError(f"Table '{replica.table.path}' is not a primary key table.")
                if bucket.partition_id is None or self._partition_name(bucket.partition_id) != HISTORICAL_PARTITION_VALUE:
                    raise PartitionSpecInvalidError(
                        f"{bucket} is not a bucket of table '{replica.table.path}''s {HISTORICAL_PARTITION_VALUE} "
                        "partition: only it answers lookups of expired partitions"
                    )
                if self._historical is None or not replica.table.options.datalake_historical_partition:
                    raise InvalidTableError(
                        f"Table '{replica.table.path}' does not serve historical partitions "
                        "('table.datalake.historical-partition.enabled' is not true)"
                    )
                values = await self._historical.lookup(replica.table, self._replicas.row_format(replica.table),
                                                       original, bucket.bucket, list(bucket_request.keys))
            except Exception as exc:
                _set_error(entry, exc)
            else:
                for value in values:
                    found = entry.values.add()
                    if value is not None:
                        found.values = value
            entries.append(response.SerializeToString())
        return b"".join(entries)

    def prefix_lookup(self, request: Any, _context: object) -> Any:
        buckets = [_bucket(request.table_id, bucket_request) for bucket_request in request.buckets_req]
        return self._replicas.once_open(buckets, lambda: self._prefix_lookup(request))

    def _prefix_lookup(self, request: Any) -> Any:
        response = pb.PrefixLookupResponse()
        for bucket_request in request.buckets_req:
            bucket, bucket_response = _bucket_response(response, request.table_id, bucket_request)
            try:
                matches = self._replicas.get(bucket).kv.prefix_lookup(bucket_request.keys, PREFIX_LOOKUP_ROWS_MAX)
                for values in matches:
                    bucket_response.value_lists.add(values=values)
            except Exception as exc:
                del bucket_response.value_lists[:]
                _set_error(bucket_response, exc)
        return response

    def limit_scan(self, request: Any, _context: object) -> Any:
        bucket = TableBucket(
            request.table_id, request.bucket_id, request.partition_id if request.HasField("partition_id") else None
        )
        return self._replicas.once_open([bucket], lambda: self._limit_scan(request, bucket))

    def _limit_scan(self, request: Any, bucket: TableBucket) -> Any:
        response = pb.LimitScanResponse()
        try:
            if request.limit <= 0:
                raise InvalidScanRequestError(f"LimitScan needs a positive limit, got {request.limit}.")
            replica = self._replicas.get(bucket)
            response.is_log_table = not replica.is_kv
            if replica.is_kv:
                values, cut_short = replica.kv.limit_scan(request.limit, LIMIT_SCAN_BYTES_MAX)
                if cut_short:
                    raise InvalidScanRequestError(
                        f"LimitScan of {request.limit} rows would answer more than {LIMIT_SCAN_BYTES_MAX >> 20} MB; "
                        "read this many rows with a KV scan (ScanKv) instead."
                    )
                response.records = build_value_batch(values)
            else:
                log_tablet = replica.log
                start = max(log_tablet.log_start_offset, log_tablet.high_watermark - request.limit)
                response.records = log_tablet.read_range(start, log_tablet.high_watermark, LIMIT_SCAN_BYTES_MAX)
        except Exception as exc:
            _set_error(response, exc)
        return response

    def serve_file_system_tokens(self, provider: S3TokenProvider | None) -> None:
        """Remote storage on S3: GetFileSystemSecurityToken hands out ``provider``'s credentials."""
        self._tokens = provider

    async def get_file_system_security_token(self, _request: Any, _context: object) -> Any:
        """Fluss's GetFileSystemSecurityToken (1025): credentials for reading remote log segments straight
        from the store (strom/remote/s3_credentials.py); a local root needs none (schema ``file``)."""
        if self._tokens is None:
            return pb.GetFileSystemSecurityTokenResponse(schema="file", token=b"")
        token = await asyncio.to_thread(self._tokens.token)
        response = pb.GetFileSystemSecurityTokenResponse(schema=token.schema, token=token.token)
        if token.expiration_ms is not None:
            response.expiration_time = token.expiration_ms
        for key, value in sorted(token.addition_info.items()):
            response.addition_info.add(key=key, value=value)
        return response


def _batch_filter(table_request: Any, table: TableInfo) -> BatchFilter | None:
    """The request's filter, or None when it cannot apply (then the read is unfiltered, as in Fluss)."""
    try:
        schema_id = table_request.filter_schema_id if table_request.HasField("filter_schema_id") else table.schema_id
        row_type = table.schema_of(schema_id).row_type
        return BatchFilter.from_pb(table_request.filter_predicate, row_type, schema_id)
    except Exception as exc:  # an unknown schema or field, a bad literal: read unfiltered
        log.warning("FetchLog filter on %s cannot apply (%s); reading unfiltered", table.path, exc)
        return None


def _filtered_read(log_tablet: LogTablet, fetch_offset: int, max_bytes: int,
                   batch_filter: BatchFilter) -> tuple[ReadResult, int | None]:
    """Batches from ``fetch_offset`` that may match ``batch_filter``, about ``max_bytes`` of them, and the
    ``filtered_end_offset`` to answer: the offset after the last batch scanned when batches after the last
    one sent were skipped (None when none were)."""
    read = log_tablet.read(fetch_offset, max_bytes)
    kept: list[memoryview] = []
    kept_bytes = 0
    kept_end: int | None = None
    scanned_end: int | None = None
    for _ in range(FILTERED_SCAN_READS_MAX):
        if not read.records:
            break
        matching, end = batch_filter.select(read.records)
        assert end is not None
        if matching:
            kept += matching
            kept_bytes += sum(len(batch) for batch in matching)
            kept_end = log_batch.read_header(matching[-1]).next_offset
        scanned_end = end
        if kept_bytes >= max_bytes or end >= read.high_watermark:
            break
        read = log_tablet.read(end, max_bytes)
    filtered_end = scanned_end if scanned_end is not None and scanned_end != kept_end else None
    return ReadResult(b"".join(kept), read.high_watermark, read.log_start_offset), filtered_end
