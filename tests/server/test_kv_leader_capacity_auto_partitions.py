"""Auto-partitioning under ``kv.leader-replica.memory-reserved``: a partition of a primary-key table that does
not fit the cluster's KV leader replica capacity is not created (logged, the table and its other partitions
stay), and the next check creates it once there is room."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.clock import ManualClock
from strom.config import Configuration
from strom.server.node import StromServer

pytestmark = pytest.mark.asyncio

START = datetime(2025, 5, 8, 10, 0, tzinfo=UTC)
FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("day", pa.string(), nullable=False)])
AUTO_DAY = {
    "table.auto-partition.enabled": "true",
    "table.auto-partition.time-unit": "DAY",
    "table.auto-partition.num-precreate": "3",
    "table.auto-partition.time-zone": "UTC",
}


async def test_an_auto_partition_beyond_the_capacity_waits_for_room(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    config = Configuration({
        "kv.snapshot.interval": "0s",
        "auto-partition.check.interval": "1h",  # the test runs the check itself
        "tablet-server.advertised-resource.memory-size": "48mb",
        "kv.leader-replica.memory-reserved": "16mb",  # 3 KV leaders
    })
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, config, clock=ManualClock(int(START.timestamp() * 1000)))
    await server.start()
    try:
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            admin = connection.get_admin()
            path = TablePath("fluss", "daily")
            with caplog.at_level(logging.WARNING, logger="strom.coordinator.auto_partitions"):
                await admin.create_table(path, TableDescriptor(Schema.from_arrow(FIELDS, ["id", "day"]),
                                                               partition_keys=("day",), bucket_count=2,
                                                               properties=AUTO_DAY))
            names = sorted(p.partition_name for p in await admin.list_partition_infos(path))
            assert names == ["20250508"], "the first fits (2 of 3), the next two do not"
            assert "Not enough KV leader replica capacity for partition '20250509'" in caplog.text

            await admin.alter_cluster_configs({"kv.leader-replica.memory-reserved": "8mb"})  # 6 KV leaders
            assert server.coordinator is not None and server.coordinator.kv_leader_capacity.capacity() == 6
            await server.role.auto_partitions.check()  # type: ignore[union-attr]
            names = sorted(p.partition_name for p in await admin.list_partition_infos(path))
            assert names == ["20250508", "20250509", "20250510"]
            assert server.coordinator.kv_leader_replica_count() == 6
    finally:
        await server.stop()
