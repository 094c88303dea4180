"""``kv.leader-replica.memory-reserved`` on a real server: a 64 MB tablet server
(``tablet-server.advertised-resource.memory-size``) at 16 MB per KV leader holds 4 primary-key buckets.
Creating primary-key tables and partitions up to that works, the next is refused with
InsufficientKvLeaderReplicaCapacity (71) and creates nothing, log tables are not counted, a drop frees
room, and AlterClusterConfigs lifts the cap at run time."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import InsufficientKvLeaderReplicaCapacityError
from tests.server_process import free_port

T = TypeVar("T")
FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("day", pa.string(), nullable=False)])
CAPPED = {"tablet-server.advertised-resource.memory-size": "64mb", "kv.leader-replica.memory-reserved": "16mb"}


def run(address: str, action: Callable[[Connection], Awaitable[T]]) -> T:
    async def main() -> T:
        async with await Connection.create(address) as connection:
            return await action(connection)

    return asyncio.run(main())


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line.startswith("strom_kv_leader_replica_")}


def _pk(buckets: int, partitioned: bool = False) -> TableDescriptor:
    if partitioned:
        return TableDescriptor(Schema.from_arrow(FIELDS, ["id", "day"]), partition_keys=("day",), bucket_count=buckets)
    return TableDescriptor(Schema.from_arrow(FIELDS, ["id"]), bucket_count=buckets)


def _create(address: str, name: str, descriptor: TableDescriptor, ignore_if_exists: bool = False) -> None:
    async def create(connection: Connection) -> None:
        await connection.get_admin().create_table(TablePath("fluss", name), descriptor, ignore_if_exists)

    run(address, create)


def test_primary_key_buckets_are_capped_by_the_clusters_memory(server_factory: Any) -> None:
    port = free_port()
    server = server_factory({**CAPPED, "metrics.reporter.prometheus.port": str(port)})
    address = server.address
    assert metrics(port) == {"strom_kv_leader_replica_count": 0.0, "strom_kv_leader_replica_capacity": 4.0}

    _create(address, "two", _pk(2))
    _create(address, "log", TableDescriptor(Schema.from_arrow(FIELDS), bucket_count=8))  # log tables are not counted
    _create(address, "days", _pk(1, partitioned=True))  # a partitioned table has no buckets of its own
    _create(address, "one", _pk(1))
    assert metrics(port)["strom_kv_leader_replica_count"] == 3.0

    with pytest.raises(InsufficientKvLeaderReplicaCapacityError) as refused:
        _create(address, "too_big", _pk(2))
    message = str(refused.value)
    assert "table 'fluss.too_big'" in message and "has 3 of its capacity of 4" in message, message
    _create(address, "one", _pk(1), ignore_if_exists=True)  # an existing table is no new one

    async def add_partition(connection: Connection, day: str) -> None:
        await connection.get_admin().create_partition(TablePath("fluss", "days"), {"day": day})

    run(address, lambda connection: add_partition(connection, "20250101"))  # the 4th KV leader
    assert metrics(port)["strom_kv_leader_replica_count"] == 4.0
    with pytest.raises(InsufficientKvLeaderReplicaCapacityError, match=r"partition '20250102' of table 'fluss\.days'"):
        run(address, lambda connection: add_partition(connection, "20250102"))
    _create(address, "more_log", TableDescriptor(Schema.from_arrow(FIELDS), bucket_count=4))

    async def official_create() -> int:
        config = pyfluss.Config({"bootstrap.servers": address})
        async with await pyfluss.FlussConnection.create(config) as official:
            schema = pyfluss.Schema(FIELDS, primary_keys=["id"])
            with pytest.raises(pyfluss.FlussError) as failure:
                await official.get_admin().create_table(pyfluss.TablePath("fluss", "official"),
                                                        pyfluss.TableDescriptor(schema, bucket_count=1))
            return int(failure.value.error_code)

    assert asyncio.run(official_create()) == 71, "pyfluss sees Fluss's code"

    async def state(connection: Connection) -> tuple[bool, bool, list[str]]:
        admin = connection.get_admin()
        partitions = await admin.list_partition_infos(TablePath("fluss", "days"))
        return (await admin.table_exists(TablePath("fluss", "too_big")),
                await admin.table_exists(TablePath("fluss", "official")), [p.partition_name for p in partitions])

    assert run(address, state) == (False, False, ["20250101"]), "a refused creation creates nothing"

    async def drop(connection: Connection) -> None:
        await connection.get_admin().drop_table(TablePath("fluss", "two"))

    run(address, drop)
    assert metrics(port)["strom_kv_leader_replica_count"] == 2.0
    _create(address, "too_big", _pk(2))  # room again

    async def lift(connection: Connection) -> None:
        await connection.get_admin().alter_cluster_configs({"kv.leader-replica.memory-reserved": "0"})

    run(address, lift)
    assert metrics(port) == {"strom_kv_leader_replica_count": 4.0, "strom_kv_leader_replica_capacity": -1.0}
    _create(address, "unlimited", _pk(16))
    run(address, lambda connection: add_partition(connection, "20250102"))
    assert metrics(port)["strom_kv_leader_replica_count"] == 21.0
