"""The leader's side of replication (ReplicationManager): the high watermark passes only what every replica
ZooKeeper may name in the ISR holds, and a follower's fetch offset counts only inside the leader's log.

The bucket states are kept in memory here, with a gate on the ISR write, so the test can hold that write in
flight (the state ZooKeeper would hold is then already the new one, as after a slow write) or lose its
answer: the cluster tests run the same code against a real ZooKeeper, but cannot stop a write half way.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from strom.config import Configuration
from strom.errors import LogOffsetOutOfRangeError
from strom.ids import TableBucket, TablePath
from strom.log.log_tablet import LogTablet
from strom.membership.contract import LeaderAndIsr
from strom.metadata.table_info import TableInfo
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import BigIntType
from strom.tablet.replica import Replica, ReplicaManager
from strom.tablet.replication import ReplicationManager
from tests.log.test_log_tablet import append, batch_bytes

pytestmark = pytest.mark.asyncio

ME, SECOND, THIRD = 1, 2, 3
TABLE = TableInfo(
    9, TablePath("db", "events"), 1,
    TableDescriptor(Schema.of([("id", BigIntType())]), bucket_count=1).to_json(), 0, 0,
)
BUCKET = TableBucket(TABLE.table_id, 0)


class GatedStates:
    """A bucket's state with its version, as BucketStates keeps them; an ISR write may be held open."""

    def __init__(self, state: LeaderAndIsr) -> None:
        self.state, self.version = state, 0
        self.gate = threading.Event()
        self.gate.set()
        self.writing = threading.Event()
        self.answer_lost = False
        """The next writes land but their caller gets an error (a connection lost before the answer)."""

    def get(self, _bucket: TableBucket) -> tuple[LeaderAndIsr, int]:
        return self.state, self.version

    def get_many(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr]:
        return dict.fromkeys(buckets, self.state)

    def compare_and_set(self, _bucket: TableBucket, state: LeaderAndIsr, version: int) -> bool:
        if version != self.version:
            return False
        self.state, self.version = state, version + 1  # stored: an election would read it from here on
        self.writing.set()
        assert self.gate.wait(10), "the test never released the ISR write"
        if self.answer_lost:
            raise ConnectionError("the connection to ZooKeeper was lost before the answer came")
        return True


@dataclass
class Leader:
    manager: ReplicationManager
    states: GatedStates
    replica: Replica


@contextlib.asynccontextmanager
async def leading(tmp_path: Path, silence_max_ms: int = 60_000) -> AsyncIterator[Leader]:
    """This server (ME) leading BUCKET with SECOND in the ISR and THIRD outside it."""
    replicas = ReplicaManager(tmp_path, Configuration())
    states = GatedStates(LeaderAndIsr(ME, 1, (ME, SECOND, THIRD), (ME, SECOND)))
    manager = ReplicationManager(
        ME, replicas, states, registry=None, peers=None, table_of=lambda _table_id: TABLE,  # type: ignore[arg-type]
        lag_max_ms=60_000, silence_max_ms=silence_max_ms,
    )
    await manager.apply(TABLE, BUCKET)
    replica = replicas.replica(BUCKET)
    try:
        yield Leader(manager, states, replica)
    finally:
        states.gate.set()
        await manager.stop()
        await asyncio.gather(*manager._writes, return_exceptions=True)
        await replicas.stop_bucket(BUCKET)


@pytest_asyncio.fixture
async def leader(tmp_path: Path) -> AsyncIterator[Leader]:
    async with leading(tmp_path) as started:
        yield started


async def append_durable(replica: Replica, ids: list[int]) -> int:
    result = append(replica.log, batch_bytes(ids))
    await replica.log.flushed(result.next_offset)
    return result.next_offset


async def test_a_follower_joining_the_isr_holds_the_high_watermark_while_its_write_is_in_flight(leader: Leader) -> None:
    first = await append_durable(leader.replica, [1, 2])
    leader.manager.on_follower_fetch(BUCKET, SECOND, first)
    leader.manager.on_follower_fetch(BUCKET, THIRD, first)  # caught up: it joins the ISR
    assert leader.replica.log.high_watermark == first
    leader.states.gate.clear()
    await asyncio.sleep(0.05)  # the write that adds it starts and is held open
    assert leader.states.writing.is_set() and THIRD in leader.states.state.isr, "ZooKeeper names it already"

    second = await append_durable(leader.replica, [3])
    leader.manager.on_follower_fetch(BUCKET, SECOND, second)
    assert leader.replica.log.high_watermark == first, "not acknowledged: the joining follower lacks it"

    leader.states.gate.set()
    await asyncio.gather(*leader.manager._writes)
    assert leader.replica.log.high_watermark == first
    leader.manager.on_follower_fetch(BUCKET, THIRD, second)
    assert leader.replica.log.high_watermark == second


async def test_a_follower_that_joins_nothing_does_not_hold_the_high_watermark(leader: Leader) -> None:
    first = await append_durable(leader.replica, [1, 2])
    leader.manager.on_follower_fetch(BUCKET, SECOND, first)
    leader.manager.on_follower_fetch(BUCKET, THIRD, 0)  # behind the high watermark: it stays outside
    second = await append_durable(leader.replica, [3])
    leader.manager.on_follower_fetch(BUCKET, SECOND, second)
    assert not leader.manager._writes and leader.replica.log.high_watermark == second


async def test_a_fetch_offset_past_the_leaders_log_is_refused_and_not_counted(leader: Leader) -> None:
    first = await append_durable(leader.replica, [1, 2])
    with pytest.raises(LogOffsetOutOfRangeError, match="past the end"):
        leader.manager.on_follower_fetch(BUCKET, SECOND, first + 5)  # batches a former leader wrote
    second = await append_durable(leader.replica, [3, 4, 5])
    assert leader.replica.log.high_watermark == 0, "the second replica has not fetched anything here"
    leader.manager.on_follower_fetch(BUCKET, SECOND, first)
    assert leader.replica.log.high_watermark == first < second


async def test_a_joining_follower_whose_isr_write_went_unanswered_counts_until_it_falls_silent(tmp_path: Path) -> None:
    async with leading(tmp_path, silence_max_ms=300) as leader:
        leader.manager.start()
        first = await append_durable(leader.replica, [1, 2])
        leader.manager.on_follower_fetch(BUCKET, SECOND, first)
        leader.states.answer_lost = True
        leader.manager.on_follower_fetch(BUCKET, THIRD, first)  # joins; ZooKeeper stores it, the answer is lost
        await asyncio.gather(*leader.manager._writes)
        assert THIRD in leader.states.state.isr

        second = await append_durable(leader.replica, [3])
        leader.manager.on_follower_fetch(BUCKET, SECOND, second)
        assert leader.replica.log.high_watermark == first, "it may be in the ISR: its write is not acknowledged"

        leader.states.answer_lost = False
        for _ in range(50):  # the second replica keeps fetching; the third has gone silent
            await asyncio.sleep(0.1)
            leader.manager.on_follower_fetch(BUCKET, SECOND, second)
            if leader.replica.log.high_watermark == second:
                assert THIRD not in leader.states.state.isr, "acknowledged only once ZooKeeper no longer names it"
                break
        assert leader.replica.log.high_watermark == second, "the silent follower stops holding writes back"


async def test_a_follower_joins_only_once_it_holds_what_the_leader_held_when_its_leadership_began(
    tmp_path: Path,
) -> None:
    """A leader restarted after a crash may have recorded its high watermark before its last acknowledged
    writes (the record is written once a second): a follower at that stale mark lacks them, so it may not
    join the ISR (and become electable) until it holds the leader's log end as of the leadership's start."""
    replicas = ReplicaManager(tmp_path, Configuration())
    before = LogTablet.open(replicas.replica_directory(TABLE, BUCKET) / "log", replicas.log_config)
    await before.durable(append(before, batch_bytes([1, 2])).next_offset)
    before.checkpoint_high_watermark()  # records 2
    await before.durable(append(before, batch_bytes([3])).next_offset)  # acknowledged alone, not recorded
    before.close()

    states = GatedStates(LeaderAndIsr(ME, 2, (ME, SECOND, THIRD), (ME, SECOND)))
    manager = ReplicationManager(
        ME, replicas, states, registry=None, peers=None, table_of=lambda _table_id: TABLE,  # type: ignore[arg-type]
        lag_max_ms=60_000, silence_max_ms=60_000,
    )
    await manager.apply(TABLE, BUCKET)
    replica = replicas.replica(BUCKET)
    try:
        assert (replica.log.high_watermark, replica.log.log_end_offset) == (2, 3)
        manager.on_follower_fetch(BUCKET, THIRD, 2)  # at the recorded high watermark: it lacks offset 2
        assert not manager._writes and THIRD not in states.state.isr
        manager.on_follower_fetch(BUCKET, THIRD, 3)
        await asyncio.gather(*manager._writes)
        assert THIRD in states.state.isr
    finally:
        await manager.stop()
        await replicas.stop_bucket(BUCKET)


async def test_the_lag_check_runs_often_only_while_a_follower_is_in_the_isr_or_joining(
        leader: Leader, tmp_path: Path) -> None:
    """The ISR check wakes the loop four times a second; a server whose buckets have one replica each has
    no follower to watch, and its loop wakes once a second, for the high watermark's checkpoint."""
    assert leader.manager._watching_followers()  # SECOND in the ISR
    alone = tmp_path / "alone"
    replicas = ReplicaManager(alone, Configuration())
    manager = ReplicationManager(
        ME, replicas, GatedStates(LeaderAndIsr(ME, 1, (ME,), (ME,))), registry=None, peers=None,  # type: ignore[arg-type]
        table_of=lambda _table_id: TABLE, lag_max_ms=60_000, silence_max_ms=60_000,
    )
    try:
        await manager.apply(TABLE, BUCKET)
        assert not manager._watching_followers()
        manager._leading[BUCKET].joining = (SECOND,)  # a follower caught up, its ISR write under way
        assert manager._watching_followers()
    finally:
        await manager.stop()
        await replicas.stop_bucket(BUCKET)


async def test_an_isr_change_whose_notice_never_came_is_taken_up_from_zookeeper(tmp_path: Path) -> None:
    """Found by the nemesis (seed 423): the coordinator took a dead follower out of the ISR at the same
    leader epoch, and its notice to the leader was lost (the leader's ZooKeeper connection dropped). The
    leader, still counting the follower in, never let it join again when it came back. It now takes up
    the ISR ZooKeeper holds, and the follower rejoins once caught up."""
    async with leading(tmp_path) as leader:
        leader.manager.start()
        first = await append_durable(leader.replica, [1, 2])
        states = leader.states
        states.state, states.version = LeaderAndIsr(ME, 1, (ME, SECOND, THIRD), (ME,)), states.version + 1  # no notice
        for _ in range(100):
            if leader.manager._leading[BUCKET].state.isr == (ME,):
                break
            await asyncio.sleep(0.1)
        assert leader.manager._leading[BUCKET].state.isr == (ME,)
        leader.manager.on_follower_fetch(BUCKET, SECOND, first)  # back and caught up: it joins again
        await asyncio.gather(*leader.manager._writes)
        assert SECOND in states.state.isr
