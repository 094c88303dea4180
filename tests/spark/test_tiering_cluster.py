"""The lake tiering job against a cluster of processes (two coordinators, two tablet servers): it tiers a
table spread over both tablet servers into Delta, and carries on after the active coordinator is SIGKILLed
and the standby takes over with the tiering state it loads from ZooKeeper."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import ConnectionFailedError, NetworkError, NotCoordinatorLeaderError
from strom.records.types import BigIntType, IntType, StringType
from strom.server.local_cluster import LocalCluster
from strom.tiering.driver import TieringDriver, TieringOptions
from strom.zk.zookeeper_server import unavailable_reason
from tests.conftest import unique_name
from tests.lake.duckdb_reader import read_delta
from tests.spark.support import Fluss
from tests.spark.tiering_support import (
    LAKE_TABLE,
    create_lake_table,
    lake_rows,
    lake_snapshot,
    strom_rows,
    tier_once,
    tiering_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(300)]

COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]
NAMES = ["id", "name", "score"]
FAILOVER_WAIT_S = 30.0


def test_tiering_carries_on_across_a_coordinator_failover(spark: Any, tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    config = tiering_config("delta", **{"datalake.delta.warehouse": str(tmp_path / "lake"),
                                        "zookeeper.client.session-timeout": "4s"})
    local = LocalCluster(tmp_path / "cluster", 2, config, coordinators=2).start()
    try:
        cluster = Fluss(local.bootstrap)
        table = create_lake_table(cluster, COLUMNS, primary_key=["id"], bucket_count=4)
        cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(200)])
        tier_once(spark, cluster)
        assert lake_rows(cluster, table, NAMES) == strom_rows(cluster, table, NAMES)
        first = lake_snapshot(cluster, table)
        assert first is not None

        local.signal_member(local.member("coordinator", 1), signal.SIGKILL)
        _wait_for_new_coordinator(local.bootstrap)

        cluster.upsert(table, [{"id": i, "name": f"u{i}", "score": -i} for i in range(0, 200, 3)])
        cluster.delete(table, [{"id": i} for i in range(1, 200, 7)])
        tier_once(spark, cluster, job_id="after-failover")
        assert lake_rows(cluster, table, NAMES) == strom_rows(cluster, table, NAMES)
        second = lake_snapshot(cluster, table)
        assert second is not None and second.snapshot_id > first.snapshot_id
    finally:
        local.stop()


def _wait_for_new_coordinator(bootstrap: str) -> None:
    async def changed() -> None:
        async with await Connection.create(bootstrap) as connection:
            deadline = time.monotonic() + FAILOVER_WAIT_S
            while True:
                try:
                    await connection.get_admin().create_database(unique_name("failover"))
                    return
                except (NotCoordinatorLeaderError, ConnectionFailedError, NetworkError):
                    assert time.monotonic() < deadline, "no coordinator took over"
                    await asyncio.sleep(0.2)

    asyncio.run(changed())


def test_the_tiering_service_tiers_a_table_of_a_secured_cluster(spark: Any, tmp_path: Path) -> None:
    """A cluster where clients log in over TLS and ACLs are enforced (`strom cluster start --secure`): the
    service, given its credentials and the cluster's CA (client.* options), tiers a table into Delta, which
    DuckDB reads back."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    config = tiering_config("delta", **{"datalake.delta.warehouse": str(tmp_path / "lake")})
    local = LocalCluster(tmp_path / "cluster", 2, config, secure=True).start()
    try:
        login = {key: value for key, value in local.client_config().items() if key != "bootstrap.servers"}
        assert login["client.security.protocol"] == "SASL_SSL"  # --secure means TLS too
        path = TablePath("fluss", unique_name("secured_lake"))

        async def prepare() -> None:
            async with await Connection.create({"bootstrap.servers": local.bootstrap, **login}) as connection:
                schema = Schema.from_arrow(pa.schema([("id", pa.int32()), ("name", pa.string())]), primary_key=["id"])
                await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2,
                                                                                properties=LAKE_TABLE))
                table = await connection.get_table(path)
                await table.new_upsert().create_writer().upsert_batch(
                    pa.table({"id": list(range(50)), "name": [f"n{i}" for i in range(50)]}))

        asyncio.run(prepare())
        options = TieringOptions(local.bootstrap, "secured-job", poll_interval_ms=200, once=True,
                                 client_options=tuple(sorted(login.items())))
        driver = TieringDriver(spark, options)
        driver.run()
        assert not driver.given_up and driver.outcomes
        rows = read_delta(str(tmp_path / "lake" / path.database_name / path.table_name))
        assert sorted(rows.column("id").to_pylist()) == list(range(50))
    finally:
        local.stop()
