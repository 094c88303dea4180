"""The rebalance manager's bookkeeping (strom.coordinator.rebalance): a stored plan is resumed where it
stopped (a coordinator that takes over), cancel lets the bucket in flight finish and starts no other, and
each bucket's status is stored as it ends. The moves themselves are recorded, not made (the replica mover
has its own tests, the cluster test makes real ones)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from strom.coordinator.rebalance import RebalanceManager
from strom.ids import TableBucket
from strom.metadata.rebalance_plan import BucketMove, RebalanceStatus, decode_task, encode_task
from strom.metadata.sqlite_store import SqliteMetadataStore
from strom.rpc.messages import pb

pytestmark = pytest.mark.asyncio

TABLE: Any = object()


def moves(*statuses: RebalanceStatus) -> list[BucketMove]:
    return [BucketMove(TableBucket(1, b), 1, 2, (1,), (2,), status) for b, status in enumerate(statuses)]


class RecordingMover:
    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.moved: list[TableBucket] = []
        self.started = asyncio.Event()
        self._gate = gate

    async def move(self, _table: object, move: BucketMove) -> RebalanceStatus:
        self.started.set()
        if self._gate is not None:
            await self._gate.wait()
        self.moved.append(move.bucket)
        return RebalanceStatus.COMPLETED


WAIT_ROUNDS = 3000
"""Polls 10 ms apart: a bound on waiting for fsynced bookkeeping, far above what it takes."""


async def until_final(store: SqliteMetadataStore) -> tuple[str, RebalanceStatus, list[BucketMove]]:
    for _ in range(WAIT_ROUNDS):
        stored = decode_task(store.get_rebalance_task())  # type: ignore[arg-type]
        if stored[1].is_final:
            return stored
        await asyncio.sleep(0.01)
    raise AssertionError("the rebalance never ended")


async def test_a_stored_plan_resumes_with_the_buckets_not_done(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "meta.sqlite"))
    plan = moves(RebalanceStatus.COMPLETED, RebalanceStatus.REBALANCING, RebalanceStatus.NOT_STARTED)
    store.put_rebalance_task(encode_task("r1", RebalanceStatus.REBALANCING, plan))
    mover = RecordingMover()
    manager = RebalanceManager(store, None, lambda _table_id: TABLE, mover)  # type: ignore[arg-type]
    manager.start()
    rebalance_id, status, done = await until_final(store)
    await manager.stop()
    assert (rebalance_id, status) == ("r1", RebalanceStatus.COMPLETED)
    assert mover.moved == [TableBucket(1, 1), TableBucket(1, 2)], "the bucket in flight again, then the rest"
    assert [m.status for m in done] == [RebalanceStatus.COMPLETED] * 3
    progress = manager.list_rebalance_progress(pb.ListRebalanceProgressRequest(), None)
    assert progress.rebalance_status == RebalanceStatus.COMPLETED
    assert len(progress.table_progress[0].buckets_progress) == 3


async def test_cancel_lets_the_bucket_in_flight_finish_and_starts_no_other(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "meta.sqlite"))
    store.put_rebalance_task(encode_task("r2", RebalanceStatus.REBALANCING, moves(*[RebalanceStatus.NOT_STARTED] * 3)))
    gate = asyncio.Event()
    mover = RecordingMover(gate)
    manager = RebalanceManager(store, None, lambda _table_id: TABLE, mover)  # type: ignore[arg-type]
    manager.start()
    await asyncio.wait_for(mover.started.wait(), 5)
    await manager.cancel_rebalance(pb.CancelRebalanceRequest(rebalance_id="r2"), None)
    assert decode_task(store.get_rebalance_task())[1] is RebalanceStatus.CANCELED  # type: ignore[arg-type]
    gate.set()
    for _ in range(WAIT_ROUNDS):
        _, _, stored = decode_task(store.get_rebalance_task())  # type: ignore[arg-type]
        if stored[0].status is RebalanceStatus.COMPLETED:
            break
        await asyncio.sleep(0.01)
    await manager.stop()
    assert mover.moved == [TableBucket(1, 0)]
    assert [m.status for m in stored] == [RebalanceStatus.COMPLETED, RebalanceStatus.CANCELED, RebalanceStatus.CANCELED]
    cancelled_again = await manager.cancel_rebalance(pb.CancelRebalanceRequest(), None)  # a final one: nothing to do
    assert cancelled_again == pb.CancelRebalanceResponse()


async def test_a_move_that_raises_fails_its_bucket_and_the_rebalance_goes_on(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "meta.sqlite"))
    store.put_rebalance_task(encode_task("r3", RebalanceStatus.REBALANCING, moves(*[RebalanceStatus.NOT_STARTED] * 2)))

    class Breaking(RecordingMover):
        async def move(self, table: object, move: BucketMove) -> RebalanceStatus:
            if move.bucket.bucket == 0:
                raise OSError("ZooKeeper went away")
            return await super().move(table, move)

    mover = Breaking()
    manager = RebalanceManager(store, None, lambda table_id: TABLE, mover)  # type: ignore[arg-type]
    manager.start()
    _, status, done = await until_final(store)
    await manager.stop()
    assert status is RebalanceStatus.FAILED
    assert [m.status for m in done] == [RebalanceStatus.FAILED, RebalanceStatus.COMPLETED]
