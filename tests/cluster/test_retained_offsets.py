"""NotifyLakeTableOffset between real processes: a lake-enabled log table of a cluster (replication factor 2)
keeps its log past ``table.log.ttl`` on both replicas until the coordinator, after a lake commit, tells
them how far the lake reaches; then both delete what the lake holds, and nothing after it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, TablePath
from strom.records.schema import Schema, TableDescriptor
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import _cluster
from tests.conftest import unique_name
from tests.integration.test_lake_rpcs import commit_round

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

FIELDS = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
LAKE_END = 100
WAIT_S = 30.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path / "cluster", 2, {
        "kv.snapshot.interval": "0s", "log.segment.file-size": "1kb", "log.retention.check-interval": "100ms",
        "remote.log.task-interval-duration": "0s", "lake.tiering.heartbeat-timeout": "30s",
    })


def _first_segments(local: LocalCluster, table_id: int) -> list[int]:
    """Each tablet server's first local segment base offset of the table's bucket 0."""
    firsts = []
    for log_dir in sorted(local.data_dir.glob(f"tablet-server-*/tablets/fluss/*-{table_id}/0/log")):
        segments = sorted(int(f.stem) for f in log_dir.glob("*.log"))
        firsts.append(segments[0])
    return firsts


def test_both_replicas_keep_a_lake_tables_log_until_the_lake_holds_it(pair: LocalCluster) -> None:
    local = pair

    async def write() -> tuple[TablePath, int]:
        async with await Connection.create(local.bootstrap) as connection:
            path = TablePath("fluss", unique_name("tiered"))
            await connection.get_admin().create_table(path, TableDescriptor(Schema.from_arrow(FIELDS), bucket_count=1, properties={
                "table.replication.factor": "2", "table.datalake.enabled": "true",
                "table.datalake.freshness": "0s", "table.log.ttl": "1ms"}))
            table = await connection.get_table(path)
            writer = table.new_append().create_writer()
            for batch in range(12):
                ids = list(range(batch * 20, batch * 20 + 20))
                await writer.write_arrow_batch(pa.table({"id": ids, "v": ["x" * 40] * 20}))
            return path, table.layout.info.table_id

    path, table_id = asyncio.run(write())
    deadline = time.monotonic() + WAIT_S
    while len(_first_segments(local, table_id)) < 2:  # the follower has fetched
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)  # retention ran about ten times on each server
    assert _first_segments(local, table_id) == [0, 0]

    async def tier() -> None:
        async with await Connection.create(local.bootstrap) as connection:
            await commit_round(connection, path, table_id, 1, {0: LAKE_END})

    asyncio.run(tier())
    deadline = time.monotonic() + WAIT_S
    while not all(first > 0 for first in _first_segments(local, table_id)):
        assert time.monotonic() < deadline, f"retention did not follow the lake: {_first_segments(local, table_id)}"
        time.sleep(0.1)
    assert all(0 < first <= LAKE_END for first in _first_segments(local, table_id))
