"""DescribeClusterConfigs (1045) and AlterClusterConfigs (1046) on a real server: a setting changed at run
time takes effect without a restart and survives one; what cannot change is refused whole."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest
from click.testing import CliRunner

from strom.cli.main import main as strom_cli
from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import InvalidConfigError

T = TypeVar("T")
SNAPSHOT_WAIT_S = 20.0
"""An interval set at run time is noticed within 5 s (the scheduler's idle tick), then snapshots start."""
INITIAL = {"kv.snapshot.interval": "0s", "datalake.iceberg.client.secret": "hunter2"}


def run(address: str, action: Callable[[Connection], Awaitable[T]]) -> T:
    async def main() -> T:
        async with await Connection.create(address) as connection:
            return await action(connection)

    return asyncio.run(main())


def _configs(address: str) -> dict[str, tuple[str | None, str]]:
    async def ask(connection: Connection) -> Any:
        return await connection.get_admin().describe_cluster_configs()

    return {entry.key: (entry.value, entry.source) for entry in run(address, ask)}


def _write_and_count_snapshots(address: str, path: TablePath, first: int) -> int:
    async def act(connection: Connection) -> int:
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        writer.upsert_arrow_batch(pa.record_batch({"id": list(range(first, first + 10))}, schema=pa.schema([("id", pa.int64())])))
        await writer.flush()
        return len(await connection.get_admin().list_kv_snapshots(table.layout.info.table_id))

    return run(address, act)


def _wait_for_snapshots(address: str, path: TablePath, more_than: int) -> int:
    async def count(connection: Connection) -> int:
        table_id = (await connection.get_table(path)).layout.info.table_id
        return len(await connection.get_admin().list_kv_snapshots(table_id))

    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while (found := run(address, count)) <= more_than and time.monotonic() < deadline:
        time.sleep(0.3)
    return found


def test_a_snapshot_interval_set_at_run_time_applies_at_once_and_after_a_restart(server_factory: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = server_factory(INITIAL, data_dir)
    path = TablePath("fluss", "configured")

    async def create(connection: Connection) -> None:
        schema = Schema.from_arrow(pa.schema([("id", pa.int64())]), primary_key=["id"])
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))

    run(server.address, create)
    assert _write_and_count_snapshots(server.address, path, 0) == 0, "snapshots are off at start"
    described = _configs(server.address)
    assert described["kv.snapshot.interval"] == ("0s", "INITIAL_SERVER_CONFIG")
    assert described["datalake.iceberg.client.secret"] == (None, "INITIAL_SERVER_CONFIG"), "a secret is left out"

    shown = CliRunner().invoke(strom_cli, ["config", "alter", "--set", "kv.snapshot.interval=1s", "-b", server.address])
    assert shown.exit_code == 0, shown.output
    assert _configs(server.address)["kv.snapshot.interval"] == ("1s", "DYNAMIC_SERVER_CONFIG")
    assert _wait_for_snapshots(server.address, path, 0) >= 1, "no snapshot after the interval was set at run time"

    assert server.stop() == 0
    server = server_factory(INITIAL, data_dir)
    shown = CliRunner().invoke(strom_cli, ["config", "describe", "-b", server.address, "--json"])
    assert {"key": "kv.snapshot.interval", "value": "1s", "source": "DYNAMIC_SERVER_CONFIG"} in json.loads(shown.output)
    before = _write_and_count_snapshots(server.address, path, 100)
    assert _wait_for_snapshots(server.address, path, before) > before, "the stored interval applies after a restart"

    async def reset(connection: Connection) -> None:
        await connection.get_admin().alter_cluster_configs(reset_configs=["kv.snapshot.interval"])

    run(server.address, reset)
    assert _configs(server.address)["kv.snapshot.interval"] == ("0s", "INITIAL_SERVER_CONFIG")


def test_changes_that_cannot_apply_are_refused_whole(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory(INITIAL, tmp_path / "data")
    before = _configs(server.address)
    refused = [
        ({"log.segment.file-size": "1mb"}, "not allowed to be changed dynamically"),
        ({"kv.snapshot.interval": "soon"}, "Invalid value for config 'kv.snapshot.interval'"),
        ({"coordinator.producer-offsets.ttl": "1 h", "no.such.key": "1"}, "no.such.key is not allowed"),
    ]
    for changes, message in refused:
        async def alter(connection: Connection, changes: dict[str, str] = changes) -> None:
            await connection.get_admin().alter_cluster_configs(changes)

        with pytest.raises(InvalidConfigError, match=message):
            run(server.address, alter)
        assert _configs(server.address) == before, f"{changes} changed something"
    shown = CliRunner().invoke(strom_cli, ["config", "alter", "--set", "log.segment.file-size=1mb", "-b", server.address])
    assert shown.exit_code == 1 and "not allowed to be changed dynamically" in shown.output
