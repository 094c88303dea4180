"""The coordinator's lake tiering state machine on a manual clock and a real SQLite store: the behaviour
Fluss pins for its manager (scheduling by freshness, epochs, fencing, heartbeat timeouts, failed and
forced rounds), and what strom adds: the state is persisted, survives a restart, and keeps epochs across
disabling and re-enabling the lake."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from strom.clock import ManualClock
from strom.coordinator.lake_tiering import (
    UNKNOWN,
    Assignment,
    LakeTableTiering,
    LakeTableTieringManager,
    TieringState,
)
from strom.errors import FencedTieringEpochError, StorageError, TableNotExistError
from strom.ids import TablePath
from strom.metadata.sqlite_store import SqliteMetadataStore

MINUTE_MS = 60_000
TIMEOUT_MS = 120_000
CHECK_MS = 15_000
T1, T2, T3 = 1, 2, 3
P1, P2, P3 = TablePath("db", "t1"), TablePath("db", "t2"), TablePath("db", "t3")

pytestmark = pytest.mark.asyncio


class FlakyStore(SqliteMetadataStore):
    """A real SQLite store whose tiering-state writes fail while ``failing`` is set (a full disk)."""

    failing = False

    def put_lake_tiering_state(self, table_id: int, payload: bytes) -> None:
        if self.failing:
            raise StorageError("disk full")
        super().put_lake_tiering_state(table_id, payload)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "metadata.sqlite"


@pytest.fixture
def store(store_path: Path) -> Iterator[FlakyStore]:
    opened = FlakyStore(str(store_path))
    yield opened
    opened.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def manager(store: FlakyStore, clock: ManualClock) -> LakeTableTieringManager:
    return LakeTableTieringManager(store, clock, TIMEOUT_MS, CHECK_MS)


async def requested(manager: LakeTableTieringManager) -> Assignment:
    assignment = await manager.request_table()
    assert assignment is not None, "a table should be due"
    return assignment


async def settled(result: Awaitable[None] | None) -> None:
    """Awaits what a manager call returned when it is a coroutine (some calls are sync, some async)."""
    if inspect.isawaitable(result):
        await result


def state_of(manager: LakeTableTieringManager, table_id: int) -> LakeTableTiering:
    table = manager.get(table_id)
    assert table is not None
    return table


# ---- Fluss's scenarios ----


async def test_tables_known_at_start_are_due_one_freshness_after_their_stored_last_round(
    store: FlakyStore, clock: ManualClock
) -> None:
    now = clock.now_ms()
    for table_id, path, base_ms in ((T1, P1, now - 3 * MINUTE_MS), (T2, P2, now)):
        stored = LakeTableTiering(table_id, path, 3 * MINUTE_MS, TieringState.SCHEDULED, 0, True, base_ms)
        store.put_lake_tiering_state(table_id, stored.encode())
    manager = LakeTableTieringManager(store, clock, TIMEOUT_MS, CHECK_MS)
    assert await requested(manager) == Assignment(T1, P1, 1)
    assert await manager.request_table() is None
    clock.advance(ms=3 * MINUTE_MS)
    assert await requested(manager) == Assignment(T2, P2, 1)


async def test_a_new_table_is_due_after_its_freshness_and_handed_to_one_job(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    await manager.add_table(T1, P1, 10_000)
    assert state_of(manager, T1).state is TieringState.SCHEDULED
    clock.advance(ms=9_999)
    assert await manager.request_table() is None
    clock.advance(ms=1)
    assert await requested(manager) == Assignment(T1, P1, 1)
    assert state_of(manager, T1).state is TieringState.TIERING
    assert await manager.request_table() is None


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.renew(T1, 1),
        lambda m: m.fail(T1, 1),
        lambda m: m.finish(T1, 1, False),
        lambda m: m.check_tiering(T1, 1),
    ],
    ids=["renew", "fail", "finish", "check"],
)
async def test_a_dropped_table_is_never_handed_out_and_calls_on_it_raise_table_not_exist(
    manager: LakeTableTieringManager, clock: ManualClock, store: FlakyStore,
    call: Callable[[LakeTableTieringManager], Awaitable[None] | None],
) -> None:
    await manager.add_table(T1, P1, 1_000)
    clock.advance(ms=1_000)
    await requested(manager)
    await manager.drop_table(T1)
    clock.advance(ms=10 * MINUTE_MS)
    assert await manager.request_table() is None
    with pytest.raises(TableNotExistError, match=r"The table 1 doesn't exist\."):
        await settled(call(manager))
    assert store.list_lake_tiering_states() == {}


async def test_a_finished_round_makes_the_table_due_a_freshness_later_with_the_next_epoch(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    await manager.add_table(T1, P1, 10_000)
    clock.advance(ms=10_000)
    await requested(manager)
    clock.advance(ms=2_000)
    await manager.finish(T1, 1, force_finished=False)
    assert await manager.request_table() is None
    clock.advance(ms=4_000)
    assert await manager.request_table() is None
    clock.advance(ms=6_000)
    assert await requested(manager) == Assignment(T1, P1, 2)
    assert state_of(manager, T1).last_round_duration_ms == 2_000


async def test_a_silent_job_loses_its_tables_and_every_other_epoch_is_fenced(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    await manager.add_table(T1, P1, 3 * MINUTE_MS)
    await manager.add_table(T2, P2, 3 * MINUTE_MS)
    clock.advance(ms=3 * MINUTE_MS)
    assert {(await requested(manager)).table_id, (await requested(manager)).table_id} == {T1, T2}
    clock.advance(ms=TIMEOUT_MS - 1)
    manager.renew(T1, 1)
    clock.advance(ms=10_000)
    await manager.tick()
    assert (state_of(manager, T2).state, state_of(manager, T2).tiering_epoch) == (TieringState.PENDING, 2)
    assert state_of(manager, T2).failures == 1
    assert state_of(manager, T1).state is TieringState.TIERING
    clock.advance(ms=TIMEOUT_MS)
    await manager.tick()
    assert (state_of(manager, T1).state, state_of(manager, T1).tiering_epoch) == (TieringState.PENDING, 2)
    for call in (lambda: manager.renew(T1, 1), lambda: manager.fail(T1, 1), lambda: manager.finish(T1, 1, False),
                 lambda: manager.renew(T1, 3)):
        with pytest.raises(FencedTieringEpochError, match="is not match current epoch 2 in coordinator for table 1"):
            await settled(call())


async def test_silent_jobs_are_looked_for_once_per_check_interval(store: FlakyStore, clock: ManualClock) -> None:
    manager = LakeTableTieringManager(store, clock, 1_000, CHECK_MS)
    await manager.add_table(T1, P1, 0)
    await requested(manager)
    clock.advance(ms=CHECK_MS - 1)
    await manager.tick()
    assert state_of(manager, T1).state is TieringState.TIERING, "timed out, but no check has run yet"
    clock.advance(ms=1)
    await manager.tick()
    assert (state_of(manager, T1).state, state_of(manager, T1).tiering_epoch) == (TieringState.PENDING, 2)


async def test_a_failed_round_is_due_again_at_once_with_the_next_epoch(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    await manager.add_table(T1, P1, 3 * MINUTE_MS)
    clock.advance(ms=3 * MINUTE_MS)
    await requested(manager)
    await manager.fail(T1, 1)
    assert state_of(manager, T1).failures == 1
    assert await requested(manager) == Assignment(T1, P1, 2)


async def test_a_force_finished_round_is_due_again_at_once(manager: LakeTableTieringManager, clock: ManualClock) -> None:
    await manager.add_table(T1, P1, 3 * MINUTE_MS)
    clock.advance(ms=3 * MINUTE_MS)
    await requested(manager)
    await manager.finish(T1, 1, force_finished=True)
    assert await requested(manager) == Assignment(T1, P1, 2)
    assert state_of(manager, T1).failures == 0


# ---- details of the state machine ----


async def test_pending_tables_are_handed_out_first_in_first_out(manager: LakeTableTieringManager, clock: ManualClock) -> None:
    await manager.add_table(T1, P1, 5_000)
    await manager.add_table(T2, P2, 1_000)
    await manager.add_table(T3, P3, 3_000)
    clock.advance(ms=1_000)
    await manager.tick()
    clock.advance(ms=2_000)
    await manager.tick()
    clock.advance(ms=2_000)
    assert [(await requested(manager)).table_id for _ in range(3)] == [T2, T3, T1]


async def test_stats_are_replaced_when_a_round_reports_any_and_kept_otherwise(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    await manager.add_table(T1, P1, 0)
    epoch = (await requested(manager)).tiering_epoch
    await manager.finish(T1, epoch, False, file_size=100, record_count=7)
    assert (state_of(manager, T1).file_size, state_of(manager, T1).record_count) == (100, 7)
    epoch = (await requested(manager)).tiering_epoch
    await manager.finish(T1, epoch, False)
    assert (state_of(manager, T1).file_size, state_of(manager, T1).record_count) == (100, 7)
    epoch = (await requested(manager)).tiering_epoch
    await manager.finish(T1, epoch, False, file_size=300)
    assert (state_of(manager, T1).file_size, state_of(manager, T1).record_count) == (300, UNKNOWN)


async def test_calls_for_a_table_not_being_tiered_are_fenced_even_with_its_epoch(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    await manager.add_table(T1, P1, 1_000)
    clock.advance(ms=1_000)
    epoch = (await requested(manager)).tiering_epoch
    await manager.finish(T1, epoch, False)
    for call in (lambda: manager.renew(T1, epoch), lambda: manager.finish(T1, epoch, False),
                 lambda: manager.check_tiering(T1, epoch)):
        with pytest.raises(FencedTieringEpochError, match="Scheduled: no round runs under epoch 1"):
            await settled(call())


async def test_a_new_freshness_rearms_a_scheduled_table(manager: LakeTableTieringManager, clock: ManualClock) -> None:
    await manager.add_table(T1, P1, 10 * MINUTE_MS)
    clock.advance(ms=MINUTE_MS)
    await manager.add_table(T1, P1, 30_000)  # the coordinator re-registers on ALTER
    assert (await requested(manager)).table_id == T1
    await manager.update_freshness(T1, 5 * MINUTE_MS)
    assert state_of(manager, T1).freshness_ms == 5 * MINUTE_MS


async def test_disabling_the_lake_stops_the_schedule_and_reenabling_never_reuses_an_epoch(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    await manager.add_table(T1, P1, 1_000)
    clock.advance(ms=1_000)
    held = await requested(manager)
    await manager.disable_table(T1)
    assert manager.get(T1) is None and manager.tables() == []
    with pytest.raises(TableNotExistError):
        manager.renew(T1, held.tiering_epoch)
    clock.advance(ms=MINUTE_MS)
    assert await manager.request_table() is None
    await manager.add_table(T1, P1, 1_000)
    assert await manager.request_table() is None, "re-enabled: due one freshness from now"
    clock.advance(ms=1_000)
    again = await requested(manager)
    assert again.tiering_epoch == held.tiering_epoch + 1
    with pytest.raises(FencedTieringEpochError):
        manager.check_tiering(T1, held.tiering_epoch)


async def test_a_failed_store_write_changes_nothing_and_the_timer_fires_later(
    manager: LakeTableTieringManager, clock: ManualClock, store: FlakyStore
) -> None:
    await manager.add_table(T1, P1, 1_000)
    clock.advance(ms=1_000)
    store.failing = True
    with pytest.raises(StorageError):
        await manager.tick()
    assert state_of(manager, T1).state is TieringState.SCHEDULED
    store.failing = False
    assignment = await requested(manager)
    store.failing = True
    with pytest.raises(StorageError):
        await manager.finish(T1, assignment.tiering_epoch, False)
    assert state_of(manager, T1).state is TieringState.TIERING
    store.failing = False
    await manager.finish(T1, assignment.tiering_epoch, False)
    assert state_of(manager, T1).state is TieringState.SCHEDULED


async def test_tables_the_catalog_no_longer_has_are_forgotten(
    manager: LakeTableTieringManager, store: FlakyStore
) -> None:
    await manager.add_table(T1, P1, 1_000)
    await manager.add_table(T2, P2, 1_000)
    await manager.retain_tables([T2])
    assert [t.table_id for t in manager.tables()] == [T2]
    assert list(store.list_lake_tiering_states()) == [T2]


async def test_counts_by_state_cover_lake_enabled_tables_only(manager: LakeTableTieringManager, clock: ManualClock) -> None:
    await manager.add_table(T1, P1, 0)
    await manager.add_table(T2, P2, MINUTE_MS)
    await manager.add_table(T3, P3, 0)
    await manager.disable_table(T3)
    await requested(manager)
    counts = manager.counts_by_state()
    assert (counts[TieringState.TIERING], counts[TieringState.SCHEDULED], sum(counts.values())) == (1, 1, 2)


# ---- restarts ----


def reopen(store_path: Path, clock: ManualClock) -> LakeTableTieringManager:
    return LakeTableTieringManager(SqliteMetadataStore(str(store_path)), clock, TIMEOUT_MS, CHECK_MS)


async def test_after_a_restart_the_round_in_flight_is_fenced_and_the_table_is_pending_with_the_next_epoch(
    manager: LakeTableTieringManager, clock: ManualClock, store_path: Path
) -> None:
    await manager.add_table(T1, P1, 10_000)
    clock.advance(ms=10_000)
    held = await requested(manager)
    restarted = reopen(store_path, clock)
    table = state_of(restarted, T1)
    assert (table.state, table.tiering_epoch, table.failures) == (TieringState.PENDING, held.tiering_epoch + 1, 0)
    with pytest.raises(FencedTieringEpochError):
        await restarted.finish(T1, held.tiering_epoch, False)
    assert await requested(restarted) == Assignment(T1, P1, held.tiering_epoch + 1)


async def test_after_a_restart_a_scheduled_table_waits_only_the_rest_of_its_freshness(
    manager: LakeTableTieringManager, clock: ManualClock, store_path: Path
) -> None:
    await manager.add_table(T1, P1, 10_000)
    clock.advance(ms=10_000)
    await manager.finish(T1, (await requested(manager)).tiering_epoch, False, file_size=5, record_count=2)
    clock.advance(ms=4_000)
    restarted = reopen(store_path, clock)
    assert await restarted.request_table() is None
    clock.advance(ms=5_999)
    assert await restarted.request_table() is None
    clock.advance(ms=1)
    assert await requested(restarted) == Assignment(T1, P1, 2)
    table = state_of(restarted, T1)
    assert (table.file_size, table.record_count, table.last_tiered_ms) == (5, 2, clock.now_ms() - 10_000)


async def test_after_a_restart_pending_tables_keep_their_epoch_and_order(
    manager: LakeTableTieringManager, clock: ManualClock, store_path: Path
) -> None:
    await manager.add_table(T2, P2, 1_000)
    await manager.add_table(T1, P1, 2_000)
    clock.advance(ms=1_000)
    await manager.tick()
    clock.advance(ms=1_000)
    await manager.tick()
    restarted = reopen(store_path, clock)
    assert [await requested(restarted) for _ in range(2)] == [Assignment(T2, P2, 1), Assignment(T1, P1, 1)]


async def test_after_a_restart_a_disabled_table_stays_unscheduled_and_keeps_its_epoch(
    manager: LakeTableTieringManager, clock: ManualClock, store_path: Path
) -> None:
    await manager.add_table(T1, P1, 0)
    await requested(manager)
    await manager.disable_table(T1)
    restarted = reopen(store_path, clock)
    assert restarted.tables() == [] and await restarted.request_table() is None
    await restarted.add_table(T1, P1, 0)
    assert (await requested(restarted)).tiering_epoch == 2


async def test_rearming_a_timer_many_times_keeps_the_timer_heap_bounded(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    await manager.add_table(T1, P1, 10 * MINUTE_MS)
    for freshness_ms in range(100):
        await manager.update_freshness(T1, 20 * MINUTE_MS + freshness_ms)
    assert len(manager._timers) <= 2 * 1 + 16
    clock.advance(ms=20 * MINUTE_MS + 98)
    assert await manager.request_table() is None
    clock.advance(ms=1)
    assert (await requested(manager)).table_id == T1


async def test_a_round_whose_finish_failed_to_store_still_times_out(
    manager: LakeTableTieringManager, clock: ManualClock, store: FlakyStore
) -> None:
    """A failed write while finishing leaves the round Tiering; if its job never reports again, the
    heartbeat deadline ends it (it used to stay Tiering until a restart)."""
    await manager.add_table(T1, P1, 0)
    assignment = await requested(manager)
    store.failing = True
    with pytest.raises(StorageError):
        await manager.finish(T1, assignment.tiering_epoch, False)
    store.failing = False
    clock.advance(ms=TIMEOUT_MS + CHECK_MS)
    await manager.tick()
    assert (state_of(manager, T1).state, state_of(manager, T1).failures) == (TieringState.PENDING, 1)


class OneTableFlakyStore(FlakyStore):
    """Tiering-state writes of table ``failing_table`` fail."""

    failing_table = -1

    def put_lake_tiering_state(self, table_id: int, payload: bytes) -> None:
        if table_id == self.failing_table:
            raise StorageError("disk full")
        super().put_lake_tiering_state(table_id, payload)


async def test_one_table_s_failed_write_does_not_spare_the_other_timed_out_rounds(
    store_path: Path, clock: ManualClock
) -> None:
    store = OneTableFlakyStore(str(store_path))
    try:
        manager = LakeTableTieringManager(store, clock, TIMEOUT_MS, CHECK_MS)
        for table_id, path in ((T1, P1), (T2, P2)):
            await manager.add_table(table_id, path, 0)
        await requested(manager), await requested(manager)
        store.failing_table = T1
        clock.advance(ms=TIMEOUT_MS + CHECK_MS)
        await manager.tick()
        assert state_of(manager, T2).state is TieringState.PENDING
        assert state_of(manager, T1).state is TieringState.TIERING, "its write failed: tried again later"
        store.failing_table = -1
        clock.advance(ms=CHECK_MS)
        await manager.tick()
        assert state_of(manager, T1).state is TieringState.PENDING
    finally:
        store.close()


async def test_the_manager_is_idle_without_lake_tables_and_arms_its_ticker_when_one_comes(
    manager: LakeTableTieringManager, clock: ManualClock
) -> None:
    """The coordinator's ticker waits while the manager is idle (no timer ticking ten times a second in a
    cluster without lake tables), and whatever gives it work wakes it."""
    assert manager.idle() and not manager.armed.is_set()
    await manager.add_table(T1, P1, 10_000)
    assert manager.armed.is_set() and not manager.idle()  # a timer to fire
    clock.advance(ms=10_000)
    manager.armed.clear()
    assert await requested(manager) == Assignment(T1, P1, 1)
    assert manager.armed.is_set() and not manager.idle()  # a round's heartbeat to check
    await manager.finish(T1, 1, False)
    assert not manager.idle()  # due again a freshness later
    await manager.drop_table(T1)
    clock.advance(ms=10_000)
    await manager.tick()  # the dropped table's timer falls due and goes
    assert manager.idle()
