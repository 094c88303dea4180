"""A bucket's storage opened ahead, on a thread (``ReplicaManager.open_soon``): its log and RocksDB open off
the event loop and the replica takes them when it opens; a replica that closes first closes them; a
follower's and every bucket under rocksdict open on use instead. The remote log manager's round opens a
restarted server's buckets so too (a snapshot restored ahead: tests/tablet/test_role_changes_off_loop.py).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from strom.clock import ManualClock
from strom.config import Configuration
from strom.ids import TableBucket, TablePath
from strom.kv import rocksdb
from strom.kv.rocksdb import open_rocksdb
from strom.log.log_tablet import LogTablet
from strom.metadata.table_info import TableInfo
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import IntType, StringType
from strom.remote.storage import RemoteStorage
from strom.tablet.remote_log_manager import RemoteLogManager, RemoteLogSettings
from strom.tablet.replica import ReplicaManager

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(not rocksdb.NATIVE_AVAILABLE, reason="buckets open ahead with the native binding only"),
]

BUCKETS = 3
T0_MS = 1_700_000_000_000


def _table(table_id: int = 7, primary_key: list[str] | None = None) -> TableInfo:
    schema = Schema.of([("id", IntType()), ("name", StringType())], primary_key=primary_key)
    descriptor = TableDescriptor(schema, bucket_count=BUCKETS)
    return TableInfo(table_id, TablePath("db", f"names_{table_id}"), 1, descriptor.to_json(), T0_MS, T0_MS)


TABLE = _table(primary_key=["id"])
ALL = [TableBucket(TABLE.table_id, bucket) for bucket in range(BUCKETS)]


class RecordingOpener(ThreadPoolExecutor):
    """The bucket opener, keeping what each open returned and on which thread it ran."""

    def __init__(self) -> None:
        super().__init__(2, thread_name_prefix="test-opener")
        self.opened: list[Any] = []
        self.threads: list[str] = []
        self._lock = threading.Lock()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        def recorded() -> Any:
            result = fn(*args, **kwargs)
            with self._lock:
                self.opened.append(result)
                self.threads.append(threading.current_thread().name)
            return result

        return super().submit(recorded)


class FailingOpener(ThreadPoolExecutor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        failed: Future[Any] = Future()
        failed.set_exception(OSError("the disk said no"))
        return failed


def _opening_with(replicas: ReplicaManager, opener: ThreadPoolExecutor, *, background: bool = False) -> ReplicaManager:
    """``replicas`` with ``opener`` in place of its bucket opener (``background``: of its background opener)."""
    replaced = replicas.background_opener if background else replicas.bucket_opener
    assert replaced is not None
    replaced.shutdown()
    if background:
        replicas.background_opener = opener
    else:
        replicas.bucket_opener = opener
    return replicas


async def _opened_new(replicas: ReplicaManager) -> None:
    """Every bucket of TABLE opened before it is hosted, as a tablet server told to lead them does."""
    opening = replicas.open_new_soon(TABLE, ALL)
    assert opening is not None
    await opening


def _replicas(tmp_path: Path, **kwargs: Any) -> ReplicaManager:
    replicas = ReplicaManager(tmp_path / "data", Configuration(), **kwargs)
    replicas.become_leader(TABLE, ALL)
    return replicas


async def test_open_soon_opens_logs_and_rocksdb_on_threads_and_the_replicas_take_them(
        tmp_path: Path, binding_kept: None) -> None:
    opener = RecordingOpener()
    replicas = _opening_with(_replicas(tmp_path), opener)
    try:
        opening = replicas.open_soon(ALL)
        assert opening is not None
        await opening
        assert len(opener.opened) == BUCKETS and all(name.startswith("test-opener") for name in opener.threads)
        by_directory = {opened.log.directory.parent: opened for opened in opener.opened}
        for bucket in ALL:
            replica = replicas.get(bucket)  # opens it: the log and RocksDB are the ones opened ahead
            ahead = by_directory[replica.directory]
            assert replica.log is ahead.log and replica.kv.db is ahead.database.db
            assert replica.kv.lookup([b"\x00\x00\x00\x01"]) == [None]
        assert replicas.open_soon(ALL) is None  # open: nothing to open ahead
    finally:
        replicas.close()


async def test_a_log_tables_buckets_open_their_logs_ahead(tmp_path: Path, binding_kept: None) -> None:
    events = _table(8)
    buckets = [TableBucket(events.table_id, bucket) for bucket in range(BUCKETS)]
    opener = RecordingOpener()
    replicas = _opening_with(ReplicaManager(tmp_path / "data", Configuration()), opener)
    replicas.become_leader(events, buckets)
    try:
        opening = replicas.open_soon(buckets)
        assert opening is not None
        await opening
        assert all(opened.database is None for opened in opener.opened)
        logs = {opened.log.directory.parent: opened.log for opened in opener.opened}
        for bucket in buckets:
            replica = replicas.get(bucket)
            assert replica.log is logs[replica.directory]
        assert replicas.open_soon(buckets) is None
    finally:
        replicas.close()


class HeldOpener(ThreadPoolExecutor):
    """A bucket opener whose opens wait for :attr:`release`."""

    def __init__(self, threads: int = 2) -> None:
        super().__init__(threads, thread_name_prefix="test-held-opener")
        self.release = threading.Event()
        self.holding = threading.Event()
        self.started = 0
        """Opens begun (each is held until :attr:`release`)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        def held() -> Any:
            self.started += 1
            self.holding.set()
            self.release.wait(HOLD_S)
            return fn(*args, **kwargs)

        return super().submit(held)


HOLD_S = 30.0


async def test_a_remote_log_round_opens_a_restarted_servers_buckets_on_threads(tmp_path: Path, binding_kept: None) -> None:
    """Its first round, right at the start, opens every bucket with files, on the background threads; the
    loop serves meanwhile."""
    events = _table(8)
    buckets = [TableBucket(events.table_id, bucket) for bucket in range(BUCKETS)]
    before = ReplicaManager(tmp_path / "data", Configuration())
    before.become_leader(events, buckets)
    for bucket in buckets:
        before.get(bucket)  # its log is made
    before.close()
    held = HeldOpener()
    replicas = _opening_with(ReplicaManager(tmp_path / "data", Configuration()), held, background=True)
    replicas.become_leader(events, buckets)
    manager = RemoteLogManager(
        replicas, RemoteStorage(str(tmp_path / "remote")),
        RemoteLogSettings(interval_ms=60_000, max_upload_segments=1, index_interval_bytes=4096,
                          default_ttl=timedelta(days=7)),
        ManualClock(0), read_handle=lambda _bucket: None, commit=None,  # type: ignore[arg-type]
        partition_name=lambda _partition: None, oldest_snapshot=lambda _bucket: None,  # type: ignore[arg-type]
    )
    try:
        round_ = asyncio.ensure_future(manager.run_once())
        assert await asyncio.to_thread(held.holding.wait, HOLD_S)
        await asyncio.sleep(0.01)  # the loop runs: the round waits for the opens off it
        assert not round_.done() and not any(replicas.replica(bucket).is_open for bucket in buckets)
        held.release.set()
        await round_
        assert all(replicas.replica(bucket).is_open for bucket in buckets)
    finally:
        held.release.set()
        replicas.close()


async def test_buckets_told_to_lead_open_ahead_before_their_replicas_exist(tmp_path: Path, binding_kept: None) -> None:
    """A cluster's tablet server told to lead a new table's buckets (NotifyLeaderAndIsr) opens them before it
    makes their replicas: each replica made then takes what was opened for it."""
    opener = RecordingOpener()
    replicas = _opening_with(ReplicaManager(tmp_path / "data", Configuration()), opener)
    try:
        await _opened_new(replicas)
        assert len(opener.opened) == BUCKETS and not replicas.hosted()
        replicas.become_leader(TABLE, ALL)
        await replicas.discard_new_ahead(ALL)  # every one was taken: nothing to discard
        by_directory = {opened.log.directory.parent: opened for opened in opener.opened}
        for bucket in ALL:
            replica = replicas.get(bucket)
            ahead = by_directory[replica.directory]
            assert replica.log is ahead.log and replica.kv.db is ahead.database.db and not ahead.database.db.closed
        assert replicas.open_new_soon(TABLE, ALL) is None  # hosted: opened as they are
    finally:
        replicas.close()


async def test_what_opened_for_buckets_no_replica_took_is_closed_and_removed(tmp_path: Path, binding_kept: None) -> None:
    opener = RecordingOpener()
    replicas = _opening_with(ReplicaManager(tmp_path / "data", Configuration()), opener)
    try:
        await _opened_new(replicas)
        replicas.become_leader(TABLE, ALL[:1])  # the others' notices said otherwise after all
        await replicas.discard_new_ahead(ALL)
        directories = {bucket: replicas.replica_directory(TABLE, bucket) for bucket in ALL[1:]}
        for opened in opener.opened:
            closed = opened.database.db.closed
            assert closed == (opened.log.directory.parent != replicas.replica(ALL[0]).directory)
        assert not any(directory.exists() for directory in directories.values())
        assert replicas.replica(ALL[0]).kv.lookup([b"\x00\x00\x00\x01"]) == [None]
    finally:
        replicas.close()


async def test_a_restarted_servers_buckets_told_to_lead_open_ahead_and_keep_their_directories(
        tmp_path: Path, binding_kept: None) -> None:
    """After a restart their directories are there: they open ahead (their changelog replaying there, as a
    request's buckets' do), the replicas take them, and one no replica takes is closed, its data kept."""
    before = ReplicaManager(tmp_path / "data", Configuration())
    before.become_leader(TABLE, ALL)
    for bucket in ALL:
        before.get(bucket)  # its log and RocksDB are made
    before.close()
    opener = RecordingOpener()
    again = _opening_with(ReplicaManager(tmp_path / "data", Configuration()), opener)
    try:
        await _opened_new(again)
        assert len(opener.opened) == BUCKETS
        again.become_leader(TABLE, ALL[:2])  # the last one's notice said otherwise after all
        await again.discard_new_ahead(ALL)
        by_directory = {opened.log.directory.parent: opened for opened in opener.opened}
        for bucket in ALL[:2]:
            replica = again.get(bucket)
            assert replica.kv.db is by_directory[replica.directory].database.db
        last = again.replica_directory(TABLE, ALL[2])
        assert by_directory[last].database.db.closed and (last / "kv" / "rocksdb").exists()
    finally:
        again.close()


async def test_a_replica_closed_before_it_takes_what_opened_ahead_closes_it(tmp_path: Path, binding_kept: None) -> None:
    opener = RecordingOpener()
    replicas = _opening_with(_replicas(tmp_path), opener)
    assert replicas.open_soon(ALL) is not None
    directories = [replicas.replica(bucket).directory for bucket in ALL]
    replicas.close()  # waits for the opens in flight, then closes what they opened
    assert len(opener.opened) == BUCKETS
    for opened in opener.opened:
        assert opened.database.db.closed
    for directory in directories:  # their locks are free: this process opens them again
        open_rocksdb(directory / "kv" / "rocksdb").close()
        LogTablet.open(directory / "log", replicas.log_config).close()


async def test_a_failed_open_ahead_leaves_the_bucket_to_open_on_use(tmp_path: Path, binding_kept: None) -> None:
    replicas = _opening_with(_replicas(tmp_path), FailingOpener())
    try:
        opening = replicas.open_soon(ALL)
        assert opening is not None
        await opening  # the failures are the opens' own; the request goes on
        for bucket in ALL:
            assert replicas.get(bucket).kv.lookup([b"\x00\x00\x00\x01"]) == [None]
    finally:
        replicas.close()


async def test_followers_and_rocksdict_buckets_open_on_use(tmp_path: Path, binding_kept: None) -> None:
    replicas = _replicas(tmp_path)
    try:
        for bucket in ALL:
            replicas.replica(bucket).is_leader = False  # no standby: a follower keeps the log only
        assert replicas.open_soon(ALL) is None
    finally:
        replicas.close()
    plain = ReplicaManager(tmp_path / "plain", Configuration({"kv.rocksdb.binding": "rocksdict"}))
    try:
        plain.become_leader(TABLE, ALL)
        assert plain.bucket_opener is None and plain.open_soon(ALL) is None
    finally:
        plain.close()


async def test_a_request_does_not_wait_behind_the_servers_own_round(tmp_path: Path, binding_kept: None) -> None:
    """The background round's opens queue on threads of their own (each may replay a changelog for
    seconds): a request for a bucket still queued there moves it to the requests' threads, and a bucket
    opened on the loop meanwhile opens at once instead of waiting its turn."""
    held = HeldOpener(threads=1)
    replicas = _opening_with(_replicas(tmp_path), held, background=True)
    try:
        round_ = replicas.open_soon(ALL, background=True)
        assert round_ is not None
        assert await asyncio.to_thread(held.holding.wait, HOLD_S)  # ALL[0] at work, the others queued
        request = replicas.open_soon(ALL[1:2])
        assert request is not None
        await request  # on the requests' threads, while the round's thread is still held
        assert replicas.replica(ALL[1]).opening_ahead is not None and replicas.replica(ALL[1]).opening_ahead.done()
        assert replicas.get(ALL[2]).kv.lookup([b"\x00\x00\x00\x01"]) == [None]  # queued: opened here, now
        assert held.started == 1 and not round_.done()  # neither waited for the round's queue
        held.release.set()
        await round_
        for bucket in ALL:
            assert replicas.get(bucket).kv.lookup([b"\x00\x00\x00\x01"]) == [None]
    finally:
        held.release.set()
        replicas.close()
        held.shutdown(wait=True)


async def test_an_answer_that_reads_a_bucket_opening_on_a_thread_waits_for_it_off_the_loop(
        tmp_path: Path, binding_kept: None) -> None:
    """GetTableStats, PrefixLookup, LimitScan and ScanKv answer through ``once_open``: while a bucket opens
    on a thread (a new leader's replay) the answer is a coroutine that waits for it, and the loop serves
    meanwhile; once the bucket is open, the answer comes at once."""
    held = HeldOpener()
    replicas = _opening_with(_replicas(tmp_path), held)
    answered: list[int] = []

    def answer() -> int:
        answered.append(replicas.get(ALL[0]).kv.row_count)
        return len(answered)

    try:
        pending = replicas.once_open(ALL[:1], answer)
        assert asyncio.iscoroutine(pending) and not answered
        assert await asyncio.to_thread(held.holding.wait, HOLD_S)
        assert replicas.replica(ALL[0]).opening_on_thread
        waiting = asyncio.ensure_future(pending)
        await asyncio.sleep(0.05)
        assert not waiting.done() and not answered  # the loop runs; the answer waits for the open
        held.release.set()
        assert await asyncio.wait_for(waiting, HOLD_S) == 1 and answered == [0]
        assert not replicas.replica(ALL[0]).opening_on_thread
        assert replicas.once_open(ALL[:1], answer) == 2  # open: answered now
    finally:
        held.release.set()
        replicas.close()
        held.shutdown(wait=True)
