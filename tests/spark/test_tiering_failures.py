"""The tiering service when things die: drivers killed with SIGKILL at each step of the commit, a Spark
task killed mid-split, the server restarted mid-round, the lease lost mid-round, two jobs at once and the
table dropped mid-round. Whatever dies, the lake ends up holding each change exactly once."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from strom.client.lake import tiering_lease_id
from strom.ids import TablePath
from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss, run, wait_until
from tests.spark.tiering_support import (
    FAST_TIERING,
    LAKE_FORMATS,
    PK_LAKE_FORMATS,
    DriverThread,
    Gates,
    TieringProcess,
    create_lake_table,
    lake_rows,
    lake_snapshot,
    strom_rows,
    tier_once,
    tiering_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(600), pytest.mark.slow]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]
PK_NAMES = ["id", "name", "score"]
LOG_COLUMNS = [("id", IntType()), ("event", StringType())]


def _append(cluster: Fluss, table: str, ids: range) -> None:
    cluster.append(table, [{"id": i, "event": f"e{i}"} for i in ids])


TIERING_PROCESSES = pytest.mark.xdist_group("tiering-processes")
"""For the tests that run the tiering service in processes of its own and not this run's Spark session:
they may run beside the session's tests, on another worker."""


@TIERING_PROCESSES
@pytest.mark.parametrize("lake_format", LAKE_FORMATS)
def test_driver_killed_at_every_step_of_the_commit_loses_and_repeats_nothing(
    server_factory: Any, tmp_path: Path, lake_format: str
) -> None:
    server = server_factory(tiering_config(lake_format, **{"kv.snapshot.interval": "1s"}))
    cluster = Fluss(server.address)
    log_table = create_lake_table(cluster, LOG_COLUMNS, bucket_count=2)
    pk_table = None  # Lance holds log tables only
    if lake_format in PK_LAKE_FORMATS:
        pk_table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=2)
        cluster.upsert(pk_table, [{"id": i, "name": f"n{i}", "score": i} for i in range(60)])
        cluster.wait_for_snapshots_at_high_watermark(pk_table, 2)
    lease_id = tiering_lease_id("crashy")
    written = 0
    for number, point in enumerate(["lake-commit", "coordinator-commit", "committed"]):
        _append(cluster, log_table, range(written, written + 40))
        written += 40
        if pk_table is not None:
            cluster.upsert(pk_table, [{"id": i, "name": f"r{number}", "score": -i} for i in range(number, 80, 4)])
            cluster.delete(pk_table, [{"id": i} for i in range(number + 1, 80, 9)])
        gates = Gates(tmp_path / f"gates-{point}")
        gates.hold(point)
        process = TieringProcess(cluster, tmp_path / f"driver-{point}.log", job_id="crashy",
                                 defines={"testing.tiering.gate-dir": gates.path})
        try:
            gates.wait_reached(point)
            assert {lease.lease_id for lease in cluster.leases()} <= {lease_id}, "one lease, named after the job"
        finally:
            process.kill()
    final = TieringProcess(cluster, tmp_path / "driver-final.log", job_id="crashy", once=True)
    assert final.wait() == 0, final.log()[-4000:]
    final = TieringProcess(cluster, tmp_path / "driver-final2.log", job_id="crashy", once=True)
    assert final.wait() == 0, final.log()[-4000:]
    assert lake_rows(cluster, log_table, ["id", "event"]) == [(i, f"e{i}") for i in range(written)]
    if pk_table is not None:
        assert lake_rows(cluster, pk_table, PK_NAMES) == strom_rows(cluster, pk_table, PK_NAMES)
    assert [lease.lease_id for lease in cluster.leases()] == [], "a clean shutdown drops the lease"


def test_a_task_killed_mid_split_fails_the_round_which_is_retried(spark: Any, server_factory: Any, tmp_path: Path) -> None:
    cluster = Fluss(server_factory(FAST_TIERING).address)
    table = create_lake_table(cluster, LOG_COLUMNS, bucket_count=1)
    _append(cluster, table, range(30))
    gates = Gates(tmp_path / "gates")
    gates.hold("task")
    thread = DriverThread(spark, cluster, gate_dir=gates.path).start()
    [worker] = gates.wait_reached("task")
    assert worker != os.getpid(), "the task runs in a Spark Python worker"
    gates.release("task")
    os.kill(worker, signal.SIGKILL)
    driver = thread.join()
    assert len(driver.outcomes) == 1
    assert lake_rows(cluster, table, ["id", "event"]) == [(i, f"e{i}") for i in range(30)]

    async def status(connection: Any) -> Any:
        [found] = await connection.get_admin().describe_lake_tiering(TablePath.parse(table))
        return found

    described = run(cluster.address, status)
    assert described.failures == 1 and described.last_failure, "the failed round's reason reached the coordinator"
    assert described.last_failure != "the tiering job reported a failure"


def test_server_restarted_mid_round(spark: Any, server_factory: Any, tmp_path: Path) -> None:
    server = server_factory(FAST_TIERING)
    cluster = Fluss(server.address)
    table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(50)])
    gates = Gates(tmp_path / "gates")
    gates.hold("task")
    thread = DriverThread(spark, cluster, gate_dir=gates.path).start()
    gates.wait_reached("task")
    server.stop()
    server_factory(FAST_TIERING, data_dir=server.data_dir, port=server.port)
    cluster.upsert(table, [{"id": i, "name": "after", "score": 0} for i in range(40, 60)])
    gates.release("task")
    thread.join()
    tier_once(spark, cluster)  # whatever the interrupted round left, the next one completes it
    assert lake_rows(cluster, table, PK_NAMES) == strom_rows(cluster, table, PK_NAMES)


def test_lease_lost_mid_round_fails_the_round_and_never_reads_a_deleted_snapshot(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory({**FAST_TIERING, "kv.snapshot.interval": "1s", "kv.snapshot.num-retained": "1"})
    cluster = Fluss(server.address)
    table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=1)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(80)])
    first = cluster.wait_for_snapshots_at_high_watermark(table, 1)
    gates = Gates(tmp_path / "gates")
    gates.hold("task")
    thread = DriverThread(spark, cluster, gate_dir=gates.path).start()
    gates.wait_reached("task")
    run(cluster.address, lambda c: c.get_admin().create_kv_snapshot_lease(tiering_lease_id("test-job"), 1000).drop())
    cluster.upsert(table, [{"id": 500, "name": "later", "score": 0}])
    wait_until(lambda: (0, first[0].snapshot_id) not in cluster.retained_snapshot_ids(table), "the snapshot deleted")
    gates.release("task")
    driver = thread.join()
    assert len(driver.outcomes) == 1, "the failed round is retried with a newer snapshot"
    [(_, outcome)] = driver.outcomes
    assert outcome.offsets[next(iter(outcome.offsets))] > first[0].log_offset
    assert lake_rows(cluster, table, PK_NAMES) == strom_rows(cluster, table, PK_NAMES)


def test_two_jobs_only_the_current_epoch_commits(spark: Any, server_factory: Any, tmp_path: Path) -> None:
    cluster = Fluss(server_factory(FAST_TIERING).address)
    table = create_lake_table(cluster, LOG_COLUMNS, bucket_count=1)
    _append(cluster, table, range(25))
    gates = Gates(tmp_path / "gates-a")
    gates.hold("lake-commit")
    job_a = TieringProcess(cluster, tmp_path / "a.log", job_id="job-a", defines={"testing.tiering.gate-dir": gates.path})
    try:
        gates.wait_reached("lake-commit")
        job_a.signal(signal.SIGSTOP)  # job A freezes before its lake commit and misses its heartbeats
        driver_b = tier_once(spark, cluster, job_id="job-b")
        assert len(driver_b.outcomes) == 1
        job_a.signal(signal.SIGCONT)
        gates.release("lake-commit")
        wait_until(lambda: "took" in job_a.log() or "failed" in job_a.log(), "job A to learn it lost the table", 60)
    finally:
        job_a.kill()
    assert lake_rows(cluster, table, ["id", "event"]) == [(i, f"e{i}") for i in range(25)]
    snapshot = lake_snapshot(cluster, table)
    assert snapshot is not None and snapshot.snapshot_id == driver_b.outcomes[0][1].lake_snapshot_id


def test_table_dropped_mid_round(spark: Any, server_factory: Any, tmp_path: Path) -> None:
    cluster = Fluss(server_factory(FAST_TIERING).address)
    table = create_lake_table(cluster, LOG_COLUMNS, bucket_count=1)
    _append(cluster, table, range(10))
    gates = Gates(tmp_path / "gates")
    gates.hold("task")
    thread = DriverThread(spark, cluster, gate_dir=gates.path).start()
    gates.wait_reached("task")
    from strom.ids import TablePath

    run(cluster.address, lambda c: c.get_admin().drop_table(TablePath.parse(table)))
    gates.release("task")
    driver = thread.join()
    assert driver.outcomes == []


@TIERING_PROCESSES
def test_sigterm_mid_round_cancels_it_reports_it_failed_and_drops_the_lease(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({**FAST_TIERING, "kv.snapshot.interval": "1s"})
    cluster = Fluss(server.address)
    table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=1)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(20)])
    cluster.wait_for_snapshots_at_high_watermark(table, 1)
    gates = Gates(tmp_path / "gates")
    gates.hold("task")
    process = TieringProcess(cluster, tmp_path / "driver.log", job_id="stopped",
                             defines={"testing.tiering.gate-dir": gates.path})
    try:
        gates.wait_reached("task")
        assert [lease.lease_id for lease in cluster.leases()] == [tiering_lease_id("stopped")]
        process.signal(signal.SIGTERM)
        assert process.wait(120) == 0, process.log()[-4000:]
    finally:
        process.kill()
    assert cluster.leases() == [], "a clean shutdown drops the job's lease"

    async def status(connection: Any) -> Any:
        [found] = await connection.get_admin().describe_lake_tiering(TablePath.parse(table))
        return found

    described = run(cluster.address, status)
    assert (described.state, described.failures) == ("Pending", 1), "the cancelled round was reported failed"
    assert described.last_failure and described.last_failure != "the tiering job reported a failure", (
        "the job told the coordinator why the round failed")
    assert lake_snapshot(cluster, table) is None
