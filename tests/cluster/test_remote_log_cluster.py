"""Remote log storage in a cluster: only a bucket's leader copies segments; when the leader is killed during
uploads, the new leader goes on from the committed manifest (and deletes what the dead one left half
done); followers cut their local logs too; pyfluss reads the whole log from the earliest offset; a replica
back after its leader cut past its log end starts over at the leader's log start and rejoins the ISR."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.ids import TableBucket
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.server.local_cluster import LocalCluster
from strom.zk.zookeeper_server import unavailable_reason
from tests.cluster.test_replication import States, wait_for_servers
from tests.conftest import unique_name
from tests.integration.test_remote_log import read_with_pyfluss
from tests.remote_log_support import read_listed_manifest

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

CONFIG = {
    "log.segment.file-size": "4kb",
    "remote.log.task-interval-duration": "200ms",
    "remote.log.task-max-upload-segments": "3",
    "kv.snapshot.interval": "0s",
}
WAIT_S = 60.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(tmp_path / "cluster", 3, CONFIG).start()
    try:
        wait_for_servers(local, 3)  # replication factor 3 needs every registration seen by the coordinator
        yield local
    finally:
        local.stop()


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.2)


def manifest(local: LocalCluster, table_id: int) -> dict[str, Any] | None:
    async def ask() -> Any:
        host, _, port = local.bootstrap.split(",")[0].rpartition(":")
        rpc = await RpcConnection.connect(host, int(port))
        try:
            return await rpc.request(ApiKey.LIST_REMOTE_LOG_MANIFESTS, pb.ListRemoteLogManifestsRequest(table_id=table_id))
        finally:
            await rpc.close()

    found = read_listed_manifest(lambda: asyncio.run(ask()))
    return None if found is None else found[1]


async def append(bootstrap: str, path: TablePath, start: int, count: int) -> None:
    async with await Connection.create(bootstrap) as connection:
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        for first in range(start, start + count, 50):
            ids = list(range(first, min(first + 50, start + count)))
            writer.append_arrow_batch(pa.table({"seq": ids, "pad": [f"row-{i:08d}" for i in ids]}))
        await writer.flush()


def local_segment_counts(local: LocalCluster, table_id: int) -> dict[int, int]:
    counts = {}
    for server_id in range(1, 4):
        files = [f for f in (local.data_dir / f"tablet-server-{server_id}" / "tablets").rglob("*.log")
                 if f"-{table_id}" in f.parent.parent.parent.name]
        counts[server_id] = len(files)
    return counts


def test_a_new_leader_goes_on_from_the_manifest_after_the_old_one_is_killed(cluster: LocalCluster) -> None:
    path = TablePath("fluss", unique_name("remote_cluster"))
    schema = Schema.from_arrow(pa.schema([("seq", pa.int64()), ("pad", pa.string())]))

    async def create() -> int:
        async with await Connection.create(cluster.bootstrap) as connection:
            await connection.get_admin().create_table(path, TableDescriptor(
                schema, bucket_count=1,
                properties={"table.replication.factor": "3", "table.log.tiered.local-segments": "2"}))
            return (await connection.get_table(path)).layout.info.table_id

    table_id = asyncio.run(create())
    asyncio.run(append(cluster.bootstrap, path, 0, 1500))
    wait_until(lambda: manifest(cluster, table_id) is not None, "a first manifest")
    first = manifest(cluster, table_id)
    assert first is not None
    states = States(cluster)
    try:
        old_leader = states.get(TableBucket(table_id, 0)).leader
        cluster.signal_member(cluster.member("tablet-server", old_leader), signal.SIGKILL)  # uploads under way
        states.wait_leader_change(TableBucket(table_id, 0), old_leader)
        asyncio.run(append(cluster.bootstrap, path, 1500, 1500))

        def went_on() -> bool:
            found = manifest(cluster, table_id)
            return found is not None and found["remote_log_segments"][-1]["end_offset"] > 2500
        wait_until(went_on, "the new leader copying on")
        latest = manifest(cluster, table_id)
        assert latest is not None
        kept = first["remote_log_segments"][0]
        assert latest["remote_log_segments"][0] == kept, "the new leader continued the same remote log"
        segments = latest["remote_log_segments"]
        for previous, following in itertools.pairwise(segments):
            assert following["start_offset"] == previous["end_offset"]
        live = [s for s in (1, 2, 3) if s != old_leader]
        wait_until(lambda: all(local_segment_counts(cluster, table_id)[s] <= 3 for s in live),
                   "the leader and the follower cut their local logs")
        tablet = (cluster.data_dir / "remote" / "log" / path.database_name / f"{path.table_name}-{table_id}" / "0")

        def no_orphans() -> bool:
            current = manifest(cluster, table_id)
            referenced = {s["segment_id"] for s in current["remote_log_segments"]} if current else set()
            return {p.name for p in tablet.iterdir() if p.is_dir() and p.name != "metadata"} == referenced
        wait_until(no_orphans, "only referenced segment directories")

        records = asyncio.run(read_with_pyfluss(cluster.bootstrap.split(",")[0], path, 3000))
        assert [r.row["seq"] for r in records] == list(range(3000))

        # the old leader comes back far behind: what it lacks is only in remote storage now, so its log
        # starts over at the leader's log start, and it catches up into the ISR
        cluster.start_member("tablet-server", old_leader)
        state = states.wait_full_isr(TableBucket(table_id, 0))
        assert old_leader in state.isr
        restarted = [f for f in (cluster.data_dir / f"tablet-server-{old_leader}" / "tablets").rglob("*.log")
                     if f"-{table_id}" in f.parent.parent.parent.name]
        assert min(int(f.stem) for f in restarted) > 1500
    finally:
        states.close()
