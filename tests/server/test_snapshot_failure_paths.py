"""Failure paths of KV snapshots, run against a StromServer in this process so a failure can be injected at
one exact step (a metadata delete that raises, a drop while an upload is in flight, a restart after a crash
left files behind) — each a defect that once lost or leaked snapshot files."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.ids import TableBucket
from strom.kv.snapshot import CompletedKvSnapshot
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.server.node import StromServer
from strom.tablet import kv_snapshot_scheduler

pytestmark = pytest.mark.asyncio

CONFIG = {"kv.snapshot.interval": "0s", "kv.snapshot.num-retained": "1"}


async def _started(data_dir: Path) -> StromServer:
    server = StromServer(data_dir, "127.0.0.1", 0, Configuration(CONFIG))
    await server.start()
    return server


async def _table(connection: Connection, name: str, *, partitioned: bool = False) -> Any:
    fields = [("id", pa.int64()), ("v", pa.string())] + ([("day", pa.string())] if partitioned else [])
    keys = ["id", "day"] if partitioned else ["id"]
    schema = Schema.from_arrow(pa.schema(fields), primary_key=keys)
    descriptor = TableDescriptor(schema, bucket_count=1, partition_keys=["day"] if partitioned else [])
    await connection.get_admin().create_table(TablePath("fluss", name), descriptor)
    return await connection.get_table(TablePath("fluss", name))


async def _write(table: Any, ids: range, tag: str, **columns: list[str]) -> None:
    data = {"id": list(ids), "v": [f"{tag}{i}" for i in ids], **columns}
    await table.new_upsert().create_writer().upsert_batch(pa.table(data))


def _bucket(table: Any, partition_id: int | None = None) -> TableBucket:
    return TableBucket(table.table_info.table_id, 0, partition_id)


async def _snapshot(server: StromServer, bucket: TableBucket) -> CompletedKvSnapshot | None:
    assert server.replicas is not None and server.snapshot_scheduler is not None
    return await server.snapshot_scheduler.snapshot(server.replicas.get(bucket))


async def _table_with_a_snapshot(server: StromServer, name: str) -> tuple[Connection, Any, TableBucket, CompletedKvSnapshot]:
    """A one-bucket table with ten rows and one committed snapshot of them."""
    connection = await Connection.create(f"127.0.0.1:{server.port}")
    table = await _table(connection, name)
    bucket = _bucket(table)
    await _write(table, range(10), "a")
    snapshot = await _snapshot(server, bucket)
    assert snapshot is not None
    return connection, table, bucket, snapshot


def _files_exist(server: StromServer, snapshot: CompletedKvSnapshot) -> bool:
    remote = server.snapshots._snapshots._remote  # type: ignore[union-attr]
    return all(remote.exists(location) for location in (snapshot.metadata_path, *(f.remote_path for f in snapshot.files)))


def _exists(location: str) -> bool:
    return Path(location).exists()


def _remote_files(data_dir: Path) -> set[str]:
    root = data_dir / "remote"
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


async def test_a_retention_failure_after_the_commit_keeps_the_committed_snapshot(tmp_path: Path) -> None:
    server = await _started(tmp_path / "data")
    try:
        connection, table, bucket, first = await _table_with_a_snapshot(server, "retention_fails")

        assert server.store is not None
        original = server.store.delete_kv_snapshot

        def failing_delete(*args: Any) -> None:
            raise OSError("metadata store unavailable")

        server.store.delete_kv_snapshot = failing_delete  # type: ignore[method-assign]
        await _write(table, range(10), "b")
        second = await _snapshot(server, bucket)
        assert second is not None, "the commit succeeded; a retention failure after it must not fail it"
        snapshots = server.snapshots._snapshots  # type: ignore[union-attr]
        await snapshots.wait_for_cleanups()
        assert snapshots.latest(bucket) == second
        assert _files_exist(server, second) and _files_exist(server, first)  # the old one waits for retention

        server.store.delete_kv_snapshot = original  # type: ignore[method-assign]
        await _write(table, range(10), "c")
        third = await _snapshot(server, bucket)
        assert third is not None
        await snapshots.wait_for_cleanups()
        assert [s.snapshot_id for s in snapshots.snapshots(bucket.table_id)] == [third.snapshot_id]
        assert _files_exist(server, third)
        await connection.close()
    finally:
        await server.stop()


class _UploadGate:
    """Holds the next snapshot upload (in its worker thread) until released, so a test can drop the
    table or partition while that upload is in flight."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        upload = kv_snapshot_scheduler.upload_checkpoint

        def gated(*args: Any, **kwargs: Any) -> CompletedKvSnapshot:
            self.entered.set()
            assert self.release.wait(30)
            return upload(*args, **kwargs)

        monkeypatch.setattr(kv_snapshot_scheduler, "upload_checkpoint", gated)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 30)


async def _drop_during_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, partitioned: bool, drop: Callable[[Any], Any]
) -> tuple[StromServer, TableBucket]:
    server = await _started(tmp_path / "data")
    connection = await Connection.create(f"127.0.0.1:{server.port}")
    table = await _table(connection, "dropped_mid_upload", partitioned=partitioned)
    partition_id = None
    if partitioned:
        admin = connection.get_admin()
        await admin.create_partition(TablePath("fluss", "dropped_mid_upload"), {"day": "d1"})
        partitions = await admin.list_partition_infos(TablePath("fluss", "dropped_mid_upload"))
        partition_id = partitions[0].partition_id
        await _write(table, range(50), "a", day=["d1"] * 50)
    else:
        await _write(table, range(50), "a")
    bucket = _bucket(table, partition_id)
    first = await _snapshot(server, bucket)  # a committed one: the in-flight upload below reuses its SSTs
    assert first is not None
    if partitioned:
        await _write(table, range(50, 100), "b", day=["d1"] * 50)
    else:
        await _write(table, range(50, 100), "b")
    # the checkpoint flushes these rows into a new SST: the held upload sends a shared file of its own
    gate = _UploadGate(monkeypatch)
    in_flight = asyncio.ensure_future(_snapshot(server, bucket))
    await gate.wait_entered()
    await drop(connection.get_admin())
    gate.release.set()
    assert await in_flight is None, "a snapshot of a dropped table or partition must not commit"
    await server.snapshots._snapshots.wait_for_cleanups()  # type: ignore[union-attr]
    await connection.close()
    return server, bucket


async def test_a_partition_dropped_during_an_upload_gets_no_record_and_keeps_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, bucket = await _drop_during_upload(
        tmp_path, monkeypatch, partitioned=True,
        drop=lambda admin: admin.drop_partition(TablePath("fluss", "dropped_mid_upload"), {"day": "d1"}),
    )
    try:
        snapshots = server.snapshots._snapshots  # type: ignore[union-attr]
        assert snapshots.snapshots(bucket.table_id) == []
        assert server.store is not None
        assert [r for r in server.store.list_kv_snapshots() if r.partition_id == bucket.partition_id] == []
        leftovers = [f for f in _remote_files(tmp_path / "data") if f"/p{bucket.partition_id}/" in f]
        assert leftovers == []
    finally:
        await server.stop()


async def test_a_table_dropped_during_an_upload_leaves_none_of_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = await _drop_during_upload(
        tmp_path, monkeypatch, partitioned=False,
        drop=lambda admin: admin.drop_table(TablePath("fluss", "dropped_mid_upload")),
    )
    try:
        assert _remote_files(tmp_path / "data") == set()
    finally:
        await server.stop()


async def test_files_a_crash_or_failed_delete_left_behind_are_removed_at_the_next_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = await _started(data_dir)
    try:
        connection, _, _, kept = await _table_with_a_snapshot(server, "swept")
        await connection.close()
    finally:
        await server.stop()
    kv_root = data_dir / "remote" / "kv"
    bucket_dir = Path(kept.metadata_path).parent.parent
    # a partial upload of a killed process, a file whose deletion failed, a table whose metadata went first
    (bucket_dir / "snap-99").mkdir()
    (bucket_dir / "snap-99" / "MANIFEST-000001").write_bytes(b"partial")
    (bucket_dir / "shared" / "gone-000042.sst").write_bytes(b"sst")
    (kv_root / "fluss" / "dropped-12345" / "0" / "shared").mkdir(parents=True)
    (kv_root / "fluss" / "dropped-12345" / "0" / "shared" / "x-000007.sst").write_bytes(b"sst")
    staging = data_dir / "snapshot-staging" / "5-None-0-3"
    staging.mkdir(parents=True)
    (staging / "000009.sst").write_bytes(b"hard link")

    server = await _started(data_dir)
    try:
        assert _files_exist(server, kept)
        expected = {str(Path(p).relative_to(data_dir / "remote")) for p in (kept.metadata_path, *(f.remote_path for f in kept.files))}
        assert _remote_files(data_dir) == expected
        assert not (bucket_dir / "snap-99").exists() and not (kv_root / "fluss" / "dropped-12345").exists()
        assert list((data_dir / "snapshot-staging").iterdir()) == []
    finally:
        await server.stop()


async def test_a_file_whose_deletion_failed_is_not_leaked_by_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = await _started(data_dir)
    try:
        connection, table, bucket, first = await _table_with_a_snapshot(server, "undeletable")
        remote = server.snapshots._snapshots._remote  # type: ignore[union-attr]

        def failing_delete(location: str) -> None:
            raise OSError("remote storage unavailable")

        remote.delete = remote.delete_tree = failing_delete
        await _write(table, range(10), "b")
        second = await _snapshot(server, bucket)
        await server.snapshots._snapshots.wait_for_cleanups()  # type: ignore[union-attr]
        assert second is not None
        assert _exists(first.metadata_path)  # the deletion failed: only memory knew it was owed
        await connection.close()
    finally:
        await server.stop()
    server = await _started(data_dir)
    try:
        assert not _exists(first.metadata_path)
        assert _files_exist(server, second)
    finally:
        await server.stop()


async def test_a_storage_error_inside_scan_kv_is_answered_in_the_response_body(tmp_path: Path) -> None:
    server = await _started(tmp_path / "data")
    try:
        connection = await Connection.create(f"127.0.0.1:{server.port}")
        table = await _table(connection, "scan_fails")
        await _write(table, range(10), "a")
        assert server.replicas is not None
        kv = server.replicas.get(_bucket(table)).kv

        def broken_open_scan() -> Any:
            raise Exception("Corruption: block checksum mismatch")  # what rocksdict raises: a bare Exception

        kv.open_scan = broken_open_scan  # type: ignore[method-assign]
        rpc = await RpcConnection.connect("127.0.0.1", server.port)
        try:
            request = pb.ScanKvRequest(call_seq_id=0, batch_size_bytes=1024)
            request.bucket_scan_req.table_id = table.table_info.table_id
            request.bucket_scan_req.bucket_id = 0
            response = await rpc.request(ApiKey.SCAN_KV, request)
            assert response.error_code == -1
            assert "block checksum mismatch" in response.error_message
            assert server.scans is not None and server.scans.scanners.session_count == 0
        finally:
            await rpc.close()
            await connection.close()
    finally:
        await server.stop()


async def test_a_bucket_whose_kv_state_opens_on_a_thread_is_snapshotted_once_it_is_open(tmp_path: Path) -> None:
    """A new leader's KV state opens on a thread (its replay may take seconds): the snapshot scheduler does
    not open it on the loop meanwhile, which would wait there for the thread, and snapshots it once open."""
    server = await _started(tmp_path / "data")
    try:
        connection, table, bucket, _first = await _table_with_a_snapshot(server, "opening")
        await _write(table, range(10, 20), "b")
        assert server.replicas is not None
        replica = server.replicas.get(bucket)
        replica.close_kv()  # as a follower that now leads: its log open, its KV state not yet
        opening: Future[Any] = Future()
        replica._ahead = opening  # at work on an opener thread
        opening.set_running_or_notify_cancel()
        given_up = OSError("the test's open, given up: the bucket opens on use")
        timer = threading.Timer(3, opening.set_exception, (given_up,))  # what a scheduler that waited would see
        timer.start()
        assert replica.opening_on_thread
        try:
            assert await _snapshot(server, bucket) is None
            assert replica.kv_if_open is None and opening.running()
        finally:
            timer.cancel()
        opening.set_exception(given_up)
        assert await _snapshot(server, bucket) is not None
        await connection.close()
    finally:
        await server.stop()
