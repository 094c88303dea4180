"""Standby replicas on a cluster of real processes: with ``table.kv.standby-replica.enabled`` (set here by
ALTER TABLE, so the followers take it up while running) the follower keeps the bucket's RocksDB warm;
when the leader is killed with SIGKILL, the follower leads with that state — no snapshot download, no
replay of the changelog from the start — and every acknowledged row is there, old and new values alike.
A table without the option fails over the old way, rebuilding its state from the log."""

from __future__ import annotations

import asyncio
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, TableBucket
from strom.ids import TablePath
from strom.records.schema import Schema, TableDescriptor
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import FAST_SESSIONS, FIELDS, _cluster, bucket_leaders, rows
from tests.cluster.test_replication import States
from tests.conftest import unique_name
from tests.server_process import free_port

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

ROWS = 3000
WAIT_S = 60.0


METRICS_PORTS: dict[str, int] = {}
"""Each member's Prometheus port, picked when the cluster starts."""


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[LocalCluster]:
    METRICS_PORTS.update({name: free_port() for name in ("tablet-server-1", "tablet-server-2", "coordinator-1")})
    ports = {name: {"metrics.reporter.prometheus.port": str(port)} for name, port in METRICS_PORTS.items()}
    yield from _cluster(tmp_path / "cluster", 2, {"kv.snapshot.interval": "0s", **FAST_SESSIONS}, member_config=ports)


def _metric(member: str, name: str, table: str | None = None) -> float | None:
    """A value from a member's Prometheus endpoint (with ``table``: that table's series)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORTS[member]}/metrics", timeout=10) as response:
        text = response.read().decode()
    prefix = name + (f'{{table="{table}"}}' if table is not None else "")
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith(prefix + " ")), None)


async def _create(connection: Connection) -> TablePath:
    path = TablePath("fluss", unique_name("standby"))
    await connection.get_admin().create_table(path, TableDescriptor(
        Schema.from_arrow(FIELDS, ["id"]), bucket_count=1, properties={"table.replication.factor": "2"}))
    return path


async def _write(connection: Connection, path: TablePath, ids: range, tag: str) -> None:
    writer = (await connection.get_table(path)).new_upsert().create_writer()
    await writer.upsert_batch(pa.table({"id": list(ids), "v": [f"{tag}{i}" for i in ids]}))


def _log_lines(local: LocalCluster, server_id: int, pattern: str) -> list[str]:
    text = (local.data_dir / f"tablet-server-{server_id}.log").read_text(errors="replace")
    return [line for line in text.splitlines() if re.search(pattern, line)]


def _wait_log(local: LocalCluster, server_id: int, pattern: str) -> list[str]:
    deadline = time.monotonic() + WAIT_S
    while not (found := _log_lines(local, server_id, pattern)):
        assert time.monotonic() < deadline, f"server {server_id} never logged {pattern!r}"
        time.sleep(0.2)
    return found


def test_a_standby_follower_leads_with_its_warm_state_after_the_leader_is_killed(pair: LocalCluster) -> None:
    local = pair
    states = States(local)

    async def setup() -> tuple[TablePath, TablePath, TableBucket, TableBucket, int, int]:
        async with await Connection.create(local.bootstrap) as connection:
            warm = await _create(connection)
            cold = await _create(connection)
            await _write(connection, warm, range(ROWS), "a")
            await _write(connection, cold, range(ROWS), "a")
            await connection.get_admin().alter_table(warm, set_properties={"table.kv.standby-replica.enabled": "true"})
            await _write(connection, warm, range(0, ROWS, 2), "b")  # updates: the standby applies -U/+U
            await _write(connection, cold, range(0, ROWS, 2), "b")
            warm_bucket = TableBucket((await connection.get_table(warm)).layout.info.table_id, 0)
            cold_bucket = TableBucket((await connection.get_table(cold)).layout.info.table_id, 0)
            (leader,) = await bucket_leaders(connection, warm)
            (cold_leader,) = await bucket_leaders(connection, cold)
            return warm, cold, warm_bucket, cold_bucket, leader, cold_leader

    try:
        warm, cold, warm_bucket, cold_bucket, leader, cold_leader = asyncio.run(setup())
        states.wait_full_isr(warm_bucket)
        states.wait_full_isr(cold_bucket)
        follower = 2 if leader == 1 else 1
        # the follower opened the warm table's state when the option was set (ALTER reached it), the cold
        # table's follower keeps its log only
        _wait_log(local, follower, rf"TableBucket\(table_id={warm_bucket.table_id}, .*standby KV state open")
        deadline = time.monotonic() + WAIT_S  # its metrics say it is warm, and caught up
        while _metric(f"tablet-server-{follower}", "strom_kv_standby_lag_records", str(warm)) != 0.0:
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.2)
        assert _metric(f"tablet-server-{follower}", "strom_kv_standby_buckets", str(warm)) == 1.0
        assert _metric(f"tablet-server-{follower}", "strom_kv_standby_buckets", str(cold)) is None
        assert _metric(f"tablet-server-{leader}", "strom_kv_backpressure_rejections_total", str(warm)) == 0.0
        assert _metric("coordinator-1", "strom_kv_snapshot_lease_count") == 0.0  # the active coordinator's
        assert not _log_lines(local, follower, rf"TableBucket\(table_id={cold_bucket.table_id}, .*standby")
        local.signal_member(local.member("tablet-server", leader), signal.SIGKILL)

        async def after() -> tuple[dict[int, str], dict[int, str]]:
            async with await Connection.create(local.bootstrap) as connection:
                return await rows(connection, warm), await rows(connection, cold)

        warm_rows, cold_rows = asyncio.run(asyncio.wait_for(after(), WAIT_S))
    finally:
        states.close()
    expected = {i: (f"b{i}" if i % 2 == 0 else f"a{i}") for i in range(ROWS)}
    assert warm_rows == expected
    assert cold_rows == expected
    _wait_log(local, follower, rf"TableBucket\(table_id={warm_bucket.table_id}, .*the standby KV state leads")
    if cold_leader == leader:  # the cold table failed over too: its new leader rebuilt the state from the log
        rebuilt = [line for line in _log_lines(local, follower, r"replayed \d+ changelog records")
                   if f"-{cold_bucket.table_id}/0/kv" in line]
        assert rebuilt and int(re.search(r"replayed (\d+)", rebuilt[-1]).group(1)) >= ROWS, rebuilt  # type: ignore[union-attr]
