"""A real ``strom server`` keeping its metadata in a real ZooKeeper (``zookeeper.address``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from kazoo.client import KazooClient

from strom.client import Connection, Schema, TableDescriptor, TablePath
from tests.server_process import ServerProcess


@pytest.mark.asyncio
async def test_a_table_created_on_a_server_backed_by_zookeeper_survives_a_restart(
    server_factory: Callable[..., ServerProcess], zookeeper_location: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    config = {"zookeeper.address": zookeeper_location}
    first = server_factory(config, data_dir=data_dir)
    path = TablePath("fluss", "on_zookeeper")
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("name", pa.string())]), primary_key=["id"])
    async with await Connection.create(first.address) as connection:
        admin = connection.get_admin()
        await admin.create_table(path, TableDescriptor(schema, bucket_count=2))
        table_id = (await admin.get_table_info(path)).table_id
        table = await connection.get_table(path)
        await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [1, 2], "name": ["a", "b"]}))
    assert first.stop() == 0
    assert not any(data_dir.glob("*.sqlite*")), "the metadata went to ZooKeeper, not to a SQLite file"

    client = KazooClient(hosts=zookeeper_location, timeout=10)
    client.start(timeout=10)
    try:
        assert client.exists("/metadata/databases/fluss/tables/on_zookeeper") is not None
        assert client.exists(f"/tabletservers/tables/{table_id}") is not None
    finally:
        client.stop()
        client.close()

    second = server_factory(config, data_dir=data_dir, port=first.port)
    async with await Connection.create(second.address) as connection:
        admin = connection.get_admin()
        assert "on_zookeeper" in await admin.list_tables("fluss")
        assert (await admin.get_table_info(path)).table_id == table_id
        table = await connection.get_table(path)
        rows = await (await table.new_scan().create_batch_scanner()).to_arrow()
        assert sorted(rows.column("id").to_pylist()) == [1, 2]


@pytest.mark.asyncio
async def test_zookeeper_path_root_places_the_tree_when_the_address_names_no_root(
    server_factory: Callable[..., ServerProcess], zookeeper_server: object, tmp_path: Path
) -> None:
    """Fluss's ``zookeeper.path.root``: the tree goes under it when ``zookeeper.address`` is a bare
    ``host:port`` (a root in the address wins, as before)."""
    import uuid

    hosts = zookeeper_server.address  # type: ignore[attr-defined]
    root = f"/strom-root-{uuid.uuid4().hex[:12]}"
    server = server_factory({"zookeeper.address": hosts, "zookeeper.path.root": root}, data_dir=tmp_path / "data")
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_database("rooted")
    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=10)
    try:
        assert client.exists(f"{root}/metadata/databases/rooted") is not None
        assert client.exists("/fluss/metadata/databases/rooted") is None, "not under Fluss's default root"
    finally:
        client.stop()
        client.close()
