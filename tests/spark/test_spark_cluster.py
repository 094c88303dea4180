"""The Spark source against a cluster of processes (coordinator + two tablet servers): writes route to each
bucket's leader, reads plan from the coordinator and read KV snapshots (committed through the coordinator)
and changelogs from the tablet servers, unchanged from the one-process server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strom.records.types import BigIntType, IntType, StringType
from strom.server.local_cluster import LocalCluster
from strom.zk.zookeeper_server import unavailable_reason
from tests.spark.support import Fluss
from tests.spark.test_spark_batch_read import load
from tests.spark.test_spark_write import save

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(240)]

COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fluss]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(Path(tmp_path_factory.mktemp("spark-cluster")), 2,
                         {"kv.snapshot.interval": "500ms", "kv.snapshot.num-retained": "1"}).start()
    try:
        yield Fluss(local.bootstrap)
    finally:
        local.stop()


def test_spark_writes_and_reads_a_table_spread_over_two_tablet_servers(spark: Any, two_servers: Fluss) -> None:
    cluster = two_servers
    table = cluster.create_table(COLUMNS, primary_key=["id"], bucket_count=4)
    frame = spark.createDataFrame([(i, f"n{i}", i * 10) for i in range(1, 401)], "id INT, name STRING, score BIGINT")
    save(frame, cluster, table)
    cluster.wait_for_snapshots_at_high_watermark(table, 4)  # the next read starts from KV snapshots
    cluster.upsert(table, [{"id": 7, "name": "seven", "score": -7}])  # and a changelog tail after them
    cluster.delete(table, [{"id": 8}])

    rows = {r.id: (r.name, r.score) for r in load(spark, cluster, table).collect()}

    expected = {i: (f"n{i}", i * 10) for i in range(1, 401) if i != 8}
    expected[7] = ("seven", -7)
    assert rows == expected
