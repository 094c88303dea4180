"""Each setting AlterClusterConfigs may change reaches the component that applies it, without a restart
(a StromServer in this process, so the components can be asked directly)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.config import DYNAMIC_OPTIONS, Configuration
from strom.server.node import StromServer

pytestmark = pytest.mark.asyncio


async def test_every_dynamic_setting_applies_where_it_is_used(tmp_path: Path) -> None:
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration({"kv.snapshot.interval": "0s"}))
    await server.start()
    try:
        role, scheduler = server.role, server.snapshot_scheduler
        assert role is not None and role.auto_partitions is not None and scheduler is not None
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            admin = connection.get_admin()
            schema = Schema.from_arrow(pa.schema([("id", pa.int64())]), primary_key=["id"])
            own, default = TablePath("fluss", "own_freshness"), TablePath("fluss", "default_freshness")
            lake = {"table.datalake.enabled": "true"}
            await admin.create_table(own, TableDescriptor(schema, bucket_count=1, properties={
                **lake, "table.datalake.freshness": "7 min"}))
            await admin.create_table(default, TableDescriptor(schema, bucket_count=1, properties=lake))
            changes = {"kv.snapshot.interval": "45s", "coordinator.producer-offsets.ttl": "2 h",
                       "auto-partition.check.interval": "30s", "table.datalake.freshness": "90s",
                       "log.replica.min-in-sync-replicas-number": "3", "security.sasl.plain.credentials": "ann:pw",
                       "server.data-disk.write-limit-ratio": "0.99", "server.data-disk.write-recover-ratio": "0.5",
                       "kv.leader-replica.memory-reserved": "8mb"}
            assert set(changes) == DYNAMIC_OPTIONS, "a new dynamic setting needs its line here"
            await admin.alter_cluster_configs(changes)
            tiering = role.lake_tiering._tables  # the manager's view of each lake table
            freshness = {t.path.table_name: t.freshness_ms for t in tiering.values()}
        assert scheduler.interval_ms == 45_000
        assert role.producer_offsets.default_ttl_ms == 2 * 3600 * 1000
        assert role.auto_partitions.check_interval_ms == 30_000
        assert freshness == {"own_freshness": 7 * 60_000, "default_freshness": 90_000}
        assert server.tablets is not None and server.tablets.tablet._min_in_sync == 3
        assert (server.tablets.disk.limit, server.tablets.disk.recover) == (0.99, 0.5)
        assert server.coordinator is not None and server.coordinator.kv_leader_capacity.reserved_bytes == 8 << 20
        # no SASL listener here: the users are kept for when one is configured (tests/integration/test_dynamic_sasl_users.py)
        assert server.security is not None and server.security.authenticator is None
    finally:
        await server.stop()
