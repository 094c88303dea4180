"""A cluster whose lake format is Lance, through a real server: log tables enable the lake and get the
cluster's Lance warehouse (``<data.dir>/lake`` by default); a primary-key table cannot enable it, at
creation or later (Fluss refuses to tier a primary-key table into Lance), and stays usable without it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import InvalidTableError
from strom.lake.formats import lake_format
from strom.lake.lance import LanceLakeTable
from tests.server_process import ServerProcess

pytestmark = pytest.mark.asyncio

LANCE = {"datalake.format": "lance"}
LAKE = {"table.datalake.enabled": "true"}


async def test_log_tables_tier_into_lance_and_primary_key_tables_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = ServerProcess(tmp_path / "data", LANCE).start()
    arrow = pa.schema([("id", pa.int64()), ("v", pa.string())])
    try:
        async with await Connection.create(server.address) as connection:
            admin = connection.get_admin()
            log_path = TablePath("fluss", "events")
            await admin.create_table(log_path, TableDescriptor(Schema.from_arrow(arrow), bucket_count=2, properties=LAKE))
            info = (await connection.get_table(log_path)).table_info
            assert info.properties["table.datalake.format"] == "lance"
            warehouse = info.properties["table.datalake.lance.warehouse"]
            assert warehouse == str((tmp_path / "data" / "lake").resolve())
            lake_table = lake_format(info).table(info)
            assert isinstance(lake_table, LanceLakeTable) and lake_table.uri == f"{warehouse}/fluss/events.lance"

            keyed = TablePath("fluss", "users")
            pk_schema = Schema.from_arrow(arrow, primary_key=["id"])
            with pytest.raises(InvalidTableError, match="primary key table to Lance"):
                await admin.create_table(keyed, TableDescriptor(pk_schema, bucket_count=2, properties=LAKE))
            assert not await admin.table_exists(keyed), "a refused creation leaves nothing"
            await admin.create_table(keyed, TableDescriptor(pk_schema, bucket_count=2))
            with pytest.raises(InvalidTableError, match="holds log tables only"):
                await admin.alter_table(keyed, set_properties=LAKE)
            table = await connection.get_table(keyed)
            assert table.table_info.properties.get("table.datalake.enabled") != "true"
            await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [1], "v": ["a"]}))
            lookup = await table.new_lookup().create_lookuper().lookup({"id": 1})
            assert lookup is not None and lookup["v"] == "a", "the table serves without the lake"
    finally:
        server.stop()
