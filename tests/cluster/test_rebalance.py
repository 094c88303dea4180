"""Moving replicas in a cluster of real processes (Fluss's server tags and rebalance, api keys 1047-1051):
a 3-server cluster grown to 4 and rebalanced, then a server tagged PERMANENT_OFFLINE and drained, while
pyfluss writes in a process of its own; every acknowledged write survives, writes never stall for long,
replicas and leaderships end evenly spread, and a drained server keeps no copy. With racks, a drain keeps
every bucket on both racks."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import (
    Connection,
    GoalType,
    RebalanceStatus,
    ServerTag,
    TableBucket,
    TableDescriptor,
    TablePath,
)
from strom.client.rebalance import RebalanceProgress
from strom.errors import RebalanceFailureError, ServerNotExistError, ServerTagAlreadyExistError
from strom.membership.contract import LeaderAndIsr
from strom.records.schema import Schema
from strom.server.local_cluster import LocalCluster
from strom.zk.zookeeper_server import unavailable_reason
from tests.cluster.test_cluster_processes import _cluster, rows, upsert
from tests.cluster.test_replication import PK_FIELDS, States, wait_for_servers
from tests.cluster.test_rolling_restart import _Writer
from tests.conftest import unique_name
from tests.docs.snippets import run_command, shell_lines, snippet

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("cluster")]

CONFIG = {"kv.snapshot.interval": "0s", "log.replica.max-lag-time": "30s"}
BUCKETS = 6
GAP_MAX_S = 10.0
"""Longest pause between two acknowledged pyfluss writes while buckets move."""
WRITER_SILENCE_S = 4.0
"""A pyfluss writer silent this long is replaced: leaderships move with batches in flight, after which
pyfluss 1.0.0's writer may go silent for good (docs/cluster.md); acknowledgements come every few ms."""
WAIT_S = 120.0


@pytest.fixture
def three(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path / "cluster", 3, CONFIG)


async def _create(connection: Connection, fields: pa.Schema, primary_key: list[str] | None) -> TablePath:
    path = TablePath("fluss", unique_name("moved"))
    descriptor = TableDescriptor(Schema.from_arrow(fields, primary_key), bucket_count=BUCKETS,
                                 properties={"table.replication.factor": "2"})
    await connection.get_admin().create_table(path, descriptor)
    return path


def _layout(local: LocalCluster, table_ids: list[int]) -> dict[TableBucket, LeaderAndIsr]:
    states = States(local)
    try:
        return {bucket: states.get(bucket) for table_id in table_ids
                for bucket in (TableBucket(table_id, b) for b in range(BUCKETS))}
    finally:
        states.close()


def _counts(layout: dict[TableBucket, LeaderAndIsr], servers: set[int]) -> tuple[Counter[int], Counter[int]]:
    replicas = Counter({server: 0 for server in servers})
    leaders = Counter({server: 0 for server in servers})
    for state in layout.values():
        replicas.update(state.replicas)
        leaders[state.leader] += 1
    return replicas, leaders


def _rebalance(local: LocalCluster, *goals: GoalType) -> RebalanceProgress:
    """Start a rebalance and wait until it ends."""
    async def scenario() -> RebalanceProgress:
        async with await Connection.create(local.bootstrap) as connection:
            admin = connection.get_admin()
            rebalance_id = await admin.rebalance(goals)
            deadline = time.monotonic() + WAIT_S
            while True:
                progress = await admin.list_rebalance_progress(rebalance_id)
                assert progress is not None and progress.rebalance_id == rebalance_id
                if progress.status.is_final:
                    return progress
                assert time.monotonic() < deadline, f"rebalance still {progress.status.name} after {WAIT_S} s"
                await asyncio.sleep(0.3)

    return asyncio.run(scenario())


def test_a_grown_cluster_is_rebalanced_and_a_tagged_server_drained_under_pyfluss_writes(three: LocalCluster) -> None:
    async def setup() -> tuple[TablePath, list[int]]:
        async with await Connection.create(three.bootstrap) as connection:
            admin = connection.get_admin()
            path = await _create(connection, PK_FIELDS, ["id"])
            log_path = await _create(connection, pa.schema([("id", pa.int64())]), None)
            table_ids = [(await admin.get_table_info(p)).table_id for p in (path, log_path)]
            with pytest.raises(RebalanceFailureError, match="goal"):
                await admin.rebalance([7])  # type: ignore[list-item]
            with pytest.raises(ServerNotExistError):
                await admin.add_server_tag([9], ServerTag.PERMANENT_OFFLINE)
            return path, table_ids

    path, table_ids = asyncio.run(setup())
    states = States(three)
    for bucket in _layout(three, table_ids):
        states.wait_full_isr(bucket)
    writer = _Writer(three, path, replace_silent_after_s=WRITER_SILENCE_S)
    try:
        writer.wait_for(20)
        three.start_member("tablet-server", 4)
        wait_for_servers(three, 4)
        before = _layout(three, table_ids)
        assert _counts(before, {1, 2, 3, 4})[0][4] == 0, "a new server holds nothing until a rebalance"

        grown = _rebalance(three)
        assert grown.status is RebalanceStatus.COMPLETED, grown
        assert grown.moves and all(m.status is RebalanceStatus.COMPLETED for m in grown.moves)
        after = _layout(three, table_ids)
        replicas, leaders = _counts(after, {1, 2, 3, 4})
        assert max(replicas.values()) - min(replicas.values()) <= 1, replicas
        assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
        assert all(set(state.isr) == set(state.replicas) for state in after.values()), after
        writer.wait_for(len(writer.acknowledged) + 20)

        # decommission server 2 with the commands of docs/rebalance.md
        tag_line, start_line, progress_line = shell_lines(snippet("docs/rebalance.md", "Decommissioning a server", 0))
        at = {"127.0.0.1:9123": three.bootstrap}
        run_command(tag_line, three.data_dir, at)

        async def tag_again() -> None:
            async with await Connection.create(three.bootstrap) as connection:
                with pytest.raises(ServerTagAlreadyExistError):
                    await connection.get_admin().add_server_tag([2], ServerTag.TEMPORARY_OFFLINE)

        asyncio.run(tag_again())
        drained = run_command(start_line, three.data_dir, at, timeout_s=WAIT_S + 30)
        assert "COMPLETED" in drained.splitlines()[0], drained
        assert "COMPLETED" in run_command(progress_line, three.data_dir, at).splitlines()[0]
        final = _layout(three, table_ids)
        replicas, leaders = _counts(final, {1, 3, 4})
        assert 2 not in replicas and 2 not in leaders, final
        assert max(replicas.values()) - min(replicas.values()) <= 1, replicas
        assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
        assert all(len(state.replicas) == 2 and set(state.isr) == set(state.replicas) for state in final.values())
        writer.wait_for(len(writer.acknowledged) + 20)

        member = three.member("tablet-server", 2)
        assert three.signal_member(member, signal.SIGTERM) == 0
        writer.wait_for(len(writer.acknowledged) + 20)  # nothing depended on the drained server
    finally:
        writer.stop()
        states.close()

    async def read() -> dict[int, str]:
        async with await Connection.create(three.bootstrap) as connection:
            return await rows(connection, path)

    writer.assert_steady_and_kept("rebalance", asyncio.run(read()), GAP_MAX_S)
    leftover = [d for d in (Path(three.data_dir) / "tablet-server-2" / "tablets").rglob("*")
                if d.is_dir() and d.name.isdigit() and d.parent.name.endswith(tuple(f"-{t}" for t in table_ids))]
    assert not leftover, f"the drained server kept bucket copies: {leftover}"


def test_a_lost_server_is_drained_keeping_every_bucket_on_both_racks(tmp_path: Path) -> None:
    """Racks a, a, b, b; server 1 stops, is tagged PERMANENT_OFFLINE while down (it still holds replicas)
    and drained: its replicas can only go to server 2, the other server of rack a, or a bucket would lose
    its rack spread. Started again, server 1 deletes the copies that moved away while it was down."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(tmp_path / "cluster", 4, {"kv.snapshot.interval": "0s"}, racks=["a", "a", "b", "b"]).start()
    try:
        wait_for_servers(local, 4)

        async def setup() -> tuple[TablePath, int]:
            async with await Connection.create(local.bootstrap) as connection:
                path = await _create(connection, PK_FIELDS, ["id"])
                await upsert(connection, path, range(100), "v")
                return path, (await connection.get_admin().get_table_info(path)).table_id

        path, table_id = asyncio.run(setup())
        racks = {1: "a", 2: "a", 3: "b", 4: "b"}
        held = [b for b, state in _layout(local, [table_id]).items() if 1 in state.replicas]
        assert held
        assert local.signal_member(local.member("tablet-server", 1), signal.SIGTERM) == 0

        async def tag_the_lost_server() -> None:
            async with await Connection.create(local.bootstrap) as connection:
                await connection.get_admin().add_server_tag([1], ServerTag.PERMANENT_OFFLINE)

        asyncio.run(tag_the_lost_server())
        done = _rebalance(local)
        assert done.status is RebalanceStatus.COMPLETED, done
        layout = _layout(local, [table_id])
        assert all(1 not in state.replicas for state in layout.values()), layout
        assert all({racks[r] for r in state.replicas} == {"a", "b"} for state in layout.values()), layout

        member = local.start_member("tablet-server", 1)
        wait_for_servers(local, 4)
        assert "bucket copies moved to other servers while this server was down" in Path(member.log).read_text()
        table_dir = Path(local.data_dir) / "tablet-server-1" / "tablets" / path.database_name / f"{path.table_name}-{table_id}"
        assert table_dir.is_dir(), "server 1 held the table before"
        assert not [b for b in range(BUCKETS) if (table_dir / str(b)).exists()], "copies left on server 1"

        async def read() -> dict[int, str]:
            async with await Connection.create(local.bootstrap) as connection:
                return await rows(connection, path)

        assert asyncio.run(read()) == {key: f"v{key}" for key in range(100)}
    finally:
        local.stop()
