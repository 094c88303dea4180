"""Writes through Spark: appends to log tables, upserts and deletes into primary-key tables, streaming
writes, and the errors a write reports before any task runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss, run_available_now
from tests.spark.test_spark_batch_read import load
from tests.spark.test_spark_errors import failure_line

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]


def save(frame: Any, cluster: Fluss, table: str, **options: str) -> None:
    frame.write.format("fluss").options(**cluster.options(table, **options)).mode("append").save()


def test_appends_to_a_log_table_round_trip(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table([("id", BigIntType()), ("event", StringType())], bucket_count=2)
    frame = spark.createDataFrame([(i, f"e{i}") for i in range(1000)], "id long, event string").repartition(3)

    save(frame, cluster, table)

    assert sorted((r.id, r.event) for r in load(spark, cluster, table).collect()) == [(i, f"e{i}") for i in range(1000)]


@pytest.fixture
def small_arrow_batches(spark: Any) -> Any:
    """Spark hands writers Arrow batches of 100 rows (instead of 10 000) during the test."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    previous = spark.conf.get(key)
    spark.conf.set(key, "100")
    yield 100
    spark.conf.set(key, previous)


def test_a_write_task_gathers_spark_batches_into_requests_of_write_batch_rows(
    spark: Any, cluster: Fluss, small_arrow_batches: int
) -> None:
    table = cluster.create_table([("id", BigIntType()), ("event", StringType())], bucket_count=1)
    frame = spark.createDataFrame([(i, f"e{i}") for i in range(1000)], "id long, event string").coalesce(1)

    save(frame, cluster, table, **{"write.batch-rows": "400"})

    assert cluster.log_batch_sizes(table) == [400, 400, 200]  # not ten requests of one Spark batch each
    assert sorted((r.id, r.event) for r in load(spark, cluster, table).collect()) == [(i, f"e{i}") for i in range(1000)]


def test_gathered_upserts_go_out_before_the_deletes_that_follow_them(
    spark: Any, cluster: Fluss, small_arrow_batches: int
) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=1)
    # per key: upserted in one Spark batch, deleted in a later one, upserted again after that
    changes = [(i, f"n{i}", i, "+I") for i in range(150)]
    changes += [(i, "", 0, "-D") for i in range(0, 150, 2)]
    changes += [(i, f"again{i}", -i, "+U") for i in range(0, 150, 4)]
    frame = spark.createDataFrame(changes, "id int, name string, score long, _change_type string").coalesce(1)

    save(frame, cluster, table, **{"write.batch-rows": "1000"})  # all 150 upserts gathered when the deletes come

    expected = {i: (f"n{i}", i) for i in range(1, 150, 2)} | {i: (f"again{i}", -i) for i in range(0, 150, 4)}
    assert {r["id"]: (r["name"], r["score"]) for r in cluster.rows(table)} == expected


def test_write_batch_rows_must_be_a_positive_integer(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table([("id", BigIntType())], bucket_count=1)
    frame = spark.createDataFrame([(1,)], "id long")
    for value in ("0", "many"):
        message = failure_line(lambda value=value: save(frame, cluster, table, **{"write.batch-rows": value}))
        assert message.startswith("option 'write.batch-rows' must be"), message


def test_upserts_and_deletes_by_change_type_in_row_order(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    save(spark.createDataFrame([(i, f"n{i}", i) for i in range(1, 11)], "id int, name string, score long"), cluster, table)
    assert cluster.rows(table) == [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 11)]

    changes = [
        (3, "n3", 3, "-D"),
        (4, "n4", 4, "-U"),
        (4, "four", 40, "+U"),
        (11, "eleven", 11, "+I"),
        (20, "a", 0, "+I"),
        (20, "a", 0, "-D"),
        (20, "b", 2, "+I"),
        (21, "c", 0, "+I"),
        (21, "c", 0, "-D"),
        (5, "ignored old row", 0, "-U"),
    ]
    frame = spark.createDataFrame(changes, "id int, name string, score long, _change_type string").coalesce(1)
    save(frame, cluster, table)

    expected = {i: (f"n{i}", i) for i in range(1, 11) if i != 3} | {4: ("four", 40), 11: ("eleven", 11), 20: ("b", 2)}
    assert {r["id"]: (r["name"], r["score"]) for r in cluster.rows(table)} == expected
    # a read feeds a write: the batch read's change type column (+I) is taken as such
    copy = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=3)
    save(load(spark, cluster, table), cluster, copy)
    assert cluster.rows(copy) == cluster.rows(table)


def test_streaming_write_upserts_each_micro_batch(spark: Any, cluster: Fluss, tmp_path: Path) -> None:
    source = cluster.create_table([("id", IntType()), ("name", StringType()), ("score", BigIntType())], bucket_count=2)
    target = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.append(source, [{"id": i % 5, "name": f"v{i}", "score": i} for i in range(10)])

    run_available_now(
        spark.readStream.format("fluss").options(**cluster.options(source, **{"scan.startup.mode": "earliest"})).load()
        .writeStream.format("fluss").options(**cluster.options(target)),
        tmp_path / "checkpoint",
    )
    assert sorted(r["id"] for r in cluster.rows(target)) == [0, 1, 2, 3, 4]


def test_write_errors_are_reported_before_any_task_runs(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=1)
    frame = spark.createDataFrame([(1, "a", 1)], "id int, name string, score long")
    message = failure_line(lambda: frame.write.format("fluss").options(**cluster.options(table)).mode("overwrite").save())
    assert message.startswith(f"mode 'overwrite' is not supported for table '{table}'")

    extra = spark.createDataFrame([(1, "a", 1, 2)], "id int, name string, score long, bonus int")
    message = failure_line(lambda: save(extra, cluster, table))
    assert message.startswith(f"table '{table}' has no columns ['bonus']")

    deleting_log = cluster.create_table([("id", IntType())], bucket_count=1)
    rows = spark.createDataFrame([(1, "-D")], "id int, _change_type string")
    message = failure_line(lambda: save(rows, cluster, deleting_log))
    assert "a log table accepts only appends" in message
