"""A leader that acknowledged writes alone (its follower had left the ISR) keeps them through a SIGKILL and
a restart: the sequence that once lost acknowledged appends.

Two tablet servers, a log table with replication factor 2: appends acknowledged by both; the follower
SIGSTOPped until the leader drops it from the ISR; appends acknowledged by the leader alone; the leader
SIGKILLed and the follower resumed (it is not electable: it left the ISR); the leader restarted. It leads
again, and every acknowledged append is there once, in order, on the leader and, once it caught up, on the
follower too.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableBucket, TableDescriptor, TablePath
from strom.membership.contract import NO_LEADER
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import _cluster
from tests.cluster.test_replication import States
from tests.conftest import unique_name

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

CONFIG = {"zookeeper.client.session-timeout": "4s", "log.replica.max-silence-time": "2s",
          "log.replica.max-lag-time": "6s", "kv.snapshot.interval": "0s"}
WAIT_S = 60.0


@pytest.fixture
def two(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path / "cluster", 2, CONFIG)


async def _append(connection: Connection, path: TablePath, ids: range) -> None:
    writer = (await connection.get_table(path)).new_append().create_writer()
    for i in ids:  # one acknowledged append each
        await writer.append_arrow_batch(pa.table({"id": [i]})).wait()


async def _read_all(connection: Connection, path: TablePath, count: int) -> list[int]:
    scanner = (await connection.get_table(path)).new_scan().create_log_scanner()
    scanner.subscribe(0, 0)
    read: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while len(read) < count and time.monotonic() < deadline:
        read += [i for b in await scanner.poll(500) for i in b.batch.column("id").to_pylist()]
    await asyncio.sleep(1.0)  # anything past ``count`` (a duplicate) shows up too
    read += [i for b in await scanner.poll(500) for i in b.batch.column("id").to_pylist()]
    return read


def _wait(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_appends_acknowledged_by_a_lone_leader_survive_its_kill_and_restart(two: LocalCluster) -> None:
    path = TablePath("fluss", unique_name("lone_leader"))

    async def create_and_append() -> int:
        async with await Connection.create(two.bootstrap) as connection:
            descriptor = TableDescriptor(Schema.from_arrow(pa.schema([("id", pa.int64())])), bucket_count=1,
                                         properties={"table.replication.factor": "2"})
            await connection.get_admin().create_table(path, descriptor)
            return (await connection.get_admin().get_table_info(path)).table_id

    table_id = asyncio.run(create_and_append())
    bucket = TableBucket(table_id, 0)
    states = States(two)
    try:
        state = states.wait_full_isr(bucket)
        leader = state.leader
        follower = next(r for r in state.replicas if r != leader)

        async def append(ids: range) -> None:
            async with await Connection.create(two.bootstrap) as connection:
                await asyncio.wait_for(_append(connection, path, ids), WAIT_S)

        asyncio.run(append(range(21)))
        follower_member = two.member("tablet-server", follower)
        two.signal_member(follower_member, signal.SIGSTOP)
        try:
            _wait(lambda: states.get(bucket).isr == (leader,), "the leader never dropped the paused follower")
            asyncio.run(append(range(21, 26)))  # acknowledged by the leader alone
            killed_epoch = states.get(bucket).leader_epoch
            two.signal_member(two.member("tablet-server", leader), signal.SIGKILL)
        finally:
            two.signal_member(follower_member, signal.SIGCONT)
        # the follower is not electable (it left the ISR): once the leader's registration expired the bucket
        # has no leader, and the restarted leader finds it so
        _wait(lambda: states.get(bucket).leader == NO_LEADER, "the bucket kept a leader")
        two.start_member("tablet-server", leader)
        _wait(lambda: (now := states.get(bucket)).leader == leader and now.leader_epoch > killed_epoch,
              "the restarted leader never led again")

        async def read() -> list[int]:
            async with await Connection.create(two.bootstrap) as connection:
                return await _read_all(connection, path, 26)

        assert asyncio.run(read()) == list(range(26)), "acknowledged appends were lost or duplicated"
        states.wait_full_isr(bucket)  # the follower caught up and rejoined
    finally:
        states.close()
