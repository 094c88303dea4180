"""Streaming reads through Spark: each startup mode, availableNow draining in several micro-batches, and
restarts from the checkpoint that neither lose nor repeat rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss, run_available_now

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]


class Collector:
    """A foreachBatch sink keeping every micro-batch's rows; it can fail once at a chosen batch."""

    def __init__(self, fail_at_batch: int | None = None) -> None:
        self.batches: dict[int, list[dict[str, Any]]] = {}
        self.fail_at_batch = fail_at_batch

    def __call__(self, frame: Any, batch_id: int) -> None:
        if batch_id == self.fail_at_batch:
            self.fail_at_batch = None
            raise RuntimeError(f"injected failure in micro-batch {batch_id}")
        self.batches[batch_id] = [row.asDict() for row in frame.collect()]

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [row for batch_id in sorted(self.batches) for row in self.batches[batch_id]]


def stream(spark: Any, cluster: Fluss, table: str, **options: str) -> Any:
    reader = spark.readStream.format("fluss")
    for key, value in cluster.options(table, **options).items():
        reader = reader.option(key, value)
    return reader.load()


def drain(frame: Any, collector: Collector, checkpoint: Path) -> None:
    """Collect every micro-batch until the source is drained."""
    run_available_now(frame.writeStream.foreachBatch(collector), checkpoint)


def test_log_table_earliest_drains_in_batches_and_restarts_without_loss_or_repeat(
    spark: Any, cluster: Fluss, tmp_path: Path
) -> None:
    table = cluster.create_table([("id", BigIntType()), ("event", StringType())], bucket_count=2)
    cluster.append(table, [{"id": i, "event": f"e{i}"} for i in range(40)])
    options = {"scan.startup.mode": "earliest", "scan.max-rows-per-trigger": "15"}

    first = Collector()
    drain(stream(spark, cluster, table, **options), first, tmp_path / "checkpoint")
    assert sorted(row["id"] for row in first.rows) == list(range(40))
    assert len(first.batches) >= 3, "15 rows per trigger need at least three micro-batches"
    assert all(len(rows) <= 15 for rows in first.batches.values())

    cluster.append(table, [{"id": i, "event": f"e{i}"} for i in range(40, 70)])
    failing = Collector(fail_at_batch=max(first.batches) + 2)
    with pytest.raises(Exception, match="injected failure"):
        drain(stream(spark, cluster, table, **options), failing, tmp_path / "checkpoint")
    resumed = Collector()
    drain(stream(spark, cluster, table, **options), resumed, tmp_path / "checkpoint")
    later = sorted(row["id"] for row in failing.rows + resumed.rows)
    assert later == list(range(40, 70)), "the replayed micro-batch returns its rows once"


def test_primary_key_table_earliest_streams_every_change_with_its_type(
    spark: Any, cluster: Fluss, tmp_path: Path
) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=1)
    cluster.upsert(table, [{"id": 1, "name": "a", "score": 1}, {"id": 2, "name": "b", "score": 2}])
    cluster.upsert(table, [{"id": 1, "name": "a2", "score": 10}])
    cluster.delete(table, [{"id": 2}])
    collector = Collector()

    drain(stream(spark, cluster, table, **{"scan.startup.mode": "earliest"}), collector, tmp_path / "checkpoint")

    assert [(r["_change_type"], r["id"], r["name"]) for r in collector.rows] == [
        ("+I", 1, "a"), ("+I", 2, "b"), ("-U", 1, "a"), ("+U", 1, "a2"), ("-D", 2, "b"),
    ]


def test_primary_key_table_full_emits_the_state_then_the_changes(
    spark: Any, snapshot_cluster: Fluss, tmp_path: Path
) -> None:
    cluster = snapshot_cluster
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 31)])
    cluster.wait_for_snapshots_at_high_watermark(table, 2)
    cluster.upsert(table, [{"id": 3, "name": "three", "score": 3}])  # after the snapshot: changelog only
    cluster.delete(table, [{"id": 4}])
    options = {"scan.startup.mode": "full", "scan.max-rows-per-trigger": "1000"}

    state = Collector()
    drain(stream(spark, cluster, table, **options), state, tmp_path / "checkpoint")
    expected = {i: f"n{i}" for i in range(1, 31) if i != 4} | {3: "three"}
    assert {r["id"]: r["name"] for r in state.rows} == expected
    assert len(state.rows) == len(expected)
    assert {r["_change_type"] for r in state.rows} == {"+I"}

    cluster.upsert(table, [{"id": 5, "name": "five", "score": 5}, {"id": 100, "name": "new", "score": 100}])
    cluster.delete(table, [{"id": 6}])
    changes = Collector()
    drain(stream(spark, cluster, table, **options), changes, tmp_path / "checkpoint")
    assert sorted((r["id"], r["_change_type"], r["name"]) for r in changes.rows) == [
        (5, "+U", "five"), (5, "-U", "n5"), (6, "-D", "n6"), (100, "+I", "new"),
    ]


def test_latest_mode_sees_only_rows_written_after_the_query_started(spark: Any, cluster: Fluss, tmp_path: Path) -> None:
    table = cluster.create_table([("id", BigIntType()), ("event", StringType())], bucket_count=2)
    cluster.append(table, [{"id": i, "event": "before"} for i in range(10)])
    untouched = Collector()
    drain(stream(spark, cluster, table, **{"scan.startup.mode": "latest"}), untouched, tmp_path / "available-now")
    assert untouched.rows == [], "availableNow from latest has nothing to drain"

    collector = Collector()
    query = (
        stream(spark, cluster, table, **{"scan.startup.mode": "latest"})
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        cluster.append(table, [{"id": i, "event": "after"} for i in range(10, 25)])
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted((r["id"], r["event"]) for r in collector.rows) == [(i, "after") for i in range(10, 25)]


def test_partitioned_log_table_streams_partitions_created_after_the_start(
    spark: Any, cluster: Fluss, tmp_path: Path
) -> None:
    table = cluster.create_table(
        [("id", BigIntType()), ("day", StringType())], partition_keys=["day"], partitions=[{"day": "d1"}], bucket_count=2
    )
    cluster.append(table, [{"id": i, "day": "d1"} for i in range(5)])
    first = Collector()
    drain(stream(spark, cluster, table), first, tmp_path / "checkpoint")
    assert sorted(r["id"] for r in first.rows) == list(range(5))

    from strom.ids import TablePath
    from tests.spark.support import run

    run(cluster.address, lambda c: c.get_admin().create_partition(TablePath.parse(table), {"day": "d2"}))
    cluster.append(table, [{"id": i, "day": "d2"} for i in range(5, 9)] + [{"id": 9, "day": "d1"}])
    second = Collector()
    drain(stream(spark, cluster, table), second, tmp_path / "checkpoint")
    assert sorted((r["id"], r["day"]) for r in second.rows) == [(5, "d2"), (6, "d2"), (7, "d2"), (8, "d2"), (9, "d1")]


def test_partitioned_primary_key_table_full_reads_each_partitions_state(spark: Any, cluster: Fluss, tmp_path: Path) -> None:
    table = cluster.create_table(
        [("id", IntType()), ("day", StringType()), ("score", BigIntType())],
        primary_key=["id", "day"], partition_keys=["day"], partitions=[{"day": "d1"}, {"day": "d2"}], bucket_count=2,
    )
    cluster.upsert(table, [{"id": i, "day": f"d{1 + i % 2}", "score": i} for i in range(10)])
    cluster.upsert(table, [{"id": 0, "day": "d1", "score": 100}])
    cluster.delete(table, [{"id": 1, "day": "d2"}])
    collector = Collector()

    drain(stream(spark, cluster, table), collector, tmp_path / "checkpoint")

    expected = {(i, f"d{1 + i % 2}"): i for i in range(10) if i != 1} | {(0, "d1"): 100}
    assert {(r["id"], r["day"]): r["score"] for r in collector.rows} == expected
    assert len(collector.rows) == len(expected)
    assert {r["_change_type"] for r in collector.rows} == {"+I"}
