"""The primary-key state of one bucket: RocksDB for current values, the LogTablet for the changelog.

Write path (see docs/write-path.md): a PutKv batch is turned into changelog records (+I, -U/+U, -D) by
reading each key's current value, the changelog batch is appended to the log, and the new values wait in
the *pre-write buffer* until the log batch is durable; only then are they written to RocksDB (one
WriteBatch that also records the applied log offset) and the write acknowledged. So RocksDB never holds a
change the log could lose, lookups never see an unacknowledged value, and after a crash RocksDB is
recovered by replaying the changelog from its applied offset.

Not thread-safe: every method runs on the server's event loop. The blocking I/O runs off it: the log
fsync in a worker thread inside LogTablet, and (with the native RocksDB binding) RocksDB's writes, and the
reads that the row cache cannot answer (of lookups, and of puts' old values: :meth:`KvTablet.read_ahead`),
on the writer threads without the GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from strom.errors import DeletionDisabledError, KvStorageError, MalformedRowError, StorageBackpressureError
from strom.kv import changelog, kv_loops
from strom.kv.auto_increment import AutoIncrementAssigner, AutoIncrementSpec, IdAllocator, IdCounter
from strom.kv.backpressure import BackpressureConfig, BucketBackpressure
from strom.kv.changelog_replay import (
    APPLIED_OFFSET_KEY,
    META_KEYS,
    OFFSET,
    ROW_COUNT_KEY,
    Replayed,
    batch_changes,
    read_meta_int,
    replay,
)
from strom.kv.merge import options as merge_options
from strom.kv.merge.options import DeleteBehavior, MergeOptions
from strom.kv.merge.row_merger import create_row_merger
from strom.kv.missing_keys import MissingKeyRows
from strom.kv.read_ahead import ReadAhead, ReadAheads
from strom.kv.rocksdb import (
    KvDatabase,
    RocksDbOptions,
    RowIterator,
    destroy_rocksdb,
    open_rocksdb,
    reads_off_loop_safe,
    vector_memtable_supported,
)
from strom.kv.row_cache import ReplayedRows, RowCache
from strom.kv.row_format import TableRowFormat
from strom.kv.snapshot import Checkpoint, create_checkpoint
from strom.log.log_tablet import AppendResult, LogTablet
from strom.log.writer_state import NO_WRITER_ID
from strom.metadata.table_info import TableInfo
from strom.records import log_batch
from strom.records.kv_batch import SCHEMA_ID, KvBatch
from strom.records.log_batch import ChangeType

log = logging.getLogger(__name__)
_T = TypeVar("_T")

INSTANCE_ID_KEY = b"instance_id"
_SORTED_READ_MIN_KEYS = 32
OFF_LOOP_READ_MIN_KEYS = 32
"""A lookup, or a put's old values (:meth:`KvTablet.read_ahead`), that must read at least this many keys from
RocksDB reads them on a writer thread (the loop serves other requests meanwhile); fewer cost less than the
hand-off to a thread and back (~20 µs here)."""
_INDEX_SLACK = 4
"""The pre-write buffer's index is rebuilt once it holds this many times more keys than the pending batches."""
STANDBY_STEP_BYTES = 4 << 20
"""Changelog a standby applies per turn of the event loop, so a follower far behind catches up without
holding the loop for long."""
SCAN_CHUNK_ROWS = 1024
"""Rows a scan session's iterator copies out per step (without the GIL, with the native binding)."""


def _chunked_values(rows: RowIterator, first: list[bytes]) -> Iterator[bytes]:
    """The values of ``rows``, ``first`` being its first chunk; the iterator is closed at the end."""
    try:
        chunk = first
        while chunk:
            yield from chunk
            chunk = rows.next(SCAN_CHUNK_ROWS, keys=False)
    finally:
        rows.close()


class KvRestoreNeededError(KvStorageError):
    """Local RocksDB and the changelog cannot be reconciled by replay alone (the changelog no longer
    reaches back to RocksDB's state): restore the bucket from its latest KV snapshot."""


@dataclass(frozen=True, slots=True)
class KvConfig:
    rocksdb: RocksDbOptions = field(default_factory=RocksDbOptions)
    delete_behavior: str = "ALLOW"  # table.delete.behavior: ALLOW | IGNORE | DISABLE
    changelog_image: str = "FULL"
    """``table.changelog.image``: FULL (-U/+U pairs) or WAL (no -U; a full-row upsert becomes +U without
    reading the key's old value, as Fluss does with its default merge engine)."""
    merge: MergeOptions = field(default_factory=lambda: MergeOptions(None, DeleteBehavior.ALLOW))
    """``table.merge-engine`` and its options; the default engine (last write wins) without them."""
    auto_increment: AutoIncrementSpec | None = None
    """The table's auto-increment column, if it has one."""
    l0_slowdown_trigger: int = 8
    """``kv.backpressure.l0-slowdown-trigger``: level-0 files at which puts start reporting pressure."""

    @classmethod
    def for_table(cls, table: TableInfo, rocksdb: RocksDbOptions, l0_slowdown_trigger: int = 8) -> KvConfig:
        """A table's KV options, with the delete behaviour its merge engine implies when none is set."""
        merge = merge_options.validate(table.schema, table.properties)
        return cls(
            rocksdb=rocksdb,
            delete_behavior=merge.delete_behavior.name,
            changelog_image=table.options.changelog_image,
            merge=merge,
            auto_increment=AutoIncrementSpec.for_table(table),
            l0_slowdown_trigger=l0_slowdown_trigger,
        )

    @property
    def backpressure(self) -> BackpressureConfig:
        return BackpressureConfig(self.l0_slowdown_trigger, self.rocksdb.write_buffer_size_bytes,
                                  self.rocksdb.write_buffer_count)


@dataclass(slots=True)
class _PendingBatch:
    next_offset: int
    keys: list[bytes]
    values: list[bytes | None]
    row_count_delta: int
    size_bytes: int
    """What the batch weighs in the pre-write buffer (its request's bytes)."""


def _lacks_many(keys: Sequence[bytes], cached: tuple[list[bytes | None], list[int]] | None) -> bool:
    """Whether a read of ``keys`` whose row cache answered ``cached`` (None: no cache) leaves the loop: it
    lacks :data:`OFF_LOOP_READ_MIN_KEYS` or more."""
    return (len(keys) if cached is None else len(cached[1])) >= OFF_LOOP_READ_MIN_KEYS


def _read_database(database: KvDatabase, keys: Sequence[bytes]) -> list[bytes | None]:
    """RocksDB's values of ``keys`` in their order: single gets for a few, else one multi-get in key order
    (neighbouring keys share blocks; the sort runs in C, kv_loops.py). Any thread, with the native binding."""
    if len(keys) < _SORTED_READ_MIN_KEYS:
        get = database.get
        return [get(key) for key in keys]
    return kv_loops.read_in_key_order(lambda ordered: database.multi_get(ordered, sorted=True), keys)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # called off an event loop (a tablet opened and caught up on a thread): write here
        return None


def reset_instance_id(path: Path) -> None:
    """Give a RocksDB restored from a snapshot a new instance id: it will create SST files whose numbers
    the original instance may already have used, so their remote names must differ."""
    db = open_rocksdb(path, RocksDbOptions(block_cache_size_bytes=1 << 20))
    try:
        db.put_meta(INSTANCE_ID_KEY, uuid.uuid4().hex.encode())
    finally:
        db.close()


@dataclass(frozen=True, slots=True)
class BucketDatabase:
    """A bucket's RocksDB, open with the memtable its tablet starts with (:func:`open_bucket_database`)."""

    db: KvDatabase
    vector_memtable: bool
    """RocksDB's vector memtable: the bucket was new and its row cache will hold every key it gets."""
    replayed_rows: ReplayedRows | None = None
    """What a changelog replay on the opener thread wrote, for the row cache to adopt as the tablet opens
    (:func:`replayed_database`): every row of a new database (its vector memtable), the latest rows of one
    that crashed."""


def open_bucket_database(directory: Path, config: KvConfig, row_cache: RowCache | None) -> BucketDatabase:
    """Open (creating it if new) the RocksDB of the bucket whose KV directory is ``directory``.

    Touches nothing the event loop owns, so it may run on a thread: the RocksDB open is ~7 ms here, mostly
    its fsyncs, and the native binding releases the GIL for it (:meth:`ReplicaManager.open_soon`).

    A new bucket whose row cache will hold every key it has (complete, row_cache.py) never reads RocksDB
    until the cache loses a row, so it opens with RocksDB's vector memtable: an insert is an append, sorted
    once at flush, instead of a skip-list search (~8x cheaper; reads of it are what cost). The first read
    that must reach RocksDB reopens the database with the skip list (:meth:`KvTablet._make_readable`).
    """
    vector_memtable = (
        row_cache is not None and row_cache.capacity_bytes > 0 and not (directory / "rocksdb").exists()
        and vector_memtable_supported(config.rocksdb)
    )
    return BucketDatabase(open_rocksdb(directory / "rocksdb", config.rocksdb, vector_memtable=vector_memtable),
                          vector_memtable)


def replayed_database(directory: Path, config: KvConfig, database: BucketDatabase,
                      rows: ReplayedRows) -> BucketDatabase:
    """A bucket's RocksDB that a changelog replay on its opener thread caught up, with the rows the replay
    wrote (``rows``), which the row cache adopts as the tablet opens, as a replay on the loop would have
    put them there. Into a new database the replay is a bulk load (its vector memtable: appends, sorted
    once at flush), and the bucket stays complete. Rows more than the cache holds cannot keep it complete:
    a new database is then flushed and reopened with the skip list here, as its first read would have done
    on the loop (:meth:`KvTablet._make_readable`), and its reads reach RocksDB."""
    if not rows.overflowed:
        return BucketDatabase(database.db, database.vector_memtable, replayed_rows=rows)
    if not database.vector_memtable:
        return database
    database.db.flush()
    database.db.close()
    return BucketDatabase(open_rocksdb(directory / "rocksdb", config.rocksdb), vector_memtable=False)


def _flush_quietly(flush: Callable[[], None], directory: Path) -> None:
    """A closing tablet's flush; a failure is logged (the changelog still covers what did not reach an SST)."""
    try:
        flush()
    except Exception as exc:
        log.warning("%s: flush on close failed: %s", directory, exc)


def _close_quietly(db: KvDatabase, directory: Path) -> None:
    """A closing tablet's RocksDB close; a failure is logged (one in an error state, a full disk, may fail
    to close cleanly)."""
    try:
        db.close()
    except Exception as exc:
        log.warning("%s: RocksDB close failed: %s", directory, exc)


def _flush_and_close(flush: Callable[[], None], db: KvDatabase, directory: Path) -> None:
    """A closed tablet's database, flushed and closed off the loop (:meth:`KvTablet.close_soon`)."""
    _flush_quietly(flush, directory)
    _close_quietly(db, directory)


@dataclass
class StagedPut:
    """A bucket's PutKv batches in the changelog. Batches appended before a failing one still become
    committed and applied; the put is answered once they are, with the first failure if there was one."""

    result: AppendResult | None
    """The last append (None: the first batch failed, nothing was appended)."""
    acknowledged: asyncio.Future[None] | None
    error: BaseException | None

    async def finish(self) -> AppendResult:
        """Wait until the appended batches are committed and applied; raises the first failure.

        Raises:
            the batch's error, or what failed the commit or the apply.
        """
        if self.acknowledged is not None:
            try:
                await self.acknowledged
            except Exception as exc:
                raise self.error or exc from None
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class KvTablet:
    """One primary-key bucket. Owned by the event loop."""

    def __init__(
        self,
        directory: Path,
        log_tablet: LogTablet,
        row_format: TableRowFormat,
        config: KvConfig,
        id_counter: IdCounter | None = None,
        row_cache: RowCache | None = None,
        writer: Executor | None = None,
        *,
        standby: bool = False,
        database: BucketDatabase | None = None,
    ) -> None:
        """``id_counter`` reserves ids for an auto-increment column (required when the table has one);
        ``row_cache``: the tablet server's cache of current rows (consulted before RocksDB); ``writer``:
        threads that write committed batches to RocksDB while the event loop goes on (for a binding whose
        write releases the GIL; without it the write runs on the loop); ``standby``: the tablet of a
        follower, which applies the changelog its log replicates as it becomes committed, takes no writes,
        and is promoted when its replica leads (:meth:`promote`); ``database``: its RocksDB, opened already
        (:func:`open_bucket_database`, on a thread); the caller closes it if the tablet fails to open."""
        self._writer = writer
        self._applying: asyncio.Future[None] | None = None
        """The RocksDB write in flight on the writer (one per bucket at a time, in log order)."""
        self._off_loop: Future[Any] | None = None
        """The bucket's latest work on the writer (a write or a checkpoint's flush): the memtable switch waits
        for it before it closes the database."""
        self._apply_waiters: list[tuple[int, asyncio.Future[None]]] = []
        """Committed puts waiting for their batches' write: (next offset, acknowledgement)."""
        self._writes_held = False
        """A checkpoint waits for the write in flight: no other starts meanwhile."""
        self._cache = row_cache
        self._cache_token = row_cache.register() if row_cache is not None else 0
        self._cache_writes = 0
        """Write-throughs to the row cache so far: a read off the loop fills the cache with what it read only
        if none happened meanwhile (one could have written a newer value of a key it read)."""
        self.directory = directory
        self.log = log_tablet
        self._format = row_format
        self._config = config
        self._merger = create_row_merger(config.merge, row_format)
        self._auto_increment: AutoIncrementAssigner | None = None
        self._missing_rows: MissingKeyRows | None = None
        if config.auto_increment is not None:
            if id_counter is None:
                raise ValueError(f"{directory}: the table has an auto-increment column but no id counter was given")
            ids = IdAllocator(config.auto_increment, id_counter)
            self._auto_increment = AutoIncrementAssigner(config.auto_increment, ids, row_format)
        # The changelog, fsynced first, is the write-ahead record: writes skip RocksDB's own WAL. After a
        # crash, RocksDB comes back at its last flush and the changelog replays the rest.
        opened = database if database is not None else open_bucket_database(directory, config, row_cache)
        self._vector_memtable = opened.vector_memtable
        self._db: KvDatabase = opened.db
        # The pre-write buffer: batches appended to the log whose values are not in RocksDB yet (in log
        # order), and an index over them (each key's latest write) built only when a request needs it.
        self._pending: list[_PendingBatch] = []
        self._pending_index: dict[bytes, bytes | None] | None = None
        self._pending_index_since = 0
        """The index holds each key's latest write among every batch from this offset on (the applied offset
        when it was built; it is kept up to date, applies included, until dropped)."""
        self._pending_bytes = 0
        """What the pending batches weigh (their requests' bytes): the pre-write buffer's memory debt."""
        self.reads_ahead = ReadAheads()
        """Puts' old values being read on the writer before their turn (:meth:`read_ahead`)."""
        self.backpressure = BucketBackpressure(self._read_property, config.backpressure)
        self._applied_offset = read_meta_int(self._db, APPLIED_OFFSET_KEY)
        self._row_count = read_meta_int(self._db, ROW_COUNT_KEY)
        if row_cache is not None:
            if opened.replayed_rows is not None:  # the rows a replay on the opener thread wrote
                adopted = row_cache.adopt(self._cache_token, opened.replayed_rows)
                if adopted and opened.vector_memtable:  # into a new database: they are all it holds
                    row_cache.mark_complete(self._cache_token)
            elif self._holds_no_rows():
                row_cache.mark_complete(self._cache_token)  # the replay below and every later write go through it
        self.instance_id = self._instance_id()
        self._closed = False
        self.failed: Exception | None = None
        """A RocksDB write failed (RocksDB then refuses writes): writes are refused until the replica
        reopens the tablet; reads go on from what RocksDB holds, which is every acknowledged write."""
        self.standby = standby
        self.standby_lost: str | None = None
        """Why a standby stopped following its log (a gap it cannot replay, a failed write): its replica
        reopens the state as a new leader would, from a snapshot."""
        self._catch_up_scheduled = False
        try:
            self._recover()
        except BaseException:
            self._close_db()
            raise
        if standby:
            self.log.add_high_watermark_listener(self._schedule_catch_up)
            return
        # what becomes committed is applied the moment the high watermark passes it, before any put waiting
        # for it is answered: reads never apply writes, and an acknowledged put is in RocksDB
        self.log.add_high_watermark_listener(self._apply_committed)
        self._apply_committed()

    # ---- recovery ----
    def _holds_no_rows(self) -> bool:
        rows = self._db.iterator()
        try:
            return not rows.next(1, keys=False)
        finally:
            rows.close()

    def _instance_id(self) -> str:
        """A random id of this RocksDB instance, so its SST names never collide with another's remotely."""
        raw = self._db.get_meta(INSTANCE_ID_KEY)
        if raw is None:
            raw = uuid.uuid4().hex.encode()
            self._db.put_meta(INSTANCE_ID_KEY, raw)
        return bytes(raw).decode()

    @property
    def size_bytes(self) -> int:
        """The RocksDB files' bytes (live SST files) plus what the memtables hold: the bucket's state on disk
        and on its way there (strom's GetTableStats extension, the console's bucket sizes)."""
        total = 0
        for name in ("rocksdb.live-sst-files-size", "rocksdb.cur-size-all-mem-tables"):
            value = self._db.property(name)
            total += int(value) if value and value.isdigit() else 0
        return total

    @property
    def row_count(self) -> int:
        """Rows in RocksDB (acknowledged writes only), maintained from the changelog; -1 with a WAL
        changelog image, whose +U does not say whether the key existed (Fluss disables it too)."""
        return -1 if self._wal else self._row_count

    @property
    def _wal(self) -> bool:
        return self._config.changelog_image == "WAL"

    @property
    def applied_offset(self) -> int:
        """Exclusive: every changelog record below this offset is reflected in RocksDB."""
        return self._applied_offset

    def _recover(self) -> None:
        if self.log.high_watermark < self._applied_offset <= self.log.durable_end:
            self.log.acknowledge_up_to(self._applied_offset)  # RocksDB holds only acknowledged writes
        end = self.log.high_watermark
        if self._applied_offset > end or self._applied_offset < self.log.log_start_offset:
            if self.log.log_start_offset != 0:
                raise KvRestoreNeededError(
                    f"{self.directory}: RocksDB is at offset {self._applied_offset} but the changelog covers "
                    f"[{self.log.log_start_offset}, {end}); the bucket must be restored from a KV snapshot"
                )
            log.warning("%s: RocksDB ahead of the changelog (%d > %d); rebuilding it from the log",
                        self.directory, self._applied_offset, end)
            self._close_db()
            destroy_rocksdb(self.directory / "rocksdb")
            self._db = open_rocksdb(self.directory / "rocksdb", self._config.rocksdb)
            self._vector_memtable = False
            self._applied_offset = 0
            self._row_count = 0
            self.instance_id = self._instance_id()
        if self._applied_offset < end:
            replayed = self.replay_changelog(end)
            log.info("%s: replayed %d changelog records up to offset %d", self.directory, replayed, end)
        if not self.standby:
            self._hold_unacknowledged()

    # ---- standby (a follower's warm state) ----
    def _schedule_catch_up(self) -> None:
        """The follower's high watermark moved: apply what it passed on a later turn of the loop (not inside
        the fetch that moved it), once however many moves come meanwhile."""
        if self._catch_up_scheduled or self.standby_lost is not None or self._closed:
            return
        self._catch_up_scheduled = True
        loop = _running_loop()
        if loop is None:
            self._catch_up()
        else:
            loop.call_soon(self._catch_up)

    def _catch_up(self) -> None:
        """Apply committed changelog up to the high watermark, about ``STANDBY_STEP_BYTES`` of it per turn of
        the loop. A gap (the log now starts past what RocksDB holds: the leader's segments went to remote
        storage before this follower fetched them) or a failed write ends the standby; the state is then
        reopened from a snapshot if this replica leads."""
        self._catch_up_scheduled = False
        if not self.standby or self._closed or self.standby_lost is not None:
            return
        start, end = self._applied_offset, self.log.high_watermark
        if start >= end:
            return
        try:
            if start < self.log.log_start_offset:
                raise KvRestoreNeededError(f"the log starts at {self.log.log_start_offset}, RocksDB is at {start}")
            self.replay_changelog(end, STANDBY_STEP_BYTES)
        except Exception as exc:
            self.standby_lost = str(exc)
            self.log.remove_high_watermark_listener(self._schedule_catch_up)
            log.warning("%s: the standby state stops following its log: %s", self.directory, exc)
            return
        if self._applied_offset < self.log.high_watermark:
            self._schedule_catch_up()

    def promote(self) -> None:
        """This follower's replica leads now: apply everything committed, hold what lies above as the
        pre-write buffer (as a leader opening its state does) and take writes.

        Raises:
            KvRestoreNeededError: the standby lost its log; reopen the state from a snapshot.
        """
        if not self.standby:
            return
        if self.standby_lost is not None:
            raise KvRestoreNeededError(f"{self.directory}: the standby state is behind its log ({self.standby_lost})")
        self.log.remove_high_watermark_listener(self._schedule_catch_up)
        self.standby = False
        end = self.log.high_watermark
        if self._applied_offset < end:
            self.replay_changelog(end)
        self._hold_unacknowledged()
        self.log.add_high_watermark_listener(self._apply_committed)
        self._apply_committed()

    def _hold_unacknowledged(self) -> None:
        """A leader that takes over a replicated bucket may hold changelog batches its followers do not have
        yet (above the high watermark): they are the log now, so they become the pre-write buffer (writes see
        them; lookups once the followers have them), as if this leader had written them."""
        start, end = self._applied_offset, self.log.log_end_offset
        if start >= end:
            return
        data = self.log.read_range(start, end, 1 << 62, unacknowledged=True)
        held = 0
        for header, keys, values, delta in batch_changes(self._format, data, start):
            self._pending.append(_PendingBatch(header.next_offset, keys, values, delta, header.size_bytes))
            self._pending_bytes += header.size_bytes
            held += len(keys)
        self._pending_index = None
        if held:
            log.info("%s: holding %d unacknowledged changelog records in [%d, %d)", self.directory, held, start, end)

    def replay_changelog(self, end_offset: int, bytes_max: int | None = None) -> int:
        """Apply changelog records from where RocksDB is up to ``end_offset`` to it (``bytes_max``: stop after
        about that much of the log), writing them through the row cache; returns records applied."""

        def written(keys: list[bytes], values: list[bytes | None]) -> None:
            if self._cache is not None:
                self._cache_writes += 1
                self._cache.put_many(self._cache_token, keys, values)

        at = Replayed(self._applied_offset, self._row_count)
        try:
            replay(self._db, self.log, self._format, at, end_offset, bytes_max, written)
        finally:  # as far as RocksDB got, should a later write of the replay fail
            self._applied_offset, self._row_count = at.offset, at.row_count
        return at.records

    # ---- writes ----
    def prepare_put(
        self,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        schema_id: int,
        target_columns: Sequence[int] | None,
        writer_id: int,
        batch_sequence: int,
        now_ms: int,
        size_bytes: int = 0,
        *,
        overwrite: bool = False,
        ahead: ReadAhead | None = None,
    ) -> AppendResult:
        """Turn one request's records into a changelog batch and append it; values wait in the pre-write
        buffer until the log's high watermark passes them (:meth:`acknowledgement` waits for that).
        ``size_bytes``: the records' size on the wire (what they weigh in the pre-write buffer);
        ``overwrite``: bypass the table's merge engine, each row replacing the stored one and deletes always
        allowed (Fluss's ``agg_mode`` OVERWRITE, which writers use to undo what they wrote); ``ahead``: the
        keys' old values, read before (:meth:`read_ahead`).

        Raises DuplicateSequenceError / OutOfOrderSequenceError (nothing written) for a replayed or
        skipped writer sequence, RequestTimeoutError (retriable) for a replay whose original is not applied
        yet, DeletionDisabledError if the table forbids deletes; KvStorageError while RocksDB is failed
        (nothing is appended, so the changelog does not grow with writes that cannot be applied).
        """
        if self.failed is not None:
            raise KvStorageError(
                f"RocksDB of {self.directory} failed ({self.failed}); writes resume once storage works again "
                "(for a full disk: once space is freed)"
            )
        self._check_open()
        # a retry is acknowledged (DUPLICATE_SEQUENCE) only once the original is visible in RocksDB
        self.log.check_writers([(writer_id, batch_sequence)], self._applied_offset)
        if not overwrite and self._config.delete_behavior == "DISABLE" and any(v is None for v in values):
            raise DeletionDisabledError("deletes are disabled on this table (table.delete.behavior=DISABLE)")
        ignore_deletes = not overwrite and self._config.delete_behavior == "IGNORE"
        merger = None if overwrite else self._merger
        if schema_id != self._format.schema_id:  # a writer whose metadata predates a column change
            values = self._format.current_rows(schema_id, values)
            schema_id = self._format.schema_id
        old_values: list[bytes | None] | None = None  # read once, by whichever step needs them first
        if self._auto_increment is not None:
            self._auto_increment.spec.check_target_columns(target_columns)
            old_values = self._current_values(keys, ahead)
            values = self._auto_increment.assign(keys, values, old_values, deletes_remove=not ignore_deletes)
        prefix = SCHEMA_ID.pack(schema_id)
        if merger is not None or target_columns:  # rows decoded and merged per row, in Python
            rule = (merger.configure(target_columns) if merger is not None
                    else self._partial(target_columns or ()))
            change_types, rows, new_keys, new_values = changelog.emit(
                keys, values, old_values if old_values is not None else self._current_values(keys, ahead), prefix, rule,
                ignore_deletes=ignore_deletes, wal_image=self._wal,
            )
        elif self._wal:
            change_types, rows, new_keys, new_values = changelog.emit_wal_full_rows(
                keys, values, prefix, ignore_deletes, lambda deleted: self._current_values(deleted, ahead)
            )
        else:
            old_values = self._current_values(keys, ahead)
            change_types, rows, new_keys, new_values = changelog.emit_full_rows(
                keys, values, old_values, prefix, ignore_deletes
            )
        try:
            batch = self._format.stored_values_to_batch(rows)
        except ValueError as exc:
            raise MalformedRowError(f"a row of the batch does not decode with the table's schema: {exc}") from exc
        data = bytearray(
            log_batch.build_arrow_batch(
                batch,
                schema_id=self._format.schema_id,
                change_types=bytes(change_types),
                compression=self._format.log_compression,
                writer_id=writer_id,
                batch_sequence=batch_sequence,
            )
        )
        headers = list(log_batch.iter_batches(data, verify_crc=False))
        result = self.log.append(data, headers, now_ms)
        delta = change_types.count(ChangeType.INSERT) - change_types.count(ChangeType.DELETE)
        self._pending.append(_PendingBatch(result.next_offset, new_keys, new_values, delta, size_bytes))
        self._pending_bytes += size_bytes
        if self._pending_index is not None:  # kept up to date, not rebuilt by every request of a group commit
            kv_loops.index_update(self._pending_index, new_keys, new_values)
        return result

    def prepare_insert_missing(self, keys: Sequence[bytes], now_ms: int) -> AppendResult:
        """Append rows for ``keys`` that hold only the key (lookups with insert_if_not_exists; an
        auto-increment column gets its id). Written as a partial update of the primary key, so a key that
        another request inserted meanwhile keeps its row. Durability and apply work as for :meth:`prepare_put`.

        Raises: InvalidTableError when the table's rows cannot be built from keys alone.
        """
        if self._missing_rows is None:
            assigned = [] if self._auto_increment is None else [self._auto_increment.spec.column_index]
            self._missing_rows = MissingKeyRows(self._format, assigned)
        rows: list[bytes | None] = [self._missing_rows.row(key) for key in keys]
        return self.prepare_put(
            keys, rows, self._format.schema_id, self._missing_rows.target_columns, NO_WRITER_ID, NO_WRITER_ID, now_ms
        )

    def read_ahead(self, keys: Sequence[bytes], values: Sequence[bytes | None], target_columns: Sequence[int] | None,
                   *, overwrite: bool = False) -> ReadAhead | None:
        """Begin getting the old values that a put of ``keys`` and ``values`` will plan from
        (:mod:`strom.kv.read_ahead`) where the row cache lacks :data:`OFF_LOOP_READ_MIN_KEYS` or more of
        them: the cache's now, and RocksDB's on a writer thread without the GIL; the put awaits ``reading``,
        then hands the result to :meth:`prepare_put`, and releases it in any case. A ``WAL`` changelog
        image's full rows read only their deletes' old values (:func:`changelog.deletes_to_read`). None
        where the put reads no old values, where the cache answers it at its turn, or where it cannot read
        off the loop (no writer, rocksdict)."""
        if self.failed is not None or self._closed or self.standby:
            return None
        if (self._wal and self._auto_increment is None and not target_columns
                and (overwrite or self._merger is None)):  # planned by emit_wal_full_rows
            if None not in values or (not overwrite and self._config.delete_behavior != "ALLOW"):
                return None  # upserts read nothing; deletes ignored or refused read nothing either
            keys = changelog.deletes_to_read(keys, values)
        loop = self._off_loop_reads()
        if loop is None:
            return None
        cached = self._cached_values(keys)
        if not _lacks_many(keys, cached):
            # the cache answers (a few gets aside) as cheaply at the put's turn: reading it now would keep
            # every batch applied meanwhile for the put to lay over, a cost that grows with the requests in
            # flight for the bucket (16 pipelined writers: 43 % of a loaded loop, docs/benchmarks.md)
            return None
        floor = self._applied_offset
        found = self._read_soon(keys, cached, loop, fill_cache=False)  # the put writes the new values through next
        ready: asyncio.Future[None] = loop.create_future()
        ahead = self.reads_ahead.begin(keys, floor, ready)

        def read(done: asyncio.Future[list[bytes | None]]) -> None:
            # a failed read leaves no values: the put reads on the loop, and meets the failure there
            if not done.cancelled() and done.exception() is None and ahead.generation >= 0:  # not released
                ahead.values = done.result()
            if not ready.done():  # cancelled where its request went away
                ready.set_result(None)

        found.add_done_callback(read)
        return ahead

    def _partial(self, target_columns: Sequence[int]) -> changelog.PartialUpdate:
        owned = self._auto_increment.spec.column_index if self._auto_increment is not None else None
        return changelog.PartialUpdate(self._format, target_columns, owned)

    def _current_values(self, keys: Sequence[bytes], ahead: ReadAhead | None = None) -> list[bytes | None]:
        """Latest values including the pre-write buffer (what the changelog must compare against); from
        ``ahead`` where it read them."""
        values = None
        if ahead is not None:  # the pre-write buffer's index, laid over below, may cover what the read needs
            covered = self._pending_index_since if self._pending and self._pending_index is not None else None
            values = self.reads_ahead.take(ahead, keys, covered_from=covered)
        if values is None:
            values = self._read_values(keys, fill_cache=False)  # the put writes the new values through next
        if self._pending:
            index = self._pending_index
            if index is None:
                # built only when a request overlaps another's fsync; later batches win
                index = self._pending_index = {}
                self._pending_index_since = self._applied_offset
                for pending in self._pending:
                    kv_loops.index_update(index, pending.keys, pending.values)
            kv_loops.overlay(values, keys, index)
        return self._format.current_values(values)

    def _read_values(self, keys: Sequence[bytes], *, fill_cache: bool = True) -> list[bytes | None]:
        """RocksDB's values of ``keys`` (None where missing), in the order given.

        A large batch is read with one multi-get in key order: neighbouring keys share the memtable's and
        the SST's cache lines and blocks, which makes a hit ~30 % cheaper than random-order single gets (the
        sort runs in C, kv_loops.py). Small batches use single gets, which cost less per call.
        """
        return self._finish_read(keys, self._cached_values(keys), fill_cache)

    def _finish_read(self, keys: Sequence[bytes], cached: tuple[list[bytes | None], list[int]] | None,
                     fill_cache: bool) -> list[bytes | None]:
        """The values of ``keys`` once the cache answered (``cached``, :meth:`_cached_values`): what it lacked
        read from RocksDB on the loop."""
        if cached is None:  # no cache, or the bucket bypasses it for now
            return self._read_rocksdb(keys)
        values, missing = cached
        if missing:
            missing_keys = [keys[position] for position in missing]
            self._place_read(values, missing, missing_keys, self._read_rocksdb(missing_keys), fill_cache)
        return values

    def _cached_values(self, keys: Sequence[bytes]) -> tuple[list[bytes | None], list[int]] | None:
        """The row cache's values of ``keys`` and the positions to read from RocksDB; None without a cache or
        while the bucket bypasses it (read every key, fill nothing)."""
        return None if self._cache is None else self._cache.get_many(self._cache_token, keys)

    def _place_read(self, values: list[bytes | None], missing: list[int], missing_keys: list[bytes],
                    found: list[bytes | None], fill_cache: bool) -> None:
        """Put RocksDB's values of the keys the cache lacked in their places, count them, and (``fill_cache``)
        keep them in the cache."""
        assert self._cache is not None
        for position, value in zip(missing, found, strict=True):
            values[position] = value
        self._cache.record_misses(self._cache_token, len(values) - len(missing), len(found) - found.count(None))
        if fill_cache:
            self._cache.put_many(self._cache_token, missing_keys, found)

    def _make_readable(self) -> None:
        """Reads reach RocksDB from now on: a vector memtable would sort a copy of itself for every read, so
        the database is flushed, closed and reopened with the skip list (and its bloom filter) first.

        Once in a bucket's life, on the loop: it waits for the bucket's work on the writer, if any, and for
        the flush (~0.35 s for a full 64 MiB memtable, docs/benchmarks.md). A failed flush or reopen fails
        the bucket, as a failed write does: the read gets the error (reads of the vector memtable would each
        sort it), and the replica reopens the bucket once its disk has room, replaying the changelog into a
        skip list.

        Raises:
            KvStorageError: the flush or the reopen failed.
        """
        if not self._vector_memtable:
            return
        if self._off_loop is not None:
            wait_for_futures([self._off_loop])  # its outcome is handled by its own callback
        try:
            self._db.flush()
            self._db.close()
            self._db = open_rocksdb(self.directory / "rocksdb", self._config.rocksdb)
        except Exception as exc:  # a later read tries again, and fails the same way on the closed database
            if self.failed is None:
                log.error("%s: leaving the vector memtable failed (%s), the bucket is failed until it is "
                          "reopened", self.directory, exc)
                self.failed = exc
            raise KvStorageError(f"RocksDB of {self.directory} cannot switch to the skip list: {exc}") from exc
        self._vector_memtable = False
        log.debug("%s: reads reach RocksDB; reopened with the skip-list memtable", self.directory)

    def _write(self, keys: list[bytes], values: list[bytes | None], metas: tuple[bytes, bytes]) -> None:
        """One apply's RocksDB write (on the writer when there is one)."""
        self._db.write(keys, values, META_KEYS, metas)

    def _read_rocksdb(self, keys: Sequence[bytes]) -> list[bytes | None]:
        self._make_readable()
        return _read_database(self._db, keys)

    def _iterator(self, start: bytes | None = None) -> RowIterator:
        self._make_readable()
        return self._db.iterator(start)

    def _on_writer(self, loop: asyncio.AbstractEventLoop, work: Callable[..., _T], *args: object) -> asyncio.Future[_T]:
        """Run ``work(*args)`` on the writer, remembered as the bucket's work off the loop."""
        assert self._writer is not None
        running = self._writer.submit(work, *args)
        self._off_loop = running
        return asyncio.wrap_future(running, loop=loop)

    def apply_durable(self) -> None:
        """Move every pre-write batch the log made durable into RocksDB, in order, with its offset.

        The pending batches and the pre-write buffer change only after the RocksDB write succeeded: a
        failed write leaves them in place, so the values stay visible to the changelog computation and a
        later call (or the replay on reopen) applies them.

        The write batch holds the keys in byte order (a stable sort: a key written twice keeps its later
        value last, and RocksDB applies a batch in order): the memtable inserts a sorted batch along one
        path of its skip list, which made a server's load and update ~15 % faster (docs/benchmarks.md).
        """
        if not self._pending or self._closed or self._applying is not None or self._writes_held:
            return  # a write in flight applies what follows it when it is done
        high_watermark = self.log.high_watermark
        if self._pending[0].next_offset > high_watermark:
            return
        applied_to = self._applied_offset
        row_count = self._row_count
        durable_count = 0
        keys: list[bytes] = []
        values: list[bytes | None] = []
        for pending in self._pending:
            if pending.next_offset > high_watermark:
                break
            keys += pending.keys
            values += pending.values
            applied_to = pending.next_offset
            row_count += pending.row_count_delta
            durable_count += 1
        keys, values = kv_loops.in_key_order(keys, values)
        metas = (OFFSET.pack(applied_to), OFFSET.pack(row_count))
        loop = _running_loop() if self._writer is not None else None
        if loop is not None:
            # Off the loop: the batches stay in the pre-write buffer (puts see them) until the write is done;
            # lookups see the old values or the new, both committed.
            self._applying = self._on_writer(loop, self._write, keys, values, metas)
            self._applying.add_done_callback(lambda done: self._written(done, durable_count, applied_to, row_count))
            return
        try:
            self._write(keys, values, metas)
        except Exception as exc:
            raise self._write_failed(exc) from exc
        self._applied(durable_count, applied_to, row_count)

    def _write_failed(self, exc: Exception) -> KvStorageError:
        if self.failed is None:
            log.error("%s: RocksDB write failed, the bucket refuses writes until it is reopened: %s",
                      self.directory, exc)
        self.failed = exc
        return KvStorageError(f"RocksDB write failed in {self.directory}: {exc}")

    def _applied(self, durable_count: int, applied_to: int, row_count: int) -> None:
        """The first ``durable_count`` pending batches are in RocksDB now."""
        if self._cache is not None and not self._closed:  # write-through, in log order: later batches win
            self._cache_writes += 1
            for pending in self._pending[:durable_count]:
                self._cache.put_many(self._cache_token, pending.keys, pending.values)
        self.reads_ahead.applied(self._pending[:durable_count])
        self._pending_bytes -= sum(pending.size_bytes for pending in self._pending[:durable_count])
        del self._pending[:durable_count]
        # The index stays valid: an entry whose write is now applied is that key's latest write, which is what
        # RocksDB holds. Rebuilding it from the pending batches after every apply took ~5 % of a loaded
        # server; it is dropped once nothing is pending, or once mostly applied writes fill it.
        index = self._pending_index
        if index is not None and (
            not self._pending or len(index) > _INDEX_SLACK * sum(len(pending.keys) for pending in self._pending)
        ):
            self._pending_index = None
        self._applied_offset = applied_to
        self._row_count = row_count

    def _written(self, done: asyncio.Future[None], durable_count: int, applied_to: int, row_count: int) -> None:
        """A write by the writer finished (on the loop): account for it, answer the puts it covered, and
        start the next one if more became committed meanwhile."""
        self._applying = None
        exc = done.exception() if not done.cancelled() else KvStorageError("the RocksDB write was cancelled")
        waiters = self._apply_waiters
        if exc is not None:
            failure = self._write_failed(exc) if isinstance(exc, Exception) else KvStorageError(str(exc))
            self._apply_waiters = []
            for _, waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(failure)
            return
        self._applied(durable_count, applied_to, row_count)
        self._apply_waiters = [(offset, waiter) for offset, waiter in waiters if offset > applied_to]
        for offset, waiter in waiters:
            if offset <= applied_to and not waiter.done():
                waiter.set_result(None)
        self._apply_committed()

    async def create_checkpoint_settled(self, directory: Path) -> Checkpoint:
        """:meth:`create_checkpoint` once the write in flight (if any) is done, holding back the next
        meanwhile: the checkpoint then holds exactly the applied offset and row count it records. With a
        writer, the memtable flush and the checkpoint run on it, so the event loop serves meanwhile."""
        self._writes_held = True
        try:
            while (applying := self._applying) is not None:
                if applying.done():
                    # Its accounting (_written, a done callback) is queued on the loop: awaiting a done future
                    # would not yield, and this loop would spin without ever letting it run.
                    await asyncio.sleep(0)
                    continue
                with contextlib.suppress(Exception):
                    await asyncio.shield(applying)
            if self._writer is not None:  # the flush and the hard links run off the loop, as the writes do
                return await self._on_writer(asyncio.get_running_loop(), self.create_checkpoint, directory)
            return self.create_checkpoint(directory)
        finally:
            self._writes_held = False
            self._apply_committed()

    def stage_put(self, batches: Sequence[KvBatch], target_columns: Sequence[int] | None, now_ms: int,
                  *, overwrite: bool = False, ahead: ReadAhead | None = None) -> StagedPut:
        """One PutKv's batches of this bucket, appended in order up to the first that fails; the wait for
        them to be committed and applied is requested at once (:meth:`acknowledgement`). ``ahead``: the old
        values of one batch's keys, read before (:meth:`read_ahead`)."""
        result: AppendResult | None = None
        try:
            for batch in batches:
                result = self.prepare_put(batch.keys, batch.values, batch.schema_id, target_columns,
                                          batch.writer_id, batch.batch_sequence, now_ms, batch.size_bytes,
                                          overwrite=overwrite, ahead=ahead)
        except Exception as exc:
            error: BaseException | None = exc
        else:
            error = None
        return StagedPut(result, self.acknowledgement(result) if result is not None else None, error)

    def _apply_committed(self) -> None:
        """The log's high watermark moved: apply what it passed. A failed RocksDB write is logged once by
        :meth:`apply_durable` and fails the puts it held (:meth:`acknowledgement`); reads go on from what
        RocksDB holds, every acknowledged write."""
        with contextlib.suppress(KvStorageError):
            self.apply_durable()

    def acknowledgement(self, result: AppendResult) -> asyncio.Future[None]:
        """A future done once the batches appended up to ``result`` are committed and applied to RocksDB
        (the moment a put is answered); failed with the log's error, or KvStorageError when RocksDB did not
        take them. Requested at once (the wait is registered now: a replica that stops leading fails it)."""
        applied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            committed = self.log.durable(result.next_offset)
        except Exception as exc:
            applied.set_exception(exc)
            return applied

        def settle(done: asyncio.Future[None]) -> None:
            if applied.done():
                return
            failure = done.exception() if not done.cancelled() else asyncio.CancelledError()
            if failure is not None:
                applied.set_exception(failure)
            elif self._applied_offset < result.next_offset and (self._applying is not None or self._writes_held):
                self._apply_waiters.append((result.next_offset, applied))  # committed; its write is in flight
            elif self._applied_offset < result.next_offset:  # committed, but RocksDB refused the write
                applied.set_exception(KvStorageError(
                    f"RocksDB of {self.directory} did not take the write ({self.failed}); it is retried once "
                    "storage works again"))
            else:
                applied.set_result(None)

        committed.add_done_callback(settle)
        return applied

    # ---- back-pressure ----
    def _read_property(self, name: str) -> str | None:
        return None if self._closed else self._db.property(name)

    @property
    def buffered_bytes(self) -> int:
        """What the pre-write buffer holds: changelog batches appended, not in RocksDB yet."""
        return self._pending_bytes

    def check_write_budget(self, size_bytes: int) -> None:
        """Raises StorageBackpressureError (retriable, nothing appended) when taking ``size_bytes`` more
        would bring this bucket's level-0 files, memtables and pre-write buffer to RocksDB's slowdown
        trigger (Fluss's admission rule, strom/kv/backpressure.py)."""
        if self.backpressure.over_budget(self._pending_bytes + size_bytes):
            self.backpressure.rejections += 1
            raise StorageBackpressureError(
                f"Write rejected for {self.directory.name}: the bucket's write budget is spent "
                f"({self.backpressure.l0_files} level-0 files, {self._pending_bytes} bytes not in RocksDB yet); "
                "retry after a back-off"
            )

    def pressure(self) -> float:
        """The back-pressure signal a put answered now carries (0: none)."""
        return self.backpressure.pressure(self._pending_bytes)

    # ---- reads ----
    def lookup(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Stored values (schema id + row) of durable writes; None for missing keys."""
        self._check_open()
        return self._format.current_values(self._read_values(keys))

    def lookup_soon(self, keys: Sequence[bytes]) -> list[bytes | None] | asyncio.Future[list[bytes | None]]:
        """:meth:`lookup`, answered now where the row cache holds the keys (or few miss it); otherwise a future
        of the answer, whose RocksDB read runs on a writer thread without the GIL, so that the event loop
        serves every other request meanwhile: a read of keys no cache holds takes milliseconds (more where
        the files are not in memory), and on the loop every client of the server would wait for it.

        A read off the loop sees each key's latest applied value at some moment after this call. It fills
        the row cache with what it read unless a write-through happened meanwhile (which may hold a newer
        value of one of its keys). Raises KvStorageError as :meth:`lookup` does; the future fails with it
        when the tablet closes before the read runs."""
        self._check_open()
        cached = self._cached_values(keys)
        if cached is not None and not cached[1]:  # the cache answered every key (a single lookup's, mostly)
            return self._format.current_values(cached[0])
        if _lacks_many(keys, cached):  # only then whether reads may leave the loop (not per cache hit)
            loop = self._off_loop_reads()
            if loop is not None:
                return self._read_soon(keys, cached, loop, fill_cache=True, then=self._format.current_values)
        return self._format.current_values(self._finish_read(keys, cached, fill_cache=True))

    def _off_loop_reads(self) -> asyncio.AbstractEventLoop | None:
        """The running event loop where RocksDB reads may leave it for a writer thread (a writer, and the
        native binding); None otherwise."""
        return _running_loop() if self._writer is not None and reads_off_loop_safe(self._db) else None

    def _read_soon(
        self, keys: Sequence[bytes], cached: tuple[list[bytes | None], list[int]] | None,
        loop: asyncio.AbstractEventLoop, *, fill_cache: bool,
        then: Callable[[list[bytes | None]], list[bytes | None]] | None = None,
    ) -> asyncio.Future[list[bytes | None]]:
        """The values of ``keys`` (``then`` applied to them) once a writer thread read what the row cache
        lacked (``cached``, :meth:`_cached_values`) from RocksDB without the GIL. ``fill_cache``: what the
        read finds goes into the cache, unless a write-through happened meanwhile (it may have written a
        newer value of a key read). The future fails with KvStorageError where the read failed or the
        tablet closed before it ran."""
        self._make_readable()  # on the loop, before any read: it may reopen the database
        missing_keys = list(keys) if cached is None else [keys[position] for position in cached[1]]
        cache_writes = self._cache_writes
        assert self._writer is not None
        reading = asyncio.wrap_future(self._writer.submit(_read_database, self._db, missing_keys), loop=loop)
        answer: asyncio.Future[list[bytes | None]] = loop.create_future()

        def read(done: asyncio.Future[list[bytes | None]]) -> None:
            if answer.cancelled():  # the request went away; its read fills nothing
                return
            if self._closed or done.cancelled() or done.exception() is not None:
                failure = None if done.cancelled() else done.exception()
                answer.set_exception(KvStorageError(
                    f"the read of {self.directory} failed: {failure or 'the kv tablet closed'}"))
                return
            try:
                found = done.result()
                if cached is not None:
                    values, missing = cached
                    self._place_read(values, missing, missing_keys, found,
                                     fill_cache=fill_cache and cache_writes == self._cache_writes)
                    found = values
                answer.set_result(found if then is None else then(found))
            except Exception as exc:  # answered as the failure it is, never left waiting
                answer.set_exception(exc)

        reading.add_done_callback(read)
        return answer

    def prefix_lookup(self, prefixes: Sequence[bytes], limit_per_prefix: int) -> list[list[bytes]]:
        self._check_open()
        results: list[list[bytes]] = []
        for prefix in prefixes:
            rows = self._iterator(prefix)
            try:
                matches: list[bytes] = rows.next(limit_per_prefix, prefix=prefix, keys=False)
            finally:
                rows.close()
            results.append(self._format.current_values(matches))  # type: ignore[arg-type]
        return results

    def limit_scan(self, limit: int, bytes_max: int | None = None) -> tuple[list[bytes], bool]:
        """The first ``limit`` values in key order, and whether ``bytes_max`` cut them short."""
        self._check_open()
        rows = self._iterator()
        try:
            values: list[bytes] = rows.next(limit, bytes_max=bytes_max or 0, keys=False)
        finally:
            rows.close()
        if bytes_max is not None and sum(map(len, values)) > bytes_max:
            return self._format.current_values(values[:-1]), True  # type: ignore[arg-type,return-value]  # the row past the bound is left out
        return self._format.current_values(values), False  # type: ignore[arg-type,return-value]

    def open_scan(self) -> tuple[Iterator[bytes], int, bool]:
        """A point-in-time view for a scan session: ``(values in key order, log offset, is empty)``.

        The iterator is created now, so later writes stay invisible to it, and the log offset (exclusive)
        is the applied offset at this same instant: every change below it is in the view, none above.
        """
        self._check_open()
        rows = self._iterator()  # the view is fixed now
        first = rows.next(SCAN_CHUNK_ROWS, keys=False)
        if not first:
            rows.close()
            return iter(()), self._applied_offset, True
        values: Iterator[bytes] = _chunked_values(rows, first)
        if self._format.upgrader is not None:  # rows of earlier schemas reach the client in the current one
            values = map(self._format.upgrader.value, values)
        return values, self._applied_offset, False

    def create_checkpoint(self, directory: Path) -> Checkpoint:
        """A consistent local checkpoint of the acknowledged state (for a KV snapshot)."""
        self._check_open()
        self._flush_memtables()  # writes skip RocksDB's WAL, so the checkpoint must find them in SSTs
        return create_checkpoint(self._db, directory, self._applied_offset, self._row_count)

    def _flush_memtables(self) -> None:
        self._db.flush()

    @property
    def db(self) -> KvDatabase:
        return self._db

    @property
    def row_format(self) -> TableRowFormat:
        return self._format

    def change_table(self, row_format: TableRowFormat, config: KvConfig) -> None:
        """Apply a change of the table (added columns, altered options) from the next request on. Stored
        and pending values keep the schema they were written with and are upgraded wherever they are read."""
        self._format = row_format
        self._config = KvConfig(self._config.rocksdb, config.delete_behavior, config.changelog_image, config.merge,
                                config.auto_increment, self._config.l0_slowdown_trigger)
        self._merger = create_row_merger(config.merge, row_format)
        if self._auto_increment is not None and config.auto_increment is not None:
            self._auto_increment = AutoIncrementAssigner(config.auto_increment, self._auto_increment.ids, row_format)
        self._missing_rows = None

    # ---- lifecycle ----
    def _check_open(self) -> None:
        if self._closed:
            raise KvStorageError(f"kv tablet {self.directory} is closed")

    def _close_db(self) -> None:
        if self._cache is not None:
            self._cache.close(self._cache_token)
        _close_quietly(self._db, self.directory)

    def _begin_close(self) -> bool:
        """Mark the tablet closed and stop following its log's high watermark; False if it was already."""
        if self._closed:
            return False
        self._closed = True
        self.log.remove_high_watermark_listener(self._apply_committed)
        self.log.remove_high_watermark_listener(self._schedule_catch_up)
        return True

    def close(self, *, flush: bool = True) -> None:
        """Flush and close; after a clean close the next open needs no changelog replay. Without ``flush``
        (its files are deleted next: a dropped table, a replica moved away) the memtables are dropped."""
        if not self._begin_close():
            return
        if flush:
            _flush_quietly(self._flush_memtables, self.directory)
        self._close_db()

    def close_soon(self, executor: Executor) -> Future[None]:
        """:meth:`close`, its flush and RocksDB's close run on ``executor`` (a leader that starts to follow:
        a full memtable's flush is ~0.35 s here, a vector memtable of millions of rows seconds). For the
        loop the tablet is closed at once: its listeners and cached rows go now. The native binding's close
        waits for calls still running on other threads (a write on the writer); whoever opens the bucket's
        RocksDB again waits for the returned future first (RocksDB locks its directory)."""
        if not self._begin_close():
            done: Future[None] = Future()
            done.set_result(None)
            return done
        if self._cache is not None:
            self._cache.close(self._cache_token)
        return executor.submit(_flush_and_close, self._flush_memtables, self._db, self.directory)

    def delete(self) -> None:
        self.close()
        shutil.rmtree(self.directory / "rocksdb", ignore_errors=True)
