"""KvSnapshotStore retention on real files: the window, leased snapshots, shared SST reference counting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from strom.coordinator.kv_snapshot_store import KvSnapshotStore
from strom.ids import TableBucket
from strom.kv.snapshot import CompletedKvSnapshot, SnapshotFile
from strom.metadata.sqlite_store import SqliteMetadataStore
from strom.remote.storage import RemoteStorage

B = TableBucket(5, 0)


def make_snapshot(remote: RemoteStorage, snapshot_id: int, shared: list[str]) -> CompletedKvSnapshot:
    """A snapshot whose files really exist: the given shared SSTs plus a private MANIFEST and _METADATA."""
    files = []
    for name in shared:
        location = remote.url(f"b/shared/{name}")
        if not remote.exists(location):
            remote.write_bytes(location, name.encode())
        files.append(SnapshotFile(location, name, len(name), True))
    manifest = remote.url(f"b/snap-{snapshot_id}/MANIFEST")
    remote.write_bytes(manifest, b"m")
    files.append(SnapshotFile(manifest, "MANIFEST", 1, False))
    metadata = remote.url(f"b/snap-{snapshot_id}/_METADATA")
    snapshot = CompletedKvSnapshot(B, snapshot_id, 100 * snapshot_id, 10, tuple(files), metadata, 0, 0)
    remote.write_bytes(metadata, snapshot.to_json())
    return snapshot


def existing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def remote(tmp_path: Path) -> RemoteStorage:
    return RemoteStorage(str(tmp_path / "remote"))


def test_retention_keeps_the_newest_and_deletes_files_no_snapshot_references(tmp_path: Path, remote: RemoteStorage) -> None:
    async def scenario() -> None:
        store = KvSnapshotStore(SqliteMetadataStore(str(tmp_path / "m.sqlite")), remote, 2, lambda b, s: False)
        await store.add(make_snapshot(remote, 0, ["a.sst", "b.sst"]))
        await store.add(make_snapshot(remote, 1, ["b.sst", "c.sst"]))
        await store.add(make_snapshot(remote, 2, ["c.sst", "d.sst"]))
        await store.wait_for_cleanups()
        assert [s.snapshot_id for s in store.snapshots(5)] == [1, 2]
        files = existing(tmp_path / "remote")
        assert "b/shared/a.sst" not in files  # only snapshot 0 used it
        assert {"b/shared/b.sst", "b/shared/c.sst", "b/shared/d.sst"} <= files
        assert not any(f.startswith("b/snap-0/") for f in files)
        assert "b/snap-1/_METADATA" in files

    asyncio.run(scenario())


def test_a_leased_snapshot_outside_the_window_keeps_all_its_files_until_released(
    tmp_path: Path, remote: RemoteStorage
) -> None:
    leased: set[tuple[TableBucket, int]] = {(B, 0)}

    async def scenario() -> None:
        store = KvSnapshotStore(
            SqliteMetadataStore(str(tmp_path / "m.sqlite")), remote, 1, lambda b, s: (b, s) in leased
        )
        await store.add(make_snapshot(remote, 0, ["a.sst", "b.sst"]))
        await store.add(make_snapshot(remote, 1, ["b.sst", "c.sst"]))
        await store.add(make_snapshot(remote, 2, ["c.sst", "d.sst"]))
        await store.wait_for_cleanups()
        assert [s.snapshot_id for s in store.snapshots(5)] == [0, 2]
        files = existing(tmp_path / "remote")
        assert {"b/shared/a.sst", "b/shared/b.sst", "b/snap-0/MANIFEST", "b/snap-0/_METADATA"} <= files
        assert not any(f.startswith("b/snap-1/") for f in files)
        leased.clear()
        await store.apply_retention([B])  # what a release triggers, without waiting for another commit
        await store.wait_for_cleanups()
        assert [s.snapshot_id for s in store.snapshots(5)] == [2]
        assert existing(tmp_path / "remote") == {
            "b/shared/c.sst", "b/shared/d.sst", "b/snap-2/MANIFEST", "b/snap-2/_METADATA",
        }

    asyncio.run(scenario())


def test_the_store_reloads_its_snapshots_after_a_restart(tmp_path: Path, remote: RemoteStorage) -> None:
    async def scenario() -> None:
        metadata = SqliteMetadataStore(str(tmp_path / "m.sqlite"))
        store = KvSnapshotStore(metadata, remote, 2, lambda b, s: False)
        first = make_snapshot(remote, await store.next_snapshot_id(B), ["a.sst"])
        await store.add(first)
        metadata.close()
        reopened = KvSnapshotStore(SqliteMetadataStore(str(tmp_path / "m.sqlite")), remote, 2, lambda b, s: False)
        assert reopened.latest(B) == first
        assert await reopened.next_snapshot_id(B) == 1  # ids are never reused

    asyncio.run(scenario())


def test_dropping_a_table_deletes_every_snapshot_file(tmp_path: Path, remote: RemoteStorage) -> None:
    async def scenario() -> None:
        store = KvSnapshotStore(SqliteMetadataStore(str(tmp_path / "m.sqlite")), remote, 2, lambda b, s: False)
        await store.add(make_snapshot(remote, 0, ["a.sst"]))
        await store.add(make_snapshot(remote, 1, ["a.sst", "b.sst"]))
        store.drop_table(5)
        await store.wait_for_cleanups()
        assert store.snapshots(5) == []
        assert existing(tmp_path / "remote") == set()

    asyncio.run(scenario())


def test_a_non_positive_retention_count_is_rejected(tmp_path: Path, remote: RemoteStorage) -> None:
    with pytest.raises(ValueError, match="num-retained"):
        KvSnapshotStore(SqliteMetadataStore(str(tmp_path / "m.sqlite")), remote, 0, lambda b, s: False)


def test_an_unreadable_lease_keeps_every_snapshot_until_dropped(tmp_path: Path, remote: RemoteStorage) -> None:
    from strom.clock import ManualClock
    from strom.coordinator.kv_snapshot_leases import KvSnapshotLeaseManager

    async def scenario() -> None:
        metadata = SqliteMetadataStore(str(tmp_path / "m.sqlite"))
        metadata.put_lease("garbled", b"\x00\x01")
        leases = KvSnapshotLeaseManager(metadata, ManualClock())
        store = KvSnapshotStore(metadata, remote, 1, leases.is_leased)
        for snapshot_id in range(3):
            await store.add(make_snapshot(remote, snapshot_id, [f"{snapshot_id}.sst"]))
        await store.wait_for_cleanups()
        assert [s.snapshot_id for s in store.snapshots(5)] == [0, 1, 2]
        assert {"b/snap-0/_METADATA", "b/shared/0.sst"} <= existing(tmp_path / "remote")
        assert (await leases.drop("garbled")).released_all
        await store.apply_retention(store.buckets())
        await store.wait_for_cleanups()
        assert [s.snapshot_id for s in store.snapshots(5)] == [2]
        assert "b/snap-0/_METADATA" not in existing(tmp_path / "remote")

    asyncio.run(scenario())
