"""A bucket's leadership changes without its RocksDB work on the event loop.

A replica that starts to lead a primary-key bucket it followed has a log and no KV state: its RocksDB is
restored from the bucket's latest KV snapshot (or made empty) and the changelog replayed into it. That work
runs on a bucket opener's thread (``ReplicaManager.start_opening``), not on the event loop, which meanwhile
serves the server's other buckets and the followers' fetches of this one; a rebuilt server's buckets told to
lead restore their snapshots there too. A leader that starts to follow flushes and closes its RocksDB on a
thread of its own (``Replica.close_kv``), and leading again waits for that close.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from strom.config import Configuration
from strom.ids import TableBucket
from strom.kv import changelog_replay, kv_tablet, rocksdb
from strom.kv.snapshot import CompletedKvSnapshot, bucket_remote_dir, upload_checkpoint
from strom.membership.contract import LeaderAndIsr
from strom.remote.storage import RemoteStorage
from strom.tablet.replica import ReplicaManager
from strom.tablet.replication import ReplicationManager
from tests.kv.test_kv_tablet import T0_MS, Bucket, table_info
from tests.tablet.test_follower import Registry, SwallowingPeers
from tests.tablet.test_leader_high_watermark import ME, SECOND, GatedStates
from tests.tablet.test_open_ahead import HOLD_S, HeldOpener, RecordingOpener, _opening_with

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(not rocksdb.NATIVE_AVAILABLE, reason="buckets open ahead with the native binding only"),
]

ROWS = 300
SNAPSHOT_ROWS = 200


class ThreadRecordingRemote(RemoteStorage):
    """Remote storage that notes the thread of every file it downloads."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.download_threads: list[str] = []

    def get_file(self, remote_path: str, local_path: Path) -> Any:
        self.download_threads.append(threading.current_thread().name)
        return super().get_file(remote_path, local_path)


async def _followers_copy(directory: Path, remote: RemoteStorage | None = None) -> tuple[Bucket, CompletedKvSnapshot | None]:
    """A follower's copy of a bucket in ``directory``: the changelog of ROWS upserts and some updates, and no
    RocksDB (a follower keeps the log only). With ``remote``, the leader's KV snapshot after SNAPSHOT_ROWS."""
    bucket = Bucket(directory)
    await bucket.put_acknowledged(*((i, (f"name-{i}", i)) for i in range(SNAPSHOT_ROWS)))
    snapshot = None
    if remote is not None:
        checkpoint = bucket.kv.create_checkpoint(directory.parent / "checkpoint")
        table_bucket = TableBucket(bucket.table.table_id, 0)
        snapshot = upload_checkpoint(
            checkpoint, instance_id=bucket.kv.instance_id, remote=remote,
            remote_dir=bucket_remote_dir(bucket.table.path, table_bucket), bucket=table_bucket, snapshot_id=1,
            reusable_shared=(), created_ms=T0_MS,
        )
    await bucket.put_acknowledged(*((i, (f"name-{i}", i)) for i in range(SNAPSHOT_ROWS, ROWS)))
    await bucket.put_acknowledged(*((i, (f"renamed-{i}", -i)) for i in range(0, ROWS, 10)))
    bucket.close()
    shutil.rmtree(directory / "kv")
    return bucket, snapshot


@asynccontextmanager
async def _following(replicas: ReplicaManager, bucket: Bucket) -> AsyncIterator[tuple[ReplicationManager, GatedStates]]:
    """``replicas`` following SECOND for ``bucket``'s table (a leader that never answers a fetch)."""
    states = GatedStates(LeaderAndIsr(SECOND, 1, (ME, SECOND), (ME, SECOND)))
    manager = ReplicationManager(
        ME, replicas, states, registry=Registry(), peers=SwallowingPeers(),  # type: ignore[arg-type]
        table_of=lambda _table_id: bucket.table, lag_max_ms=60_000, silence_max_ms=60_000,
    )
    await manager.apply(bucket.table, TableBucket(bucket.table.table_id, 0))
    try:
        yield manager, states
    finally:
        await manager.stop()
        replicas.close()


def _elected(states: GatedStates) -> None:
    """The coordinator made ME the leader, alone in the ISR (SECOND is gone)."""
    states.state, states.version = LeaderAndIsr(ME, 2, (ME, SECOND), (ME,)), states.version + 1


def _rows(replicas: ReplicaManager, bucket: Bucket) -> list[Any]:
    kv = replicas.get(TableBucket(bucket.table.table_id, 0)).kv
    return [None if v is None else bucket.format.decode_stored(v) for v in kv.lookup([bucket.key(i) for i in range(ROWS)])]


def _expected(i: int) -> tuple[int, str, int]:
    return (i, f"renamed-{i}", -i) if i % 10 == 0 else (i, f"name-{i}", i)


class ReplayThreads:
    """Where the changelog's records were replayed into RocksDB: (thread name, records) per replay."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.replays: list[tuple[str, int]] = []
        original = changelog_replay.replay

        def recorded(*args: Any, **kwargs: Any) -> changelog_replay.Replayed:
            at = original(*args, **kwargs)
            self.replays.append((threading.current_thread().name, at.records))
            return at

        monkeypatch.setattr(changelog_replay, "replay", recorded)
        monkeypatch.setattr(kv_tablet, "replay", recorded)

    def records(self, on_loop: bool) -> int:
        return sum(n for name, n in self.replays if (name == threading.main_thread().name) == on_loop)


async def test_a_follower_elected_leader_replays_its_changelog_on_a_thread_while_the_loop_serves(
        tmp_path: Path, binding_kept: None, monkeypatch: pytest.MonkeyPatch) -> None:
    replays = ReplayThreads(monkeypatch)
    replicas = ReplicaManager(tmp_path / "data", Configuration())
    table_bucket = TableBucket(7, 0)
    bucket, _ = await _followers_copy(replicas.replica_directory(table_info(), table_bucket))
    held = HeldOpener()
    _opening_with(replicas, held)
    async with _following(replicas, bucket) as (manager, states):
        replica = replicas.replica(table_bucket)
        assert not replica.is_leader and replica.kv_if_open is None
        _elected(states)
        leading = asyncio.ensure_future(manager.apply(bucket.table, table_bucket))
        try:
            assert await asyncio.to_thread(held.holding.wait, HOLD_S), "the KV state never opened on a thread"
            await asyncio.sleep(0.01)
            assert replica.is_leader and not leading.done() and replica.kv_if_open is None
            # the loop serves meanwhile, and a follower's fetch of this bucket reads its log without waiting
            read = replicas.get(table_bucket).log.read(0, 1 << 20, for_follower=True)
            assert read.records and read.high_watermark == replica.log.log_end_offset
            assert replica.opening_ahead is not None and not replica.opening_ahead.done()
        finally:
            held.release.set()
        await leading
        kv = replica.kv_if_open
        assert kv is not None and not kv.standby and kv.applied_offset == replica.log.high_watermark
        assert replays.records(on_loop=False) == ROWS + ROWS // 10 and replays.records(on_loop=True) == 0
        assert replicas.row_cache.is_complete(kv._cache_token), "the cache adopted the replayed rows"
        assert _rows(replicas, bucket) == [_expected(i) for i in range(ROWS)]
    held.shutdown(wait=True)


async def test_a_follower_elected_leader_restores_its_snapshot_on_a_thread(
        tmp_path: Path, binding_kept: None, monkeypatch: pytest.MonkeyPatch) -> None:
    replays = ReplayThreads(monkeypatch)
    remote = ThreadRecordingRemote(str(tmp_path / "remote"))
    table_bucket = TableBucket(7, 0)
    snapshot: list[CompletedKvSnapshot] = []
    replicas = ReplicaManager(tmp_path / "data", Configuration(), remote=remote,
                              latest_snapshot=lambda _bucket: snapshot[0] if snapshot else None)
    bucket, made = await _followers_copy(replicas.replica_directory(table_info(), table_bucket),
                                         remote)
    assert made is not None
    snapshot.append(made)
    remote.download_threads.clear()
    opener = RecordingOpener()
    _opening_with(replicas, opener)
    async with _following(replicas, bucket) as (manager, states):
        _elected(states)
        await manager.apply(bucket.table, table_bucket)
        assert remote.download_threads and all(name.startswith("test-opener") for name in remote.download_threads)
        assert len(opener.opened) == 1 and opener.opened[0].log is None  # the follower's log, open already
        assert replays.records(on_loop=False) == ROWS - SNAPSHOT_ROWS + ROWS // 10  # what came after the snapshot
        assert replays.records(on_loop=True) == 0
        assert _rows(replicas, bucket) == [_expected(i) for i in range(ROWS)]  # the snapshot, then the changelog
    opener.shutdown(wait=True)


async def test_buckets_told_to_lead_restore_their_snapshots_on_threads_before_they_are_hosted(
        tmp_path: Path, binding_kept: None) -> None:
    """A rebuilt server (its RocksDB gone, its log there) told to lead: the restore runs where the bucket
    opens ahead; a bucket whose RocksDB is there keeps it."""
    remote = ThreadRecordingRemote(str(tmp_path / "remote"))
    table_bucket = TableBucket(7, 0)
    snapshot: list[CompletedKvSnapshot] = []
    replicas = ReplicaManager(tmp_path / "data", Configuration(), remote=remote,
                              latest_snapshot=lambda _bucket: snapshot[0] if snapshot else None)
    directory = replicas.replica_directory(table_info(), table_bucket)
    bucket, made = await _followers_copy(directory, remote)
    assert made is not None
    snapshot.append(made)
    remote.download_threads.clear()
    opener = RecordingOpener()
    _opening_with(replicas, opener)
    try:
        opening = replicas.open_new_soon(bucket.table, [table_bucket])
        assert opening is not None
        await opening
        assert (directory / "kv" / "rocksdb").exists() and remote.download_threads
        assert all(name.startswith("test-opener") for name in remote.download_threads)
        replicas.become_leader(bucket.table, [table_bucket])
        await replicas.discard_new_ahead([table_bucket])
        assert _rows(replicas, bucket) == [_expected(i) for i in range(ROWS)]
        replicas.close()

        again = ReplicaManager(tmp_path / "data", Configuration(), remote=remote, latest_snapshot=lambda _b: made)
        _opening_with(again, RecordingOpener())
        remote.download_threads.clear()
        opening = again.open_new_soon(bucket.table, [table_bucket])
        assert opening is not None
        await opening
        assert not remote.download_threads  # its RocksDB is there: nothing is restored
        again.become_leader(bucket.table, [table_bucket])
        assert _rows(again, bucket) == [_expected(i) for i in range(ROWS)]
        again.close()
    finally:
        replicas.close()
        opener.shutdown(wait=True)


class HeldCloser(HeldOpener):
    """The KV closer, its closes held until :attr:`release`."""


async def test_a_leader_that_starts_to_follow_closes_its_rocksdb_on_a_thread_and_leads_again_after_it(
        tmp_path: Path, binding_kept: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its flush and close run on the closer's thread: the role change does not wait for them, and leading
    the bucket again opens its RocksDB only once they are done (RocksDB locks its directory)."""
    replays = ReplayThreads(monkeypatch)
    replicas = ReplicaManager(tmp_path / "data", Configuration())
    table_bucket = TableBucket(7, 0)
    bucket, _ = await _followers_copy(replicas.replica_directory(table_info(), table_bucket))
    held = HeldCloser()
    assert replicas.kv_closer is not None
    replicas.kv_closer.shutdown()
    replicas.kv_closer = held
    async with _following(replicas, bucket) as (manager, states):
        _elected(states)
        await manager.apply(bucket.table, table_bucket)
        replica = replicas.replica(table_bucket)
        assert replica.kv_if_open is not None
        states.state, states.version = LeaderAndIsr(SECOND, 3, (ME, SECOND), (ME, SECOND)), states.version + 1
        await asyncio.wait_for(manager.apply(bucket.table, table_bucket), HOLD_S)  # does not wait for the close
        assert not replica.is_leader and replica.kv_if_open is None
        assert await asyncio.to_thread(held.holding.wait, HOLD_S)

        states.state, states.version = LeaderAndIsr(ME, 4, (ME, SECOND), (ME,)), states.version + 1
        leading = asyncio.ensure_future(manager.apply(bucket.table, table_bucket))
        try:
            await asyncio.sleep(0.2)
            assert not leading.done(), "it leads once its RocksDB is closed"
        finally:
            held.release.set()
        await asyncio.wait_for(leading, HOLD_S)
        assert replica.is_leader
        assert _rows(replicas, bucket) == [_expected(i) for i in range(ROWS)]
        assert replays.records(on_loop=True) == 0
    held.shutdown(wait=True)


async def test_a_bucket_whose_files_are_deleted_next_is_closed_without_a_flush(
        tmp_path: Path, binding_kept: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica moved away (stop_bucket) or a dropped table (stop_replicas with delete): the memtables
    are dropped with the files, not flushed first on the loop; a replica closed to stay (a stopping
    server) still flushes, so its next open replays nothing."""
    flushed: list[Path] = []
    real = kv_tablet.KvTablet._flush_memtables

    def recorded(self: kv_tablet.KvTablet) -> None:
        flushed.append(self.directory)
        real(self)

    monkeypatch.setattr(kv_tablet.KvTablet, "_flush_memtables", recorded)
    replicas = ReplicaManager(tmp_path / "data", Configuration())
    table = table_info()
    buckets = [TableBucket(table.table_id, 0)]
    replicas.become_leader(table, buckets)
    try:
        assert replicas.get(buckets[0]).kv.row_count == 0
        await replicas.stop_bucket(buckets[0])
        assert not flushed and not replicas.replica_directory(table, buckets[0]).exists()
        replicas.become_leader(table, buckets)
        assert replicas.get(buckets[0]).kv.row_count == 0
        await replicas.stop_replicas(table.table_id, None, delete=True)
        assert not flushed
        replicas.become_leader(table, buckets)
        directory = replicas.get(buckets[0]).kv.directory
    finally:
        replicas.close()
    assert flushed == [directory]
