"""``kv.leader-replica.memory-reserved`` in a cluster: each tablet server registers its own memory
(``tablet-server.advertised-resource.memory-size``) in ZooKeeper, and the coordinator sums the live ones."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import InsufficientKvLeaderReplicaCapacityError
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import _cluster
from tests.server_process import free_port

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False)])


@pytest.fixture
def metrics_port() -> int:
    """The coordinator's Prometheus port."""
    return free_port()


@pytest.fixture
def cluster(tmp_path: Path, metrics_port: int) -> Iterator[LocalCluster]:
    members = {"tablet-server-1": {"tablet-server.advertised-resource.memory-size": "32mb"},
               "tablet-server-2": {"tablet-server.advertised-resource.memory-size": "96mb"},
               "coordinator-1": {"metrics.reporter.prometheus.port": str(metrics_port)}}
    config = {"kv.snapshot.interval": "0s", "kv.leader-replica.memory-reserved": "32mb"}  # 128 MB: 4 KV leaders
    yield from _cluster(tmp_path / "cluster", 2, config, member_config=members)


def test_the_coordinator_sums_the_memory_each_tablet_server_registered(cluster: LocalCluster, metrics_port: int) -> None:
    async def scenario() -> None:
        async with await Connection.create(cluster.client_config()) as connection:
            admin = connection.get_admin()
            schema = Schema.from_arrow(FIELDS, ["id"])
            await admin.create_table(TablePath("fluss", "four"), TableDescriptor(schema, bucket_count=4))
            with pytest.raises(InsufficientKvLeaderReplicaCapacityError, match="capacity of 4"):
                await admin.create_table(TablePath("fluss", "fifth"), TableDescriptor(schema, bucket_count=1))
            await admin.create_table(TablePath("fluss", "log"), TableDescriptor(Schema.from_arrow(FIELDS), bucket_count=4))

    asyncio.run(scenario())
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
             if line.startswith("strom_kv_leader_replica_")}
    assert found == {"strom_kv_leader_replica_count": 4.0, "strom_kv_leader_replica_capacity": 4.0}
