"""The ``$binlog`` form of a primary-key table (``table=db.t$binlog``): one row per change with the row
before and after it, checked against the changelog strom's LogScanner reports, whole, split into ranges
that cut update pairs apart, streamed in micro-batches that do the same, and within a time range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss, LogRecord
from tests.spark.test_spark_errors import failure_line
from tests.spark.test_spark_streaming import Collector, drain, stream

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]
Binlog = tuple[int, str, int, int, Any, Any]
"""``(bucket, change type, offset, commit ms, before, after)`` with rows as ``(id, name, score)`` or None."""


def load(spark: Any, cluster: Fluss, table: str, **options: str) -> Any:
    return spark.read.format("fluss").options(**cluster.options(table, **options)).load()


def as_tuple(row: Any) -> tuple[Any, ...] | None:
    return None if row is None else (row["id"], row["name"], row["score"])


def binlog_rows(rows: list[Any]) -> list[Binlog]:
    return sorted(
        (r["_bucket"], r["_change_type"], r["_log_offset"], int(r["_commit_timestamp"].timestamp() * 1000),
         as_tuple(r["before"]), as_tuple(r["after"]))
        for r in rows
    )


def expected_binlog(records: list[LogRecord]) -> list[Binlog]:
    """The changelog as the scanner reports it, each -U folded with the +U right after it."""
    expected: list[Binlog] = []
    by_position = sorted(records, key=lambda r: (r.bucket, r.offset))
    for index, record in enumerate(by_position):
        row = as_tuple(record.row)
        if record.change_type == "+I":
            expected.append((record.bucket, "insert", record.offset, record.commit_timestamp, None, row))
        elif record.change_type == "-D":
            expected.append((record.bucket, "delete", record.offset, record.commit_timestamp, row, None))
        elif record.change_type == "-U":
            after = by_position[index + 1]
            assert (after.change_type, after.offset) == ("+U", record.offset + 1)
            expected.append((record.bucket, "update", record.offset, record.commit_timestamp, row, as_tuple(after.row)))
    return sorted(expected)


def write_history(cluster: Fluss, table: str) -> list[LogRecord]:
    """Inserts, full updates, deletes and re-inserts over both buckets; the log of both."""
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(12)])
    cluster.upsert(table, [{"id": i, "name": f"u{i}", "score": -i} for i in range(0, 12, 2)])
    cluster.delete(table, [{"id": 3}, {"id": 4}])
    cluster.upsert(table, [{"id": 3, "name": "back", "score": 33}, {"id": 0, "name": "again", "score": 100}])
    return cluster.log_records(table, 0) + cluster.log_records(table, 1)


@pytest.fixture(scope="module")
def history(cluster: Fluss) -> tuple[str, list[LogRecord]]:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2, prefix="binlog")
    return table, write_history(cluster, table)


def test_binlog_has_fluss_columns_and_one_row_per_change(spark: Any, cluster: Fluss, history: tuple[str, list[LogRecord]]) -> None:
    table, records = history
    frame = load(spark, cluster, f"{table}$binlog", **{"read.metadata-columns": "_bucket"})

    assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
        ("_change_type", "string"), ("_log_offset", "bigint"), ("_commit_timestamp", "timestamp"),
        ("before", "struct<id:int,name:string,score:bigint>"), ("after", "struct<id:int,name:string,score:bigint>"),
        ("_bucket", "int"),
    ]
    expected = expected_binlog(records)
    assert binlog_rows(frame.collect()) == expected
    assert {change for _b, change, *_ in expected} == {"insert", "update", "delete"}
    updated = frame.where("_change_type = 'update' AND after.id = 2").select("before.name", "after.name").collect()
    assert [tuple(row) for row in updated] == [("n2", "u2")]


def test_split_ranges_cutting_update_pairs_return_each_change_once(
    spark: Any, cluster: Fluss, history: tuple[str, list[LogRecord]]
) -> None:
    table, records = history
    expected = expected_binlog(records)
    for records_max in ("1", "2", "3"):  # 1 and 2 put a -U and its +U in different ranges
        frame = load(spark, cluster, f"{table}$binlog", **{
            "read.metadata-columns": "_bucket", "scan.maxRecordsPerPartition": records_max,
        })
        assert frame.rdd.getNumPartitions() > 2
        assert binlog_rows(frame.collect()) == expected, f"scan.maxRecordsPerPartition={records_max}"


def test_streaming_binlog_in_small_micro_batches_equals_the_batch_read(
    spark: Any, cluster: Fluss, tmp_path: Path
) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2, prefix="binlog")
    records = write_history(cluster, table)
    collector = Collector()

    frame = stream(spark, cluster, f"{table}$binlog", **{"scan.max-rows-per-trigger": "3", "read.metadata-columns": "_bucket"})
    drain(frame, collector, tmp_path / "checkpoint")

    assert len(collector.batches) > 3
    assert binlog_rows(collector.rows) == expected_binlog(records)  # full (the default) streams from the log start
    cluster.upsert(table, [{"id": 1, "name": "more", "score": 1}])
    later = Collector()
    drain(stream(spark, cluster, f"{table}$binlog"), later, tmp_path / "checkpoint")
    assert [(r["_change_type"], as_tuple(r["before"]), as_tuple(r["after"])) for r in later.rows] == [
        ("update", (1, "n1", 1), (1, "more", 1))
    ]


def test_time_range_binlog_returns_the_changes_committed_in_the_range(
    spark: Any, cluster: Fluss, history: tuple[str, list[LogRecord]]
) -> None:
    table, records = history
    updates = [r for r in records if r.change_type == "-U"]
    start = min(r.commit_timestamp for r in updates)
    end = max(r.commit_timestamp for r in records)
    inside = [r for r in records if start <= r.commit_timestamp < end]

    frame = load(spark, cluster, f"{table}$binlog", **{
        "scan.incremental.start.timestamp": str(start), "scan.incremental.end.timestamp": str(end),
        "read.metadata-columns": "_bucket",
    })

    assert binlog_rows(frame.collect()) == expected_binlog(inside)


def test_aggregation_table_binlog_shows_each_aggregate_before_and_after(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(
        [("id", IntType()), ("total", BigIntType())], primary_key=["id"], bucket_count=1, prefix="binlog",
        properties={"table.merge-engine": "aggregation", "fields.total.agg": "sum"},
    )
    for delta in (5, 7):
        cluster.upsert(table, [{"id": 1, "total": delta}])

    rows = load(spark, cluster, f"{table}$binlog").orderBy("_log_offset").collect()

    assert [(r["_change_type"], r["before"] and r["before"]["total"], r["after"]["total"]) for r in rows] == [
        ("insert", None, 5), ("update", 5, 12),
    ]


def test_binlog_refuses_what_has_no_before_and_after_form(spark: Any, cluster: Fluss) -> None:
    log_table = cluster.create_table([("id", IntType())], bucket_count=1, prefix="binlog")
    assert "exists only for primary-key tables" in failure_line(lambda: load(spark, cluster, f"{log_table}$binlog"))
    wal = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=1, prefix="binlog",
                               properties={"table.changelog.image": "WAL"})
    assert "table.changelog.image=WAL" in failure_line(lambda: load(spark, cluster, f"{wal}$binlog"))

    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=1, prefix="binlog")
    cluster.upsert(table, [{"id": 1, "name": "a", "score": 1}])
    offset_column = failure_line(lambda: load(spark, cluster, f"{table}$binlog", **{"read.metadata-columns": "_log_offset"}))
    assert "leave them out of option 'read.metadata-columns'" in offset_column
    assert "read.optimized" in failure_line(lambda: load(spark, cluster, f"{table}$binlog", **{"read.optimized": "true"}))
    frame = spark.createDataFrame([(2, "b", 2)], "id INT, name STRING, score BIGINT")
    write = lambda: frame.write.format("fluss").options(**cluster.options(f"{table}$binlog")).mode("append").save()  # noqa: E731
    assert "read-only form of table" in failure_line(write)
    assert cluster.rows(table) == [{"id": 1, "name": "a", "score": 1}], "the refused write changed nothing"
