"""Exactly-once writes from Spark (``write.exactly-once``), with drivers and Python workers killed by SIGKILL.

Streaming: three queries read one log table and write a log table, a primary-key table and an aggregation
table; their drivers are killed at random moments (their workers too, more often) and restarted from the
checkpoints until a run drains the source. Batch: a task is killed after some of its rows were acknowledged
and Spark retries it. Either way each table ends up holding each input row's effect exactly once: every row
once in the log table, each key's last value in the primary-key table, each key's sum in the aggregation
table.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from strom.records.types import BigIntType, IntType
from tests.spark.support import Fluss

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(600), pytest.mark.slow]

DRIVER = Path(__file__).with_name("exactly_once_driver.py")
ROWS = 480
KEYS = 13
CHAOS_RUNS = 1
FINAL_RUNS_MAX = 3
"""Undisturbed runs allowed to drain the source: one run after a kill has been seen to fail inside Spark (its
tasks did not deserialize: java.io.OptionalDataException); a user restarts such a query from its checkpoint,
and so does the test. Exactness is asserted on whatever the runs wrote together."""
DRIVER_TIMEOUT_S = 240


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    return children


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (the driver's JVM, its Python daemon and workers), from /proc."""
    children = _children_by_parent()
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _is_daemon(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"pyspark.daemon" in cmdline.read().split(b"\0")
    except OSError:
        return False


def _task_workers(pid: int) -> list[int]:
    """The Python workers running the driver's tasks: the processes ``python -m pyspark.daemon`` forks (not
    the daemon itself, nor the Python processes Spark plans data source reads with)."""
    children = _children_by_parent()
    return [worker for daemon in _descendants(pid) if _is_daemon(daemon) for worker in children.get(daemon, [])]


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver we started and everything below it."""
    below = _descendants(process.pid)
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(30)


def _driver(mode: str, cluster: Fluss, source: str, directory: Path, targets: dict[str, str], log: Path) -> Any:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    command = [sys.executable, str(DRIVER), mode, cluster.address, source, str(directory)]
    command += [f"{columns}={table}" for table, columns in targets.items()]
    with open(log, "ab") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)


def _tables(cluster: Fluss) -> tuple[str, str, str, str]:
    source = cluster.create_table([("id", BigIntType()), ("k", IntType()), ("v", BigIntType())], bucket_count=2,
                                  bucket_keys=["k"], prefix="eo_source")  # a key's rows stay in order
    cluster.append(source, [{"id": i, "k": i % KEYS, "v": i} for i in range(ROWS)])
    log = cluster.create_table([("id", BigIntType()), ("v", BigIntType())], bucket_count=2, prefix="eo_log")
    pk = cluster.create_table([("k", IntType()), ("v", BigIntType())], primary_key=["k"], prefix="eo_pk")
    aggregation = cluster.create_table(
        [("k", IntType()), ("v", BigIntType())], primary_key=["k"], prefix="eo_sum",
        properties={"table.merge-engine": "aggregation", "fields.v.agg": "sum"},
    )
    return source, log, pk, aggregation


def _log_rows(cluster: Fluss, table: str) -> int:
    return len(cluster.log_records(table, 0)) + len(cluster.log_records(table, 1))


def _assert_exact(cluster: Fluss, log: str, pk: str, aggregation: str) -> None:
    logged = Counter((record.row["id"], record.row["v"]) for bucket in (0, 1)
                     for record in cluster.log_records(log, bucket))
    assert logged == Counter((i, i) for i in range(ROWS)), "every row of the source exactly once"
    last = {k: max(i for i in range(ROWS) if i % KEYS == k) for k in range(KEYS)}
    assert {row["k"]: row["v"] for row in cluster.rows(pk)} == last, "each key's last value"
    sums = {k: sum(i for i in range(ROWS) if i % KEYS == k) for k in range(KEYS)}
    assert {row["k"]: row["v"] for row in cluster.rows(aggregation)} == sums, "each key's rows summed once"


def test_streaming_queries_killed_at_random_write_every_row_exactly_once(server_factory: Any, tmp_path: Path) -> None:
    cluster = Fluss(server_factory().address)
    source, log, pk, aggregation = _tables(cluster)
    targets = {log: "id,v", pk: "k,v", aggregation: "k,v"}
    rng = random.Random(20261126)
    worker_kills = drivers_killed = 0
    for run in range(CHAOS_RUNS + FINAL_RUNS_MAX):
        before = _log_rows(cluster, log)
        process = _driver("stream", cluster, source, tmp_path / "checkpoints", targets, tmp_path / "driver.log")
        if run >= CHAOS_RUNS:  # undisturbed runs, restarted from the checkpoints until one drains the source
            code = process.wait(DRIVER_TIMEOUT_S)
            if code == 0:
                break
            assert run + 1 < CHAOS_RUNS + FINAL_RUNS_MAX, (tmp_path / "driver.log").read_text()[-4000:]
            continue
        started = time.monotonic()
        while _log_rows(cluster, log) == before and process.poll() is None:  # until micro-batches run
            assert time.monotonic() - started < DRIVER_TIMEOUT_S, "the streaming queries never wrote"
            time.sleep(0.2)
        deadline = time.monotonic() + rng.uniform(1.0, 4.0)
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(rng.uniform(0.2, 0.8))
            workers = _task_workers(process.pid)
            if workers:
                os.kill(rng.choice(workers), signal.SIGKILL)
                worker_kills += 1
        drivers_killed += process.poll() is None
        _kill_tree(process)
        assert _log_rows(cluster, log) < ROWS or run > 0, "the first run should be killed part-way"
    assert worker_kills > 0 and drivers_killed > 0
    _assert_exact(cluster, log, pk, aggregation)


def test_a_batch_write_whose_tasks_crash_after_writing_is_retried_exactly_once(
    server_factory: Any, tmp_path: Path
) -> None:
    cluster = Fluss(server_factory().address)
    source, log, pk, aggregation = _tables(cluster)
    process = _driver("batch", cluster, source, tmp_path, {log: "id,v", pk: "k,v", aggregation: "k,v"},
                      tmp_path / "driver.log")
    try:
        assert process.wait(DRIVER_TIMEOUT_S) == 0, (tmp_path / "driver.log").read_text()[-4000:]
    finally:
        if process.poll() is None:
            _kill_tree(process)
    for table in (log, pk, aggregation):  # each write had a task killed after two acknowledged requests
        assert (tmp_path / f"crashed-{table}").exists()
    _assert_exact(cluster, log, pk, aggregation)
