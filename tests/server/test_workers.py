"""``strom server --workers N``: N tablet-server processes behind one coordinator on the embedded metadata
store, as real processes on loopback. Buckets spread over the workers; kill -9 of any process (a worker, the
coordinator) loses no acknowledged write, the supervisor starts it again; SIGTERM stops every process, and
kill -9 of the supervisor leaves none behind."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import fluss as pyfluss
import pyarrow as pa
import pytest
from click.testing import CliRunner

from strom.cli.main import main
from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.server.local_cluster import Member, alive
from strom.server.workers import RESTARTS_MAX, WorkerSupervisor, check_layout
from tests.conftest import unique_name
from tests.server_process import WorkersProcess, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("workers")]

WAIT_S = 30.0
FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())])


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[[int], WorkersProcess]]:
    started: list[WorkersProcess] = []

    def start(count: int) -> WorkersProcess:
        started.append(WorkersProcess(tmp_path / f"data{len(started)}", count))
        return started[-1]

    yield start
    for supervisor in started:
        if supervisor.process.poll() is None:
            supervisor.process.kill()
            supervisor.process.wait(WAIT_S)
        for pid in supervisor.members().values():  # members outlive a killed supervisor by at most a second
            wait_until(lambda pid=pid: not alive(pid), f"member {pid} gone")


async def write_through_faults(bootstrap: str, path: TablePath, faults: list[Callable[[], None]]) -> dict[int, int]:
    """Upsert rounds of 40 keys (value = round) while each fault runs between two rounds; a round that fails
    is retried until it is acknowledged. Returns every key's last acknowledged value."""
    acknowledged: dict[int, int] = {}
    async with await Connection.create(bootstrap) as connection:
        table = await connection.get_table(path)
        for round_ in range(3 * (len(faults) + 1)):
            if round_ % 3 == 2 and faults:
                await asyncio.to_thread(faults.pop(0))
            ids = [(round_ * 13 + i) % 200 for i in range(40)]
            batch = pa.table({"id": ids, "v": [round_] * len(ids)}, schema=FIELDS)
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    await table.new_upsert().create_writer().upsert_batch(batch)
                    break
                except Exception:  # the bucket's worker is restarting: the client's retries ran out, try again
                    assert time.monotonic() < deadline, "a round was never acknowledged"
                    await asyncio.sleep(0.2)
            acknowledged.update(dict.fromkeys(ids, round_))
    return acknowledged


async def read_all(bootstrap: str, path: TablePath) -> dict[int, int]:
    async with await Connection.create(bootstrap) as connection:
        table = await connection.get_table(path)
        rows = await (await table.new_scan().create_batch_scanner()).to_arrow()
    return dict(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))


@pytest.mark.asyncio
async def test_buckets_spread_over_the_workers_and_no_kill_loses_an_acknowledged_write(
        workers: Callable[[int], WorkersProcess]) -> None:
    supervisor = workers(2)
    path = TablePath("fluss", unique_name("workers"))
    async with await Connection.create(supervisor.bootstrap) as connection:
        await connection.get_admin().create_table(
            path, TableDescriptor(Schema.from_arrow(FIELDS, primary_key=["id"]), bucket_count=6))
    with sqlite3.connect(supervisor.data_dir / "cluster.sqlite") as db:  # read by an independent reader
        leaders = {json.loads(state)["leader"] for (state,) in db.execute("SELECT state FROM membership_bucket_states")}
    assert leaders == {1, 2}

    faults = [lambda: supervisor.kill_member("tablet-server-1"), lambda: supervisor.kill_member("coordinator-1"),
              lambda: supervisor.kill_member("tablet-server-2")]
    acknowledged = await write_through_faults(supervisor.bootstrap, path, faults)
    assert await read_all(supervisor.bootstrap, path) == acknowledged

    connection = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": supervisor.bootstrap}))
    try:  # the official client finds each bucket's worker through the coordinator
        lookuper = (await connection.get_table(pyfluss.TablePath("fluss", path.table_name))).new_lookup().create_lookuper()
        for key in sorted(acknowledged)[::25]:
            assert await lookuper.lookup({"id": key}) == {"id": key, "v": acknowledged[key]}
    finally:
        await connection.close()

    members = supervisor.members()
    assert supervisor.stop() == 0
    assert not any(alive(pid) for pid in members.values())


def test_members_stop_by_themselves_when_the_supervisor_is_killed(workers: Callable[[int], WorkersProcess]) -> None:
    supervisor = workers(2)
    members = supervisor.members()
    assert len(members) == 3 and all(alive(pid) for pid in members.values())
    supervisor.process.kill()
    supervisor.process.wait(WAIT_S)
    for name, pid in members.items():
        wait_until(lambda pid=pid: not alive(pid), f"{name} stopped after its supervisor was killed")


def test_a_data_directory_serves_only_the_kind_of_server_that_wrote_it(tmp_path: Path) -> None:
    one_process = tmp_path / "one"
    (one_process / "tablets").mkdir(parents=True)
    with pytest.raises(ValueError, match="without --workers"):
        check_layout(one_process, 2)
    check_layout(one_process, 1)
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "cluster.json").write_text(json.dumps({"data_dir": str(cluster), "members": [
        {"role": role, "pid": 0, "address": "127.0.0.1:1", "server_id": i} for role, i in
        [("coordinator", 1), ("tablet-server", 1), ("tablet-server", 2), ("tablet-server", 3)]]}))
    with pytest.raises(ValueError, match="--workers again"):
        check_layout(cluster, 1)
    with pytest.raises(ValueError, match="served by 3 workers"):
        check_layout(cluster, 2)
    check_layout(cluster, 3)
    check_layout(cluster, 4)  # more workers: new tables use them too

    result = CliRunner().invoke(main, ["server", "--workers", "2", "--data-dir", str(one_process), "--bind", "127.0.0.1:0"])
    assert result.exit_code != 0 and "without --workers" in result.output
    result = CliRunner().invoke(main, ["server", "--workers", "0", "--data-dir", str(tmp_path / "x")])
    assert result.exit_code != 0 and "from 1 to 256, or auto" in result.output


def test_a_member_that_keeps_exiting_is_restarted_a_bounded_number_of_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A member that cannot stay up (a broken disk, a bad setting) is started again RESTARTS_MAX times within
    the window; then the supervisor gives up: it stops everything and exits with an error."""
    supervisor = WorkerSupervisor(tmp_path / "data", 2, port=0)
    cluster = supervisor.cluster

    def start_member(role: str, server_id: int, port: int | None = None) -> Member:
        process = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once, as a crashing member
        process.wait(WAIT_S)
        member = Member(role, process.pid, "127.0.0.1:1", server_id)
        cluster.state.members = [m for m in cluster.state.members if m.server_id != server_id] + [member]
        cluster.processes[process.pid] = process
        return member

    monkeypatch.setattr(cluster, "start_member", start_member)
    monkeypatch.setattr(cluster, "stop", lambda: {})
    start_member("tablet-server", 1)
    assert supervisor.supervise() == 1  # returns by itself: no stop was requested
    assert len(supervisor._restarts["tablet-server-1"]) == RESTARTS_MAX + 1
