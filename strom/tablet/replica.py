"""Replicas hosted by the tablet server: one per bucket, opened on first use.

Opening a bucket means recovering its log (and, for primary-key tables, its RocksDB from the changelog),
which can take a while after a crash, so buckets are opened lazily rather than all at start-up.

A bucket whose storage failed (a full disk: the log refuses appends, RocksDB refuses writes) keeps serving
reads from what it has and is reopened — the same recovery as after a crash — on its next use once the
disk has room again, so writes resume without a restart.

A bucket whose data directory is offline (:mod:`strom.tablet.data_dirs`: gone at start, or vanished while
running) answers StorageError while this server leads it; a follower starts it over, empty, in an online
directory, and replication fills it in from the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from strom.config import (
    KV_BACKPRESSURE_L0_SLOWDOWN_TRIGGER,
    KV_ROCKSDB_BINDING,
    KV_ROW_CACHE_SIZE,
    LOG_FLUSH_INTERVAL_MESSAGES,
    LOG_SEGMENT_FILE_SIZE,
    WRITER_ID_EXPIRATION_TIME,
    Configuration,
)
from strom.errors import (
    InvalidColumnProjectionError,
    InvalidTargetColumnError,
    NonPrimaryKeyTableError,
    NotLeaderOrFollowerError,
    StorageError,
    UnknownTableOrBucketError,
)
from strom.ids import TableBucket
from strom.kv import changelog_replay, rocksdb
from strom.kv.auto_increment import IdCounter
from strom.kv.kv_tablet import (
    BucketDatabase,
    KvConfig,
    KvRestoreNeededError,
    KvTablet,
    open_bucket_database,
    replayed_database,
    reset_instance_id,
)
from strom.kv.rocksdb import RocksDbOptions
from strom.kv.row_cache import RowCache, default_capacity_bytes
from strom.kv.row_format import TableRowFormat
from strom.kv.snapshot import CompletedKvSnapshot, download_snapshot
from strom.log.log_tablet import LogConfig, LogTablet
from strom.metadata.table_info import TableInfo
from strom.records import log_batch
from strom.records.log_batch import LogBatchHeader
from strom.records.row_log import LogBatchDecoder
from strom.remote.storage import RemoteStorage
from strom.tablet.data_dirs import DataDirectories, DataDirectory
from strom.tablet.retained_offsets import RetainedOffsets

log = logging.getLogger(__name__)
_T = TypeVar("_T")

RECOVERY_INTERVAL_S = 1.0
ROCKSDB_WRITER_THREADS = min(4, os.cpu_count() or 1)
"""Buckets whose RocksDB writes run at the same time (each bucket writes one batch at a time, in order)."""
BUCKET_OPENER_THREADS = 4
"""Buckets whose storage opens at the same time (:meth:`ReplicaManager.open_soon`). An open mostly waits for
its fsyncs, so more of them than cores help."""
BACKGROUND_OPENER_THREADS = 2
"""Buckets opening at the same time for the server's own rounds (the remote log manager's first, which opens
every bucket of a restarted server): on threads of their own, so that a request's buckets never queue behind
them (each may replay its changelog for seconds)."""
RECOVERY_FREE_BYTES_MIN = 16 << 20
"""A failed bucket is reopened only when its disk has this much room: reopening needs some, and closing
it while the disk is still full would stop its reads too."""


@dataclass(frozen=True, slots=True)
class _OpenedAhead:
    log: LogTablet | None
    """None: the log was open already."""
    database: BucketDatabase | None
    """None: a log table's bucket."""


def _open_ahead(log_dir: Path | None, log_config: LogConfig, kv_dir: Path | None, kv_config: KvConfig,
                row_cache: RowCache, replay_with: TableRowFormat | None = None, *, open_log: LogTablet | None = None,
                restore: Callable[[LogTablet, Path], bool] | None = None,
                after: Future[None] | None = None) -> _OpenedAhead:
    """A bucket's log (unless ``log_dir`` is None) and RocksDB (unless ``kv_dir`` is None), opened on a thread
    (:meth:`Replica.open_ahead`). Neither touches the event loop until it is handed to it. ``open_log``: the
    log, open already (a follower that now leads; the loop holds its segments meanwhile). ``restore``: puts
    the bucket's latest KV snapshot where its RocksDB is missing (a replica that never held it, or a rebuilt
    server). With ``replay_with`` (a leader's bucket), the committed changelog that RocksDB lacks (after a
    crash, since the snapshot, or since this replica last led) is replayed into it here too
    (:func:`changelog_replay.catch_up_opened`). ``after``: the bucket's RocksDB still closing on another
    thread (RocksDB locks its directory), waited for first."""
    if after is not None:
        wait_for_futures([after])
    log_tablet = LogTablet.open(log_dir, log_config) if log_dir is not None else None
    changelog = log_tablet if log_tablet is not None else open_log
    database = None
    try:
        if kv_dir is not None and restore is not None and changelog is not None and not (kv_dir / "rocksdb").exists():
            restore(changelog, kv_dir)
        database = open_bucket_database(kv_dir, kv_config, row_cache) if kv_dir is not None else None
        if replay_with is not None and changelog is not None and database is not None and kv_dir is not None:
            rows = row_cache.replayed_rows()
            if changelog_replay.catch_up_opened(database, changelog, replay_with, rows.add):
                database = replayed_database(kv_dir, kv_config, database, rows)
        return _OpenedAhead(log_tablet, database)
    except BaseException:
        if database is not None:
            database.db.close()
        if log_tablet is not None:
            log_tablet.close()
        raise


async def _opened_ahead(replicas: Sequence[Replica]) -> None:
    """Done once none of ``replicas`` is opening ahead any more: what each opens ahead *now* is waited for,
    since a request may move a bucket's queued open to its own threads meanwhile (:meth:`Replica.hurry_ahead`)."""
    for replica in replicas:
        while (ahead := replica.opening_ahead) is not None and not ahead.done():
            await asyncio.wait([asyncio.wrap_future(ahead)])  # not cancelled with the waiter, unlike an await


async def _answered_once_open(opening: Awaitable[Any], answer: Callable[[], _T]) -> _T:
    await opening
    return answer()


def _restore_snapshot(remote: RemoteStorage, snapshot: CompletedKvSnapshot, bucket: TableBucket,
                      log_tablet: LogTablet, kv_dir: Path) -> bool:
    """Put ``snapshot``'s files in ``kv_dir/rocksdb`` if the changelog still holds everything after it (its
    offset lies in the log's range, so a replay brings the restored state up to date); False if it does not.
    Blocking (a download): on the loop where the bucket opens there, else on its opener's thread."""
    if not log_tablet.log_start_offset <= snapshot.log_offset <= log_tablet.high_watermark:
        log.error("%s: latest snapshot %d covers offset %d, outside the changelog [%d, %d]", bucket,
                  snapshot.snapshot_id, snapshot.log_offset, log_tablet.log_start_offset, log_tablet.high_watermark)
        return False
    log.warning("%s: restoring RocksDB from snapshot %d (log offset %d)", bucket, snapshot.snapshot_id,
                snapshot.log_offset)
    target = kv_dir / "rocksdb"
    download_snapshot(remote, snapshot, target)
    reset_instance_id(target)
    return True


def _close_opened(opened: _OpenedAhead) -> None:
    if opened.database is not None:
        opened.database.db.close()
    if opened.log is not None:
        opened.log.close()


class ReplicaStorage(Protocol):
    """What a replica takes from the server that hosts it to open its log and KV state (the
    :class:`ReplicaManager`): settings shared by every bucket, one row format per table, the row cache,
    and a restore from the bucket's latest snapshot."""

    log_config: LogConfig
    id_counter: IdCounter | None
    row_cache: RowCache
    rocksdb_writer: Executor | None

    def row_format(self, table: TableInfo) -> TableRowFormat: ...

    def kv_config(self, table: TableInfo) -> KvConfig: ...

    def restore_from_snapshot(self, replica: Replica, log_tablet: LogTablet, kv_dir: Path) -> bool: ...

    def start_opening(self, table: TableInfo, bucket: TableBucket, directory: Path, *,
                      open_log: LogTablet | None = None, replay: bool = False, background: bool = False,
                      after: Future[None] | None = None) -> Future[_OpenedAhead]: ...

    def replace_offline(self, replica: Replica) -> Path: ...


class Replica:
    """One bucket this server leads. Owned by the event loop."""

    def __init__(self, table: TableInfo, bucket: TableBucket, directory: Path, storage: ReplicaStorage) -> None:
        assert bucket.table_id == table.table_id
        self.table = table
        self.bucket = bucket
        self.directory = directory
        self._storage = storage
        self._log: LogTablet | None = None
        self._kv: KvTablet | None = None
        self.stopped = False
        self._next_recovery = 0.0
        self.is_leader = True
        """False while this server follows the bucket's leader (a replicated bucket): clients are refused, the
        log is fetched from the leader, and KV state is kept only as a standby (:attr:`keeps_standby`)."""
        self.leader_epoch = 0
        self.offline: str | None = None
        """Why its data directory cannot be used (None while it can): a leader refuses with StorageError."""
        self._standby_failed = False
        """The standby state could not open in this role: not tried again on every use (each follower fetch
        opens the replica) until the replica's KV state is dropped (a role change)."""
        self._ahead: Future[_OpenedAhead] | None = None
        """Its storage, opening on a thread ahead of its first use (:meth:`open_ahead`)."""
        self._ahead_in_background = False
        """... for the server's own round (:meth:`hurry_ahead` moves it to the requests' threads)."""
        self._ahead_database: BucketDatabase | None = None
        """The RocksDB opened ahead, until the KV state takes it."""
        self._kv_closing: Future[None] | None = None
        """The KV state's flush and close, running on a thread (:meth:`close_kv`)."""

    @property
    def is_open(self) -> bool:
        return self._log is not None

    @property
    def is_kv(self) -> bool:
        return self.table.has_primary_key

    @property
    def keeps_standby(self) -> bool:
        """A follower of a primary-key table with ``table.kv.standby-replica.enabled``: it keeps the KV state
        warm, applying the changelog it replicates, so it serves at once when it leads."""
        return self.is_kv and not self.is_leader and self.table.options.standby_replica

    @property
    def writable_open(self) -> bool:
        """Whether what a write to the bucket needs is open: its log, and a primary-key bucket's KV state."""
        return self._log is not None and (self._kv is not None or not self.is_kv)

    @property
    def may_open_ahead(self) -> bool:
        """Whether :meth:`open_ahead` may start opening the storage that :meth:`open` would open, none of it
        opening yet: a leader's closed log, or the KV state of a primary-key bucket it leads (or keeps a
        standby of)."""
        if self._ahead is not None or self._ahead_database is not None or self.stopped or self.offline is not None:
            return False
        if not self.is_kv:
            return self.is_leader and self._log is None
        return self._kv is None and (self.is_leader or (self.keeps_standby and not self._standby_failed))

    def open_ahead(self, *, background: bool = False) -> None:
        """Start opening the bucket's log (unless open) and RocksDB (a primary-key bucket's) on a thread:
        their files' creation and fsyncs, a snapshot's restore, and a leader's changelog replay, without the
        event loop. :meth:`open` takes them from there, waiting for the thread if it is still at work. Only
        where :attr:`may_open_ahead`; ``background``: for the server's own round, not a request."""
        self._ahead = self._storage.start_opening(self.table, self.bucket, self.directory, open_log=self._log,
                                                  replay=self.is_leader, background=background,
                                                  after=self._kv_closing)
        self._ahead_in_background = background

    def hurry_ahead(self) -> None:
        """A request waits for this bucket: an open still queued for the server's own round (behind others
        that may replay for seconds) is cancelled and started again on the requests' threads."""
        if self._ahead is not None and self._ahead_in_background and self._ahead.cancel():
            self._ahead = None
            if self.may_open_ahead:
                self.open_ahead()

    def adopt_ahead(self, ahead: Future[_OpenedAhead]) -> None:
        """Take the storage :meth:`ReplicaManager.open_new_soon` is opening for this new replica."""
        assert self._ahead is None and self._log is None, "only a new replica adopts what was opened for it"
        self._ahead, self._ahead_in_background = ahead, False

    @property
    def opening_ahead(self) -> Future[Any] | None:
        """What :meth:`open_ahead` is opening, until :meth:`open` takes it."""
        return self._ahead

    @property
    def opening_on_thread(self) -> bool:
        """Whether its storage is opening on a thread now: using it from the loop would wait for the thread
        there (a new leader's replay may take seconds)."""
        return self._ahead is not None and not self._ahead.done()

    def _take_ahead(self) -> None:
        """Wait for what :meth:`open_ahead` is opening and take it: the log becomes the replica's, the
        RocksDB waits for the KV state. An open that failed is left to :meth:`open`, which meets the
        failure itself, and so is one still queued behind others' (cancelled): a caller that did not wait
        for it off the loop (:meth:`ReplicaManager.open_soon`) waits for at most the bucket's own open."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead.cancel():  # still queued: the bucket opens here now, not after those before it
            return
        try:
            opened = ahead.result()
        except Exception as exc:  # concurrent.futures' CancelledError too
            log.debug("%s: opening its storage ahead failed (%r); it opens on use", self.bucket, exc)
            return
        if opened.log is not None:
            assert self._log is None, "the log opens ahead only while it is closed, and opening takes the ahead first"
            self._log = opened.log
        self._ahead_database = opened.database

    def _kv_closed(self) -> None:
        """Wait for the KV state's close still running on a thread (:meth:`close_kv` with a ``closer``):
        before its RocksDB opens again here, or the replica's files close or go."""
        closing, self._kv_closing = self._kv_closing, None
        if closing is not None and not closing.done():
            log.info("%s: waiting for its KV state's close on a thread", self.bucket)
            wait_for_futures([closing])

    def _discard_ahead_database(self) -> None:
        """Close a RocksDB opened ahead that no KV state took (the replica closes or stops leading). An open
        still queued is cancelled; one at work is waited for, and so is a close of the KV state."""
        self._take_ahead()
        self._kv_closed()
        database, self._ahead_database = self._ahead_database, None
        if database is not None:
            database.db.close()

    def open(self) -> None:
        """Open the log and, while leading a primary-key bucket (or following one as a standby), its KV state."""
        if self.stopped:
            raise UnknownTableOrBucketError(f"{self.bucket} is no longer hosted here")
        if self._kv is not None:  # open KV state comes with an open log: nothing to open (every lookup asks)
            if self._kv.standby and self.is_leader:
                self._promote_standby()
            return
        opened_log = self._log is None
        log_tablet = self.open_log()
        if self.keeps_standby and not self._standby_failed:
            self._open_standby(log_tablet)
        elif self.is_kv and self.is_leader:
            try:
                self._kv = self._open_kv(log_tablet)
            except BaseException:
                if opened_log:
                    log_tablet.close()
                    self._log = None
                raise

    def _open_standby(self, log_tablet: LogTablet) -> None:
        """Open the follower's warm KV state; one that cannot open leaves the follower without it (it still
        replicates the log, and its state opens as a leader's would if it leads)."""
        try:
            self._kv = self._open_kv(log_tablet, standby=True)
        except Exception as exc:
            self._standby_failed = True
            log.warning("%s: no standby KV state on this follower: %s", self.bucket, exc)
            return
        log.info("%s: standby KV state open at offset %d", self.bucket, self._kv.applied_offset)

    def _promote_standby(self) -> None:
        """The follower whose state is warm leads now; a standby that lost its log is reopened as a new
        leader's state is (from a snapshot)."""
        assert self._kv is not None and self._log is not None
        try:
            self._kv.promote()
        except KvRestoreNeededError as exc:
            log.warning("%s: the standby state cannot lead (%s); reopening it", self.bucket, exc)
            self.close_kv()
            self._kv = self._open_kv(self._log)
            return
        log.info("%s: the standby KV state leads, at offset %d", self.bucket, self._kv.applied_offset)

    def open_log(self) -> LogTablet:
        """Open the log alone (a leader sets its replication limit before its KV state catches up; a
        follower's fetch reads it while the new leader's KV state still opens on a thread)."""
        if self._log is None:
            self._take_ahead()  # what opens ahead with the log: the log is taken from it
        if self._log is None:
            self._check_online()
            self._log = LogTablet.open(self.directory / "log", self._storage.log_config)
        return self._log

    def _check_online(self) -> None:
        """A bucket whose directory is offline: refused while leading (its data is not here); a follower
        starts over in another directory (its leader has the data)."""
        if self.offline is None:
            return
        if self.is_leader:
            raise StorageError(self.offline)
        self.directory = self._storage.replace_offline(self)
        self.offline = None

    def go_offline(self, reason: str) -> None:
        """Its data directory is gone: close what is open (failing the writes that wait on it) and refuse
        from now on."""
        self.offline = reason
        with contextlib.suppress(Exception):
            self._discard_ahead_database()
        kv, log_tablet, self._kv, self._log = self._kv, self._log, None, None
        if log_tablet is not None:
            with contextlib.suppress(Exception):
                log_tablet.fail_unacknowledged(StorageError(reason))
        for part in (kv, log_tablet):
            if part is not None:
                try:
                    part.close()
                except Exception as exc:  # its files are gone: what it still held is lost with them
                    log.warning("%s: closing after its data directory went offline: %s", self.bucket, exc)

    def close_kv(self, closer: Executor | None = None) -> None:
        """Drop the KV state (this replica now follows): unacknowledged writes die with it; the next time it
        leads, RocksDB is caught up from the log. ``closer``: RocksDB's flush and close run there, off the
        loop (:meth:`KvTablet.close_soon`); the bucket's RocksDB opens again only once they are done."""
        self._standby_failed = False
        self._discard_ahead_database()
        kv, self._kv = self._kv, None
        if kv is None:
            return
        if closer is None:
            kv.close()
        else:
            self._kv_closing = kv.close_soon(closer)

    @property
    def serving_kv(self) -> KvTablet | None:
        """The KV state a lookup reads at once: open, leading and healthy. None where :attr:`kv` (after
        :meth:`ReplicaManager.get`) decides instead: it opens the state, promotes a standby, recovers a failed
        bucket or refuses one this server does not lead."""
        kv = self._kv
        if kv is None or kv.standby or kv.failed is not None or not self.is_leader or self.stopped:
            return None
        return kv if self._log is not None and self._log.failed is None else None

    @property
    def storage_failure(self) -> Exception | None:
        """Why the open log or RocksDB refuses writes, if it does."""
        if self._log is None:
            return None
        if self._log.failed is not None:
            return self._log.failed
        return self._kv.failed if self._kv is not None else None

    def recover_if_failed(self, before_close: Callable[[TableBucket], object] | None = None) -> bool:
        """Reopen a bucket whose storage failed, at most once a second and only once its disk has room;
        True if it was reopened. ``before_close`` releases what holds the old RocksDB (scan sessions)."""
        failure = self.storage_failure
        if failure is None or self.stopped or time.monotonic() < self._next_recovery:
            return False
        self._next_recovery = time.monotonic() + RECOVERY_INTERVAL_S
        assert self._log is not None
        if self._log.flush_in_flight:
            return False
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            return False
        if free < RECOVERY_FREE_BYTES_MIN:
            return False
        log.warning("%s: reopening after a storage failure (%s); %d MB free", self.bucket, failure, free >> 20)
        if before_close is not None:
            before_close(self.bucket)
        self._discard_ahead_database()  # a thread may be reading the log
        if self._kv is not None:
            self._kv.close()
        self._log.close()
        self._log = self._kv = None
        self.open()  # a failure here is the request's error; the next use tries again
        log.warning("%s: reopened; writes accepted again", self.bucket)
        return True

    def _open_kv(self, log_tablet: LogTablet, *, standby: bool = False) -> KvTablet:
        """Open the bucket's RocksDB, restoring it from the latest KV snapshot when the local copy is gone
        (a rebuilt server) or can no longer be caught up from the changelog."""
        kv_dir = self.directory / "kv"

        def open_tablet(database: BucketDatabase | None = None) -> KvTablet:
            try:
                return KvTablet(
                    kv_dir, log_tablet, self._storage.row_format(self.table), self._storage.kv_config(self.table),
                    self._storage.id_counter, self._storage.row_cache, self._storage.rocksdb_writer,
                    standby=standby, database=database,
                )
            except BaseException:
                if database is not None:
                    database.db.close()
                raise

        self._take_ahead()
        self._kv_closed()
        ahead, self._ahead_database = self._ahead_database, None  # only where no snapshot is restored
        if ahead is None and not (kv_dir / "rocksdb").exists() and \
                self._storage.restore_from_snapshot(self, log_tablet, kv_dir):
            return open_tablet()
        try:
            return open_tablet(ahead)
        except KvRestoreNeededError:
            if not self._storage.restore_from_snapshot(self, log_tablet, kv_dir):
                raise
            return open_tablet()

    @property
    def log(self) -> LogTablet:
        """The open log; a primary-key leader's KV state opens where it is used (:attr:`kv`)."""
        return self.open_log()

    @property
    def kv(self) -> KvTablet:
        self.open()
        if self._kv is None:
            raise NonPrimaryKeyTableError(f"Table '{self.table.path}' is not a primary key table.")
        return self._kv

    @property
    def kv_if_open(self) -> KvTablet | None:
        return self._kv

    def log_decoder(self) -> LogBatchDecoder:
        """Decodes this table's log batches (ARROW, INDEXED or COMPACTED) of its current schema into Arrow."""
        return self._storage.row_format(self.table).log_decoder

    def check_produced(self, data: bytes | bytearray, batches: Sequence[tuple[int, LogBatchHeader]]) -> None:
        """Refuse produced batches that do not decode in the table's format and one of its schemas (a
        writer may still use the schema it knew before columns were added)."""
        row_format = self._storage.row_format(self.table)
        for position, header in batches:
            row_format.read_log_batch(data, position, header)

    def upgrade_log(self, records: bytes) -> bytes:
        """Fetched batches with those of earlier schemas re-encoded in the current one."""
        return self._storage.row_format(self.table).upgrade_log(records)

    def project_records(self, records: bytes, columns: list[int]) -> bytes:
        """Re-encode fetched batches with only ``columns`` (FetchLog projection pushdown, ARROW logs only)."""
        row_format = self._storage.row_format(self.table)
        field_count = len(row_format.arrow_schema)
        if not columns or any(c < 0 or c >= field_count for c in columns) or len(set(columns)) != len(columns):
            raise InvalidColumnProjectionError(
                f"Projection {columns} is invalid for table '{self.table.path}' with {field_count} columns."
            )
        parts = [
            log_batch.project(records, position, header, row_format.arrow_schema, columns, row_format.log_compression)
            for position, header in log_batch.iter_batches(records, verify_crc=False)
        ]
        return b"".join(parts)

    def validate_target_columns(self, columns: list[int]) -> None:
        """Partial updates must name existing columns and include the whole primary key."""
        row_format = self._storage.row_format(self.table)
        field_count = len(row_format.arrow_schema)
        if any(c < 0 or c >= field_count for c in columns):
            raise InvalidTargetColumnError(f"Target columns {columns} are out of range for {field_count} columns.")
        missing = [i for i in row_format.primary_key_indexes if i not in columns]
        if missing:
            raise InvalidTargetColumnError(
                f"The target columns {columns} of a partial update must include the primary key columns {missing}."
            )

    def close(self, *, deleting: bool = False) -> None:
        """Stop hosting the bucket; ``deleting``: its files are removed next, so RocksDB is not flushed."""
        self.stopped = True
        self._discard_ahead_database()
        if self._kv is not None:
            self._kv.close(flush=not deleting)
        if self._log is not None:
            self._log.close()


class ReplicaManager:
    """All replicas of this tablet server, keyed by bucket."""

    def __init__(
        self,
        data_dir: Path | DataDirectories,
        config: Configuration,
        remote: RemoteStorage | None = None,
        latest_snapshot: Callable[[TableBucket], CompletedKvSnapshot | None] = lambda bucket: None,
        id_counter: IdCounter | None = None,
        *,
        before_reopen: Callable[[TableBucket], object] | None = None,
        resolve_bucket: Callable[[TableBucket], TableInfo | None] | None = None,
    ) -> None:
        """``remote`` and ``latest_snapshot`` (the coordinator's view) let a bucket be restored from its
        latest KV snapshot; without them a bucket can only be recovered from its local changelog.
        ``before_reopen(bucket)`` runs before a failed bucket is reopened (the scan sessions on it end
        there); ``resolve_bucket(bucket)``, in a cluster, is the table of a bucket assigned to this server
        that it does not host yet (else None). ``data_dir``: the data directories, or one directory whose
        buckets lie right under it."""
        self.directories = data_dir if isinstance(data_dir, DataDirectories) else DataDirectories.plain(data_dir)
        self.directories.on_offline(self._directory_offline)
        self._config = config
        self._remote = remote
        self._latest_snapshot = latest_snapshot
        self.id_counter = id_counter
        """Reserves auto-increment ids (the metadata store's durable counters)."""
        self.log_config = LogConfig(
            segment_size_bytes_max=config.get(LOG_SEGMENT_FILE_SIZE),
            flush_interval_messages=config.get(LOG_FLUSH_INTERVAL_MESSAGES),
            writer_expiration_ms=config.get_ms(WRITER_ID_EXPIRATION_TIME),
        )
        rocksdb.use_binding(config.get(KV_ROCKSDB_BINDING))  # one binding per process, chosen at start
        self._rocksdb = RocksDbOptions.from_config(config)  # every bucket's kv.rocksdb.* options
        configured = config.get(KV_ROW_CACHE_SIZE)
        self.row_cache = RowCache(default_capacity_bytes() if configured is None else configured)
        """Current rows of every primary-key bucket hosted here (``kv.row-cache.size``)."""
        self.rocksdb_writer: Executor | None = None
        """Threads writing the buckets' committed batches to RocksDB while the event loop goes on; only with
        a binding whose write releases the GIL (with rocksdict a thread would stop the loop all the same)."""
        self.bucket_opener: Executor | None = None
        """Threads opening the storage of buckets a request is about to open (:meth:`open_soon`); only with a
        binding whose RocksDB open releases the GIL."""
        self.background_opener: Executor | None = None
        """Threads opening buckets for the server's own rounds (:data:`BACKGROUND_OPENER_THREADS`)."""
        self.kv_closer: Executor | None = None
        """A thread flushing and closing the RocksDB of buckets that stopped leading (``Replica.close_kv``);
        of its own, since an open ahead may wait for a close."""
        if rocksdb.binding() == "native":
            self.rocksdb_writer = ThreadPoolExecutor(ROCKSDB_WRITER_THREADS, thread_name_prefix="strom-rocksdb-write")
            self.bucket_opener = ThreadPoolExecutor(BUCKET_OPENER_THREADS, thread_name_prefix="strom-bucket-open")
            self.background_opener = ThreadPoolExecutor(BACKGROUND_OPENER_THREADS,
                                                        thread_name_prefix="strom-bucket-open-background")
            self.kv_closer = ThreadPoolExecutor(1, thread_name_prefix="strom-kv-close")
        self._replicas: dict[TableBucket, Replica] = {}
        self._new_ahead: dict[TableBucket, Future[_OpenedAhead]] = {}
        """Storage opening for buckets this server is about to host (:meth:`open_new_soon`)."""
        self._made_ahead: set[TableBucket] = set()
        """... of those, the ones whose directory the opening made (removed again if no replica takes it)."""
        self.retained = RetainedOffsets()
        """What the coordinator said the buckets must keep (NotifyKvSnapshotOffset, NotifyLakeTableOffset)."""
        self._row_formats: dict[tuple[int, int], TableRowFormat] = {}
        self.before_reopen = before_reopen
        self.resolve_bucket = resolve_bucket

    def replica_directory(self, table: TableInfo, bucket: TableBucket) -> Path:
        """Where the bucket lives, placed in a data directory now if it has no place yet."""
        return self.directories.directory_of(table, bucket)

    def replace_offline(self, replica: Replica) -> Path:
        """A followed bucket whose directory is offline starts over, empty, in an online one."""
        self.directories.forget(replica.bucket)
        directory = self.directories.directory_of(replica.table, replica.bucket)
        log.warning("%s: %s; as a follower it starts over in %s and replication fills it in from the leader",
                    replica.bucket, replica.offline, directory)
        return directory

    def _directory_offline(self, directory: DataDirectory) -> None:
        """A data directory vanished: its buckets close (scan sessions first) and answer StorageError."""
        for replica in list(self._replicas.values()):
            reason = self.directories.offline_reason(replica.bucket)
            if reason is None or replica.stopped or replica.offline is not None:
                continue
            if self.before_reopen is not None:
                self.before_reopen(replica.bucket)
            replica.go_offline(reason)

    def row_format(self, table: TableInfo) -> TableRowFormat:
        key = (table.table_id, table.schema_id)
        row_format = self._row_formats.get(key)
        if row_format is None:
            row_format = self._row_formats[key] = TableRowFormat(table)
        return row_format

    def kv_config(self, table: TableInfo) -> KvConfig:
        return KvConfig.for_table(table, self._rocksdb, self._config.get(KV_BACKPRESSURE_L0_SLOWDOWN_TRIGGER))

    def restore_from_snapshot(self, replica: Replica, log_tablet: LogTablet, kv_dir: Path) -> bool:
        """Put the latest usable snapshot's files in ``kv_dir/rocksdb``; False if there is none (see
        :func:`_restore_snapshot`)."""
        snapshot = self._latest_snapshot(replica.bucket)
        if snapshot is None or self._remote is None:
            return False
        return _restore_snapshot(self._remote, snapshot, replica.bucket, log_tablet, kv_dir)

    def _snapshot_restore(self, table: TableInfo, directory: Path,
                          bucket: TableBucket) -> Callable[[LogTablet, Path], bool] | None:
        """What restores a primary-key bucket in ``directory`` that has no RocksDB from its latest snapshot,
        chosen here (on the loop, where the coordinator's view is read) and run where the bucket opens;
        None: it has its RocksDB, or no snapshot to restore."""
        if not table.has_primary_key or self._remote is None or (directory / "kv" / "rocksdb").exists():
            return None
        snapshot = self._latest_snapshot(bucket)
        return None if snapshot is None else functools.partial(_restore_snapshot, self._remote, snapshot, bucket)

    def become_leader(self, table: TableInfo, buckets: Sequence[TableBucket]) -> None:
        for bucket in buckets:
            existing = self._replicas.get(bucket)
            if existing is not None and not existing.stopped:
                continue
            replica = self._replicas[bucket] = Replica(table, bucket, self.replica_directory(table, bucket), self)
            replica.offline = self.directories.offline_reason(bucket)
            ahead = self._new_ahead.pop(bucket, None)
            self._made_ahead.discard(bucket)
            if ahead is not None:
                replica.adopt_ahead(ahead)

    def change_table(self, table: TableInfo) -> None:
        """The table changed (columns added, options altered): every hosted bucket serves it from now on."""
        for key in [key for key in self._row_formats if key[0] == table.table_id]:
            del self._row_formats[key]
        for replica in self.hosted(table.table_id):
            replica.table = table
            kv = replica.kv_if_open
            if kv is not None and kv.standby and not replica.keeps_standby:
                replica.close_kv()  # table.kv.standby-replica.enabled turned off: a follower keeps the log only
            elif kv is not None:
                kv.change_table(self.row_format(table), self.kv_config(table))
            elif replica.keeps_standby and replica.is_open:
                replica.open()  # turned on: the follower's state opens and catches up

    def serving_kv(self, bucket: TableBucket) -> KvTablet | None:
        """The KV state of a bucket this server leads, where a lookup reads it at once (one dictionary lookup
        and a few checks, :attr:`Replica.serving_kv`); None: ``get(bucket).kv`` decides, after
        :meth:`open_soon`."""
        replica = self._replicas.get(bucket)
        return None if replica is None else replica.serving_kv

    def get(self, bucket: TableBucket) -> Replica:
        """The open replica of ``bucket`` that this server leads; raises UnknownTableOrBucketError if it is not
        hosted here, NotLeaderOrFollowerError if this server follows it."""
        replica = self.get_hosted(bucket)
        if not replica.is_leader:
            raise NotLeaderOrFollowerError(f"{bucket} is led by another tablet server (epoch {replica.leader_epoch})")
        return replica

    def replica(self, bucket: TableBucket) -> Replica:
        """The hosted replica of ``bucket``, its storage not necessarily open (the replication manager
        sets its role first). Raises UnknownTableOrBucketError."""
        replica = self._replicas.get(bucket)
        if replica is None or replica.stopped:
            raise UnknownTableOrBucketError.not_hosted(bucket)
        return replica

    def _hosted_or_assigned(self, bucket: TableBucket) -> Replica | None:
        """The replica of ``bucket`` if this server hosts it or (in a cluster) it was assigned here; not opened."""
        replica = self._replicas.get(bucket)
        if (replica is None or replica.stopped) and self.resolve_bucket is not None:
            table = self.resolve_bucket(bucket)  # a cluster's tablet server takes a bucket assigned to it
            if table is not None:
                self.become_leader(table, [bucket])
                replica = self._replicas.get(bucket)
        return None if replica is None or replica.stopped else replica

    def open_soon(self, buckets: Iterable[TableBucket], *, background: bool = False) -> asyncio.Future[Any] | None:
        """Start opening on threads, all at once, the storage of each of ``buckets`` that a request is about
        to open; a future done once every one is open ahead (None: none is to open). A request that awaits it
        before it uses the buckets (TabletService's writes and lookups) leaves the event loop to the server's
        other clients meanwhile, and waits for the slowest bucket instead of their sum: a primary-key bucket
        is ~7 ms here, mostly its files' creation and fsyncs, and a leader's changelog replay after a crash
        (~2 µs a record) is done there too. What is left of the recovery stays on the loop, where :meth:`get`
        finishes each bucket's opening. ``background``: the server's own round opens them, on threads of its
        own (:data:`BACKGROUND_OPENER_THREADS`)."""
        if self.bucket_opener is None:
            return None
        opening: list[Replica] = []
        for bucket in buckets:
            replica = self._replicas.get(bucket)
            if replica is not None and replica.writable_open:
                continue  # the common case, decided in one lookup
            try:
                replica = self._hosted_or_assigned(bucket)
                if replica is None:
                    continue
                if replica.may_open_ahead:
                    replica.open_ahead(background=background)
                elif not background:
                    replica.hurry_ahead()
            except Exception:  # the request meets it when it opens the bucket, and answers it for that bucket
                continue
            if replica.opening_ahead is not None:
                opening.append(replica)
        # shielded: a request cancelled while it waits must not cancel the opens that other requests await
        return asyncio.shield(asyncio.ensure_future(_opened_ahead(opening))) if opening else None

    async def opened(self, buckets: Iterable[TableBucket], *, background: bool = False) -> None:
        """:meth:`open_soon`, waited for: done once each of ``buckets`` that opens on a thread is open there."""
        opening = self.open_soon(buckets, background=background)
        if opening is not None:
            await opening

    def once_open(self, buckets: Iterable[TableBucket], answer: Callable[[], _T]) -> _T | Awaitable[_T]:
        """``answer()`` now, or, where some of ``buckets`` open on threads first (:meth:`open_soon`), a
        coroutine of it once they are: a request that reads a bucket's KV state does not wait on the event
        loop for its open (a new leader's restore and replay)."""
        opening = self.open_soon(buckets)
        if opening is None:
            return answer()
        return _answered_once_open(opening, answer)

    def open_new_soon(self, table: TableInfo, buckets: Iterable[TableBucket]) -> asyncio.Future[Any] | None:
        """Start opening on threads, all at once, the storage of each of ``buckets`` that this server is told
        to lead and does not host yet: a new table's or partition's buckets, ones moved here, and a
        restarted server's, whose directories are there (their changelog replays there too, as a request's
        buckets' do); a future done once every one is open (None: none is to open). :meth:`become_leader`
        hands each to the replica it makes; :meth:`discard_new_ahead` closes what none took, and removes the
        directories it made. A bucket a snapshot may restore (a primary-key bucket without RocksDB) opens as
        before, where the restore is decided."""
        if self.bucket_opener is None:
            return None
        opening: list[asyncio.Future[Any]] = []
        for bucket in buckets:
            ahead = self._new_ahead.get(bucket)
            if ahead is None:
                hosted = self._replicas.get(bucket)
                if (hosted is not None and not hosted.stopped) or self.directories.offline_reason(bucket) is not None:
                    continue
                directory = self.replica_directory(table, bucket)  # placed now, where become_leader finds it
                if not directory.exists():
                    self._made_ahead.add(bucket)
                ahead = self._new_ahead[bucket] = self.start_opening(table, bucket, directory, replay=True)
            opening.append(asyncio.wrap_future(ahead))
        # shielded: a request cancelled while it waits must not cancel the opens that other requests await
        return asyncio.shield(asyncio.gather(*opening, return_exceptions=True)) if opening else None

    def start_opening(self, table: TableInfo, bucket: TableBucket, directory: Path, *,
                      open_log: LogTablet | None = None, replay: bool = False, background: bool = False,
                      after: Future[None] | None = None) -> Future[_OpenedAhead]:
        """Open, on :attr:`bucket_opener` (:attr:`background_opener` if ``background``), the storage of
        ``table``'s bucket in ``directory``: its log unless ``open_log`` is it, open already, and a
        primary-key table's RocksDB, restored from the bucket's latest snapshot where it is missing, and
        with the committed changelog it lacks replayed if ``replay`` (the bucket is led here). The open
        log's segments are held while the thread may read them. ``after``: the bucket's KV state still
        closing on :attr:`kv_closer`, waited for first."""
        opener = self.background_opener if background else self.bucket_opener
        assert opener is not None, "storage opens ahead with the native binding only"
        kv_dir = directory / "kv" if table.has_primary_key else None
        replay_with = self.row_format(table) if replay and kv_dir is not None else None
        restore = self._snapshot_restore(table, directory, bucket)
        ahead = opener.submit(_open_ahead, directory / "log" if open_log is None else None, self.log_config, kv_dir,
                              self.kv_config(table), self.row_cache, replay_with, open_log=open_log, restore=restore,
                              after=after)
        if open_log is not None and (replay_with is not None or restore is not None):
            release = open_log.hold_segments()
            ahead.add_done_callback(lambda _ahead: release())
        return ahead

    async def discard_new_ahead(self, buckets: Iterable[TableBucket]) -> None:
        """Close what :meth:`open_new_soon` opened for any of ``buckets`` that no replica took (this server
        was not made a replica of it after all), and remove the directory if it made it."""
        for bucket in buckets:
            ahead = self._new_ahead.pop(bucket, None)
            made = bucket in self._made_ahead
            self._made_ahead.discard(bucket)
            if ahead is None:
                continue
            try:
                opened = await asyncio.wrap_future(ahead)
            except Exception:  # nothing was left open
                continue
            _close_opened(opened)
            if made and opened.log is not None and bucket not in self._replicas:
                await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, opened.log.directory.parent, True)
                self.directories.forget(bucket)

    def get_hosted(self, bucket: TableBucket) -> Replica:
        """The replica of ``bucket``, leader or follower, its log open."""
        replica = self._hosted_or_assigned(bucket)
        if replica is None:
            raise UnknownTableOrBucketError.not_hosted(bucket)
        replica.open_log()  # a primary-key leader's KV state opens where it is used (Replica.kv)
        if replica.storage_failure is not None:  # else nothing to recover from: the common case, one check
            self.directories.check()  # the failure may be its directory vanishing: then it goes offline now
            replica.open_log()
            replica.recover_if_failed(self.before_reopen)
        return replica

    def hosted(self, table_id: int | None = None) -> list[Replica]:
        return [r for r in self._replicas.values() if table_id is None or r.bucket.table_id == table_id]

    async def stop_replicas(self, table_id: int, partition_id: int | None, *, delete: bool) -> None:
        stopped = [
            replica
            for bucket, replica in list(self._replicas.items())
            if bucket.table_id == table_id and (partition_id is None or bucket.partition_id == partition_id)
        ]
        for replica in stopped:
            del self._replicas[replica.bucket]
            replica.close(deleting=delete and replica.offline is None)
        if delete and stopped:
            online = [replica for replica in stopped if replica.offline is None]  # an offline one's is not ours
            directories = {replica.directory for replica in online}
            if partition_id is None:
                directories = {replica.directory.parent if replica.bucket.partition_id is None
                               else replica.directory.parent.parent for replica in online}
            loop = asyncio.get_running_loop()
            for directory in directories:
                await loop.run_in_executor(None, shutil.rmtree, directory, True)
            self.directories.forget_table(table_id, partition_id)
        if delete:
            self.retained.forget(table_id, partition_id)

    async def stop_bucket(self, bucket: TableBucket) -> None:
        """Stop hosting one bucket and delete its data (its replica moved to another server)."""
        replica = self._replicas.pop(bucket, None)
        if replica is None:
            return
        if self.before_reopen is not None:
            self.before_reopen(bucket)  # scan sessions end before the RocksDB they read closes
        replica.close(deleting=replica.offline is None)
        if replica.offline is None:  # an offline directory's files are not touched (another process may own them)
            await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, replica.directory, True)
        self.directories.forget(bucket)

    def close(self) -> None:
        for replica in self._replicas.values():
            replica.close()
        self._replicas.clear()
        for ahead in self._new_ahead.values():
            with contextlib.suppress(Exception):
                _close_opened(ahead.result())
        self._new_ahead.clear()
        if self.rocksdb_writer is not None:
            self.rocksdb_writer.shutdown(wait=True)
        for executor in (self.bucket_opener, self.background_opener, self.kv_closer):
            if executor is not None:
                executor.shutdown(wait=True)
