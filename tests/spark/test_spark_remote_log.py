"""Spark reads a log whose older part lives in remote storage: a batch read (one task, and split into many
whose ranges lie in remote segments) and a streaming read from the earliest offset return every row once.
The tasks read the remote segments straight from remote storage; FetchLog only names them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strom.client import Connection, TablePath
from strom.records.types import BigIntType, StringType
from tests.integration.test_remote_log import REMOTE_CONFIG, append, create_log_table, offloaded, wait_until
from tests.server_process import ServerProcess
from tests.spark.support import Fluss, run_available_now
from tests.spark.tiering_support import create_lake_table, lake_rows, tier_once, tiering_config

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(240)]

ROWS = 3000


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("spark-remote-log")
    server = ServerProcess(base / "data", {**REMOTE_CONFIG, "remote.data.dir": str(base / "remote")}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tiered_table(remote_server: ServerProcess) -> str:
    path, table_id = asyncio.run(create_log_table(remote_server.address))
    asyncio.run(append(remote_server.address, path, 0, ROWS))
    wait_until(lambda: offloaded(remote_server, path, table_id), "segments copied and cut locally")
    return str(path)


def test_a_batch_read_returns_remote_and_local_rows_with_one_task_or_many(
    spark: Any, remote_server: ServerProcess, tiered_table: str
) -> None:
    options = Fluss(remote_server.address).options(tiered_table)
    whole = spark.read.format("fluss").options(**options).load()
    assert sorted(row["seq"] for row in whole.select("seq").collect()) == list(range(ROWS))
    split = spark.read.format("fluss").options(**options, **{"scan.maxRecordsPerPartition": "400"}).load()
    assert split.rdd.getNumPartitions() >= 7
    rows = split.collect()
    assert sorted(row["seq"] for row in rows) == list(range(ROWS))
    assert {row["pad"] for row in rows if row["seq"] == 17} == {"row-00000017"}


def test_a_streaming_read_from_the_earliest_offset_returns_every_row_once(
    spark: Any, remote_server: ServerProcess, tiered_table: str, tmp_path: Path
) -> None:
    seen: list[int] = []

    def collect(frame: Any, _batch_id: int) -> None:
        seen.extend(row["seq"] for row in frame.select("seq").collect())

    reader = spark.readStream.format("fluss")
    options = Fluss(remote_server.address).options(tiered_table, **{"scan.startup.mode": "earliest",
                                                                   "scan.max-rows-per-trigger": "1000"})
    for key, value in options.items():
        reader = reader.option(key, value)
    run_available_now(reader.load().writeStream.foreachBatch(collect), tmp_path / "checkpoint")
    assert sorted(seen) == list(range(ROWS)) and len(seen) == ROWS


def test_the_tiering_service_tiers_a_log_whose_start_is_only_in_remote_storage(spark: Any, server_factory: Any,
                                                                              tmp_path: Path) -> None:
    """The tiering job's log splits read the remote segments like any reader: the lake copy holds every row."""
    config = {**tiering_config("delta"), **REMOTE_CONFIG, "remote.data.dir": str(tmp_path / "remote")}
    server = server_factory(config)
    cluster = Fluss(server.address)
    table = create_lake_table(cluster, [("seq", BigIntType()), ("pad", StringType())], bucket_count=1,
                              properties={"table.log.tiered.local-segments": "2"})
    path = TablePath.parse(table)
    asyncio.run(append(server.address, path, 0, ROWS))
    table_id = asyncio.run(table_id_of(server.address, path))
    wait_until(lambda: offloaded(server, path, table_id), "segments copied and cut locally")
    tier_once(spark, cluster)
    assert [row[0] for row in lake_rows(cluster, table, ["seq"])] == list(range(ROWS))


async def table_id_of(address: str, path: TablePath) -> int:
    async with await Connection.create(address) as connection:
        return (await connection.get_table(path)).layout.info.table_id
