"""The replica mover's steps on a real ZooKeeper (strom.coordinator.replica_mover): the tablet servers are
played by the notice callback, which does what a bucket's leader does (adds a caught-up follower to the
ISR by compare-and-set) or nothing (a replica that never catches up)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from strom.coordinator.replica_mover import ReplicaMover
from strom.ids import TableBucket
from strom.membership.contract import LeaderAndIsr
from strom.metadata.rebalance_plan import BucketMove, RebalanceStatus
from strom.zk.bucket_state import ZooKeeperBucketStates
from strom.zk.metadata_store import connect_kazoo, parse_location

pytestmark = pytest.mark.asyncio

BUCKET = TableBucket(7, 0)
TABLE: Any = object()  # the mover hands the table to the notices only


@pytest.fixture
def zookeeper(zookeeper_location: str) -> Iterator[tuple[KazooClient, str]]:
    hosts, root = parse_location(zookeeper_location)
    client = connect_kazoo(hosts, 10_000)
    yield client, root
    client.stop()
    client.close()


@pytest.fixture
def states(zookeeper: tuple[KazooClient, str]) -> ZooKeeperBucketStates:
    return ZooKeeperBucketStates(*zookeeper)


class Tablets:
    """Records every notice; as the leader would, adds the followers named in ``catch_up`` to the ISR."""

    def __init__(self, states: ZooKeeperBucketStates, catch_up: set[int]) -> None:
        self.states, self.catch_up = states, catch_up
        self.notices: list[set[int]] = []

    async def notify(self, _table: object, bucket: TableBucket, servers: Iterable[int]) -> None:
        self.notices.append(set(servers))
        found = self.states.get(bucket)
        assert found is not None
        state, version = found
        joining = [r for r in state.replicas if r in self.catch_up and r not in state.isr]
        if joining:
            assert self.states.compare_and_set(bucket, state.with_isr((*state.isr, *joining)), version)


async def test_a_move_adds_waits_for_the_isr_then_switches_leader_and_drops_the_old_replica(
    states: ZooKeeperBucketStates,
) -> None:
    states.create(BUCKET, LeaderAndIsr(1, 3, (1, 2), (1, 2)))
    tablets = Tablets(states, catch_up={3})
    move = BucketMove(BUCKET, 1, 3, (1, 2), (3, 2))
    assert await ReplicaMover(states, tablets.notify).move(TABLE, move) is RebalanceStatus.COMPLETED
    final = states.get(BUCKET)
    assert final is not None and final[0] == LeaderAndIsr(3, 4, (3, 2), (3, 2))
    assert tablets.notices[0] == {1, 2, 3}, "first every replica, the new one included"
    assert tablets.notices[-1] == {1, 2, 3}, "last the leaving replica too, which is no longer in the state"

    again = await ReplicaMover(states, tablets.notify).move(TABLE, move)  # a resumed plan: nothing left to do
    assert again is RebalanceStatus.COMPLETED and states.get(BUCKET)[0] == final[0]  # type: ignore[index]


async def test_moving_only_followers_keeps_the_leader_epoch(states: ZooKeeperBucketStates) -> None:
    states.create(BUCKET, LeaderAndIsr(1, 0, (1, 2), (1, 2)))
    tablets = Tablets(states, catch_up={4})
    move = BucketMove(BUCKET, 1, 1, (1, 2), (1, 4))
    assert await ReplicaMover(states, tablets.notify).move(TABLE, move) is RebalanceStatus.COMPLETED
    assert states.get(BUCKET)[0] == LeaderAndIsr(1, 0, (1, 4), (1, 4))  # type: ignore[index]


async def test_a_replica_that_never_catches_up_is_rolled_back(states: ZooKeeperBucketStates) -> None:
    states.create(BUCKET, LeaderAndIsr(1, 2, (1, 2), (1, 2)))
    tablets = Tablets(states, catch_up=set())
    mover = ReplicaMover(states, tablets.notify, catch_up_timeout_s=0.6)
    status = await mover.move(TABLE, BucketMove(BUCKET, 1, 3, (1, 2), (3, 1)))
    assert status is RebalanceStatus.TIMEOUT
    assert states.get(BUCKET)[0] == LeaderAndIsr(1, 2, (1, 2), (1, 2)), "as before the move"  # type: ignore[index]
    assert tablets.notices[-1] == {3}, "the added replica is told to leave"


async def test_a_replica_that_drops_out_of_the_isr_again_is_rolled_back(states: ZooKeeperBucketStates) -> None:
    states.create(BUCKET, LeaderAndIsr(1, 0, (1, 2), (1, 2)))

    async def leader_shrinks_the_isr(_table: object, bucket: TableBucket, _servers: Iterable[int]) -> None:
        state, version = states.get(bucket)  # type: ignore[misc]
        if 3 not in state.isr and 3 in state.replicas:  # joins, then falls behind before the switch
            states.compare_and_set(bucket, state.with_isr((*state.isr, 3)), version)
            await asyncio.sleep(0)
            state, version = states.get(bucket)  # type: ignore[misc]
            states.compare_and_set(bucket, state.with_isr((1, 2)), version)

    mover = ReplicaMover(states, leader_shrinks_the_isr, catch_up_timeout_s=0.5)
    status = await mover.move(TABLE, BucketMove(BUCKET, 1, 3, (1, 2), (3, 2)))
    assert status is RebalanceStatus.TIMEOUT
    assert states.get(BUCKET)[0].replicas == (1, 2)  # type: ignore[index]


async def test_a_bucket_whose_table_was_dropped_fails_its_move(states: ZooKeeperBucketStates) -> None:
    tablets = Tablets(states, catch_up={3})
    status = await ReplicaMover(states, tablets.notify).move(TABLE, BucketMove(TableBucket(99, 0), 1, 3, (1,), (3,)))
    assert status is RebalanceStatus.FAILED


async def test_a_new_leader_out_of_the_isr_at_the_switch_fails_the_move_and_rolls_it_back(
    zookeeper: tuple[KazooClient, str], states: ZooKeeperBucketStates,
) -> None:
    """Between the catch-up check and the switch, the leader drops the new replica from the ISR again."""
    states.create(BUCKET, LeaderAndIsr(1, 0, (1, 2), (1, 2)))

    class Shrinking(ZooKeeperBucketStates):
        seen_in_sync = 0

        def get(self, bucket: TableBucket) -> tuple[LeaderAndIsr, int] | None:
            found = super().get(bucket)
            if found is not None and 3 in found[0].isr:
                self.seen_in_sync += 1
                if self.seen_in_sync == 2:  # the read after the catch-up check: the leader shrinks the ISR
                    assert super().compare_and_set(bucket, found[0].with_isr((1, 2)), found[1])
                    return super().get(bucket)
            return found

    shrinking = Shrinking(*zookeeper)
    tablets = Tablets(shrinking, catch_up={3})
    status = await ReplicaMover(shrinking, tablets.notify).move(TABLE, BucketMove(BUCKET, 1, 3, (1, 2), (3, 2)))
    assert status is RebalanceStatus.FAILED
    assert states.get(BUCKET)[0] == LeaderAndIsr(1, 0, (1, 2), (1, 2)), "the added replica left again"  # type: ignore[index]
