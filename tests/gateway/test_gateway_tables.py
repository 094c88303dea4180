"""The gateway's catalog changes (ALTER TABLE and DATABASE, schemas, one partition) and its table cache: a
table's handle, lookuper and idle writers are kept between requests, and what the gateway changes (or finds
changed elsewhere) is never written through a stale handle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import fluss as pyfluss
import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from strom.client import Column, Connection, Table, TablePath
from strom.client.writer import UpsertWriter
from strom.gateway.app import create_app
from strom.records.types import StringType
from tests.conftest import unique_name
from tests.gateway.support import served
from tests.gateway.test_gateway import DATABASE, assert_error, create_pk_table
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]


@pytest_asyncio.fixture
async def app(server: ServerProcess) -> AsyncIterator[FastAPI]:
    made = create_app(server.address, {"gateway.table-cache.ttl": "1h"})  # only invalidation refreshes a handle
    async with made.router.lifespan_context(made):
        yield made


@pytest_asyncio.fixture
async def gateway(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client


def table_url(name: str) -> str:
    return f"/v1/databases/{DATABASE}/tables/{name}"


async def upsert(gateway: httpx.AsyncClient, name: str, *rows: dict[str, Any]) -> httpx.Response:
    return await gateway.post(f"{table_url(name)}/rows:upsert", json={"rows": list(rows)})


async def lookup(gateway: httpx.AsyncClient, name: str, *ids: int) -> list[Any]:
    response = await gateway.post(f"{table_url(name)}/lookup", json={"keys": [[i] for i in ids]})
    assert response.status_code == 200, response.text
    return list(response.json()["rows"])


# ---- ALTER ----

async def test_alter_table_sets_options_and_adds_columns(
    gateway: httpx.AsyncClient, server: ServerProcess, fluss: Any
) -> None:
    name = unique_name("gwalter")
    created = await create_pk_table(gateway, name, properties={"table.log.ttl": "2h"},
                                    custom_properties={"owner": "ops"})
    body = {"set": {"table.log.ttl": "3h", "team": "data"}, "reset": ["owner"],
            "add_columns": [{"name": "extra", "type": "STRING", "comment": "added"}]}
    altered = await gateway.patch(table_url(name), json=body)
    assert altered.status_code == 200, altered.text
    info = altered.json()
    assert info["table_id"] == created["table_id"] and info["schema_id"] == created["schema_id"] + 1
    assert info["columns"][-1] == {"name": "extra", "type": "STRING", "data_type": {"type": "STRING"},
                                   "comment": "added"}
    assert info["properties"]["table.log.ttl"] == "3h"
    assert info["custom_properties"] == {"team": "data"}
    assert (await gateway.get(table_url(name))).json() == info
    async with await Connection.create(server.address) as connection:
        found = await connection.get_admin().get_table_info(TablePath(DATABASE, name))
        assert found.schema.column_names[-1] == "extra" and found.properties["table.log.ttl"] == "3h"
    # the new column is written through the gateway and read back by pyfluss
    assert (await upsert(gateway, name, {"id": 7, "extra": "x"})).status_code == 200
    table = await fluss.get_table(pyfluss.TablePath(DATABASE, name))
    assert (await table.new_lookup().create_lookuper().lookup({"id": 7}))["extra"] == "x"

    assert_error(await gateway.patch(table_url(name), json={}), 400, "invalid_argument")
    not_null = {"add_columns": [{"name": "strict", "type": "INT NOT NULL"}]}
    assert_error(await gateway.patch(table_url(name), json=not_null), 400, "invalid_argument")
    fixed = {"set": {"table.log.format": "INDEXED"}}  # fixed at creation
    assert_error(await gateway.patch(table_url(name), json=fixed), 400, "invalid_argument")
    assert (await gateway.get(table_url(name))).json()["schema_id"] == info["schema_id"]  # nothing changed
    assert_error(await gateway.patch(table_url(name), json={"sett": {}}), 400, "invalid_argument")
    assert_error(await gateway.patch(table_url("nope"), json={"set": {"a": "b"}}), 404, "table_not_found")
    ignored = await gateway.patch(table_url("nope"), json={"set": {"a": "b"}, "ignore_if_not_exists": True})
    assert ignored.status_code == 204, ignored.text


async def test_alter_database(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwaltdb")
    created = await gateway.post("/v1/databases", json={"name": name, "comment": "c", "properties": {"a": "1", "b": "2"}})
    assert created.status_code == 201, created.text
    altered = await gateway.patch(f"/v1/databases/{name}", json={"set": {"a": "9"}, "reset": ["b"], "comment": "d"})
    assert altered.status_code == 200, altered.text
    assert altered.json()["properties"] == {"a": "9"} and altered.json()["comment"] == "d"
    assert (await gateway.get(f"/v1/databases/{name}")).json() == altered.json()
    assert_error(await gateway.patch(f"/v1/databases/{name}", json={}), 400, "invalid_argument")
    assert_error(await gateway.patch("/v1/databases/nope_db", json={"comment": "x"}), 404, "database_not_found")
    ignored = await gateway.patch("/v1/databases/nope_db", json={"comment": "x", "ignore_if_not_exists": True})
    assert ignored.status_code == 204
    assert (await gateway.delete(f"/v1/databases/{name}?cascade=true")).status_code == 204


# ---- schemas and partitions ----

async def test_schemas_current_and_by_id(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwschema")
    await create_pk_table(gateway, name)
    first = await gateway.get(f"{table_url(name)}/schema")
    assert first.status_code == 200, first.text
    assert first.json()["schema_id"] == 1 and first.json()["primary_key"] == ["id"]
    assert [(c["name"], c["type"]) for c in first.json()["columns"]][:2] == [("id", "BIGINT NOT NULL"), ("v", "STRING")]
    assert first.json()["columns"][2]["data_type"] == {"type": "DECIMAL", "precision": 10, "scale": 2}
    added = {"add_columns": [{"name": "note", "type": "ARRAY<STRING>"}]}
    assert (await gateway.patch(table_url(name), json=added)).status_code == 200
    current = (await gateway.get(f"{table_url(name)}/schema")).json()
    assert current["schema_id"] == 2 and current["columns"][-1]["type"] == "ARRAY<STRING>"
    assert (await gateway.get(f"{table_url(name)}/schemas/2")).json() == current
    assert (await gateway.get(f"{table_url(name)}/schemas/1")).json() == first.json()
    assert_error(await gateway.get(f"{table_url(name)}/schemas/99"), 404, "schema_not_found")
    assert_error(await gateway.get(f"{table_url(name)}/schemas/one"), 400, "invalid_argument")
    assert_error(await gateway.get(f"{table_url('nope')}/schema"), 404, "table_not_found")


async def test_one_partition(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwpart")
    body = {"name": name, "columns": [{"name": "id", "type": "INT"}, {"name": "region", "type": "STRING"},
                                      {"name": "day", "type": "STRING"}],
            "primary_key": ["id", "region", "day"], "partition_keys": ["region", "day"]}
    assert (await gateway.post(f"/v1/databases/{DATABASE}/tables", json=body)).status_code == 201
    partitions = f"{table_url(name)}/partitions"
    for day in ("d1", "d2"):
        assert (await gateway.post(partitions, json={"spec": {"region": "eu", "day": day}})).status_code == 201
    one = await gateway.get(f"{partitions}/eu$d2")
    assert one.status_code == 200, one.text
    listed = {p["name"]: p for p in (await gateway.get(partitions)).json()["partitions"]}
    assert one.json() == listed["eu$d2"] and one.json()["spec"] == {"region": "eu", "day": "d2"}
    assert_error(await gateway.get(f"{partitions}/eu$d9"), 404, "partition_not_found")
    assert_error(await gateway.get(f"{partitions}/eu"), 400, "invalid_argument")
    await create_pk_table(gateway, plain := unique_name("gwplain"))
    assert_error(await gateway.get(f"{table_url(plain)}/partitions/x"), 400, "invalid_argument")


# ---- the table cache ----

async def test_handles_and_writers_are_kept_and_never_shared_at_once(
    gateway: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique_name("gwcache")
    await create_pk_table(gateway, name)
    opened: list[TablePath] = []
    writers: list[object] = []
    get_table, new_upsert = Connection.get_table, Table.new_upsert

    async def counting_get_table(self: Connection, path: TablePath) -> Table:
        opened.append(path)
        return await get_table(self, path)

    def counting_new_upsert(self: Table) -> Any:
        writers.append(self)
        return new_upsert(self)

    monkeypatch.setattr(Connection, "get_table", counting_get_table)
    monkeypatch.setattr(Table, "new_upsert", counting_new_upsert)
    for i in range(3):
        assert (await upsert(gateway, name, {"id": i, "v": f"v{i}"})).status_code == 200
    assert await lookup(gateway, name, 0, 1, 2) == [
        {"id": i, "v": f"v{i}", "amount": None, "day": None, "at": None, "raw": None} for i in range(3)
    ]
    # the table was opened by CREATE only, one writer served the three upserts in turn
    assert opened == [] and len(writers) == 1
    # requests at once each have a writer of their own (both are held inside a write here at the same time);
    # both writers go back to the idle list
    inside: list[UpsertWriter] = []
    both_inside = asyncio.Event()
    upsert_batch = UpsertWriter.upsert_batch

    async def held(self: UpsertWriter, data: Any) -> None:
        inside.append(self)
        if len(inside) == 2:
            both_inside.set()
        await asyncio.wait_for(both_inside.wait(), 10)
        await upsert_batch(self, data)

    monkeypatch.setattr(UpsertWriter, "upsert_batch", held)
    answers = await asyncio.gather(*(upsert(gateway, name, {"id": 10 + i}) for i in range(2)))
    assert [a.status_code for a in answers] == [200, 200]
    assert len(writers) == 2 and inside[0] is not inside[1]
    monkeypatch.setattr(UpsertWriter, "upsert_batch", upsert_batch)
    assert (await upsert(gateway, name, {"id": 20})).status_code == 200
    assert len(writers) == 2


async def test_one_requests_failure_is_not_anothers(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwcachefail")
    body = {"name": name, "columns": [{"name": "id", "type": "INT"}, {"name": "day", "type": "STRING"}],
            "primary_key": ["id", "day"], "partition_keys": ["day"]}
    assert (await gateway.post(f"/v1/databases/{DATABASE}/tables", json=body)).status_code == 201
    assert (await gateway.post(f"{table_url(name)}/partitions", json={"spec": {"day": "d1"}})).status_code == 201
    url = f"{table_url(name)}/rows:upsert"
    for _ in range(3):
        good, bad = await asyncio.gather(gateway.post(url, json={"rows": [{"id": 1, "day": "d1"}]}),
                                         gateway.post(url, json={"rows": [{"id": 1, "day": "d9"}]}))
        assert good.status_code == 200, good.text
        assert_error(bad, 404, "partition_not_found")
    looked = await gateway.post(f"{table_url(name)}/lookup", json={"keys": [[1, "d1"]]})
    assert looked.json() == {"rows": [{"id": 1, "day": "d1"}]}


async def test_an_alter_through_the_gateway_reaches_the_cached_table(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwcachealter")
    await create_pk_table(gateway, name)
    assert (await upsert(gateway, name, {"id": 1, "v": "a"})).status_code == 200
    assert (await upsert(gateway, name, {"id": 2, "v": "b"})).status_code == 200
    added = {"add_columns": [{"name": "tag", "type": "STRING"}]}
    assert (await gateway.patch(table_url(name), json=added)).status_code == 200
    written = await upsert(gateway, name, {"id": 3, "v": "c", "tag": "new"})
    assert written.status_code == 200, written.text
    rows = await lookup(gateway, name, 1, 3)
    assert rows[0]["tag"] is None and rows[1]["tag"] == "new"


async def test_a_table_dropped_and_created_again_through_the_gateway(
    gateway: httpx.AsyncClient, server: ServerProcess
) -> None:
    name = unique_name("gwcachedrop")
    first = await create_pk_table(gateway, name)
    assert (await upsert(gateway, name, {"id": 1, "v": "old"})).status_code == 200
    assert (await gateway.delete(table_url(name))).status_code == 204
    again = {"name": name, "columns": [{"name": "id", "type": "BIGINT"}, {"name": "w", "type": "INT"}],
             "primary_key": ["id"], "bucket_count": 1}
    created = await gateway.post(f"/v1/databases/{DATABASE}/tables", json=again)
    assert created.status_code == 201 and created.json()["table_id"] != first["table_id"]
    written = await upsert(gateway, name, {"id": 2, "w": 5})
    assert written.status_code == 200, written.text
    async with await Connection.create(server.address) as connection:
        table = await connection.get_table(TablePath(DATABASE, name))
        assert table.table_info.table_id == created.json()["table_id"]
        found = await table.new_lookup().create_lookuper().lookup_many([{"id": 1}, {"id": 2}])
        assert found == [None, {"id": 2, "w": 5}]


async def test_a_column_added_elsewhere_is_found(gateway: httpx.AsyncClient, server: ServerProcess) -> None:
    name = unique_name("gwcacheelse")
    await create_pk_table(gateway, name)
    assert (await upsert(gateway, name, {"id": 1, "v": "a"})).status_code == 200
    assert len(await lookup(gateway, name, 1)) == 1  # the handle and its lookuper are cached now
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().alter_table(TablePath(DATABASE, name), add_columns=[Column("tag", StringType())])
    # a lookup on the cached handle meets rows of the new schema: it runs again on a fresh one
    assert (await lookup(gateway, name, 1))[0]["tag"] is None
    # a row naming the new column does not convert on the cached handle: it is converted on a fresh one
    assert (await upsert(gateway, name, {"id": 2, "tag": "t"})).status_code == 200
    assert (await lookup(gateway, name, 2))[0]["tag"] == "t"
    # and a column that exists nowhere is still refused
    assert_error(await upsert(gateway, name, {"id": 3, "nope": 1}), 400, "invalid_argument")


async def test_the_cache_can_be_turned_off(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(server.address, {"gateway.table-cache.size": "0"})
    opened: list[TablePath] = []
    get_table = Connection.get_table

    async def counting_get_table(self: Connection, path: TablePath) -> Table:
        opened.append(path)
        return await get_table(self, path)

    monkeypatch.setattr(Connection, "get_table", counting_get_table)
    async with served(app) as client:
        name = unique_name("gwnocache")
        await create_pk_table(client, name)
        for i in range(2):
            assert (await upsert(client, name, {"id": i})).status_code == 200
        assert len(opened) == 3 and len(app.state.gateway.tables) == 0
    with pytest.raises(ValueError, match="duration"):
        create_app(server.address, {"gateway.table-cache.ttl": "soon"})
