"""Primary-key batch reads from KV snapshots: no hole between snapshot and changelog, and leases that keep a
snapshot readable while retention rolls past it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from strom.client import Column, TablePath
from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss, run, wait_until
from tests.spark.test_spark_batch_read import load

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]


def test_no_data_hole_between_a_kv_snapshot_and_the_changelog(spark: Any, server_factory: Any) -> None:
    snapshotting = server_factory({"kv.snapshot.interval": "1s"})
    cluster = Fluss(snapshotting.address)
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 101)])
    snapshots = cluster.wait_for_snapshots_at_high_watermark(table, 2)
    snapshotting.stop()  # restart without snapshots: what follows lives only in the changelog
    server_factory({"kv.snapshot.interval": "0s"}, data_dir=snapshotting.data_dir, port=snapshotting.port)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(101, 201)])
    assert cluster.latest_snapshots(table) == snapshots

    stats = load(spark, cluster, table).selectExpr("count(*) AS c", "min(id) AS lo", "max(id) AS hi").first()
    assert (stats.c, stats.lo, stats.hi) == (200, 1, 200)

    cluster.upsert(table, [{"id": 10, "name": "ten", "score": -10}, {"id": 150, "name": "x", "score": -150}])
    cluster.delete(table, [{"id": 20}, {"id": 160}])
    cluster.upsert(table, [{"id": 10, "name": "ten again", "score": -11}])
    cluster.delete(table, [{"id": 10}])
    cluster.upsert(table, [{"id": 10, "name": "back", "score": 10}])
    rows = {r.id: (r.name, r.score) for r in load(spark, cluster, table).collect()}
    expected = {i: (f"n{i}", i) for i in range(1, 201) if i not in (20, 160)}
    expected[10] = ("back", 10)
    expected[150] = ("x", -150)
    assert rows == expected
    assert cluster.latest_snapshots(table) == snapshots


def read_in_background(
    spark: Any, cluster: Fluss, table: str, lease_id: str, gate: Path
) -> tuple[dict[str, Any], threading.Thread]:
    """A batch read in a thread that plans (and leases its snapshots as ``lease_id``) at once but reads
    only once ``gate`` exists; its rows (or its error) land in the returned dict."""
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            df = load(spark, cluster, table, **{"scan.kv.snapshot.lease.id": lease_id, "testing.read.wait-for-file": str(gate)})
            result["rows"] = [r.asDict() for r in df.collect()]
        except Exception as exc:  # surfaced by the callers' assertions
            result["error"] = exc

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return result, reader


def test_a_read_leases_its_snapshots_and_reads_them_after_retention_rolled_past(
    spark: Any, snapshot_cluster: Fluss, tmp_path: Path
) -> None:
    cluster = snapshot_cluster
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    original = [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 51)]
    cluster.upsert(table, original)
    planned = cluster.wait_for_snapshots_at_high_watermark(table, 2)
    lease_id = f"test-lease-{tmp_path.name}"
    gate = tmp_path / "go"
    result, reader = read_in_background(spark, cluster, table, lease_id, gate)
    try:
        # planned: the lease pins exactly the snapshots that were latest, visible to the admin API and the CLI
        lease = wait_until(lambda: [x for x in cluster.leases() if x.lease_id == lease_id], "the read's lease")[0]
        assert {(b.bucket, s) for b, s in lease.snapshots.items()} == {(b, s.snapshot_id) for b, s in planned.items()}
        listed = subprocess.run(
            [sys.executable, "-m", "strom.cli.main", "lease", "list", "--json", "-b", cluster.address],
            capture_output=True, text=True, timeout=60, check=True,
        )
        assert lease_id in {entry["lease_id"] for entry in json.loads(listed.stdout)}

        # newer snapshots commit; with kv.snapshot.num-retained=1 only the lease keeps the planned ones
        cluster.upsert(table, [{**row, "name": "updated"} for row in original])
        newer = wait_until(
            lambda: all(
                (s := cluster.latest_snapshots(table)[b]) is not None and s.snapshot_id > p.snapshot_id
                for b, p in planned.items()
            ),
            "newer snapshots of every bucket",
        )
        assert newer
        pinned = {(b, p.snapshot_id) for b, p in planned.items()}
        assert pinned <= cluster.retained_snapshot_ids(table)
    finally:
        gate.touch()
        reader.join(120)
    assert "error" not in result, result.get("error")
    assert sorted(result["rows"], key=lambda r: r["id"]) == [{**row, "_change_type": "+I"} for row in original]
    wait_until(lambda: not [x for x in cluster.leases() if x.lease_id == lease_id], "the lease's release")
    wait_until(lambda: not pinned & cluster.retained_snapshot_ids(table), "retention of the released snapshots")


def test_a_snapshot_reads_the_same_rows_with_and_without_keys(snapshot_cluster: Fluss) -> None:
    """Reads without a changelog tail iterate values alone; they must see what the keyed iteration sees."""
    import asyncio

    from strom.client import Connection
    from strom.client.snapshots import KvSnapshotReader
    from strom.ids import TablePath

    cluster = snapshot_cluster
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=1)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(10)])
    snapshot = cluster.wait_for_snapshots_at_high_watermark(table, 1)[0]

    async def read() -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
        async with await Connection.create(cluster.address) as connection:
            handle = await connection.get_table(TablePath.parse(table))
            bucket = handle.layout.info.buckets()[0]
            metadata = await connection.get_admin().get_kv_snapshot_metadata(bucket, snapshot.snapshot_id)
        with KvSnapshotReader(handle.layout, metadata) as reader:
            plain = [batch.to_pylist() for batch in reader.iter_batches(3)]
            keyed = [batch.to_pylist() for _keys, batch in reader.iter_keyed_batches(3)]
        return plain, keyed

    plain, keyed = asyncio.run(read())
    assert plain == keyed
    assert [len(rows) for rows in plain] == [3, 3, 3, 1]
    assert sorted(row["id"] for rows in plain for row in rows) == list(range(10))


def test_a_table_whose_columns_changed_reads_its_snapshot_and_changelog_in_the_new_schema(
    spark: Any, snapshot_cluster: Fluss
) -> None:
    """Rows in the KV snapshot and the changelog keep the schema they were written in; Spark sees one."""
    cluster = snapshot_cluster
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 11)])

    async def add_column(connection: Any) -> None:
        await connection.get_admin().alter_table(TablePath.parse(table), add_columns=[Column("email", StringType())])

    run(cluster.address, add_column)
    cluster.upsert(table, [{"id": 3, "name": "three", "score": 3, "email": "3@x"}, {"id": 11, "name": "n11", "score": 11}])
    cluster.wait_for_snapshots_at_high_watermark(table, 2)  # both schemas' rows in the snapshots
    cluster.upsert(table, [{"id": 4, "name": "four", "score": 4, "email": "4@x"}])  # and in the changelog after them

    df = load(spark, cluster, table)
    assert df.columns[:4] == ["id", "name", "score", "email"]
    rows = {r.id: (r.name, r.email) for r in df.collect()}
    expected: dict[int, tuple[str, str | None]] = {i: (f"n{i}", None) for i in range(1, 12)}
    expected[3], expected[4] = ("three", "3@x"), ("four", "4@x")
    assert rows == expected


def test_a_read_planned_before_a_column_was_added_returns_the_planned_columns(
    spark: Any, snapshot_cluster: Fluss, tmp_path: Path
) -> None:
    cluster = snapshot_cluster
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    original = [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 21)]
    cluster.upsert(table, original)
    cluster.wait_for_snapshots_at_high_watermark(table, 2)
    lease_id, gate = f"test-lease-{tmp_path.name}", tmp_path / "go"
    result, reader = read_in_background(spark, cluster, table, lease_id, gate)
    try:
        wait_until(lambda: [x for x in cluster.leases() if x.lease_id == lease_id], "the read's plan (its lease)")

        async def add_column(connection: Any) -> None:
            await connection.get_admin().alter_table(TablePath.parse(table), add_columns=[Column("email", StringType())])

        run(cluster.address, add_column)  # the tasks open the table after this: its layout has four columns
    finally:
        gate.touch()
        reader.join(120)
    assert "error" not in result, result.get("error")
    assert sorted(result["rows"], key=lambda r: r["id"]) == [{**row, "_change_type": "+I"} for row in original]
