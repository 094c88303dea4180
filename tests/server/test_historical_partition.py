"""The coordinator's historical system partition (``table.datalake.historical-partition.enabled``) on a manual
clock: a StromServer in this process, driven by strom's client. The partition comes and goes with the
option, retention never drops it, users can neither create nor drop it, ListPartitionInfos hides it while
GetMetadata resolves it, its buckets count against ``kv.leader-replica.memory-reserved``, and each
auto-partition check puts it right with the option."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.clock import ManualClock
from strom.config import Configuration
from strom.errors import (
    InsufficientKvLeaderReplicaCapacityError,
    PartitionNotExistError,
    PartitionSpecInvalidError,
)
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.server.node import StromServer
from strom.table_properties import HISTORICAL_PARTITION_VALUE

pytestmark = pytest.mark.asyncio

DAY_MS = 24 * 3600 * 1000
START = datetime(2025, 5, 8, 10, 0, tzinfo=UTC)
FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("day", pa.string(), nullable=False)])
HISTORICAL = "table.datalake.historical-partition.enabled"
OPTIONS = {
    "table.auto-partition.enabled": "true",
    "table.auto-partition.time-unit": "DAY",
    "table.auto-partition.num-precreate": "2",
    "table.auto-partition.num-retention": "1",
    "table.auto-partition.time-zone": "UTC",
    "table.datalake.enabled": "true",
    HISTORICAL: "true",
}


async def _server(tmp_path: Path, clock: ManualClock, **extra: str) -> StromServer:
    config = {
        "datalake.format": "paimon",
        "kv.snapshot.interval": "0s",
        "auto-partition.check.interval": "1h",  # the test runs the checks itself
        **extra,
    }
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration(config), clock=clock)
    await server.start()
    return server


def _descriptor(bucket_count: int = 2, **changed: str) -> TableDescriptor:
    return TableDescriptor(Schema.from_arrow(FIELDS, ["id", "day"]), partition_keys=("day",),
                           bucket_count=bucket_count, properties={**OPTIONS, **changed})


def _partition_names(server: StromServer, path: TablePath) -> set[str]:
    coordinator = server.coordinator
    assert coordinator is not None
    return {record.name for record in coordinator.list_partitions(coordinator.table_info(path))}


async def test_the_historical_partition_follows_the_option(tmp_path: Path) -> None:
    clock = ManualClock(int(START.timestamp() * 1000))
    server = await _server(tmp_path, clock)
    try:
        path = TablePath("fluss", "orders")
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            admin = connection.get_admin()
            await admin.create_table(path, _descriptor())
            assert _partition_names(server, path) == {HISTORICAL_PARTITION_VALUE, "20250508", "20250509"}
            listed = {info.partition_name for info in await admin.list_partition_infos(path)}
            assert listed == {"20250508", "20250509"}, "ListPartitionInfos hides the system partition"
            assert server.coordinator is not None and server.coordinator.kv_leader_replica_count() == 6

            # GetMetadata resolves it by name and by id, with a leader for each of the table's buckets
            info = await connection.metadata.refresh_table(path)
            partition_id = await connection.metadata.partition_id(info, HISTORICAL_PARTITION_VALUE)
            request = pb.MetadataRequest()
            request.partitions_id.append(partition_id)
            response = await connection.bootstrap_request(ApiKey.GET_METADATA, request)
            [metadata] = response.partition_metadata
            assert metadata.partition_name == HISTORICAL_PARTITION_VALUE
            assert [bucket.bucket_id for bucket in metadata.bucket_metadata] == [0, 1]
            assert all(bucket.HasField("leader_id") for bucket in metadata.bucket_metadata)

            with pytest.raises(PartitionSpecInvalidError, match="managed by the coordinator and cannot be dropped"):
                await admin.drop_partition(path, {"day": HISTORICAL_PARTITION_VALUE})
            with pytest.raises(PartitionSpecInvalidError, match="reserved for the historical system partition"):
                await admin.create_partition(path, {"day": HISTORICAL_PARTITION_VALUE})

            clock.advance(ms=5 * DAY_MS)  # retention drops the day partitions, never the historical one
            manager = server.role.auto_partitions
            assert manager is not None
            result = await manager.check()
            assert sorted(result.dropped[str(path)]) == ["20250508", "20250509"]
            assert _partition_names(server, path) == {HISTORICAL_PARTITION_VALUE, "20250513", "20250514"}

            await admin.alter_table(path, {HISTORICAL: "false"})
            assert _partition_names(server, path) == {"20250513", "20250514"}
            assert server.coordinator.kv_leader_replica_count() == 4
            async with await Connection.create(f"127.0.0.1:{server.port}") as fresh:
                with pytest.raises(PartitionNotExistError):
                    await fresh.metadata.partition_id(info, HISTORICAL_PARTITION_VALUE)

            await admin.alter_table(path, {HISTORICAL: "true"})
            assert _partition_names(server, path) == {HISTORICAL_PARTITION_VALUE, "20250513", "20250514"}
            async with await Connection.create(f"127.0.0.1:{server.port}") as fresh:
                assert await fresh.metadata.partition_id(info, HISTORICAL_PARTITION_VALUE) > partition_id
    finally:
        await server.stop()


async def test_each_check_reconciles_the_partition_with_the_option(tmp_path: Path) -> None:
    clock = ManualClock(int(START.timestamp() * 1000))
    server = await _server(tmp_path, clock)
    try:
        coordinator, manager = server.coordinator, server.role.auto_partitions
        assert coordinator is not None and manager is not None
        path = TablePath("fluss", "orders")
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            await connection.get_admin().create_table(path, _descriptor())
        table = coordinator.table_info(path)
        # the partition lost (a creation that failed after the table was stored): the next check makes it
        await coordinator.drop_partition_of(table, coordinator.partition(table, HISTORICAL_PARTITION_VALUE))
        result = await manager.check()
        assert result.created == {str(path): [HISTORICAL_PARTITION_VALUE]}
        assert HISTORICAL_PARTITION_VALUE in _partition_names(server, path)
        assert await manager.check() == type(result)(), "nothing left to do"

        # one left over without the option (a drop that failed after AlterTable stored it off): dropped
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            await connection.get_admin().alter_table(path, {HISTORICAL: "false"})
        await coordinator._create_historical_partition(coordinator.table_info(path))
        assert HISTORICAL_PARTITION_VALUE in _partition_names(server, path)
        assert (await manager.check()).dropped == {str(path): [HISTORICAL_PARTITION_VALUE]}
        assert HISTORICAL_PARTITION_VALUE not in _partition_names(server, path)
    finally:
        await server.stop()


async def test_historical_buckets_count_against_the_kv_leader_capacity(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(int(START.timestamp() * 1000))
    server = await _server(tmp_path, clock, **{
        "tablet-server.advertised-resource.memory-size": "48mb",
        "kv.leader-replica.memory-reserved": "16mb",  # 3 KV leaders
    })
    try:
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            admin = connection.get_admin()
            with pytest.raises(InsufficientKvLeaderReplicaCapacityError,
                               match=r"the historical partition of table 'fluss\.too_big'"):
                await admin.create_table(TablePath("fluss", "too_big"), _descriptor(bucket_count=4))
            assert not await admin.table_exists(TablePath("fluss", "too_big")), "refused before it was stored"

            path = TablePath("fluss", "orders")
            with caplog.at_level(logging.WARNING, logger="strom.coordinator.auto_partitions"):
                await admin.create_table(path, _descriptor())
            assert _partition_names(server, path) == {HISTORICAL_PARTITION_VALUE}, (
                "the historical partition comes first; today's does not fit beside it")
            assert "Not enough KV leader replica capacity for partition '20250508'" in caplog.text

            await admin.alter_table(path, {HISTORICAL: "false"})  # room for today's partition, made at once
            assert _partition_names(server, path) == {"20250508"}
            with pytest.raises(InsufficientKvLeaderReplicaCapacityError, match="The option was not changed"):
                await admin.alter_table(path, {HISTORICAL: "true"})
            assert (await admin.get_table_info(path)).properties[HISTORICAL] == "false"
            assert _partition_names(server, path) == {"20250508"}
    finally:
        await server.stop()
