"""The coordinator's lake tiering state machine, on a manual clock and a real SQLite store: Fluss's
scenarios (scheduling by freshness, epochs, fencing, heartbeat timeouts, forced finishes), plus what strom
adds: the state survives a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.clock import ManualClock
from strom.errors import FencedTieringEpochError, TableNotExistError
from strom.ids import TablePath
from strom.metadata.sqlite_store import SqliteMetadataStore
from strom.server.lake_tiering import LakeSnapshotRecord, LakeTableTieringManager, TieringState

MINUTES = 60_000
TIMEOUT_MS = 120_000
CHECK_MS = 15_000
T1, T2 = 1, 2
P1, P2 = TablePath("db", "t1"), TablePath("db", "t2")


@pytest.fixture
def store(tmp_path: Path) -> SqliteMetadataStore:
    return SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def manager_on(store: SqliteMetadataStore, clock: ManualClock) -> LakeTableTieringManager:
    return LakeTableTieringManager(store, clock, TIMEOUT_MS, CHECK_MS)


def test_new_table_is_due_one_freshness_after_it_was_added(store: SqliteMetadataStore, clock: ManualClock) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 10_000)
    assert manager.request_table() is None
    clock.advance(ms=9_999)
    assert manager.request_table() is None
    clock.advance(ms=1)
    assignment = manager.request_table()
    assert assignment is not None and (assignment.table_id, assignment.path, assignment.tiering_epoch) == (T1, P1, 1)
    assert manager.request_table() is None, "a table is handed to one job at a time"


def test_finished_round_waits_a_freshness_and_comes_back_with_the_next_epoch(store: SqliteMetadataStore, clock: ManualClock) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 10_000)
    clock.advance(ms=10_000)
    manager.request_table()
    manager.finish(T1, 1, force_finished=False, file_size=100, record_count=7)
    assert manager.entry(T1).state is TieringState.SCHEDULED
    clock.advance(ms=4_000)
    assert manager.request_table() is None
    clock.advance(ms=6_000)
    assignment = manager.request_table()
    assert assignment is not None and assignment.tiering_epoch == 2
    assert (manager.entry(T1).file_size, manager.entry(T1).record_count) == (100, 7)


def test_force_finished_and_failed_rounds_are_due_at_once(store: SqliteMetadataStore, clock: ManualClock) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 3 * MINUTES)
    clock.advance(ms=3 * MINUTES)
    manager.request_table()
    manager.finish(T1, 1, force_finished=True)
    again = manager.request_table()
    assert again is not None and again.tiering_epoch == 2
    manager.fail(T1, 2)
    assert manager.entry(T1).failures == 1
    third = manager.request_table()
    assert third is not None and third.tiering_epoch == 3


def test_pending_tables_are_handed_out_first_in_first_out(store: SqliteMetadataStore, clock: ManualClock) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 5_000)
    clock.advance(ms=1_000)
    manager.add_table(T2, P2, 3_000)
    clock.advance(ms=10_000)
    first, second = manager.request_table(), manager.request_table()
    assert first is not None and second is not None
    assert {first.table_id, second.table_id} == {T1, T2}


def test_silent_job_loses_its_table_and_old_epochs_are_fenced(store: SqliteMetadataStore, clock: ManualClock) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 3 * MINUTES)
    manager.add_table(T2, P2, 3 * MINUTES)
    clock.advance(ms=3 * MINUTES)
    assert manager.request_table() is not None and manager.request_table() is not None
    clock.advance(ms=TIMEOUT_MS - 1)
    manager.renew(T1, 1)
    clock.advance(ms=CHECK_MS)
    manager.tick()
    assert manager.entry(T2).state is TieringState.PENDING and manager.entry(T2).tiering_epoch == 2
    assert manager.entry(T1).state is TieringState.TIERING
    clock.advance(ms=TIMEOUT_MS)
    manager.tick()
    assert manager.entry(T1).tiering_epoch == 2
    for call in (lambda: manager.renew(T1, 1), lambda: manager.fail(T1, 1),
                 lambda: manager.finish(T1, 1, False), lambda: manager.renew(T1, 3)):
        with pytest.raises(FencedTieringEpochError, match="not match current epoch 2"):
            call()


def test_removed_table_is_never_handed_out_and_calls_on_it_fail(store: SqliteMetadataStore, clock: ManualClock) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 1_000)
    clock.advance(ms=1_000)
    manager.tick()
    manager.remove_table(T1)
    assert manager.request_table() is None
    with pytest.raises(TableNotExistError, match="The table 1 doesn't exist"):
        manager.renew(T1, 1)
    assert store.list_lake_tables() == {}


def test_freshness_change_rearms_a_scheduled_table(store: SqliteMetadataStore, clock: ManualClock) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 10 * MINUTES)
    clock.advance(ms=MINUTES)
    manager.update_freshness(T1, 30_000)
    assert manager.request_table() is not None


def test_state_survives_a_restart_and_fences_the_old_holder(store: SqliteMetadataStore, clock: ManualClock, tmp_path: Path) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 10_000)
    manager.add_table(T2, P2, 10_000)
    clock.advance(ms=10_000)
    held = manager.request_table()
    assert held is not None
    other = manager.request_table()
    assert other is not None
    manager.finish(other.table_id, other.tiering_epoch, False)
    entry = manager.entry(other.table_id)
    manager.add_snapshot(entry, LakeSnapshotRecord(5, "remote/x.offsets", None, [(None, 0, 42)]), None)
    store.close()

    clock.advance(ms=4_000)
    reopened = manager_on(SqliteMetadataStore(str(tmp_path / "metadata.sqlite")), clock)
    restarted = reopened.entry(held.table_id)
    assert restarted.state is TieringState.PENDING and restarted.tiering_epoch == held.tiering_epoch + 1
    with pytest.raises(FencedTieringEpochError):
        reopened.finish(held.table_id, held.tiering_epoch, False)
    again = reopened.request_table()
    assert again is not None and again.table_id == held.table_id
    assert reopened.request_table() is None, "the finished table waits the rest of its freshness, not a new one"
    clock.advance(ms=6_000)
    scheduled = reopened.request_table()
    assert scheduled is not None and scheduled.table_id == other.table_id
    snapshot = reopened.entry(other.table_id).latest_snapshot
    assert snapshot is not None and snapshot.snapshot_id == 5 and snapshot.offsets == [(None, 0, 42)]


def test_snapshot_retention_follows_earliest_to_keep(store: SqliteMetadataStore, clock: ManualClock) -> None:
    manager = manager_on(store, clock)
    manager.add_table(T1, P1, 1_000)
    entry = manager.entry(T1)

    def snapshot(snapshot_id: int) -> LakeSnapshotRecord:
        return LakeSnapshotRecord(snapshot_id, f"p{snapshot_id}", None, [])

    assert manager.add_snapshot(entry, snapshot(1), -1) == []
    assert manager.add_snapshot(entry, snapshot(2), -1) == []
    assert [s.snapshot_id for s in manager.add_snapshot(entry, snapshot(3), 2)] == [1]
    assert [s.snapshot_id for s in entry.snapshots] == [2, 3]
    assert [s.snapshot_id for s in manager.add_snapshot(entry, snapshot(4), None)] == [2, 3]
    assert [s.snapshot_id for s in entry.snapshots] == [4]
