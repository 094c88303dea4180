"""The append-only log of one bucket: offsets, segments, durability and the high watermark.

Appends are stamped with consecutive offsets and a commit timestamp, written to the active segment, and
become visible (the high watermark moves) once durable: after an fsync when ``log.flush.interval-messages``
is 1 (strom's default), otherwise after every N appends. Concurrent appenders share one fsync (group
commit). Readers never see data above the high watermark, so nothing they read can vanish in a crash.

All methods run on the server's event loop; only the fsync runs in a worker thread, on descriptors that
stay open until the tablet closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from strom.errors import (
    DuplicateSequenceError,
    LogOffsetOutOfRangeError,
    LogStorageError,
    RequestTimeoutError,
)
from strom.fsync import fsync_path
from strom.log.segment import FILE_SUFFIX, LogSegment
from strom.log.writer_state import WriterStateManager
from strom.records import log_batch

log = logging.getLogger(__name__)

EARLIEST_OFFSET = -2  # FetchLog's "from the log start"
WRITER_SNAPSHOT_FILE = "writer-state.json"
"""The writer state saved before segments are deleted (see :func:`_open_segments`)."""
HIGH_WATERMARK_FILE = "high-watermark"
"""A replicated bucket's last recorded high watermark (absent for a bucket without followers)."""


@dataclass(slots=True)
class _Waiter:
    offset: int
    future: asyncio.Future[None]
    visible: bool
    """Waits for the high watermark (acknowledgement), else only for the fsync."""


class DivergedLogError(LogStorageError):
    """A follower's log holds, from ``base_offset`` on, batches its leader does not have."""

    def __init__(self, base_offset: int, message: str) -> None:
        super().__init__(message)
        self.base_offset = base_offset


def _read_checkpoint(directory: Path, default: int) -> int:
    try:
        return int((directory / HIGH_WATERMARK_FILE).read_text())
    except (OSError, ValueError):
        return default


def _open_segments(directory: Path, paths: Sequence[Path], expiration_ms: int) -> tuple[list[LogSegment], WriterStateManager]:
    """Open the segment files in order and rebuild the writer state: from the saved state (what deleted
    segments held) plus the batches at or after the offset it covers, or, when the saved state does not fit
    the log (its batches were truncated away), from the batches alone."""
    try:
        saved, covered = WriterStateManager.from_bytes((directory / WRITER_SNAPSHOT_FILE).read_bytes(), expiration_ms)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: ignoring an unreadable writer state: %s", directory, exc)
    else:
        segments = _replay_segments(paths, saved, covered)
        start = segments[0].base_offset if segments else 0
        end = segments[-1].next_offset if segments else 0
        if start <= covered <= end:
            return segments, saved
        log.warning("%s: the saved writer state covers offsets up to %d, the log holds [%d, %d): rebuilt "
                    "from the log alone", directory, covered, start, end)
        for segment in segments:
            segment.close()
    writer_state = WriterStateManager(expiration_ms)
    return _replay_segments(paths, writer_state, -1), writer_state


def _replay_segments(paths: Sequence[Path], writer_state: WriterStateManager, covered: int) -> list[LogSegment]:
    """Open the segments, feeding ``writer_state`` every batch at or after ``covered`` (older ones are in it)."""

    def observe(header: log_batch.LogBatchHeader) -> None:
        if header.base_offset >= covered:
            writer_state.observe_header(header)

    segments: list[LogSegment] = []
    try:
        for index, path in enumerate(paths):
            segments.append(LogSegment.open(path, is_last=index == len(paths) - 1, on_batch=observe))
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_size_bytes_max: int
    flush_interval_messages: int
    writer_expiration_ms: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    next_offset: int
    """Exclusive: the offset the next append will get."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: bytes
    high_watermark: int
    log_start_offset: int


class LogTablet:
    """One bucket's log. Not thread-safe: owned by the event loop (a thread may read committed batches while
    the loop holds its segments: :meth:`hold_segments`)."""

    def __init__(
        self, directory: Path, config: LogConfig, segments: list[LogSegment], writer_state: WriterStateManager
    ) -> None:
        assert segments, "a log always has an active segment"
        self.directory = directory
        self._config = config
        self._segments = segments
        self.writer_state = writer_state
        self._unflushed_segments: list[LogSegment] = []
        self._appends_since_flush = 0
        self._durable_end = self.log_end_offset
        """Everything below is fsynced (what a leader may send its followers)."""
        self._high_watermark = min(self.log_end_offset, _read_checkpoint(directory, self.log_end_offset))
        self._checkpointed_high_watermark: int | None = None
        """What this object last wrote to the record (None: nothing yet, so the first checkpoint writes)."""
        self._replication_limit: int | None = None
        """With followers: what every in-sync replica has; the high watermark never passes it."""
        self._flush_target: int | None = None
        """The end offset the running fsync covers; None while no fsync runs."""
        self._flush_scheduled = False
        self._flush_waiters: list[_Waiter] = []
        self._next_waiters: list[_Waiter] = []
        """Waiting for appends made after the running fsync started: the next fsync starts as it ends."""
        self._visible_waiters: list[_Waiter] = []
        """Flushed, waiting for the high watermark (the followers) to pass their offset."""
        self._hw_advanced = asyncio.Event()
        self._hw_listeners: list[Callable[[], None]] = []
        self._durable_advanced = asyncio.Event()
        self._last_commit_timestamp = max(s.last_timestamp for s in segments)
        self._failed: Exception | None = None
        self._closed = False
        self._writers_expired_at_ms = self._last_commit_timestamp
        self._segment_holds = 0
        self._segment_holds_lock = threading.Lock()

    @classmethod
    def open(cls, directory: Path, config: LogConfig) -> LogTablet:
        """Open (creating if needed) the log in ``directory``, repairing a torn tail and rebuilding state."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = sorted(directory.glob(f"*{FILE_SUFFIX}"))
        segments: list[LogSegment] = []
        try:
            segments, writer_state = _open_segments(directory, paths, config.writer_expiration_ms)
            if not segments:
                segments.append(LogSegment.create(directory, 0))
            # The previous process may have died between a write and its fsync: make what is on disk
            # durable before the high watermark exposes it (earlier segments were fsynced when they rolled).
            segments[-1].fsync()
            for previous, segment in itertools.pairwise(segments):
                if segment.base_offset != previous.next_offset:
                    raise LogStorageError(
                        f"log {directory} has a gap: {previous.path.name} ends at offset {previous.next_offset} "
                        f"but the next segment starts at {segment.base_offset}"
                    )
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        return cls(directory, config, segments, writer_state)

    # ---- offsets ----
    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def durable_end(self) -> int:
        """Every offset below is fsynced here (a follower's fetch position, a leader's limit for followers)."""
        return self._durable_end

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self._segments)

    # ---- appending ----
    def append(
        self, data: bytearray, batches: Sequence[tuple[int, log_batch.LogBatchHeader]], now_ms: int
    ) -> AppendResult:
        """Append validated batches (positions and headers from :func:`log_batch.iter_batches`).

        Raises DuplicateSequenceError / OutOfOrderSequenceError / RequestTimeoutError (nothing is written)
        when the writer state rejects the batches (:meth:`check_writers`). The batches are stamped in place
        with offsets and a timestamp.
        """
        self._check_usable()
        assert batches
        self._expire_writers(now_ms)
        writers = [(header.writer_id, header.batch_sequence) for _position, header in batches]
        self.check_writers(writers, self._high_watermark)
        commit_timestamp = max(now_ms, self._last_commit_timestamp)
        base_offset = self.log_end_offset
        next_offset = base_offset
        index_entries = []
        for position, header in batches:
            log_batch.stamp(data, position, next_offset, commit_timestamp)
            batch_next = next_offset + header.last_offset_delta + 1
            index_entries.append((position, next_offset, batch_next, commit_timestamp))
            next_offset = batch_next
        self._write(data, index_entries)
        for (_position, header), (_p, batch_base, batch_next, _t) in zip(batches, index_entries, strict=True):
            self.writer_state.observe(header.writer_id, header.batch_sequence, batch_base, batch_next, commit_timestamp)
        self._last_commit_timestamp = commit_timestamp
        if self._config.flush_interval_messages > 1 and self._appends_since_flush < self._config.flush_interval_messages:
            self._advance_durable_end(next_offset)
        return AppendResult(base_offset, next_offset)

    def append_replicated(self, data: bytes, now_ms: int) -> AppendResult:
        """Append batches fetched from the leader as they are (offsets and timestamps kept); they must start
        at this log's end.

        Raises:
            DivergedLogError: they start before this log's end, inside a batch this log holds differently
                (it kept batches its new leader never had): the follower truncates to their start and fetches
                again.
            LogStorageError: they start after this log's end.
        """
        self._check_usable()
        batches = list(log_batch.iter_batches(data))
        if not batches:
            return AppendResult(self.log_end_offset, self.log_end_offset)
        if batches[0][1].base_offset < self.log_end_offset:
            raise DivergedLogError(
                batches[0][1].base_offset,
                f"{self.directory}: replicated batches start at {batches[0][1].base_offset}, the log ends at "
                f"{self.log_end_offset}",
            )
        if batches[0][1].base_offset != self.log_end_offset:
            raise LogStorageError(
                f"{self.directory}: replicated batches start at {batches[0][1].base_offset}, the log ends at "
                f"{self.log_end_offset}"
            )
        self._expire_writers(now_ms)
        self._write(data, [(position, h.base_offset, h.next_offset, h.commit_timestamp) for position, h in batches])
        for _position, header in batches:
            self.writer_state.observe_header(header)
            self._last_commit_timestamp = max(self._last_commit_timestamp, header.commit_timestamp)
        return AppendResult(batches[0][1].base_offset, self.log_end_offset)

    async def append_from_leader(self, data: bytes, now_ms: int) -> int:
        """Take batches a follower fetched from its leader, which may overlap the end of this log; returns the
        offset up to which this log now holds the leader's batches byte for byte (the end of the last one).

        A fetched batch this log already holds at the same offset, byte for byte, is kept as it is; at the
        first one it holds differently (or not at a batch boundary) the log is truncated there and the
        leader's batches are appended from that point. This is the only way a follower gives up batches:
        at the first offset where its log and its leader's differ. An acknowledged batch is on every in-sync
        replica, the leader included, byte for byte (followers store batches as they are), so it is never
        where the two differ (docs/cluster.md, "No acknowledged write is lost").
        """
        batches = list(log_batch.iter_batches(data))
        if not batches:
            return self.log_end_offset
        matched = 0
        for position, header in batches:
            if header.base_offset >= self.log_end_offset:
                break
            if self._batch_at(header.base_offset) != data[position : position + header.size_bytes]:
                log.warning("%s: the leader's batch at offset %d differs from this log's; truncating there",
                            self.directory, header.base_offset)
                await self.truncate_to(header.base_offset)
                break
            matched += 1
        if matched < len(batches):
            position, header = batches[matched]
            if header.base_offset != self.log_end_offset:
                return self.log_end_offset  # truncated below it (inside a batch of ours): fetch again from here
            self.append_replicated(data[position:], now_ms)
        return batches[-1][1].next_offset

    def _batch_at(self, base_offset: int) -> bytes | None:
        for segment in self._segments_from(base_offset):
            return segment.batch_at(base_offset)
        return None

    def _write(self, data: bytes | bytearray, index_entries: list[tuple[int, int, int, int]]) -> None:
        """Write whole batches to the active segment (rolling it when full); the next fsync covers them."""
        try:
            segment = self._segment_for_append(len(data))
            segment.append(data, index_entries)
        except OSError as exc:
            self._fail(exc)
            raise LogStorageError(f"cannot append to {self.directory}: {exc}") from exc
        if segment not in self._unflushed_segments:
            self._unflushed_segments.append(segment)
        self._appends_since_flush += 1

    async def truncate_to(self, offset: int) -> None:
        """Drop what lies at or after ``offset`` (a follower giving up batches its leader does not have: only
        where docs/cluster.md, "No acknowledged write is lost", allows); the writer state is rebuilt from what
        remains."""
        if offset >= self.log_end_offset:
            return
        self._check_usable()
        while self.flush_in_flight:  # the running fsync holds the segments it covers
            with contextlib.suppress(LogStorageError):
                await self.flushed(self.log_end_offset)
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            self._segments.pop().delete()
        self._segments[-1].truncate_to(max(offset, self._segments[-1].base_offset))
        self._unflushed_segments = [segment for segment in self._unflushed_segments if segment in self._segments]
        for segment in self._segments:
            segment.close()
        paths = [segment.path for segment in self._segments]
        self._segments, self.writer_state = _open_segments(self.directory, paths, self._config.writer_expiration_ms)
        self._unflushed_segments = []
        end = self.log_end_offset
        self._durable_end = min(self._durable_end, end)
        self._high_watermark = min(self._high_watermark, end)
        log.warning("%s: truncated to offset %d", self.directory, end)

    async def start_at(self, offset: int) -> None:
        """Make the log start at ``offset``: a follower whose leader's log now starts there (what lay before
        was copied to remote storage and deleted) cannot compare or fetch what lies below. Batches this log
        holds from ``offset`` on are kept (rewritten; held in memory meanwhile, a rare path) when a batch of
        its starts there, so nothing it may be the last in-sync holder of is given up; otherwise (its log
        ends before, or its batches straddle ``offset`` and so differ from the leader's) it starts empty
        (docs/cluster.md, "No acknowledged write is lost")."""
        assert offset > self.log_start_offset, (offset, self.log_start_offset)
        kept = b""
        if offset < self.log_end_offset and self._batch_at(offset) is not None:
            kept = self.read_range(offset, self.log_end_offset, 1 << 62, unacknowledged=True)
        await self._start_over(offset)
        if kept:
            self.append_replicated(kept, self._last_commit_timestamp)
            await self.flushed(self.log_end_offset)
        log.warning("%s: the log starts at offset %d now (the leader no longer has what lies before); %d "
                    "bytes kept", self.directory, offset, len(kept))

    async def _start_over(self, offset: int) -> None:
        self._check_usable()
        while self.flush_in_flight:
            with contextlib.suppress(LogStorageError):
                await self.flushed(self.log_end_offset)
        (self.directory / WRITER_SNAPSHOT_FILE).unlink(missing_ok=True)  # it covers a log no longer here
        for segment in self._segments:
            segment.delete()  # first: one of them may bear the new segment's name
        self._segments = [LogSegment.create(self.directory, offset)]
        self._unflushed_segments = []
        self.writer_state = WriterStateManager(self._config.writer_expiration_ms)
        self._durable_end = offset
        self._high_watermark = offset
        self.checkpoint_high_watermark()

    def acknowledge_up_to(self, offset: int) -> None:
        """Raise the high watermark to ``offset`` (at most the durable end), known committed otherwise (a
        KV state already holding it): a recorded high watermark may lag."""
        self._recompute_high_watermark(known_committed=offset)

    def set_replication_limit(self, limit: int | None) -> None:
        """What every in-sync replica has (None: no followers); the high watermark advances up to it."""
        self._replication_limit = limit
        self._recompute_high_watermark()

    def checkpoint_high_watermark(self) -> None:
        """Record the high watermark, so a replica restarted after a crash knows which of its batches surely
        are committed: as a follower it compares what lies above with its leader's before claiming it. A
        stale record is merely lower: safe.

        An unchanged high watermark is not written again: the replication manager checkpoints every bucket
        each second on the event loop, and an idle bucket's file write would stall requests for nothing."""
        high_watermark = self._high_watermark
        if high_watermark == self._checkpointed_high_watermark:
            return
        path = self.directory / HIGH_WATERMARK_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(str(high_watermark))
        temporary.replace(path)
        self._checkpointed_high_watermark = high_watermark

    def _expire_writers(self, now_ms: int) -> None:
        """Forget writers idle longer than ``writer_expiration_ms``, at most every eighth of that period, so
        the writer state stays bounded without a pass over every writer on every append."""
        if now_ms - self._writers_expired_at_ms >= max(1, self._config.writer_expiration_ms // 8):
            self._writers_expired_at_ms = now_ms
            expired_count = self.writer_state.expire(now_ms)
            if expired_count:
                log.info("%s: forgot %d idle writers", self.directory, expired_count)

    def check_writers(self, batches: Sequence[tuple[int, int]], acknowledged_offset: int) -> None:
        """Validate the ``(writer_id, batch_sequence)`` of the batches of one append (nothing is recorded).

        A retried batch is answered DUPLICATE_SEQUENCE, which the client takes as its acknowledgement. So that
        answer waits for the original to be acknowledged too: while the original batch still ends above
        ``acknowledged_offset`` (the high watermark, or for a KV bucket the offset applied to RocksDB), the
        retry gets the retriable RequestTimeoutError and comes back later.

        Raises DuplicateSequenceError, OutOfOrderSequenceError or RequestTimeoutError.
        """
        try:
            self.writer_state.check_append(batches)
        except DuplicateSequenceError:
            ((writer_id, batch_sequence),) = batches  # only a lone batch is reported as a duplicate
            next_offset = self.writer_state.batch_next_offset(writer_id, batch_sequence)
            assert next_offset is not None
            if next_offset > acknowledged_offset:
                raise RequestTimeoutError(
                    f"batch {batch_sequence} of writer {writer_id} is still being written (it ends at offset "
                    f"{next_offset}, {acknowledged_offset} is acknowledged); retry it"
                ) from None
            raise

    def _segment_for_append(self, size_bytes: int) -> LogSegment:
        active = self._segments[-1]
        if active.size_bytes > 0 and active.size_bytes + size_bytes > self._config.segment_size_bytes_max:
            # A closed segment must be whole on disk before a later one exists: open() repairs a torn tail
            # only in the last segment and refuses a damaged earlier one. Once per roll, so done inline.
            active.fsync()
            if active in self._unflushed_segments:
                self._unflushed_segments.remove(active)
            active = LogSegment.create(self.directory, active.next_offset)
            self._segments.append(active)
        return active

    async def wait_durable(self, offset: int) -> None:
        """Return once every offset below ``offset`` is durable and visible (the high watermark passed it)."""
        await self.durable(offset)

    def durable(self, offset: int) -> asyncio.Future[None]:
        """A future done once every offset below ``offset`` is durable and visible; it fails with
        LogStorageError if the fsync does. The flush is requested here, not when the future is awaited,
        so a caller can request the flushes of several buckets before awaiting any of them.

        Group commit: the fsync starts on the loop's next turn, so every append of this turn shares it;
        appends made while it runs share the next one, which starts as soon as it ends. Each caller gets
        its own future, resolved straight from the fsync's completion, so cancelling one caller never
        disturbs the others.
        """
        return self._wait(offset, visible=True)

    def flushed(self, offset: int) -> asyncio.Future[None]:
        """A future done once every offset below ``offset`` is fsynced here, replicated or not (a follower
        fetches its next batches only then, so its position tells the leader what it has durably)."""
        return self._wait(offset, visible=False)

    def _wait(self, offset: int, *, visible: bool) -> asyncio.Future[None]:
        assert offset <= self.log_end_offset, (offset, self.log_end_offset)  # else no flush could ever reach it
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        entry = _Waiter(offset, waiter, visible)
        if (self._high_watermark if visible else self._durable_end) >= offset:
            waiter.set_result(None)
            return waiter
        self._check_usable()
        if self._durable_end >= offset:
            self._visible_waiters.append(entry)  # flushed already: only the followers are awaited
        elif self._flush_target is None:
            self._flush_waiters.append(entry)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._start_flush)
        elif offset <= self._flush_target:
            self._flush_waiters.append(entry)
        else:
            self._next_waiters.append(entry)
        return waiter

    def _start_flush(self) -> None:
        """fsync what is appended so far in a worker thread; :meth:`_flush_done` runs on the loop after."""
        self._flush_scheduled = False
        if self._closed or self._failed is not None:
            self._fail_waiters(LogStorageError(f"log {self.directory} is closed or failed"))
            return
        target = self._flush_target = self.log_end_offset
        segments = self._unflushed_segments
        self._unflushed_segments = []
        self._appends_since_flush = 0
        loop = asyncio.get_running_loop()

        def fsync() -> None:  # in the worker thread
            error: Exception | None = None
            try:
                for segment in segments:
                    segment.fsync()
            except Exception as exc:  # any failure must reach the waiters, or they would wait forever
                error = exc
            # straight back onto the loop: no executor future (and its extra loop turns) in between
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
                loop.call_soon_threadsafe(self._flush_done, target, error)

        loop.run_in_executor(None, fsync)

    def _flush_done(self, target: int, error: Exception | None) -> None:
        waiters, self._flush_waiters = self._flush_waiters, []
        self._flush_target = None
        if error is not None:
            self._fail(error)
            self._flush_waiters = waiters
            self._fail_waiters(LogStorageError(f"fsync of {self.directory} failed: {error}"))
            return
        self._advance_durable_end(target)
        for entry in waiters:
            if entry.visible and entry.offset > self._high_watermark:
                self._visible_waiters.append(entry)  # durable here, not yet on every in-sync replica
            elif not entry.future.done():
                entry.future.set_result(None)
        if self._next_waiters:  # they waited a whole fsync already: start theirs now
            self._flush_waiters, self._next_waiters = self._next_waiters, []
            self._start_flush()

    def _fail_waiters(self, failure: LogStorageError) -> None:
        waiters = self._flush_waiters + self._next_waiters + self._visible_waiters
        self._flush_waiters, self._next_waiters, self._visible_waiters = [], [], []
        for entry in waiters:
            if not entry.future.done():
                entry.future.set_exception(failure)
                entry.future.exception()  # its caller may be gone; don't warn

    def _advance_durable_end(self, offset: int) -> None:
        if offset > self._durable_end:
            self._durable_end = offset
            self._durable_advanced.set()
            self._durable_advanced = asyncio.Event()
        self._recompute_high_watermark()

    def durable_event(self) -> asyncio.Event:
        """An event set the next time the durable end moves (a follower's long poll waits for it)."""
        return self._durable_advanced

    def _recompute_high_watermark(self, known_committed: int = 0) -> None:
        """The high watermark: what is durable here and, with followers, on every in-sync replica (or
        ``known_committed``). It never moves back."""
        limit = self._durable_end if self._replication_limit is None else min(self._durable_end, self._replication_limit)
        limit = max(limit, min(known_committed, self._durable_end))
        if limit <= self._high_watermark:
            return
        self._high_watermark = limit
        self._hw_advanced.set()
        self._hw_advanced = asyncio.Event()
        for listener in list(self._hw_listeners):  # before any waiter hears of it: a put is applied, then answered
            listener()
        if self._visible_waiters:
            waiting = []
            for entry in self._visible_waiters:
                if entry.offset <= limit:
                    if not entry.future.done():
                        entry.future.set_result(None)
                else:
                    waiting.append(entry)
            self._visible_waiters = waiting

    def add_high_watermark_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` each time the high watermark moves, before the waiters for it are told (the
        KV tablet applies what became committed there, so an acknowledged put is always applied)."""
        self._hw_listeners.append(listener)

    def remove_high_watermark_listener(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._hw_listeners.remove(listener)

    def high_watermark_event(self) -> asyncio.Event:
        """An event set the next time the high watermark moves (or the tablet closes)."""
        return self._hw_advanced

    # ---- reading ----
    def read(self, fetch_offset: int, max_bytes: int, *, for_follower: bool = False) -> ReadResult:
        """Whole batches whose last offset is at or after ``fetch_offset``, below the high watermark (for a
        follower: below what is durable here, replicated or not).

        At least one batch is returned when one is available, even above ``max_bytes``.
        Raises LogOffsetOutOfRangeError below the log start or above that end.
        """
        self._check_usable()
        start = self.log_start_offset
        end = self._durable_end if for_follower else self._high_watermark
        if fetch_offset == EARLIEST_OFFSET:
            fetch_offset = start
        if fetch_offset < start or fetch_offset > end:
            raise LogOffsetOutOfRangeError(
                f"offset {fetch_offset} is outside [{start}, {end}] of {self.directory.name}"
            )
        records = b""
        if fetch_offset < end:
            for segment in self._segments_from(fetch_offset):
                records = segment.read(segment.batch_index_for(fetch_offset), max_bytes, end)
                if records:
                    break
        return ReadResult(records, self._high_watermark, start)

    def read_range(self, start_offset: int, end_offset: int, max_bytes: int, *, unacknowledged: bool = False) -> bytes:
        """Whole batches covering ``[start_offset, end_offset)`` (end capped at the high watermark, or with
        ``unacknowledged`` at the log end: a new leader taking over what its followers may not have yet)."""
        end_offset = min(end_offset, self.log_end_offset if unacknowledged else self._high_watermark)
        chunks: list[bytes] = []
        total = 0
        offset = max(start_offset, self.log_start_offset)
        while offset < end_offset and total < max_bytes:
            data = b""
            for segment in self._segments_from(offset):
                data = segment.read(segment.batch_index_for(offset), max_bytes - total, end_offset)
                if data:
                    break
            if not data:
                break
            chunks.append(data)
            total += len(data)
            last = None
            for _position, header in log_batch.iter_batches(data, verify_crc=False):
                last = header
            assert last is not None
            offset = last.next_offset
        return b"".join(chunks)

    def _segments_from(self, offset: int) -> list[LogSegment]:
        for index in range(len(self._segments) - 1, -1, -1):
            if self._segments[index].base_offset <= offset:
                return self._segments[index:]
        return list(self._segments)

    def offset_for_timestamp(self, timestamp: int) -> int:
        """The base offset of the first batch committed at or after ``timestamp``, else the high watermark."""
        for segment in self._segments:
            if segment.last_timestamp >= timestamp:
                found = segment.first_offset_at_or_after(timestamp)
                if found is not None:
                    return min(found, self._high_watermark)
        return self._high_watermark

    # ---- retention ----
    def delete_segments(self, *, older_than_ms: int | None, below_offset: int | None) -> int:
        """Delete whole closed segments that end below ``below_offset`` and whose last batch is older than
        ``older_than_ms``; the active segment always stays. Returns the bytes freed. (Retention: data leaving
        on purpose, docs/cluster.md, "No acknowledged write is lost".)"""
        return self._delete_oldest(
            lambda segment: (below_offset is None or segment.next_offset <= below_offset)
            and (older_than_ms is None or segment.last_timestamp < older_than_ms)
        )

    def hold_segments(self) -> Callable[[], None]:
        """Keep every segment until the returned release is called (from any thread, once): a thread reads
        the log meanwhile (a new leader's changelog replay, :meth:`ReplicaManager.start_opening`), and a
        segment deleted under it would close the file it reads, whose descriptor the process may reuse."""
        with self._segment_holds_lock:
            self._segment_holds += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._segment_holds_lock:
                if not released:
                    released = True
                    self._segment_holds -= 1

        return release

    def _delete_oldest(self, deletable: Callable[[LogSegment], bool], keep: int = 1) -> int:
        """Delete the oldest durable segments while ``deletable`` says so and more than ``keep`` remain (the
        active one always does), saving the writer state first; returns the bytes freed. Nothing is deleted
        while a segment hold lasts: the next round of retention deletes it."""
        freed = 0
        if self._segment_holds:
            return freed
        while len(self._segments) > max(keep, 1):
            oldest = self._segments[0]
            if oldest in self._unflushed_segments or not deletable(oldest):
                break
            if not freed:
                self._save_writer_state()
            freed += oldest.size_bytes
            oldest.delete()
            self._segments.pop(0)
        return freed

    def _save_writer_state(self) -> None:
        """Before segments are deleted: the writer state as of the log end, durable, so a restart that no
        longer has those segments to replay still knows their writers."""
        path = self.directory / WRITER_SNAPSHOT_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(self.writer_state.to_bytes(self.log_end_offset))
        fsync_path(temporary)
        temporary.replace(path)
        fsync_path(self.directory)

    def closed_segments(self, end_offset: int) -> list[LogSegment]:
        """The rolled segments (never the active one) that end at or below ``end_offset``, oldest first:
        what may be copied to remote storage (with the high watermark as ``end_offset``)."""
        return [segment for segment in self._segments[:-1] if segment.next_offset <= end_offset]

    def delete_tiered_segments(self, below_offset: int, keep: int) -> int:
        """Delete the oldest segments that end at or below ``below_offset`` (copied to remote storage, and
        nothing local still needs them) while more than ``keep`` segments remain; returns the bytes freed.
        (Remote storage holds them: docs/cluster.md, "No acknowledged write is lost".)"""
        return self._delete_oldest(lambda segment: segment.next_offset <= below_offset, keep)

    # ---- lifecycle ----
    @property
    def failed(self) -> Exception | None:
        """The storage error that took this log offline (appends refuse until the replica reopens it)."""
        return self._failed

    @property
    def flush_in_flight(self) -> bool:
        return self._flush_target is not None or self._flush_scheduled

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise LogStorageError(f"log {self.directory} failed earlier and is offline: {self._failed}")
        if self._closed:
            raise LogStorageError(f"log {self.directory} is closed")

    def _fail(self, exc: Exception) -> None:
        log.error("log %s goes offline: %s", self.directory, exc)
        self._failed = exc

    def fail_unacknowledged(self, failure: Exception) -> None:
        """Fail every wait for the high watermark (this replica stopped leading: its followers will not
        acknowledge through it any more), those whose fsync is still running included: once it ends they
        would otherwise wait on, and be answered by, a high watermark that follows another leader's log."""
        waiting, self._visible_waiters = self._visible_waiters, []
        for pending in (self._flush_waiters, self._next_waiters):
            waiting += [entry for entry in pending if entry.visible]
            pending[:] = [entry for entry in pending if not entry.visible]
        for entry in waiting:
            if not entry.future.done():
                entry.future.set_exception(failure)
                entry.future.exception()

    def close(self) -> None:
        self._closed = True
        self.fail_unacknowledged(LogStorageError(f"log {self.directory} is closed"))
        self._hw_advanced.set()
        self._durable_advanced.set()
        for segment in self._segments:
            segment.close()

    def delete(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
