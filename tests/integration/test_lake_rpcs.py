"""The coordinator's lake RPCs on a real server process: lake-enabled tables, the tiering heartbeat,
prepare and commit of lake snapshots with epoch fencing, GetLakeSnapshot (also through the official
pyfluss client), AlterTable, restarts, drops, DescribeLakeTiering and metrics."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import (
    FencedTieringEpochError,
    InvalidAlterTableError,
    InvalidConfigError,
    LakeSnapshotNotExistError,
    LogOffsetOutOfRangeError,
    StromError,
    TableNotExistError,
)
from strom.ids import TableBucket
from strom.records.types import IntType, StringType
from tests.conftest import unique_name
from tests.server_process import free_port

pytestmark = pytest.mark.asyncio

FAST = {"lake.tiering.heartbeat-timeout": "1s", "lake.tiering.heartbeat-check-interval": "100ms",
        "kv.snapshot.interval": "0s"}
LAKE = {"table.datalake.enabled": "true", "table.datalake.freshness": "200ms"}
SCHEMA = Schema.of([("id", IntType()), ("name", StringType())], ["id"])
WAIT_S = 20.0


async def create(connection: Connection, properties: dict[str, str] | None = None, buckets: int = 2) -> TablePath:
    path = TablePath("fluss", unique_name("lake"))
    descriptor = TableDescriptor(SCHEMA, bucket_count=buckets, properties=properties or {})
    await connection.get_admin().create_table(path, descriptor)
    return path


def offsets_file(path: str) -> Any:
    return json.loads(Path(path).read_text())


def exists(path: str) -> bool:
    return Path(path).exists()


def scrape(port: int) -> str:
    return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())


def write_garbage(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not json")
    return path.resolve()


async def take_table(connection: Connection, table_id: int) -> Any:
    """Ask for tables until ``table_id`` is handed out (bounded)."""
    admin = connection.get_admin()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        result = await admin.lake_tiering_heartbeat(request_table=True)
        if result.assignment is not None and result.assignment.table_id == table_id:
            return result.assignment
        await asyncio.sleep(0.05)
    raise AssertionError(f"table {table_id} was never handed out")


async def test_one_round_of_the_protocol(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        info = await admin.get_table_info(path)
        assert info.properties["table.datalake.format"] == "delta"
        assert info.properties["table.datalake.delta.warehouse"] == str((server.data_dir / "lake").resolve())
        with pytest.raises(LakeSnapshotNotExistError):
            await admin.get_lake_snapshot(path)

        assignment = await take_table(connection, info.table_id)
        assert assignment.table_path == path and assignment.tiering_epoch == 1
        heartbeat = await admin.lake_tiering_heartbeat(tiering={info.table_id: 1})
        assert heartbeat.errors == {}
        offsets = {TableBucket(info.table_id, 0): 10, TableBucket(info.table_id, 1): 3}
        file = await admin.prepare_lake_table_snapshot(info.table_id, path, offsets, tiering_epoch=1)
        assert offsets_file(file) == {"version": 1, "table_id": info.table_id, "bucket_offsets": [10, 3]}
        await admin.commit_lake_table_snapshot(info.table_id, 7, file, tiering_epoch=1)
        snapshot = await admin.get_lake_snapshot(path)
        assert (snapshot.snapshot_id, snapshot.bucket_offsets) == (7, offsets)
        assert (await admin.get_lake_snapshot(path, readable=True)).snapshot_id == 7

        from strom.client.lake import FinishedTiering

        done = await admin.lake_tiering_heartbeat(finished=[FinishedTiering(info.table_id, 1, False, 512, 13)])
        assert done.errors == {}
        [status] = await admin.describe_lake_tiering(path)
        assert (status.state, status.tiering_epoch, status.lake_snapshot_id) == ("Scheduled", 1, 7)
        assert (status.file_size, status.record_count, status.bucket_offsets) == (512, 13, offsets)

        # the next round merges its offsets into the previous ones and never moves a bucket back
        second = await take_table(connection, info.table_id)
        assert second.tiering_epoch == 2
        merged = await admin.prepare_lake_table_snapshot(info.table_id, path, {TableBucket(info.table_id, 1): 9}, 2)
        assert offsets_file(merged)["bucket_offsets"] == [10, 9]
        backwards = await admin.prepare_lake_table_snapshot(info.table_id, path, {TableBucket(info.table_id, 0): 4}, 2)
        with pytest.raises(LogOffsetOutOfRangeError, match="only move forward"):
            await admin.commit_lake_table_snapshot(info.table_id, 8, backwards, tiering_epoch=2)
        await admin.commit_lake_table_snapshot(info.table_id, 8, merged, tiering_epoch=2)
        assert not exists(file), "the discarded snapshot's offsets file is deleted"


async def test_official_client_reads_the_lake_snapshot(server_factory: Any) -> None:
    import fluss

    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE, buckets=1)
        info = await admin.get_table_info(path)
        await take_table(connection, info.table_id)
        file = await admin.prepare_lake_table_snapshot(info.table_id, path, {TableBucket(info.table_id, 0): 5}, 1)
        await admin.commit_lake_table_snapshot(info.table_id, 3, file, tiering_epoch=1)
    official = await fluss.FlussConnection.create(fluss.Config({"bootstrap.servers": server.address}))
    try:
        snapshot = await official.get_admin().get_latest_lake_snapshot(fluss.TablePath(*path))
        assert snapshot.snapshot_id == 3
        assert [offset for offset in snapshot.table_buckets_offset.values()] == [5]
    finally:
        await official.close()


async def test_a_job_that_stops_heartbeating_is_fenced(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        info = await admin.get_table_info(path)
        first = await take_table(connection, info.table_id)
        file = await admin.prepare_lake_table_snapshot(info.table_id, path, {TableBucket(info.table_id, 0): 1}, 1)
        second = await take_table(connection, info.table_id)  # after the 1 s heartbeat timeout
        assert second.tiering_epoch == first.tiering_epoch + 1
        stale = await admin.lake_tiering_heartbeat(tiering={info.table_id: first.tiering_epoch})
        assert isinstance(stale.errors[info.table_id], FencedTieringEpochError)
        with pytest.raises(FencedTieringEpochError):
            await admin.prepare_lake_table_snapshot(info.table_id, path, {TableBucket(info.table_id, 0): 1}, 1)
        with pytest.raises(FencedTieringEpochError):
            await admin.commit_lake_table_snapshot(info.table_id, 1, file, tiering_epoch=first.tiering_epoch)
        [status] = await admin.describe_lake_tiering(path)
        assert status.failures == 1


async def test_alter_table_enables_and_disables_the_lake(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection)
        assert await admin.describe_lake_tiering() == []
        await admin.alter_table(path, set_properties={"table.datalake.enabled": "true",
                                                      "table.datalake.freshness": "100ms"})
        info = await admin.get_table_info(path)
        assert info.properties["table.datalake.delta.warehouse"]
        assert await take_table(connection, info.table_id)
        await admin.alter_table(path, reset_properties=["table.datalake.enabled"])
        info = await admin.get_table_info(path)
        assert not any(key.startswith("table.datalake.") for key in info.properties)
        assert await admin.describe_lake_tiering() == []
        with pytest.raises(InvalidConfigError, match=r"table\.datalake\.format"):
            await admin.alter_table(path, set_properties={"table.datalake.enabled": "true",
                                                          "table.datalake.format": "paimon"})
        with pytest.raises(InvalidConfigError, match="freshness"):
            await admin.alter_table(path, set_properties={"table.datalake.freshness": "soon"})
        with pytest.raises(TableNotExistError):
            await admin.alter_table(TablePath("fluss", "missing"), set_properties={"a": "b"})
        await admin.alter_table(TablePath("fluss", "missing"), set_properties={"a": "b"}, ignore_if_not_exists=True)
        with pytest.raises(InvalidConfigError, match="must be true or false"):
            await create(connection, {"table.datalake.enabled": "yes"})


async def test_alter_table_rejects_column_changes(server_factory: Any) -> None:
    from strom.rpc.api_keys import ApiKey
    from strom.rpc.messages import pb

    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        path = await create(connection)
        request = pb.AlterTableRequest(table_path=pb.PbTablePath(database_name=path.database_name,
                                                                 table_name=path.table_name),
                                       ignore_if_not_exists=False)
        request.drop_columns.add(column_name="name")
        with pytest.raises(InvalidAlterTableError, match="not supported"):
            await connection.coordinator_request(ApiKey.ALTER_TABLE, request)


async def test_restart_keeps_lake_snapshots_and_fences_the_round_in_flight(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        info = await admin.get_table_info(path)
        await take_table(connection, info.table_id)
        file = await admin.prepare_lake_table_snapshot(info.table_id, path, {TableBucket(info.table_id, 1): 4}, 1)
        await admin.commit_lake_table_snapshot(info.table_id, 2, file, tiering_epoch=1)
    server.stop()
    restarted = server_factory(FAST, data_dir=server.data_dir, port=server.port)
    async with await Connection.create(restarted.address) as connection:
        admin = connection.get_admin()
        snapshot = await admin.get_lake_snapshot(path)
        assert (snapshot.snapshot_id, snapshot.bucket_offsets) == (2, {TableBucket(info.table_id, 1): 4})
        [status] = await admin.describe_lake_tiering(path)
        assert status.tiering_epoch == 2, "the round in flight at the restart is fenced"
        with pytest.raises(FencedTieringEpochError):
            await admin.commit_lake_table_snapshot(info.table_id, 3, file, tiering_epoch=1)


async def test_drop_forgets_the_lake_state_and_its_offsets_files(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        info = await admin.get_table_info(path)
        await take_table(connection, info.table_id)
        file = await admin.prepare_lake_table_snapshot(info.table_id, path, {TableBucket(info.table_id, 0): 1}, 1)
        await admin.commit_lake_table_snapshot(info.table_id, 1, file, tiering_epoch=1)
        await admin.drop_table(path)
        assert not exists(file)
        assert await admin.describe_lake_tiering() == []
        heartbeat = await admin.lake_tiering_heartbeat(tiering={info.table_id: 1})
        assert isinstance(heartbeat.errors[info.table_id], TableNotExistError)


async def test_bad_commits_get_clear_errors_and_the_server_survives(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        info = await admin.get_table_info(path)
        await take_table(connection, info.table_id)
        outside = tmp_path / "elsewhere.offsets"
        with pytest.raises(StromError, match="not under the remote data dir"):
            await admin.commit_lake_table_snapshot(info.table_id, 1, str(outside), tiering_epoch=1)
        remote = str((server.data_dir / "remote").resolve())
        with pytest.raises(StromError, match="cannot read"):
            await admin.commit_lake_table_snapshot(info.table_id, 1, f"{remote}/lake/missing.offsets")
        garbage = write_garbage(server.data_dir / "remote" / "lake" / "garbage.offsets")
        with pytest.raises(StromError, match="not a lake offsets file"):
            await admin.commit_lake_table_snapshot(info.table_id, 1, str(garbage))
        with pytest.raises(TableNotExistError):
            await admin.commit_lake_table_snapshot(987654, 1, str(garbage))
        other = await create(connection, LAKE)
        other_info = await admin.get_table_info(other)
        await take_table(connection, other_info.table_id)
        foreign = await admin.prepare_lake_table_snapshot(other_info.table_id, other, {TableBucket(other_info.table_id, 0): 1}, 1)
        with pytest.raises(StromError, match="belongs to table"):
            await admin.commit_lake_table_snapshot(info.table_id, 1, foreign)
        assert await admin.list_databases()  # still serving


async def test_metrics_report_tiering_states_and_lag(server_factory: Any) -> None:
    port = free_port()
    server = server_factory({**FAST, "metrics.reporter.prometheus.port": str(port)})
    async with await Connection.create(server.address) as connection:
        path = await create(connection, LAKE)
        info = await connection.get_admin().get_table_info(path)
        await take_table(connection, info.table_id)
    body = await asyncio.to_thread(scrape, port)
    assert 'strom_lake_tiering_tables{state="Tiering"} 1.0' in body
    assert f'strom_lake_tiering_lag_seconds{{table="{path}"}}' in body
