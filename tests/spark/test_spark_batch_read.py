"""Batch reads through Spark: log tables, primary-key tables (snapshot + changelog), partitions, projections."""

from __future__ import annotations

from typing import Any

import pytest

from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]


def load(spark: Any, cluster: Fluss, table: str, **options: str) -> Any:
    reader = spark.read.format("fluss")
    for key, value in cluster.options(table, **options).items():
        reader = reader.option(key, value)
    return reader.load()


def test_log_table_batch_read_returns_every_record(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table([("id", BigIntType()), ("event", StringType())], bucket_count=3)
    cluster.append(table, [{"id": i, "event": f"e{i}"} for i in range(50)])

    df = load(spark, cluster, table)

    assert df.columns == ["id", "event"]
    assert sorted((r.id, r.event) for r in df.collect()) == [(i, f"e{i}") for i in range(50)]


def test_primary_key_table_read_without_snapshots_folds_the_changelog(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 21)])
    cluster.upsert(table, [{"id": 5, "name": "five", "score": 500}])
    cluster.delete(table, [{"id": 7}])

    df = load(spark, cluster, table)

    rows = {r.id: (r.name, r.score, r._change_type) for r in df.collect()}
    expected = {i: (f"n{i}", i, "+I") for i in range(1, 21) if i != 7}
    expected[5] = ("five", 500, "+I")
    assert rows == expected


def test_partitioned_tables_read_every_partition(spark: Any, cluster: Fluss) -> None:
    days = [{"day": "d1"}, {"day": "d2"}, {"day": "d3"}]
    users = cluster.create_table(
        [("id", IntType()), ("day", StringType()), ("score", BigIntType())],
        primary_key=["id", "day"], partition_keys=["day"], partitions=days, bucket_count=2,
    )
    cluster.upsert(users, [{"id": i, "day": f"d{1 + i % 2}", "score": i} for i in range(20)])
    cluster.upsert(users, [{"id": 0, "day": "d1", "score": 1000}])
    cluster.delete(users, [{"id": 1, "day": "d2"}])
    events = cluster.create_table(
        [("id", IntType()), ("day", StringType())], partition_keys=["day"], partitions=days, bucket_count=2
    )
    cluster.append(events, [{"id": i, "day": f"d{1 + i % 3}"} for i in range(30)])

    user_rows = {(r.id, r.day): r.score for r in load(spark, cluster, users).collect()}
    expected = {(i, f"d{1 + i % 2}"): i for i in range(20) if i != 1} | {(0, "d1"): 1000}
    assert user_rows == expected
    per_day = {r.day: r.n for r in load(spark, cluster, events).groupBy("day").count().withColumnRenamed("count", "n").collect()}
    assert per_day == {"d1": 10, "d2": 10, "d3": 10}


def test_projections_and_filters_apply_after_the_load(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i * 10} for i in range(1, 11)])
    frame = load(spark, cluster, table)

    assert sorted(r.name for r in frame.select("name").where("score > 50").collect()) == sorted(
        f"n{i}" for i in range(6, 11)
    )
    assert [tuple(r) for r in frame.select("score", "id").orderBy("id").limit(2).collect()] == [(10, 1), (20, 2)]
    assert load(spark, cluster, table, **{"read.change-type-column": ""}).columns == ["id", "name", "score"]


def test_server_scan_strategy_reads_the_current_rows(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=3)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 101)])
    cluster.delete(table, [{"id": 50}])

    frame = load(spark, cluster, table, **{"read.strategy": "server-scan"})

    assert sorted(r.id for r in frame.collect()) == [i for i in range(1, 101) if i != 50]


def test_a_log_table_dataframe_run_again_reads_what_was_appended_since(spark: Any, cluster: Fluss) -> None:
    """Spark 4.3 keeps a relation's planned partitions (docs/spark.md); a log table's last range per bucket
    is read to the bucket's end when the task runs, so the same DataFrame, split or not, sees new records,
    in buckets that had records when it was planned and in those that were empty."""
    table = cluster.create_table([("id", IntType())], bucket_count=3, bucket_keys=["id"])
    cluster.append(table, [{"id": 1}] * 40)  # one bucket holds everything
    whole, split = load(spark, cluster, table), load(spark, cluster, table, **{"scan.maxRecordsPerPartition": "15"})
    assert (whole.count(), split.count()) == (40, 40)
    cluster.append(table, [{"id": i} for i in range(2, 12)])  # into every bucket
    assert (whole.count(), split.count()) == (50, 50)
    assert sorted(r.id for r in split.collect()) == [1] * 40 + list(range(2, 12))


def test_a_dataframe_run_again_sees_new_rows_only_where_tasks_read_the_server_s_current_rows(
    spark: Any, cluster: Fluss
) -> None:
    """Spark 4.3 plans a Python data source's relation once per DataFrame (docs/spark.md): a snapshot read run
    again returns its first rows; a server-scan read and a pushed-down key lookup read the leaders anew."""
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": "a", "score": i} for i in range(1, 4)])
    planned = load(spark, cluster, table)
    scanned = load(spark, cluster, table, **{"read.strategy": "server-scan"})
    looked_up = load(spark, cluster, table, **{"read.filter-pushdown": "true"}).where("id = 9")  # a snapshot read
    assert (planned.count(), scanned.count(), looked_up.count()) == (3, 3, 0)
    cluster.upsert(table, [{"id": 9, "name": "b", "score": 9}])
    assert (planned.count(), scanned.count(), looked_up.count()) == (3, 4, 1)
