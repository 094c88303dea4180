"""Time-based reads: a batch read of the records committed in a time range, ``scan.startup.mode=timestamp``
for batch and streaming reads, and the metadata columns checked against strom's LogScanner."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss, LogRecord
from tests.spark.test_spark_errors import failure_line
from tests.spark.test_spark_streaming import Collector, drain, stream

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]
METADATA = "_log_offset,_commit_timestamp,_bucket"


def load(spark: Any, cluster: Fluss, table: str, **options: str) -> Any:
    return spark.read.format("fluss").options(**cluster.options(table, **options)).load()


def rows_with_position(frame: Any) -> list[tuple[Any, ...]]:
    """``(bucket, offset, commit time in ms, change type or None, data columns…)`` per row, sorted."""
    data = [c for c in frame.columns if not c.startswith("_")]
    change = "_change_type" if "_change_type" in frame.columns else "CAST(NULL AS STRING)"
    projected = frame.selectExpr("_bucket", "_log_offset", "unix_millis(_commit_timestamp)", change, *data)
    return sorted(tuple(row) for row in projected.collect())


def scanner_rows(records: list[LogRecord], with_change_type: bool) -> list[tuple[Any, ...]]:
    return sorted(
        (r.bucket, r.offset, r.commit_timestamp, r.change_type if with_change_type else None, *r.row.values())
        for r in records
    )


def write_phases(cluster: Fluss, table: str, phases: dict[str, Any]) -> list[LogRecord]:
    """Run each phase's writes in turn, a few ms apart (distinct commit times); the log of both buckets."""
    for write in phases.values():
        write()
        time.sleep(0.01)
    return cluster.log_records(table, 0) + cluster.log_records(table, 1)


def test_time_range_read_of_a_log_table_returns_exactly_the_records_committed_in_the_range(
    spark: Any, cluster: Fluss
) -> None:
    table = cluster.create_table([("id", BigIntType()), ("phase", StringType())], bucket_count=2)
    phases = ("before", "first", "second", "after")
    records = write_phases(
        cluster, table, {p: (lambda p=p: cluster.append(table, [{"id": i, "phase": p} for i in range(10)])) for p in phases}
    )
    first_commit = {p: min(r.commit_timestamp for r in records if r.row["phase"] == p) for p in phases}
    start, end = first_commit["first"], first_commit["after"]
    inside = [r for r in records if start <= r.commit_timestamp < end]
    assert {r.row["phase"] for r in inside} == {"first", "second"}

    end_iso = datetime.fromtimestamp(end / 1000, UTC).isoformat()  # either form is accepted
    frame = load(spark, cluster, table, **{
        "scan.incremental.start.timestamp": str(start), "scan.incremental.end.timestamp": end_iso,
        "read.metadata-columns": METADATA,
    })

    assert rows_with_position(frame) == scanner_rows(inside, with_change_type=False)
    open_ended = load(spark, cluster, table, **{"scan.startup.mode": "timestamp", "scan.startup.timestamp": str(start)})
    assert sorted(tuple(r) for r in open_ended.collect()) == sorted(
        (r.row["id"], r.row["phase"]) for r in records if r.commit_timestamp >= start
    )


def test_time_range_read_of_a_primary_key_table_returns_its_changelog_in_the_range(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    records = write_phases(cluster, table, {
        "insert": lambda: cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(10)]),
        "update": lambda: cluster.upsert(table, [{"id": i, "name": f"u{i}", "score": -i} for i in range(5)]),
        "delete": lambda: cluster.delete(table, [{"id": 7}, {"id": 8}]),
        "later": lambda: cluster.upsert(table, [{"id": 20, "name": "late", "score": 0}]),
    })
    start = min(r.commit_timestamp for r in records if r.change_type == "-U")
    end = min(r.commit_timestamp for r in records if r.row["id"] == 20)
    inside = [r for r in records if start <= r.commit_timestamp < end]
    assert sorted({r.change_type for r in inside}) == ["+U", "-D", "-U"]

    frame = load(spark, cluster, table, **{
        "scan.incremental.start.timestamp": str(start), "scan.incremental.end.timestamp": str(end),
        "read.metadata-columns": METADATA,
    })

    assert rows_with_position(frame) == scanner_rows(inside, with_change_type=True)


def test_a_start_time_in_the_future_is_refused_with_the_option_named(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table([("id", IntType())])
    cluster.append(table, [{"id": 1}])
    future = str(int(time.time() * 1000) + 3_600_000)

    message = failure_line(lambda: load(spark, cluster, table, **{"scan.incremental.start.timestamp": future}).collect())

    assert message.startswith(f"option 'scan.incremental.start.timestamp' is {future} (")
    assert "later than the server's current time" in message
    bad = failure_line(lambda: load(spark, cluster, table, **{"scan.incremental.end.timestamp": "1000"}).collect())
    assert bad.startswith("option 'scan.incremental.end.timestamp' needs option 'scan.incremental.start.timestamp'")
    bad = failure_line(lambda: load(spark, cluster, table, **{"scan.incremental.start.timestamp": "yesterday"}).collect())
    assert bad.startswith("option 'scan.incremental.start.timestamp' must be epoch milliseconds or an ISO-8601 time")


def test_a_streaming_read_from_a_timestamp_starts_at_the_first_offsets_committed_at_or_after_it(
    spark: Any, cluster: Fluss, tmp_path: Path
) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    records = write_phases(cluster, table, {
        "old": lambda: cluster.upsert(table, [{"id": i, "name": "old", "score": i} for i in range(20)]),
        "new": lambda: cluster.upsert(table, [{"id": i, "name": "new", "score": i} for i in range(10, 30)]),
    })
    start = min(r.commit_timestamp for r in records if r.row["name"] == "new")
    expected = [r for r in records if r.commit_timestamp >= start]
    assert {r.row["name"] for r in expected} == {"new", "old"}, "the updates' -U rows carry the old values"

    collector = Collector()
    frame = stream(spark, cluster, table, **{
        "scan.startup.mode": "timestamp", "scan.startup.timestamp": str(start), "read.metadata-columns": METADATA,
    })
    drain(frame, collector, tmp_path / "checkpoint")

    got = sorted(
        (row["_bucket"], row["_log_offset"], row["_change_type"], row["id"], row["name"]) for row in collector.rows
    )
    assert got == sorted((r.bucket, r.offset, r.change_type, r.row["id"], r.row["name"]) for r in expected)
    first = {bucket: min(r.offset for r in expected if r.bucket == bucket) for bucket in (0, 1)}
    assert {b: min(o for bb, o, *_ in got if bb == b) for b in (0, 1)} == first


def test_metadata_columns_equal_what_the_log_scanner_reports(spark: Any, cluster: Fluss) -> None:
    events = cluster.create_table([("id", BigIntType()), ("event", StringType())], bucket_count=2)
    for start in range(0, 30, 10):
        cluster.append(events, [{"id": i, "event": f"e{i}"} for i in range(start, start + 10)])
    records = cluster.log_records(events, 0) + cluster.log_records(events, 1)

    frame = load(spark, cluster, events, **{"read.metadata-columns": METADATA})

    assert frame.columns == ["id", "event", "_log_offset", "_commit_timestamp", "_bucket"]
    assert rows_with_position(frame) == scanner_rows(records, with_change_type=False)

    users = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(users, [{"id": i, "name": f"n{i}", "score": i} for i in range(10)])
    cluster.upsert(users, [{"id": 3, "name": "three", "score": 33}])
    cluster.delete(users, [{"id": 4}])
    changelog = cluster.log_records(users, 0) + cluster.log_records(users, 1)
    last: dict[int, LogRecord] = {}
    for record in sorted(changelog, key=lambda r: r.offset):
        last[record.row["id"]] = record
    live = [r for r in last.values() if r.change_type != "-D"]

    state = load(spark, cluster, users, **{"read.metadata-columns": "_bucket,_log_offset"})

    assert state.columns == ["id", "name", "score", "_change_type", "_bucket", "_log_offset"]
    assert sorted((r.id, r.name, r._bucket, r._log_offset) for r in state.collect()) == sorted(
        (r.row["id"], r.row["name"], r.bucket, r.offset) for r in live
    )
    message = failure_line(lambda: load(spark, cluster, users, **{"read.metadata-columns": "_offset"}))
    assert message.startswith("option 'read.metadata-columns' takes distinct names among _log_offset")
