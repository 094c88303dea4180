"""Auto-partitioning on a manual clock: a StromServer in this process whose clock the test moves day by day,
written to by the official client (pyfluss) and checked with strom's client."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fluss
import pyarrow as pa
import pytest

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.clock import ManualClock
from strom.config import Configuration
from strom.errors import PartitionSpecInvalidError
from strom.server.node import StromServer

pytestmark = pytest.mark.asyncio

DAY_MS = 24 * 3600 * 1000
START = datetime(2025, 5, 8, 10, 0, tzinfo=UTC)
FIELDS = [pa.field("id", pa.int64()), pa.field("day", pa.string()), pa.field("pad", pa.string())]
AUTO_DAY = {
    "table.auto-partition.enabled": "true",
    "table.auto-partition.time-unit": "DAY",
    "table.auto-partition.num-precreate": "2",
    "table.auto-partition.num-retention": "3",
    "table.auto-partition.time-zone": "UTC",
}


def day(offset: int) -> str:
    return (START + timedelta(days=offset)).strftime("%Y%m%d")


async def _server(tmp_path: Path, clock: ManualClock) -> StromServer:
    config = {
        "kv.snapshot.interval": "0s",
        "auto-partition.check.interval": "1h",  # the test runs the checks after moving the clock
        "remote.data.dir": str(tmp_path / "remote"),
        "log.segment.file-size": "4kb",
        "remote.log.task-interval-duration": "1h",
    }
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration(config), clock=clock)
    await server.start()
    return server


async def _partitions(server: StromServer, path: TablePath) -> set[str]:
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        return {info.partition_name for info in await connection.get_admin().list_partition_infos(path)}


def _remote_files(tmp_path: Path) -> list[str]:
    return sorted(str(p) for p in (tmp_path / "remote").rglob("*") if p.is_file() and "/log/" in str(p))


async def test_a_day_partitioned_table_over_ten_days(tmp_path: Path) -> None:
    """num-precreate 2 and num-retention 3 across 10 days: each day exactly today and tomorrow are created
    and the partitions of more than 3 days ago are gone — their local log and their remote segments too.
    pyfluss writes into the day's partition without creating it."""
    clock = ManualClock(int(START.timestamp() * 1000))
    server = await _server(tmp_path, clock)
    try:
        address = f"127.0.0.1:{server.port}"
        config = fluss.Config({"bootstrap.servers": address})
        async with await fluss.FlussConnection.create(config) as official:
            path = fluss.TablePath("fluss", "events")
            schema = fluss.Schema(pa.schema(FIELDS))
            descriptor = fluss.TableDescriptor(schema, partition_keys=["day"], bucket_count=1, properties=AUTO_DAY)
            await official.get_admin().create_table(path, descriptor)
        strom_path = TablePath("fluss", "events")
        assert await _partitions(server, strom_path) == {day(0), day(1)}, "created with the table"

        manager, remote_logs = server.role.auto_partitions, server.tablets.remote_logs  # type: ignore[union-attr]
        assert manager is not None and remote_logs is not None
        local_dirs: dict[str, list[Path]] = {}
        for today in range(10):
            if today:
                clock.advance(ms=DAY_MS)
                await manager.check()
            expected = {day(d) for d in range(max(0, today - 3), today + 2)}
            assert await _partitions(server, strom_path) == expected, f"day {today}"
            async with await fluss.FlussConnection.create(config) as official:
                table = await official.get_table(path)
                writer = table.new_append().create_writer()
                for row in range(60):  # 3 batches of ~3 kB: 4 kB segments roll, and one goes to remote storage
                    writer.append({"id": today * 1000 + row, "day": day(today), "pad": os.urandom(50).hex()})
                    if row % 20 == 19:
                        await writer.flush()
            await remote_logs.run_once()
            table_id = server.coordinator.table_info(strom_path).table_id  # type: ignore[union-attr]
            by_id = {p.partition_id: p.name for p in server.coordinator.list_partitions(  # type: ignore[union-attr]
                server.coordinator.table_info(strom_path))}  # type: ignore[union-attr]
            for replica in server.replicas.hosted(table_id):  # type: ignore[union-attr]
                local_dirs.setdefault(by_id[replica.bucket.partition_id], []).append(replica.log.directory)
            gone = [day(d) for d in range(0, today - 3)]
            for name in gone:
                assert not any(directory.exists() for directory in local_dirs[name]), f"{name}'s local log remains"
            remote = _remote_files(tmp_path)
            assert not [f for f in remote if any(f"/{name}" in f for name in gone)], "an expired partition's remote files remain"
            assert any(f"/{day(today)}" in f for f in remote), "today's partition has a segment in remote storage"

        async with await Connection.create(address) as connection:
            admin = connection.get_admin()
            table_id = (await connection.get_table(strom_path)).layout.info.table_id
            ends = {}
            for info in await admin.list_partition_infos(strom_path):
                latest = await admin.list_bucket_offsets(table_id, info.partition_id, [0], OffsetSpec.latest())
                ends[info.partition_name] = latest[0]
        assert ends == {day(6): 60, day(7): 60, day(8): 60, day(9): 60, day(10): 0}, "every write in its day"
    finally:
        await server.stop()


async def test_hand_made_partitions_of_an_auto_partitioned_table_are_checked(tmp_path: Path) -> None:
    clock = ManualClock(int(START.timestamp() * 1000))
    server = await _server(tmp_path, clock)
    try:
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            admin = connection.get_admin()
            path = TablePath("fluss", "by_hour")
            schema = Schema.from_arrow(pa.schema(FIELDS))
            properties = {**AUTO_DAY, "table.auto-partition.time-unit": "HOUR", "table.auto-partition.num-precreate": "3"}
            await admin.create_table(path, TableDescriptor(schema, partition_keys=["day"], bucket_count=1,
                                                           properties=properties))
            assert await _partitions(server, path) == {"2025050810", "2025050811", "2025050812"}
            with pytest.raises(PartitionSpecInvalidError, match="out-of-date"):
                await admin.create_partition(path, {"day": "2025050806"})
            with pytest.raises(PartitionSpecInvalidError, match="expected format 'yyyyMMddHH'"):
                await admin.create_partition(path, {"day": "20250508"})
            await admin.create_partition(path, {"day": "2025050807"})  # within the 3 retained hours
            await admin.alter_table(path, set_properties={"table.auto-partition.num-retention": "1"})
            assert await _partitions(server, path) == {"2025050810", "2025050811", "2025050812"}, \
                "AlterTable applies the new retention at once: hour 07 is more than 1 hour back"
            await admin.alter_table(path, set_properties={"table.auto-partition.enabled": "false"})
            clock.advance(ms=DAY_MS)
            await server.role.auto_partitions.check()  # type: ignore[union-attr]
            assert len(await _partitions(server, path)) == 3, "a disabled table is left alone"
            info = await admin.get_table_info(path)
            assert info.properties["table.auto-partition.enabled"] == "false"
    finally:
        await server.stop()


async def test_the_partitions_come_back_after_a_restart_missed_some_days(tmp_path: Path) -> None:
    """A server down for days catches up at its first check: expired partitions dropped, new ones created."""
    clock = ManualClock(int(START.timestamp() * 1000))
    server = await _server(tmp_path, clock)
    path = TablePath("fluss", "restarted")
    try:
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            schema = Schema.from_arrow(pa.schema(FIELDS))
            await connection.get_admin().create_table(
                path, TableDescriptor(schema, partition_keys=["day"], bucket_count=1, properties=AUTO_DAY))
    finally:
        await server.stop()
    clock.advance(ms=5 * DAY_MS)
    server = await _server(tmp_path, clock)
    try:
        assert await _partitions(server, path) == {day(5), day(6)}
    finally:
        await server.stop()


async def test_a_time_format_names_the_partitions_pyfluss_writes_into(tmp_path: Path) -> None:
    """``table.auto-partition.time-format = yyyy-MM-dd``: the partitions are named in that pattern, expire
    by it, pyfluss writes into today's, and a hand-made one must fit it."""
    clock = ManualClock(int(START.timestamp() * 1000))
    server = await _server(tmp_path, clock)
    try:
        address = f"127.0.0.1:{server.port}"
        dashed = {**AUTO_DAY, "table.auto-partition.time-format": "yyyy-MM-dd"}
        config = fluss.Config({"bootstrap.servers": address})
        async with await fluss.FlussConnection.create(config) as official:
            descriptor = fluss.TableDescriptor(fluss.Schema(pa.schema(FIELDS)), partition_keys=["day"], bucket_count=1,
                                               properties=dashed)
            await official.get_admin().create_table(fluss.TablePath("fluss", "dashed"), descriptor)
            table = await official.get_table(fluss.TablePath("fluss", "dashed"))
            writer = table.new_append().create_writer()
            writer.append({"id": 1, "day": "2025-05-08", "pad": "x"})
            await writer.flush()
        path = TablePath("fluss", "dashed")
        assert await _partitions(server, path) == {"2025-05-08", "2025-05-09"}
        async with await Connection.create(address) as connection:
            admin = connection.get_admin()
            with pytest.raises(PartitionSpecInvalidError, match="expected format 'yyyy-MM-dd'"):
                await admin.create_partition(path, {"day": "20250510"})
            await admin.create_partition(path, {"day": "2025-05-06"})
        clock.advance(ms=2 * DAY_MS)
        await server.role.auto_partitions.check()  # type: ignore[union-attr]
        assert await _partitions(server, path) == {"2025-05-08", "2025-05-09", "2025-05-10", "2025-05-11"}, (
            "2025-05-06 is more than 3 days back: retention compares the dashed values")
    finally:
        await server.stop()
