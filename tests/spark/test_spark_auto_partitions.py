"""An auto-partitioned lake table whose oldest partition expires: Spark's union read still returns that
partition's rows from the lake. The server runs in this process on a clock the test moves by days."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from strom.clock import ManualClock
from strom.records.types import IntType, StringType
from tests.server_thread import ServerThread
from tests.spark.support import Fluss, run
from tests.spark.test_spark_batch_read import load
from tests.spark.tiering_support import FAST_TIERING, create_lake_table, lake_rows, tier_once

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(300)]

START = datetime(2025, 5, 8, 10, 0, tzinfo=UTC)
DAY_MS = 24 * 3600 * 1000
COLUMNS = [("id", IntType()), ("day", StringType()), ("event", StringType())]
AUTO_DAY = {
    "table.auto-partition.enabled": "true",
    "table.auto-partition.time-unit": "DAY",
    "table.auto-partition.num-precreate": "2",
    "table.auto-partition.num-retention": "1",
    "table.auto-partition.time-zone": "UTC",
}


def day(offset: int) -> str:
    return (START + timedelta(days=offset)).strftime("%Y%m%d")


def test_an_expired_partition_is_read_from_the_lake(spark: Any, tmp_path: Path) -> None:
    clock = ManualClock(int(START.timestamp() * 1000))
    config = {**FAST_TIERING, "auto-partition.check.interval": "1h"}
    with ServerThread(tmp_path / "data", config, clock) as server:
        cluster = Fluss(server.address)
        table = create_lake_table(cluster, COLUMNS, partition_keys=["day"], bucket_count=1, properties=AUTO_DAY)
        first = [{"id": i, "day": day(0), "event": f"first-{i}"} for i in range(20)]
        cluster.append(table, first)
        clock.advance(ms=2000)  # the table's freshness (1 s) passes: it is due for tiering
        tier_once(spark, cluster)

        clock.advance(ms=2 * DAY_MS)
        manager = server.server.role.auto_partitions  # type: ignore[union-attr]
        assert manager is not None
        result = server.call(manager.check)
        assert result.dropped == {table: [day(0)]} and result.created == {table: [day(2), day(3)]}

        async def partitions(connection: Any) -> set[str]:
            from strom.ids import TablePath

            return {i.partition_name for i in await connection.get_admin().list_partition_infos(TablePath.parse(table))}

        assert run(cluster.address, partitions) == {day(1), day(2), day(3)}
        later = [{"id": 100 + i, "day": day(2), "event": f"later-{i}"} for i in range(5)]
        cluster.append(table, later)
        names = ["id", "day", "event"]
        read = sorted(tuple(row[c] for c in names) for row in load(spark, cluster, table).select(*names).collect())
        assert read == sorted(tuple(r[c] for c in names) for r in first + later)
        assert lake_rows(cluster, table, names) == sorted(tuple(r[c] for c in names) for r in first), \
            "the lake copy of the expired partition stays"
