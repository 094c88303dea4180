"""The active coordinator moves a bucket's leadership, and shrinks its ISR, when a tablet server is gone.

Triggered by every change of the live tablet servers (their ZooKeeper registrations) and, as a safety net,
every few seconds: for each bucket whose leader is not alive, the first live member of its ISR becomes the
leader under the next leader epoch, and the ISR shrinks to the live members; when none is alive, the bucket
has no leader (its ISR is kept: only those replicas hold every acknowledged write, so only they may lead it
later). A bucket whose leader lives but whose ISR names a server that is gone keeps its leader and epoch
and loses that member (Fluss's OnlineReplica → OfflineReplica), so its writes stop waiting for it. The
new state is written by compare-and-set, then every replica is told to read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from strom.coordinator.gateway import TabletServerGateway
from strom.coordinator.placement import placed_tables
from strom.ids import TableBucket
from strom.membership.contract import NO_LEADER, BucketStates, LeaderAndIsr, ServerRegistry
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 2.0


def elected(state: LeaderAndIsr, live: set[int]) -> LeaderAndIsr | None:
    """The state after an election among ``live`` servers, None when the leader and its ISR are fine."""
    if state.leader in live:
        isr = tuple(r for r in state.isr if r in live or r == state.leader)
        return None if isr == state.isr else LeaderAndIsr(state.leader, state.leader_epoch, state.replicas, isr)
    alive = tuple(r for r in state.isr if r in live)
    if not alive:
        if state.leader == NO_LEADER:
            return None
        return LeaderAndIsr(NO_LEADER, state.leader_epoch + 1, state.replicas, state.isr)
    return LeaderAndIsr(alive[0], state.leader_epoch + 1, state.replicas, alive)


class LeaderElector:
    """Owned by the active coordinator's event loop."""

    def __init__(
        self,
        store: MetadataStore,
        states: BucketStates,
        registry: ServerRegistry,
        tablets: TabletServerGateway,
        table_of: Callable[[int], TableInfo | None],
    ) -> None:
        self._store = store
        self._states = states
        self._registry = registry
        self._tablets = tablets
        self._table_of = table_of
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._shutting_down: set[int] = set()
        """Tablet servers stopping under ControlledShutdown: treated as gone until their registration is."""

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def on_change(_live: object) -> None:  # on a ZooKeeper thread
            loop.call_soon_threadsafe(self._wake.set)

        self._registry.add_listener(on_change)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:
                log.exception("leader election round failed; trying again")
            self._wake.clear()
            # asyncio.timeout, not wait_for: before Python 3.12 wait_for swallows a cancel that comes as the
            # wake does, and this loop would outlive the stop() that awaits it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECONCILE_INTERVAL_S):
                    await self._wake.wait()

    async def shut_down(self, server_id: int) -> list[TableBucket]:
        """ControlledShutdown: move every leadership off ``server_id`` (to a live member of the ISR) and take
        it out of every ISR, as if it were gone, before it stops; returns the buckets it still leads (no
        other in-sync replica is alive)."""
        self._shutting_down.add(server_id)
        await self.reconcile()
        remaining = []
        for table, partition_id in await off_loop(placed_tables, self._store, self._table_of):
            states = await off_loop(self._states.get_many, table.buckets(partition_id))
            remaining += [bucket for bucket, state in states.items() if state.leader == server_id]
        return remaining

    async def reconcile(self) -> int:
        """Elect leaders where needed; returns how many buckets changed."""
        registered = set(self._registry.live())
        self._shutting_down &= registered  # a stopped server's registration is gone; when it returns it leads again
        live = registered - self._shutting_down
        changed = 0
        for table, partition_id in await off_loop(placed_tables, self._store, self._table_of):
            buckets = table.buckets(partition_id)
            states = await off_loop(self._states.get_many, buckets)
            moved: list[TableBucket] = []
            for bucket, state in states.items():
                if elected(state, live) is None:
                    continue
                found = await off_loop(self._states.get, bucket)
                if found is None:
                    continue
                current, version = found
                new = elected(current, live)
                if new is None:
                    continue
                if await off_loop(self._states.compare_and_set, bucket, new, version):
                    log.info("%s: leader %d -> %d at epoch %d (ISR %s)", bucket, current.leader, new.leader,
                             new.leader_epoch, list(new.isr))
                    moved.append(bucket)
            if moved:
                self._tablets.become_leader(table, moved)
                changed += len(moved)
        return changed


__all__ = ["LeaderElector", "elected"]
