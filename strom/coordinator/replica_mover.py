"""Moving one bucket's replicas and leadership, without losing or blocking acknowledged writes.

The steps, each a compare-and-set of the bucket's ZooKeeper state (:mod:`strom.zk.bucket_state`) followed
by a notice to the replicas concerned (they read the state and act, :mod:`strom.tablet.replication`):

1. add the new replicas as followers (same leader, same leader epoch): they fetch the leader's log from
   the start; the leader waits for none of them, so writes go on as before;
2. wait until each new replica, and the new leader, is in the ISR (the leader adds a follower once it holds
   every acknowledged write);
3. in one write, make the new leader lead (next leader epoch, only when it changes) and drop the replicas
   that leave, from the replicas and the ISR; a replica that leaves stops and deletes its copy, a leader
   that leaves fails its unacknowledged writes so clients retry at the new one.

A move that does not reach step 3 in time is rolled back: the replicas it added leave again. Moves are
safe to run again after a coordinator restart: every step checks where the bucket already is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from strom.ids import TableBucket
from strom.membership.contract import BucketStates, LeaderAndIsr
from strom.metadata.off_loop import off_loop
from strom.metadata.rebalance_plan import BucketMove, RebalanceStatus
from strom.metadata.table_info import TableInfo

log = logging.getLogger(__name__)

CATCH_UP_TIMEOUT_S = 300.0
"""How long new replicas may take to join the ISR before the move is rolled back (Fluss: 5 minutes a task)."""
POLL_S = 0.2
RENOTIFY_S = 2.0
"""A new replica not in the ISR yet is told again this often (a notice lost on the way costs no more)."""
CAS_ATTEMPTS_MAX = 20

Notify = Callable[[TableInfo, TableBucket, Iterable[int]], Awaitable[None]]
"""Tell these servers to read the bucket's state and act on it."""


class MoveAborted(Exception):
    """The bucket is gone or its state changed in a way the move cannot follow."""


class ReplicaMover:
    """Owned by the active coordinator's event loop."""

    def __init__(self, states: BucketStates, notify: Notify, catch_up_timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        self._states = states
        self._notify = notify
        self.catch_up_timeout_s = catch_up_timeout_s

    async def move(self, table: TableInfo, move: BucketMove) -> RebalanceStatus:
        """Carry out ``move``; COMPLETED, or TIMEOUT after a rollback, or FAILED (the bucket is gone)."""
        bucket, target = move.bucket, move.new_replicas
        added = [r for r in target if r not in move.original_replicas]
        try:
            state = await self._update(bucket, lambda s: _with_added(s, target))
            await self._notify(table, bucket, state.replicas)
            if not await self._caught_up(table, bucket, {*added, move.new_leader}):
                await self._roll_back(table, bucket, added)
                return RebalanceStatus.TIMEOUT
            # only this move changes the replicas, so ``state`` still names every one, the leaving ones too
            final = await self._update(bucket, lambda s: _switched(s, target, move.new_leader))
            await self._notify(table, bucket, {*state.replicas, *final.replicas})
        except MoveAborted as exc:
            log.warning("%s: move to %s abandoned: %s", bucket, list(target), exc)
            with contextlib.suppress(MoveAborted):
                await self._roll_back(table, bucket, added)  # no bucket is left with an extra replica
            return RebalanceStatus.FAILED
        log.info("%s: replicas %s -> %s, leader %s -> %d (epoch %d)", bucket, list(move.original_replicas),
                 list(final.replicas), move.original_leader, final.leader, final.leader_epoch)
        return RebalanceStatus.COMPLETED

    async def _caught_up(self, table: TableInfo, bucket: TableBucket, needed: set[int]) -> bool:
        deadline = time.monotonic() + self.catch_up_timeout_s
        told = time.monotonic()
        while True:
            state, _version = await self._current(bucket)
            if needed <= set(state.isr):
                return True
            if time.monotonic() >= deadline:
                log.warning("%s: %s did not join the ISR %s within %.0f s", bucket, sorted(needed - set(state.isr)),
                            list(state.isr), self.catch_up_timeout_s)
                return False
            if time.monotonic() - told >= RENOTIFY_S:
                told = time.monotonic()
                await self._notify(table, bucket, [state.leader, *(needed - set(state.isr))])
            await asyncio.sleep(POLL_S)

    async def _roll_back(self, table: TableInfo, bucket: TableBucket, added: list[int]) -> None:
        def without_added(state: LeaderAndIsr) -> LeaderAndIsr | None:
            if not any(r in state.replicas for r in added) or state.leader in added:
                return None
            return LeaderAndIsr(state.leader, state.leader_epoch, tuple(r for r in state.replicas if r not in added),
                                tuple(r for r in state.isr if r not in added))

        await self._update(bucket, without_added)
        await self._notify(table, bucket, added)

    async def _current(self, bucket: TableBucket) -> tuple[LeaderAndIsr, int]:
        """The bucket's state and its node version."""
        found = await off_loop(self._states.get, bucket)
        if found is None:
            raise MoveAborted("the bucket has no state (its table was dropped)")
        return found

    async def _update(self, bucket: TableBucket, change: Callable[[LeaderAndIsr], LeaderAndIsr | None]) -> LeaderAndIsr:
        """Apply ``change`` to the bucket's state by compare-and-set (again after a concurrent write: the
        leader changing the ISR, an election); returns the state in force afterwards."""
        for _ in range(CAS_ATTEMPTS_MAX):
            state, version = await self._current(bucket)
            new = change(state)
            if new is None:
                return state
            if await off_loop(self._states.compare_and_set, bucket, new, version):
                return new
            await asyncio.sleep(POLL_S / 4)
        raise MoveAborted(f"its state kept changing under {CAS_ATTEMPTS_MAX} attempts")


def _with_added(state: LeaderAndIsr, target: tuple[int, ...]) -> LeaderAndIsr | None:
    missing = tuple(r for r in target if r not in state.replicas)
    if not missing:
        return None
    return LeaderAndIsr(state.leader, state.leader_epoch, (*state.replicas, *missing), state.isr)


def _switched(state: LeaderAndIsr, target: tuple[int, ...], new_leader: int) -> LeaderAndIsr | None:
    if state.leader == new_leader and state.replicas == target:
        return None
    if new_leader not in state.isr:
        raise MoveAborted(f"server {new_leader} left the ISR {list(state.isr)} before it could lead")
    epoch = state.leader_epoch + (1 if state.leader != new_leader else 0)
    isr = (new_leader, *(r for r in state.isr if r in target and r != new_leader))
    return LeaderAndIsr(new_leader, epoch, target, isr)


__all__ = ["CATCH_UP_TIMEOUT_S", "MoveAborted", "Notify", "ReplicaMover"]
