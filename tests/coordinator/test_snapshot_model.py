"""A model-based test (hypothesis stateful) of KV snapshots, leases, retention, restarts and table and
partition drops, with injected failures: metadata writes and deletes that raise, uploads that break off,
remote deletions that fail, and crashes between steps (a restart that does not wait for anything).

The real coordinator-side components run against a real SQLite store and real files: ``KvSnapshotStore``,
``KvSnapshotLeaseManager``, ``KvSnapshotService`` (commit, lease RPCs, drops) and the tablet server's
upload-and-commit step (``upload_checkpoint`` + ``commit_uploaded``). Only the catalog is a stand-in: a
table here is just an id, a path and its partitions.

Invariants, checked after every step:

* every snapshot the store knows is complete and readable: its ``_METADATA`` and every file exist, and the
  metadata describes that snapshot; the store's memory and its SQLite rows agree;
* a snapshot pinned by a live lease, or inside a bucket's retention window, is never lost;
* once cleanups finished and no deletion failed since the last start, no remote file is unreferenced;
* leases expire by the clock: after an expiry check, none has passed its expiry, and none was dropped early.

``STROM_MODEL_EXAMPLES`` runs more examples (CI runs enough for thousands of steps).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from strom.clock import ManualClock
from strom.coordinator.kv_snapshot_leases import KvSnapshotLeaseManager
from strom.coordinator.kv_snapshot_service import KvSnapshotService
from strom.coordinator.kv_snapshot_store import KvSnapshotStore
from strom.ids import TableBucket, TablePath
from strom.kv.snapshot import Checkpoint, CompletedKvSnapshot, bucket_remote_dir, upload_checkpoint
from strom.metadata.sqlite_store import SqliteMetadataStore
from strom.remote.storage import RemoteStorage
from strom.rpc.messages import add_snapshot_pins, pb
from strom.tablet.kv_snapshot_scheduler import commit_uploaded

NUM_RETAINED = 2
BUCKETS = 2
EXAMPLES = int(os.environ.get("STROM_MODEL_EXAMPLES", "40"))


class Injected(OSError):
    """A failure this test injected (an OSError, as storage raises)."""


class FlakyMetadataStore(SqliteMetadataStore):
    """The real SQLite store; an operation named in ``fail_next`` raises once, before touching anything."""

    fail_next: set[str]

    def _maybe_fail(self, operation: str) -> None:
        if operation in self.fail_next:
            self.fail_next.discard(operation)
            raise Injected(f"injected {operation} failure")

    def add_kv_snapshot(self, record: Any) -> None:
        self._maybe_fail("add_kv_snapshot")
        super().add_kv_snapshot(record)

    def delete_kv_snapshot(self, *args: Any) -> None:
        self._maybe_fail("delete_kv_snapshot")
        super().delete_kv_snapshot(*args)

    def put_lease(self, lease_id: str, payload: bytes) -> None:
        self._maybe_fail("put_lease")
        super().put_lease(lease_id, payload)


class FlakyRemote(RemoteStorage):
    """Local remote storage whose uploads or deletions fail on demand."""

    fail_put_after: int | None = None  # uploads left before one fails
    fail_deletes: bool = False
    delete_failed: bool = False

    def put_file(self, local_path: Path, location: str) -> int:
        if self.fail_put_after is not None:
            if self.fail_put_after == 0:
                self.fail_put_after = None
                raise Injected("injected upload failure")
            self.fail_put_after -= 1
        return super().put_file(local_path, location)

    def delete(self, location: str) -> None:
        if self.fail_deletes:
            self.delete_failed = True
            raise Injected("injected delete failure")
        super().delete(location)

    def delete_tree(self, location: str) -> None:
        if self.fail_deletes:
            self.delete_failed = True
            raise Injected("injected delete failure")
        super().delete_tree(location)


@dataclass
class BucketHistory:
    """What the tablet server side knows of a bucket: its RocksDB's live SSTs and its offset."""

    next_sst: int = 1
    live: list[int] = field(default_factory=list)
    offset: int = 0


class SnapshotModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="strom-model-"))
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.metadata = FlakyMetadataStore(str(self.directory / "meta.sqlite"))
        self.metadata.fail_next = set()
        self.remote = FlakyRemote(str(self.directory / "remote"))
        self.tables: dict[int, SimpleNamespace] = {}
        self.partitions: dict[int, SimpleNamespace] = {}
        self.next_table_id = 1
        self.next_partition_id = 100
        self.history: dict[TableBucket, BucketHistory] = {}
        # the model: live leases by id -> (expiry, pins) as acknowledged to clients
        self.leases: dict[str, tuple[int, dict[TableBucket, int]]] = {}
        self.committed: dict[TableBucket, list[int]] = {}  # snapshot ids the model saw committed, in order
        self._start()

    # ---- wiring (what StromServer.start does for these parts) ----
    def _start(self) -> None:
        self.lease_manager = KvSnapshotLeaseManager(self.metadata, self.clock)
        self.store = KvSnapshotStore(self.metadata, self.remote, NUM_RETAINED, self.lease_manager.is_leased)
        catalog = SimpleNamespace(
            table_info_by_id=lambda table_id: self.tables.get(table_id),
            partition_by_id=lambda partition_id: self.partitions.get(partition_id),
        )
        self.service = KvSnapshotService(catalog, self.store, self.lease_manager, self.clock, 1_000)  # type: ignore[arg-type]
        self.remote.delete_failed = False
        self.loop.run_until_complete(self.store.sweep_unreferenced())

    def _on_loop(self, function: Any, *args: Any) -> Any:
        """Await a call on the event loop, as the server does (cleanups it starts are tasks of that loop)."""
        return self.loop.run_until_complete(function(*args))

    def _settle(self) -> None:
        self.loop.run_until_complete(self.store.wait_for_cleanups())

    def teardown(self) -> None:
        self.remote.fail_deletes = False
        self._settle()
        self.loop.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # ---- catalog ----
    def _buckets(self) -> list[TableBucket]:
        found = []
        for table in self.tables.values():
            owners = [p.partition_id for p in self.partitions.values() if p.table_id == table.table_id]
            for partition_id in owners if table.is_partitioned else [None]:
                found += [TableBucket(table.table_id, b, partition_id) for b in range(BUCKETS)]
        return found

    @rule(partitioned=st.booleans())
    def create_table(self, partitioned: bool) -> None:
        table_id = self.next_table_id
        self.next_table_id += 1
        self.tables[table_id] = SimpleNamespace(
            table_id=table_id, path=TablePath("db", f"t{table_id}"), has_primary_key=True, is_partitioned=partitioned
        )
        if partitioned:
            self.add_partition_to(table_id)

    def add_partition_to(self, table_id: int) -> None:
        self.partitions[self.next_partition_id] = SimpleNamespace(partition_id=self.next_partition_id, table_id=table_id)
        self.next_partition_id += 1

    @precondition(lambda self: any(t.is_partitioned for t in self.tables.values()))
    @rule(data=st.data())
    def create_partition(self, data: st.DataObject) -> None:
        table = data.draw(st.sampled_from([t for t in self.tables.values() if t.is_partitioned]))
        self.add_partition_to(table.table_id)

    # ---- snapshots (the tablet server's side) ----
    def _upload(self, bucket: TableBucket, fail_after: int | None) -> CompletedKvSnapshot:
        history = self.history.setdefault(bucket, BucketHistory())
        # RocksDB: a flush adds an SST, a compaction may merge the oldest ones into a new one
        history.live.append(history.next_sst)
        history.next_sst += 1
        if len(history.live) > 3:
            history.live = [*history.live[2:], history.next_sst]
            history.next_sst += 1
        history.offset += 10
        checkpoint_dir = self.directory / "checkpoint"
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        checkpoint_dir.mkdir()
        for number in history.live:
            (checkpoint_dir / f"{number:06d}.sst").write_bytes(f"{bucket}-{number}".encode())
        (checkpoint_dir / "MANIFEST-000001").write_bytes(os.urandom(8))
        (checkpoint_dir / "CURRENT").write_bytes(b"MANIFEST-000001\n")
        table = self.tables[bucket.table_id]
        latest = self.store.latest(bucket)
        self.remote.fail_put_after = fail_after
        try:
            return upload_checkpoint(
                Checkpoint(checkpoint_dir, history.offset, len(history.live)),
                instance_id=f"i{bucket.table_id}",
                remote=self.remote,
                remote_dir=bucket_remote_dir(table.path, bucket),
                bucket=bucket,
                snapshot_id=self._on_loop(self.store.next_snapshot_id, bucket),
                reusable_shared=[f for f in latest.files if f.shared] if latest else [],
                created_ms=self.clock.now_ms(),
            )
        finally:
            self.remote.fail_put_after = None

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), failure=st.sampled_from([None, None, None, "upload", "persist", "retention"]))
    def take_snapshot(self, data: st.DataObject, failure: str | None) -> None:
        buckets = self._buckets()
        if not buckets:
            return
        bucket = data.draw(st.sampled_from(buckets))
        try:
            completed = self._upload(bucket, data.draw(st.integers(0, 4)) if failure == "upload" else None)
        except Injected:
            return
        latest = self.store.latest(bucket)
        reused = tuple(f for f in latest.files if f.shared) if latest else ()
        if failure == "persist":
            self.metadata.fail_next.add("add_kv_snapshot")
        if failure == "retention":
            self.metadata.fail_next.add("delete_kv_snapshot")
        try:
            self.loop.run_until_complete(commit_uploaded(self.service, self.remote, completed, reused))
        except Injected:
            assert failure == "persist"
        else:
            self.committed.setdefault(bucket, []).append(completed.snapshot_id)
        self.metadata.fail_next.clear()

    # ---- leases (the RPCs) ----
    @precondition(lambda self: self.store.buckets())
    @rule(data=st.data(), lease=st.sampled_from(["a", "b", "c"]), duration=st.integers(1, 5_000),
          persist_fails=st.booleans())
    def acquire_lease(self, data: st.DataObject, lease: str, duration: int, persist_fails: bool) -> None:
        candidates = [(b, s.snapshot_id) for b in self.store.buckets() for s in self.store.snapshots(b.table_id, b.partition_id) if s.bucket == b]
        wanted = dict(data.draw(st.lists(st.sampled_from(candidates), max_size=3))) if candidates else {}
        request = pb.AcquireKvSnapshotLeaseRequest(lease_id=lease, lease_duration_ms=duration)
        add_snapshot_pins(request.snapshots_to_lease, wanted)
        if persist_fails:
            self.metadata.fail_next.add("put_lease")
        try:
            response = self._on_loop(self.service.acquire_kv_snapshot_lease, request, None)
        except Injected:
            assert persist_fails
            return
        finally:
            self.metadata.fail_next.clear()
        assert not response.unavailable_snapshots  # every pin named an existing snapshot
        _expiry, pins = self.leases.get(lease, (0, {}))
        self.leases[lease] = (self.clock.now_ms() + duration, {**pins, **wanted})

    @rule(lease=st.sampled_from(["a", "b", "c"]))
    def drop_lease(self, lease: str) -> None:
        self._on_loop(self.service.drop_kv_snapshot_lease, pb.DropKvSnapshotLeaseRequest(lease_id=lease), None)
        self.leases.pop(lease, None)

    @rule(ms=st.integers(0, 3_000))
    def advance_clock_and_expire(self, ms: int) -> None:
        self.clock.advance(ms=ms)
        self._on_loop(self.service.expire_leases)
        now = self.clock.now_ms()
        self.leases = {lease: (expiry, pins) for lease, (expiry, pins) in self.leases.items() if expiry >= now}

    # ---- drops, failures, restarts ----
    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def drop_table(self, data: st.DataObject) -> None:
        table = self.tables.pop(data.draw(st.sampled_from(sorted(self.tables))))
        for partition_id in [p for p, record in self.partitions.items() if record.table_id == table.table_id]:
            del self.partitions[partition_id]
        self.metadata.drop_table(table.table_id)  # the catalog drops its rows first, as the coordinator does
        self._on_loop(self.service.on_table_dropped, table, None)
        self._forget(lambda b: b.table_id == table.table_id)

    @precondition(lambda self: self.partitions)
    @rule(data=st.data())
    def drop_partition(self, data: st.DataObject) -> None:
        partition = self.partitions.pop(data.draw(st.sampled_from(sorted(self.partitions))))
        self.metadata.drop_partition(partition.partition_id)
        self._on_loop(self.service.on_table_dropped, self.tables[partition.table_id], partition.partition_id)
        self._forget(lambda b: b.partition_id == partition.partition_id)

    def _forget(self, gone: Any) -> None:
        for lease, (expiry, pins) in list(self.leases.items()):
            kept = {b: s for b, s in pins.items() if not gone(b)}
            if kept or len(kept) == len(pins):
                self.leases[lease] = (expiry, kept)
            else:
                del self.leases[lease]  # the manager deletes a lease whose last pin went
        self.committed = {b: ids for b, ids in self.committed.items() if not gone(b)}

    @rule(failing=st.booleans())
    def remote_deletes_fail(self, failing: bool) -> None:
        self.remote.fail_deletes = failing

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        """A restart: clean (cleanups finish) or a crash (whatever was pending is abandoned)."""
        if not crash:
            self._settle()
        self.remote.fail_deletes = False
        self._settle()  # abandoned deletions of a crashed process may still land, like files deleted just before it
        self._start()

    # ---- invariants ----
    @invariant()
    def stored_snapshots_are_complete_and_match_the_metadata(self) -> None:
        stored = {(s.bucket, s.snapshot_id): s for b in self.store.buckets() for s in self.store.snapshots(b.table_id, b.partition_id)}
        rows = {
            (TableBucket(r.table_id, r.bucket, r.partition_id), r.snapshot_id) for r in self.metadata.list_kv_snapshots()
        }
        assert set(stored) == rows
        for snapshot in stored.values():
            assert CompletedKvSnapshot.from_json(self.remote.read_bytes(snapshot.metadata_path)) == snapshot
            for file in snapshot.files:
                assert self.remote.exists(file.remote_path), (snapshot.snapshot_id, file.remote_path)

    @invariant()
    def leased_and_retained_snapshots_are_kept(self) -> None:
        for _lease, (_expiry, pins) in self.leases.items():
            for bucket, snapshot_id in pins.items():
                assert self.store.exists(bucket, snapshot_id), (bucket, snapshot_id)
        for bucket, ids in self.committed.items():
            for snapshot_id in ids[-NUM_RETAINED:]:
                assert self.store.exists(bucket, snapshot_id), (bucket, snapshot_id, ids)

    @invariant()
    def leases_match_the_model(self) -> None:
        held = {lease.lease_id: (lease.expiration_ms, lease.pins) for lease in self.lease_manager.leases()}
        assert held == self.leases

    @invariant()
    def nothing_unreferenced_remains_after_cleanup(self) -> None:
        if self.remote.fail_deletes or self.remote.delete_failed:
            return  # a failed deletion is retried later or swept at the next start
        self._settle()
        present = set(self.remote.list_files("kv"))
        assert present == self.store.referenced_files(), sorted(present ^ self.store.referenced_files())[:5]


SnapshotModel.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_snapshot_model = SnapshotModel.TestCase
