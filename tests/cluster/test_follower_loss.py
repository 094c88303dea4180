"""A dead follower stops holding up writes within seconds, not ``log.replica.max-lag-time``.

Two ways out of the ISR, each tested with the other (and the lag bound) set too long to act: the leader
drops a follower that has sent no fetch for ``log.replica.max-silence-time``; the coordinator drops a tablet
server from every ISR once its ZooKeeper registration is gone. Either way the next write is acknowledged
without the dead server, and the server rejoins once it is back and caught up.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.client import Connection, TableBucket
from strom.metadata.cluster_health import ClusterHealth, ClusterHealthStatus
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import _cluster, upsert
from tests.cluster.test_replication import PK_FIELDS, States, create

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

SLOW = "60s"
"""Longer than any wait below: a bound set to this cannot be what let a write through."""
WRITE_WAIT_S = 20.0


def _three(tmp_path: Path, config: dict[str, str]) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path / "cluster", 3, {"kv.snapshot.interval": "0s", **config})


@pytest.fixture
def silence_bound(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _three(tmp_path, {"zookeeper.client.session-timeout": SLOW, "log.replica.max-lag-time": SLOW,
                                 "log.replica.max-silence-time": "2s"})


@pytest.fixture
def registration_bound(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _three(tmp_path, {"zookeeper.client.session-timeout": "4s", "log.replica.max-lag-time": SLOW,
                                 "log.replica.max-silence-time": SLOW})


def _kill_a_follower_and_write(local: LocalCluster) -> tuple[float, int, tuple[int, ...], TableBucket]:
    """Seconds from a follower's SIGKILL to the next acknowledged upsert; the follower; the ISR after."""

    async def setup() -> tuple[object, TableBucket]:
        async with await Connection.create(local.bootstrap) as connection:
            path = await create(connection, PK_FIELDS, ["id"])
            await upsert(connection, path, range(10), "before")
            return path, TableBucket((await connection.get_admin().get_table_info(path)).table_id, 0)

    path, bucket = asyncio.run(setup())
    states = States(local)
    try:
        state = states.wait_full_isr(bucket)
        follower = next(r for r in state.replicas if r != state.leader)
        local.signal_member(local.member("tablet-server", follower), signal.SIGKILL)
        killed = time.monotonic()

        async def write() -> None:
            async with await Connection.create(local.bootstrap) as connection:
                await asyncio.wait_for(upsert(connection, path, range(10, 20), "after"), WRITE_WAIT_S)  # type: ignore[arg-type]

        asyncio.run(write())
        waited = time.monotonic() - killed
        return waited, follower, states.get(bucket).isr, bucket
    finally:
        states.close()


def test_the_leader_drops_a_follower_that_fell_silent(silence_bound: LocalCluster) -> None:
    waited, follower, isr, _ = _kill_a_follower_and_write(silence_bound)
    assert follower not in isr
    assert waited < WRITE_WAIT_S  # the registration (60 s) and lag (60 s) bounds could not have acted


def _health(local: LocalCluster) -> ClusterHealth:
    async def ask() -> ClusterHealth:
        async with await Connection.create(local.bootstrap) as connection:
            return await connection.get_admin().get_cluster_health()

    return asyncio.run(ask())


def test_the_coordinator_drops_a_gone_server_from_the_isr_and_it_rejoins(registration_bound: LocalCluster) -> None:
    """GetClusterHealth follows: YELLOW while the server is gone (every bucket led, its replicas out of
    sync), GREEN once it is back in every ISR."""
    waited, follower, isr, bucket = _kill_a_follower_and_write(registration_bound)
    assert follower not in isr
    assert waited < WRITE_WAIT_S  # the silence (60 s) and lag (60 s) bounds could not have acted
    gone = _health(registration_bound)
    assert gone.status is ClusterHealthStatus.YELLOW, gone
    assert gone.active_leader_replicas == gone.num_leader_replicas > 0
    assert gone.in_sync_replicas < gone.num_replicas == 3 * gone.num_leader_replicas
    registration_bound.start_member("tablet-server", follower)
    states = States(registration_bound)
    try:
        assert follower in states.wait_full_isr(bucket).isr
    finally:
        states.close()
    deadline = time.monotonic() + WRITE_WAIT_S
    while (back := _health(registration_bound)).status is not ClusterHealthStatus.GREEN and time.monotonic() < deadline:
        time.sleep(0.2)
    assert back == ClusterHealth(gone.num_replicas, gone.num_replicas, gone.num_leader_replicas,
                                 gone.num_leader_replicas, ClusterHealthStatus.GREEN)
