"""Splitting large buckets into several Spark partitions, and the snapshot-only read (``read.optimized``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss
from tests.spark.test_spark_streaming import Collector, drain, stream

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]
SPLIT = "scan.maxRecordsPerPartition"


def load(spark: Any, cluster: Fluss, table: str, **options: str) -> Any:
    return spark.read.format("fluss").options(**cluster.options(table, **options)).load()


def test_a_two_bucket_log_table_read_with_splitting_runs_more_tasks_and_returns_the_same_rows(
    spark: Any, cluster: Fluss
) -> None:
    table = cluster.create_table([("id", BigIntType()), ("event", StringType())], bucket_count=2, bucket_keys=["id"])
    for start in range(0, 200, 50):
        cluster.append(table, [{"id": i, "event": f"e{i}"} for i in range(start, start + 50)])
    whole = load(spark, cluster, table, **{"read.metadata-columns": "_bucket,_log_offset"})
    split = load(spark, cluster, table, **{SPLIT: "30", "read.metadata-columns": "_bucket,_log_offset"})

    assert whole.rdd.getNumPartitions() == 2
    assert split.rdd.getNumPartitions() >= 200 // 30
    rows = sorted(tuple(r) for r in whole.collect())
    assert len(rows) == 200
    assert {r[2] for r in rows} == {0, 1}, "both buckets hold rows"
    assert sorted(tuple(r) for r in split.collect()) == rows


def test_a_time_range_and_a_stream_split_their_log_ranges_too(spark: Any, cluster: Fluss, tmp_path: Path) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    for start in range(0, 100, 25):
        cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(start, start + 25)])
    options = {"scan.startup.mode": "timestamp", "scan.startup.timestamp": "0"}
    changes = load(spark, cluster, table, **options, **{SPLIT: "10"})
    assert changes.rdd.getNumPartitions() >= 10
    assert sorted(r.id for r in changes.collect()) == list(range(100))

    collector = Collector()
    drain(stream(spark, cluster, table, **{"scan.startup.mode": "earliest", SPLIT: "10"}), collector, tmp_path / "c")
    assert sorted(row["id"] for row in collector.rows) == list(range(100))


def test_read_optimized_reads_the_leased_snapshot_without_the_changelog(spark: Any, cluster: Fluss, snapshot_cluster: Fluss) -> None:
    without_snapshots = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(without_snapshots, [{"id": i, "name": "n", "score": i} for i in range(10)])
    assert load(spark, cluster, without_snapshots).count() == 10
    assert load(spark, cluster, without_snapshots, **{"read.optimized": "true"}).count() == 0, "no snapshot, no rows"

    table = snapshot_cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    snapshot_cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(40)])
    snapshot_cluster.wait_for_snapshots_at_high_watermark(table, 2)
    frame = load(spark, snapshot_cluster, table, **{"read.optimized": "true", "read.metadata-columns": "_log_offset,_bucket"})

    rows = frame.collect()
    assert sorted((r.id, r.name, r._change_type) for r in rows) == [(i, f"n{i}", "+I") for i in range(40)]
    assert {r._log_offset for r in rows} == {None}, "snapshot rows have no log position"
    assert {r._bucket for r in rows} == {0, 1}
    assert not [lease for lease in snapshot_cluster.leases() if lease.snapshots], "every task released its pin"


def test_each_read_task_logs_its_rows_and_bytes_where_spark_collects_python_worker_logs(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(30)])
    spark.conf.set("spark.sql.pyspark.worker.logging.enabled", "true")
    try:
        assert load(spark, cluster, table).count() == 30
        logs = spark.tvf.python_worker_logs().where("logger = 'strom.spark.read'").select("msg").collect()
    finally:
        spark.conf.unset("spark.sql.pyspark.worker.logging.enabled")
    mine = [row.msg for row in logs if f"fluss read of {table}," in row.msg]
    assert len(mine) == 2, mine
    assert sum(int(msg.split("rows=", 1)[1].split()[0]) for msg in mine) == 30
    assert all(" bytes=" in msg and "(log rows=" in msg for msg in mine)
