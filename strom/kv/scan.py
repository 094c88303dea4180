"""Server-side KV scan sessions (Fluss FIP-17): pull a bucket's rows in batches from one RocksDB view.

``ScannerManager`` owns every open session of the tablet server. A session holds a RocksDB iterator
created when the session opened — a point-in-time view that later writes never change — and the log
offset that view covers, captured at the same instant. Limits (per bucket, per server) are enforced at
registration, so concurrent opens can never exceed them; idle sessions expire after ``kv.scanner.ttl``
and their ids are remembered for 2 × ttl so a late continuation learns SCANNER_EXPIRED (restart the scan)
rather than UNKNOWN_SCANNER_ID. ``close_scanners_for_bucket`` must be called when a bucket loses
leadership or its table is dropped: it releases the RocksDB iterators promptly.

Sessions know the connection that last used them. When that connection closes, its sessions are
*orphaned*: still resumable (a client that reconnects continues where it was, and adopts the session),
but the first to go when a bucket or the server is at its session limit — so a client that opens many
sessions and disappears cannot keep everyone else out of a bucket for ``kv.scanner.ttl``.

strom extension — replay: each session keeps its last response. A continuation that repeats the last
``call_seq_id`` (the client lost the response) gets that same response again instead of an error, so a
dropped connection does not kill a long scan. Clients that never repeat a sequence number never notice.

Concurrency: everything runs on the event loop, and a batch is built without suspending, so a close can
never interleave with an iteration. ``in_use`` marks a request that is being served; a close that arrives
then is deferred to that request, which closes the session when it finishes (never a use-after-close).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from strom.clock import Clock
from strom.errors import ScannerExpiredError, TooManyScannersError, UnknownScannerIdError
from strom.ids import TableBucket
from strom.records import kv_batch
from strom.records.kv_batch import VALUE_HEADER

log = logging.getLogger(__name__)

_EMPTY_VALUE_BATCH = VALUE_HEADER.pack(VALUE_HEADER.size - 4, 0, 0)


@dataclass(frozen=True, slots=True)
class ScannerConfig:
    ttl_ms: int
    expiration_interval_ms: int
    scanners_per_bucket_max: int
    scanners_per_server_max: int
    batch_size_bytes_max: int


@dataclass(frozen=True, slots=True)
class ScanBatch:
    """What one ScanKv response carries; ``records`` is a value record batch."""

    records: bytes
    record_count: int
    has_more: bool


@dataclass(slots=True)
class ScanSession:
    """One open scan. Not thread-safe: used on the event loop only."""

    scanner_id: bytes
    bucket: TableBucket
    values: Iterator[bytes] | None
    log_offset: int
    remaining_limit: int  # -1: unlimited
    last_access_ms: int
    owner: int | None = None
    """The connection that last used the session."""
    orphaned: bool = False
    """That connection closed: the session is the first to go when a limit is reached."""
    last_call_seq_id: int = -1
    last_response: object | None = None
    in_use: bool = False
    close_requested: bool = False
    closed: bool = False
    _lookahead: list[bytes] = field(default_factory=list)

    def next_batch(self, batch_size_bytes: int) -> ScanBatch:
        """Pull rows until ``batch_size_bytes`` is reached (at least one row while any remain)."""
        assert not self.closed and self.values is not None
        lookahead = self._lookahead.pop() if self._lookahead else None
        records, count, following = kv_batch.fill_value_batch(
            self.values, lookahead, batch_size_bytes, self.remaining_limit
        )
        if self.remaining_limit > 0:
            self.remaining_limit -= count
            assert self.remaining_limit >= 0
        if following is not None:
            self._lookahead.append(following)
        return ScanBatch(records, count, following is not None)

    def release(self) -> None:
        """Drop the iterator (it pins RocksDB's resources) exactly once."""
        if not self.closed:
            self.closed = True
            self.values = None
            self._lookahead.clear()
            self.last_response = None


class ScannerManager:
    """All scan sessions of one tablet server. Built with its config and clock; owned by the event loop."""

    def __init__(self, config: ScannerConfig, clock: Clock) -> None:
        assert config.ttl_ms > 0 and config.scanners_per_bucket_max > 0 and config.scanners_per_server_max > 0
        self.config = config
        self._clock = clock
        self._sessions: dict[bytes, ScanSession] = {}
        self._per_bucket: dict[TableBucket, int] = {}
        self._recently_expired: dict[bytes, int] = {}

    # ---- opening ----
    def check_capacity(self, bucket: TableBucket) -> None:
        """Raises TooManyScannersError when a new session of ``bucket`` would exceed a limit that evicting
        orphaned sessions (oldest first) cannot bring it under."""
        if self._per_bucket.get(bucket, 0) >= self.config.scanners_per_bucket_max:
            self._evict_orphan(bucket)
        if len(self._sessions) >= self.config.scanners_per_server_max:
            self._evict_orphan(None)
        if len(self._sessions) >= self.config.scanners_per_server_max:
            raise TooManyScannersError(
                f"Cannot create scanner for {bucket}: server-wide limit of {self.config.scanners_per_server_max} reached."
            )
        if self._per_bucket.get(bucket, 0) >= self.config.scanners_per_bucket_max:
            raise TooManyScannersError(
                f"Cannot create scanner for {bucket}: per-bucket limit of {self.config.scanners_per_bucket_max} reached."
            )

    def _evict_orphan(self, bucket: TableBucket | None) -> None:
        orphans = [
            s for s in self._sessions.values()
            if s.orphaned and not s.in_use and (bucket is None or s.bucket == bucket)
        ]
        if orphans:
            victim = min(orphans, key=lambda s: s.last_access_ms)
            log.info("scanner %s of %s evicted: its client disconnected and the limit is reached",
                     victim.scanner_id.decode(), victim.bucket)
            self.close(victim, expired=True)

    def register(
        self, bucket: TableBucket, values: Iterator[bytes], log_offset: int, limit: int | None, owner: int | None = None
    ) -> ScanSession:
        """Register an opened view as a session (limits checked again here, where it counts)."""
        self.check_capacity(bucket)
        session = ScanSession(
            scanner_id=uuid.uuid4().hex.encode(),
            bucket=bucket,
            values=values,
            log_offset=log_offset,
            remaining_limit=limit if limit is not None and limit > 0 else -1,
            last_access_ms=self._clock.now_ms(),
            owner=owner,
        )
        self._sessions[session.scanner_id] = session
        self._per_bucket[bucket] = self._per_bucket.get(bucket, 0) + 1
        assert len(self._sessions) <= self.config.scanners_per_server_max
        return session

    # ---- lookups ----
    def get(self, scanner_id: bytes) -> ScanSession:
        """The open session (does not refresh its idle timer). Raises 66 for an expired id, 67 otherwise."""
        session = self._sessions.get(scanner_id)
        if session is not None:
            return session
        if scanner_id in self._recently_expired:
            raise ScannerExpiredError(
                f"Scanner {scanner_id.decode(errors='replace')} expired due to inactivity or lost its bucket; "
                "restart the scan."
            )
        raise UnknownScannerIdError(f"Unknown scanner ID {scanner_id.decode(errors='replace')}.")

    def mark_accessed(self, session: ScanSession, owner: int | None = None) -> None:
        """Refresh the idle timer and adopt the session for ``owner``; called only once a request passed
        validation."""
        session.last_access_ms = self._clock.now_ms()
        if owner is not None:
            session.owner = owner
            session.orphaned = False

    def on_connection_closed(self, owner: int) -> None:
        """The connection went away: its sessions stay resumable but are evicted first under pressure."""
        for session in self._sessions.values():
            if session.owner == owner:
                session.orphaned = True

    # ---- closing ----
    def close(self, session: ScanSession, *, expired: bool = False) -> None:
        """Remove a session; if a request is using it, that request closes it when done."""
        if self._sessions.get(session.scanner_id) is not session:
            return
        del self._sessions[session.scanner_id]
        remaining = self._per_bucket.get(session.bucket, 1) - 1
        if remaining:
            self._per_bucket[session.bucket] = remaining
        else:
            self._per_bucket.pop(session.bucket, None)
        if expired:
            self._recently_expired[session.scanner_id] = self._clock.now_ms()
        if session.in_use:
            session.close_requested = True
        else:
            session.release()

    def finish_use(self, session: ScanSession) -> None:
        """End of a request: release the session now if a close arrived while it was in use."""
        session.in_use = False
        if session.close_requested or session.scanner_id not in self._sessions:
            session.release()

    def close_scanners_for_bucket(self, bucket: TableBucket) -> int:
        """Close every session of ``bucket`` (leadership lost, table dropped), marking them expired."""
        sessions = [s for s in self._sessions.values() if s.bucket == bucket]
        for session in sessions:
            self.close(session, expired=True)
        return len(sessions)

    def close_scanners_for_table(self, table_id: int, partition_id: int | None = None) -> int:
        buckets = {
            s.bucket for s in self._sessions.values()
            if s.bucket.table_id == table_id and (partition_id is None or s.bucket.partition_id == partition_id)
        }
        return sum(self.close_scanners_for_bucket(bucket) for bucket in buckets)

    def expire_idle(self) -> int:
        """Evict sessions idle longer than the TTL; forget expired ids older than 2 × TTL."""
        now = self._clock.now_ms()
        ttl = self.config.ttl_ms
        for scanner_id in [i for i, t in self._recently_expired.items() if now - t > 2 * ttl]:
            del self._recently_expired[scanner_id]
        idle = [s for s in self._sessions.values() if now - s.last_access_ms > ttl and not s.in_use]
        for session in idle:
            log.info("scanner %s of %s expired after %d ms idle", session.scanner_id.decode(), session.bucket, ttl)
            self.close(session, expired=True)
        return len(idle)

    def shutdown(self) -> None:
        for session in list(self._sessions.values()):
            self.close(session)
        self._recently_expired.clear()

    # ---- introspection ----
    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def bucket_session_count(self, bucket: TableBucket) -> int:
        return self._per_bucket.get(bucket, 0)

    def is_recently_expired(self, scanner_id: bytes) -> bool:
        return scanner_id in self._recently_expired


def empty_value_batch() -> bytes:
    return _EMPTY_VALUE_BATCH


__all__ = ["ScanBatch", "ScanSession", "ScannerConfig", "ScannerManager", "empty_value_batch"]
