"""The active coordinator answers GetMetadata from memory: it makes every change to the catalog and to the
buckets' leadership, so what it read or wrote last is current, and a slow or briefly unreachable ZooKeeper
does not hold up the clients' metadata.

The coordinator reaches ZooKeeper through a proxy the test cuts (a partition, well within its session):
every GetMetadata of tables it knows is answered, with the leaders ZooKeeper holds; once ZooKeeper is back,
a leader elected after a kill and a changed table are what the next GetMetadata says."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.client import Connection, TableBucket, TablePath
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.server.local_cluster import LocalCluster, Member
from strom.zk.zookeeper_server import unavailable_reason
from tests.cluster.test_cluster_processes import create_table, upsert
from tests.cluster.test_replication import States
from tests.nemesis.proxy import FaultyProxy

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

REQUESTS = 50
CONFIG = {"kv.snapshot.interval": "0s", "zookeeper.client.session-timeout": "18s"}


class ZooKeeperProxiedCluster(LocalCluster):
    """A cluster whose ``proxied`` members (``coordinator-1``, ``tablet-server-1``, …) reach ZooKeeper
    through one proxy that can be cut or slowed (:attr:`proxy`, made when the first member starts)."""

    def __init__(self, data_dir: Path, tablet_servers: int, config: dict[str, str], proxied: tuple[str, ...]) -> None:
        super().__init__(data_dir, tablet_servers, config)
        self.proxied = proxied
        self.proxy: FaultyProxy | None = None

    def start_member(self, role: str, server_id: int, port: int | None = None) -> Member:
        if self.proxy is None:
            host, _, rest = self.zookeeper_address.partition(":")
            zk_port, slash, root = rest.partition("/")
            self.proxy = FaultyProxy(host, int(zk_port))
            for name in self.proxied:
                self.member_config[name] = {"zookeeper.address": f"{self.proxy.address}{slash}{root}"}
        return super().start_member(role, server_id, port)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ZooKeeperProxiedCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = ZooKeeperProxiedCluster(tmp_path / "cluster", 2, CONFIG, proxied=("coordinator-1",))
    try:
        local.start()
        yield local
    finally:
        local.stop()
        if local.proxy is not None:
            local.proxy.close()


def _request(path: TablePath) -> pb.MetadataRequest:
    request = pb.MetadataRequest()
    request.table_path.add(database_name=path.database_name, table_name=path.table_name)
    return request


def _leaders(response: pb.MetadataResponse) -> dict[int, int]:
    return {b.bucket_id: b.leader_id for b in response.table_metadata[0].bucket_metadata}


def test_get_metadata_is_answered_from_memory_while_zookeeper_is_cut_off(cluster: ZooKeeperProxiedCluster) -> None:
    assert cluster.proxy is not None
    states = States(cluster)

    async def scenario() -> None:
        async with await Connection.create(cluster.client_config()) as connection:
            deadline = time.monotonic() + 30
            while sum(n.server_type == "TabletServer" for n in await connection.get_admin().get_server_nodes()) < 2:
                assert time.monotonic() < deadline, "the tablet servers did not register"
                await asyncio.sleep(0.2)
            path = await create_table(connection, buckets=3, **{"table.replication.factor": "2"})
            await upsert(connection, path, range(30), "a")
            table_id = (await connection.get_admin().get_table_info(path)).table_id
            warm = await connection.bootstrap_request(ApiKey.GET_METADATA, _request(path))
            in_zookeeper = {b: states.get(TableBucket(table_id, b)).leader for b in range(3)}
            assert _leaders(warm) == in_zookeeper

            cluster.proxy.cut()  # type: ignore[union-attr]
            try:
                latencies = []
                for _ in range(REQUESTS):
                    started = time.perf_counter()
                    answer = await asyncio.wait_for(
                        connection.bootstrap_request(ApiKey.GET_METADATA, _request(path)), 5)
                    latencies.append(time.perf_counter() - started)
                    assert _leaders(answer) == in_zookeeper
                    assert answer.table_metadata[0].table_id == table_id
            finally:
                cluster.proxy.heal()  # type: ignore[union-attr]
            latencies.sort()
            print(f"GetMetadata with ZooKeeper cut off: p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
                  f"p99 {latencies[int(len(latencies) * 0.99) - 1] * 1000:.1f} ms")

            # a leader elected by the coordinator (its own write) is what GetMetadata says next
            victim = in_zookeeper[0]
            cluster.signal_member(cluster.member("tablet-server", victim), signal.SIGKILL)
            deadline = time.monotonic() + 60
            while True:
                now_leading = states.get(TableBucket(table_id, 0)).leader
                answer = await connection.bootstrap_request(ApiKey.GET_METADATA, _request(path))
                if now_leading != victim and _leaders(answer)[0] == now_leading:
                    break
                assert time.monotonic() < deadline, f"GetMetadata still names {_leaders(answer)[0]} as leader"
                await asyncio.sleep(0.2)

            # a changed table (a new column) is read again: its next GetMetadata carries the new schema
            await connection.get_admin().alter_table(path, set_properties={"table.log.ttl": "3d"})
            answer = await connection.bootstrap_request(ApiKey.GET_METADATA, _request(path))
            assert b"3d" in answer.table_metadata[0].table_json

    try:
        asyncio.run(scenario())
    finally:
        states.close()


ZOOKEEPER_DELAY_S = 0.5


def test_a_slow_zookeeper_holds_up_no_answer_the_coordinator_has_in_memory(cluster: ZooKeeperProxiedCluster) -> None:
    """With every ZooKeeper exchange of the coordinator delayed 500 ms, a table creation takes seconds (its
    store calls run on store threads); GetMetadata of a known table is answered meanwhile, from memory, as
    fast as ever — a store call on the event loop would hold each answer until the creation's call ends."""
    assert cluster.proxy is not None

    async def scenario() -> None:
        async with await Connection.create(cluster.client_config()) as connection:
            known = await create_table(connection, buckets=2)
            expected = await connection.bootstrap_request(ApiKey.GET_METADATA, _request(known))
            cluster.proxy.slow(ZOOKEEPER_DELAY_S)  # type: ignore[union-attr]
            try:
                creation = asyncio.ensure_future(create_table(connection, buckets=1))
                latencies: list[float] = []
                while not creation.done():
                    started = time.perf_counter()
                    answer = await asyncio.wait_for(
                        connection.bootstrap_request(ApiKey.GET_METADATA, _request(known)), 5)
                    latencies.append(time.perf_counter() - started)
                    assert _leaders(answer) == _leaders(expected)
                    await asyncio.sleep(0.01)
                await creation
            finally:
                cluster.proxy.heal()  # type: ignore[union-attr]
            # the creation waited on ZooKeeper for several delays; the answers did not wait on it at all
            assert len(latencies) >= 20, f"{len(latencies)} GetMetadata answers while the creation ran"
            latencies.sort()
            print(f"GetMetadata while a creation waits on a ZooKeeper slowed {ZOOKEEPER_DELAY_S * 1000:.0f} ms: "
                  f"{len(latencies)} answers, p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
                  f"p99 {latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000:.1f} ms")

    asyncio.run(scenario())
