"""Server options Fluss users set, through a real server process: ``default.replication.factor`` is what a
table without ``table.replication.factor`` gets, ``allow.create.log.tables`` / ``allow.create.kv.tables``
refuse those tables with Fluss's message, and ``log.replica.min-in-sync-replicas-number`` refuses a write
with acks = all (-1) while the in-sync replicas are fewer (NotEnoughReplicas, 29) and lets acks = 1 through,
as Fluss does. (tests/cluster/test_min_isr.py has the same rule on a replicated cluster.)"""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
import pytest_asyncio

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import InvalidReplicationFactorError, InvalidTableError
from strom.records import kv_batch, log_batch
from strom.records.compacted import CompactedKeyEncoder, CompactedRowEncoder
from strom.records.types import DataField, IntType, RowType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

NOT_ENOUGH_REPLICAS = 29
ROW_TYPE = RowType((DataField("id", IntType(nullable=False)), DataField("name", StringType())))
PK_SCHEMA = Schema.from_arrow(pa.schema([pa.field("id", pa.int32(), nullable=False), ("name", pa.string())]), ["id"])
LOG_SCHEMA = Schema.from_arrow(pa.schema([("id", pa.int32()), ("name", pa.string())]))


@pytest_asyncio.fixture
async def rpc_of(tmp_path):  # type: ignore[no-untyped-def]
    """A server with the given options and strom's raw RPC client to it."""
    servers: list[ServerProcess] = []
    connections: list[RpcConnection] = []

    async def start(config: dict[str, str]) -> tuple[ServerProcess, RpcConnection]:
        server = ServerProcess(tmp_path / f"data-{len(servers)}", config).start()
        servers.append(server)
        host, _, port = server.address.rpartition(":")
        connections.append(await RpcConnection.connect(host, int(port)))
        return server, connections[-1]

    yield start
    for connection in connections:
        await connection.close()
    for server in servers:
        server.stop()


async def _create(address: str, name: str, schema: Schema, **properties: str) -> int:
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", name)
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1, properties=properties))
        return int((await connection.get_admin().get_table_info(path)).table_id)


async def _put(rpc: RpcConnection, table_id: int, acks: int, key: int) -> pb.PbPutKvRespForBucket:
    row = (key, f"n{key}")
    records = kv_batch.build_kv_batch(1, [CompactedKeyEncoder(ROW_TYPE, [0]).encode(row)],
                                      [CompactedRowEncoder(ROW_TYPE).encode(row)])
    request = pb.PutKvRequest(acks=acks, table_id=table_id, timeout_ms=10_000)
    request.buckets_req.add(bucket_id=0, records=records)
    return (await rpc.request(ApiKey.PUT_KV, request)).buckets_resp[0]


async def _produce(rpc: RpcConnection, table_id: int, acks: int) -> pb.PbProduceLogRespForBucket:
    batch = pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["a"]})
    request = pb.ProduceLogRequest(acks=acks, table_id=table_id, timeout_ms=10_000)
    request.buckets_req.add(bucket_id=0, records=log_batch.build_arrow_batch(batch, schema_id=1))
    return (await rpc.request(ApiKey.PRODUCE_LOG, request)).buckets_resp[0]


async def test_min_in_sync_replicas_refuses_acks_all_writes_the_isr_cannot_satisfy(rpc_of) -> None:  # type: ignore[no-untyped-def]
    server, rpc = await rpc_of({"log.replica.min-in-sync-replicas-number": "2"})
    kv_table = await _create(server.address, "users", PK_SCHEMA)
    log_table = await _create(server.address, "events", LOG_SCHEMA)
    refused = await _put(rpc, kv_table, -1, 1)
    assert refused.error_code == NOT_ENOUGH_REPLICAS and "insufficient to satisfy the required acks" in refused.error_message
    assert (await _produce(rpc, log_table, -1)).error_code == NOT_ENOUGH_REPLICAS
    accepted = await _put(rpc, kv_table, 1, 2)
    assert not accepted.HasField("error_code") or accepted.error_code == 0, accepted
    produced = await _produce(rpc, log_table, 1)
    assert not produced.HasField("error_code") or produced.error_code == 0, produced
    async with await Connection.create(server.address) as connection:
        table = await connection.get_table(TablePath("fluss", "users"))
        lookuper = table.new_lookup().create_lookuper()
        assert await lookuper.lookup({"id": 1}) is None, "a refused write leaves nothing"
        assert (await lookuper.lookup({"id": 2})) == {"id": 2, "name": "n2"}


async def test_default_replication_factor_and_which_tables_may_be_created(rpc_of) -> None:  # type: ignore[no-untyped-def]
    server, _ = await rpc_of({"default.replication.factor": "2", "allow.create.log.tables": "false"})
    with pytest.raises(InvalidReplicationFactorError, match="Replication factor: 2 larger than available tablet servers: 1"):
        await _create(server.address, "defaulted", PK_SCHEMA)
    await _create(server.address, "explicit", PK_SCHEMA, **{"table.replication.factor": "1"})
    with pytest.raises(InvalidTableError, match="Creation of Log Tables is disallowed in the cluster"):
        await _create(server.address, "events", LOG_SCHEMA, **{"table.replication.factor": "1"})
    other, _ = await rpc_of({"allow.create.kv.tables": "false"})
    with pytest.raises(InvalidTableError, match="Creation of Primary Key Tables is disallowed in the cluster"):
        await _create(other.address, "users", PK_SCHEMA)
    await _create(other.address, "events", LOG_SCHEMA)


async def test_the_minimum_of_in_sync_replicas_changes_at_run_time(rpc_of) -> None:  # type: ignore[no-untyped-def]
    server, rpc = await rpc_of({})
    kv_table = await _create(server.address, "users", PK_SCHEMA)
    assert not (await _put(rpc, kv_table, -1, 1)).error_code
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().alter_cluster_configs({"log.replica.min-in-sync-replicas-number": "2"}, [])
        assert (await _put(rpc, kv_table, -1, 2)).error_code == NOT_ENOUGH_REPLICAS, "applied without a restart"
        await connection.get_admin().alter_cluster_configs({}, ["log.replica.min-in-sync-replicas-number"])
    assert not (await _put(rpc, kv_table, -1, 3)).error_code


async def test_writes_are_refused_while_the_data_disk_is_above_the_write_limit(rpc_of, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``server.data-disk.write-limit-ratio`` below the disk's real usage: client writes get DiskWriteLocked
    (70, retriable) and nothing is appended; raising the limit at run time lets them through at the next
    sample, as lowering the usage below the recover ratio would."""
    import shutil

    disk = shutil.disk_usage(tmp_path)
    usage = disk.used / (disk.used + disk.free)
    limit, recover = usage / 2, usage / 4  # the disk is already past the limit
    server, rpc = await rpc_of({"server.data-disk.write-limit-ratio": str(limit),
                                "server.data-disk.write-recover-ratio": str(recover),
                                "server.data-disk.check-interval": "100ms"})
    kv_table = await _create(server.address, "users", PK_SCHEMA)
    log_table = await _create(server.address, "events", LOG_SCHEMA)
    refused = await _put(rpc, kv_table, -1, 1)
    assert refused.error_code == 70 and "data disk usage reached" in refused.error_message
    assert (await _produce(rpc, log_table, 1)).error_code == 70, "whatever the acks"
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().alter_cluster_configs({"server.data-disk.write-limit-ratio": "1.0"}, [])
        deadline = asyncio.get_running_loop().time() + 10
        while (answer := await _put(rpc, kv_table, -1, 2)).error_code == 70:
            assert asyncio.get_running_loop().time() < deadline, "writes never resumed"
            await asyncio.sleep(0.1)
        assert not answer.error_code
        lookuper = (await connection.get_table(TablePath("fluss", "users"))).new_lookup().create_lookuper()
        assert await lookuper.lookup({"id": 1}) is None and await lookuper.lookup({"id": 2}) is not None
