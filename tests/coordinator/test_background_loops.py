"""The active coordinator's background loops stop when their owner stops them, even when the event they wait
on is set at the same moment.

Python 3.11's ``asyncio.wait_for`` returns the inner result instead of raising when the waiting task is
cancelled just as the inner wait completes, so a ``while True`` loop around it lives on, and the ``stop()``
that awaits it never returns. A coordinator stopping as its tablet servers deregister (the registry change
wakes the leader elector) hung that way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from strom.clock import ManualClock
from strom.coordinator.lake_service import LakeTieringService
from strom.coordinator.lake_tiering import LakeTableTieringManager
from strom.coordinator.leader_election import LeaderElector
from strom.membership.local_membership import LocalBucketStates, LocalServerRegistry
from strom.metadata.sqlite_store import SqliteMetadataStore

STOP_WITHIN_S = 5.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    opened = SqliteMetadataStore(str(tmp_path / "metadata.db"))
    try:
        yield opened
    finally:
        opened.close()


async def _stopped_in_time(stop: Any) -> bool:
    """Awaited in the caller's step, so the cancel comes in the same step as the wake. Past the bound the
    timeout cancels the stop, and that second cancel does end the loop (the stop then returns), so whether
    the bound expired is the answer, not whether the stop returned."""
    async with asyncio.timeout(STOP_WITHIN_S) as bound:
        await stop
    return not bound.expired()


@pytest.mark.asyncio
async def test_the_leader_elector_stops_when_woken_as_it_is_stopped(
        tmp_path: Path, store: SqliteMetadataStore) -> None:
    registry = LocalServerRegistry(str(tmp_path / "membership.db"))
    states = LocalBucketStates(str(tmp_path / "membership.db"))
    elector = LeaderElector(store, states, cast(Any, registry), cast(Any, None), lambda _table_id: None)
    try:
        elector.start()
        await asyncio.sleep(0.2)  # one reconcile round (no tables), then it waits for a change or the interval
        elector._wake.set()  # a registration changed, in the same step as the stop
        assert await _stopped_in_time(elector.stop()), "the elector's loop swallowed its cancellation"
    finally:
        states.close()
        registry.close()


@pytest.mark.asyncio
async def test_the_lake_tiering_ticker_stops_when_armed_as_it_is_stopped(store: SqliteMetadataStore) -> None:
    manager = LakeTableTieringManager(store, ManualClock(), 60_000, 60_000)
    service = LakeTieringService(cast(Any, None), manager, store, cast(Any, None), cast(Any, None))
    service.start()
    await asyncio.sleep(0.2)  # no lake table: it waits to be armed
    assert manager.idle()
    manager.armed.set()  # a table became due, in the same step as the stop
    assert await _stopped_in_time(service.stop()), "the ticker swallowed its cancellation"
