"""What a client was told is written survives a restart of the server, clean (SIGTERM) or not (SIGKILL):
the catalog (databases, tables, partitions) together with the rows, changelogs and log offsets in it, and
writes keep working afterwards. (test_durability.py covers in-flight writes across crashes.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from tests.integration.pyfluss_support import change_types, changelog, lookup_many, poll_records
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(90)

KV_FIELDS = [pa.field("id", pa.int32()), pa.field("name", pa.string())]
LOG_FIELDS = [pa.field("id", pa.int32()), pa.field("region", pa.string())]


async def connect(server: ServerProcess) -> Any:
    return await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": server.address}))


async def write_everything(connection: Any) -> None:
    admin = connection.get_admin()
    await admin.create_database("shop", pyfluss.DatabaseDescriptor(comment="kept"))
    kv_path = pyfluss.TablePath("shop", "users")
    await admin.create_table(
        kv_path, pyfluss.TableDescriptor(pyfluss.Schema(pa.schema(KV_FIELDS), primary_keys=["id"]), bucket_count=2)
    )
    log_path = pyfluss.TablePath("shop", "events")
    await admin.create_table(
        log_path,
        pyfluss.TableDescriptor(pyfluss.Schema(pa.schema(LOG_FIELDS)), partition_keys=["region"], bucket_count=1),
    )
    await admin.create_partition(log_path, {"region": "EU"})

    users = (await connection.get_table(kv_path)).new_upsert().create_writer()
    for key in range(20):
        users.upsert({"id": key, "name": f"user {key}"})
    await users.flush()
    await users.upsert({"id": 0, "name": "renamed"}).wait()
    await users.delete({"id": 1}).wait()

    events = (await connection.get_table(log_path)).new_append().create_writer()
    for key in range(5):
        events.append({"id": key, "region": "EU"})
    await events.flush()


async def check_everything(connection: Any) -> None:
    admin = connection.get_admin()
    assert (await admin.get_database_info("shop")).get_database_descriptor().comment == "kept"
    assert sorted(await admin.list_tables("shop")) == ["events", "users"]
    kv_path, log_path = pyfluss.TablePath("shop", "users"), pyfluss.TablePath("shop", "events")
    assert [p.partition_name for p in await admin.list_partition_infos(log_path)] == ["EU"]

    users = await connection.get_table(kv_path)
    expected = [{"id": key, "name": f"user {key}"} for key in range(20)]
    expected[0], expected[1] = {"id": 0, "name": "renamed"}, None
    assert await lookup_many(users, [{"id": key} for key in range(20)]) == expected
    latest = await admin.list_offsets(kv_path, [0, 1], pyfluss.OffsetSpec.latest())
    assert sum(latest.values()) == 20 + 2 + 1  # 20 inserts, one -U/+U pair, one delete
    records = await changelog(users, 23, buckets=2)
    assert sorted(change_types(records)) == sorted(["+I"] * 20 + ["-U", "+U", "-D"])

    assert await admin.list_partition_offsets(log_path, "EU", [0], pyfluss.OffsetSpec.latest()) == {0: 5}
    events = await connection.get_table(log_path)
    scanner = await events.new_scan().create_log_scanner()
    partition_id = (await admin.list_partition_infos(log_path))[0].partition_id
    scanner.subscribe_partition(partition_id, 0, pyfluss.EARLIEST_OFFSET)
    assert [r.row["id"] for r in await poll_records(scanner, 5)] == [0, 1, 2, 3, 4]


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_acknowledged_writes_survive_a_restart(
    how: str, server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_factory(data_dir=data_dir)
    connection = await connect(first)
    try:
        await write_everything(connection)
        await check_everything(connection)
    finally:
        await connection.close()
    if how == "stop":
        assert first.stop() == 0
    else:
        first.kill()

    second = server_factory(data_dir=data_dir, port=first.port)
    connection = await connect(second)
    try:
        await check_everything(connection)
        # Writing goes on from where the log ended, with fresh writer ids.
        users = await connection.get_table(pyfluss.TablePath("shop", "users"))
        writer = users.new_upsert().create_writer()
        await writer.upsert({"id": 1, "name": "back"}).wait()
        assert await users.new_lookup().create_lookuper().lookup({"id": 1}) == {"id": 1, "name": "back"}
        records = await changelog(users, 24, buckets=2)
        assert change_types(records).count("+I") == 21
    finally:
        await connection.close()

