"""The ScanKv RPC (api key 1061) on the tablet server, following Fluss's order of checks.

Errors travel in the response body (``error_code``), never as a request-level error. Any error after a
session was found or opened closes it — except strom's replay of the last response (see
``strom.kv.scan``), which also covers the final batch: a finished scan's last response is kept briefly in
a small, byte-bounded cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Any

from strom.clock import Clock
from strom.errors import InvalidScanRequestError, StromError, code_for_exception
from strom.ids import TableBucket
from strom.kv.scan import ScannerManager, ScanSession
from strom.rpc.messages import pb
from strom.tablet.replica import ReplicaManager

log = logging.getLogger(__name__)

FINISHED_CACHE_BYTES_MAX = 64 << 20
FINISHED_CACHE_COUNT_MAX = 256


class ScanKvService:
    """Owned by the event loop; ``start()`` runs the idle-session evictor."""

    def __init__(self, replicas: ReplicaManager, scanners: ScannerManager, clock: Clock) -> None:
        self._replicas = replicas
        self.scanners = scanners
        self._clock = clock
        self._evictor: asyncio.Task[None] | None = None
        # scanner id -> (call_seq_id, final response, size, finished at) for replaying a lost last batch
        self._finished: OrderedDict[bytes, tuple[int, Any, int, int]] = OrderedDict()
        self._finished_bytes = 0

    def start(self) -> None:
        self._evictor = asyncio.ensure_future(self._evict_periodically())

    async def stop(self) -> None:
        if self._evictor is not None:
            self._evictor.cancel()
            await asyncio.gather(self._evictor, return_exceptions=True)
        self.scanners.shutdown()
        self._finished.clear()

    async def _evict_periodically(self) -> None:
        interval_s = self.scanners.config.expiration_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            self.scanners.expire_idle()
            self._prune_finished()

    def _prune_finished(self) -> None:
        horizon = self._clock.now_ms() - 2 * self.scanners.config.ttl_ms
        while self._finished:
            scanner_id, (_seq, _response, size, finished_ms) = next(iter(self._finished.items()))
            over = self._finished_bytes > FINISHED_CACHE_BYTES_MAX or len(self._finished) > FINISHED_CACHE_COUNT_MAX
            if finished_ms >= horizon and not over:
                break
            del self._finished[scanner_id]
            self._finished_bytes -= size

    def _remember_finished(self, scanner_id: bytes, call_seq_id: int, response: Any) -> None:
        size = len(response.records) if response.HasField("records") else 0
        self._finished[scanner_id] = (call_seq_id, response, size, self._clock.now_ms())
        self._finished_bytes += size
        self._prune_finished()

    def scan_kv(self, request: Any, context: Any) -> Any:
        if not request.HasField("bucket_scan_req"):
            return self._scan_answer(request, context)
        bucket = _scanned_bucket(request.bucket_scan_req)
        return self._replicas.once_open([bucket], lambda: self._scan_answer(request, context))

    def _scan_answer(self, request: Any, context: Any) -> Any:
        try:
            return self._scan(request, getattr(context, "connection_id", None))
        except StromError as exc:
            return _error_response(exc, request)
        except Exception as exc:  # a storage failure (RocksDB raises plain exceptions): still a scan error
            log.error("ScanKv failed", exc_info=exc)
            return _error_response(exc, request)

    def _scan(self, request: Any, owner: int | None) -> Any:
        opening = request.HasField("bucket_scan_req")
        continuing = request.HasField("scanner_id")
        closing = request.HasField("close_scanner") and request.close_scanner
        if opening and continuing:
            raise InvalidScanRequestError("A scan request must not set both bucket_scan_req and scanner_id.")
        if opening and closing:
            raise InvalidScanRequestError("close_scanner cannot be combined with bucket_scan_req.")
        if not opening and not continuing:
            raise InvalidScanRequestError("A scan request must set bucket_scan_req (open) or scanner_id.")
        if continuing and closing:
            return self._close(request.scanner_id)
        if not request.HasField("batch_size_bytes") or request.batch_size_bytes <= 0:
            raise InvalidScanRequestError("batch_size_bytes is required and must be positive.")
        batch_size = min(request.batch_size_bytes, self.scanners.config.batch_size_bytes_max)
        if not request.HasField("call_seq_id"):
            if continuing:
                self._close_quietly(request.scanner_id)
            raise InvalidScanRequestError("call_seq_id is required (0 to open, then 1, 2, ...).")
        if opening:
            return self._open(request.bucket_scan_req, request.call_seq_id, batch_size, owner)
        return self._continue(request.scanner_id, request.call_seq_id, batch_size, owner)

    def _open(self, scan_request: Any, call_seq_id: int, batch_size: int, owner: int | None) -> Any:
        if call_seq_id != 0:
            raise InvalidScanRequestError(f"Out-of-order scan request: expected callSeqId=0 but got {call_seq_id}.")
        bucket = _scanned_bucket(scan_request)
        kv = self._replicas.get(bucket).kv  # 21 unknown bucket, 20 log table
        self.scanners.check_capacity(bucket)
        limit = scan_request.limit if scan_request.HasField("limit") else None
        values, log_offset, empty = kv.open_scan()
        if empty:
            return pb.ScanKvResponse(has_more_results=False, log_offset=log_offset)
        session = self.scanners.register(bucket, values, log_offset, limit, owner)
        response = self._serve(session, call_seq_id, batch_size, owner)
        response.log_offset = log_offset
        return response

    def _continue(self, scanner_id: bytes, call_seq_id: int, batch_size: int, owner: int | None) -> Any:
        try:
            session = self.scanners.get(scanner_id)
        except StromError:
            finished = self._finished.get(scanner_id)
            if finished is not None and finished[0] == call_seq_id:
                return finished[1]  # replay of a lost final batch
            raise
        if call_seq_id == session.last_call_seq_id and session.last_response is not None:
            self.scanners.mark_accessed(session, owner)
            return session.last_response  # replay: the client lost this response
        if call_seq_id != session.last_call_seq_id + 1:
            self.scanners.close(session)
            raise InvalidScanRequestError(
                f"Out-of-order scan request: expected callSeqId={session.last_call_seq_id + 1} but got {call_seq_id}."
            )
        return self._serve(session, call_seq_id, batch_size, owner)

    def _serve(self, session: ScanSession, call_seq_id: int, batch_size: int, owner: int | None) -> Any:
        session.in_use = True
        try:
            self.scanners.mark_accessed(session, owner)
            batch = session.next_batch(batch_size)
        except Exception:
            self.scanners.close(session)
            raise
        finally:
            self.scanners.finish_use(session)
        response = pb.ScanKvResponse(
            scanner_id=session.scanner_id, has_more_results=batch.has_more, records=batch.records
        )
        session.last_call_seq_id = call_seq_id
        if batch.has_more:
            session.last_response = response
        else:
            self.scanners.close(session)
            self._remember_finished(session.scanner_id, call_seq_id, response)
        return response

    def _close(self, scanner_id: bytes) -> Any:
        self._close_quietly(scanner_id)
        return pb.ScanKvResponse(scanner_id=scanner_id, has_more_results=False)

    def _close_quietly(self, scanner_id: bytes) -> None:
        with contextlib.suppress(StromError):  # closing an unknown, expired or finished scanner is a success
            self.scanners.close(self.scanners.get(scanner_id))

    def on_connection_closed(self, connection_id: int) -> None:
        self.scanners.on_connection_closed(connection_id)

    def on_buckets_stopped(self, table_id: int, partition_id: int | None) -> None:
        """Leadership lost or table dropped: close the sessions (continuations then get 66)."""
        self.scanners.close_scanners_for_table(table_id, partition_id)


def _error_response(exc: Exception, request: Any) -> Any:
    code, message = code_for_exception(exc)
    response = pb.ScanKvResponse(error_code=code, error_message=message[:4096])
    if request.HasField("scanner_id"):
        response.scanner_id = request.scanner_id
    return response


def _scanned_bucket(scan_request: Any) -> TableBucket:
    """The bucket a ScanKv that opens a scanner names."""
    partition_id = scan_request.partition_id if scan_request.HasField("partition_id") else None
    return TableBucket(scan_request.table_id, scan_request.bucket_id, partition_id)
