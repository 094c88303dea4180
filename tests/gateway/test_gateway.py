"""The REST gateway against a real strom server: the app runs in-process behind httpx's ASGI transport, its
strom connections reach the server over RPC, and pyfluss reads back what the gateway wrote."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import fluss as pyfluss
import httpx
import pyarrow as pa
import pytest
import pytest_asyncio

from strom.gateway.app import create_app
from tests.conftest import unique_name
from tests.gateway.support import served
from tests.integration.pyfluss_support import poll_records
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.timeout(120)]

DATABASE = "fluss"


@pytest_asyncio.fixture
async def gateway(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(server.address, {"gateway.rest.write.max-request-bytes": "64kb"})
    async with served(app) as client:
        yield client


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["request_id"] == response.headers["x-request-id"]
    uuid.UUID(error["request_id"])
    assert error["message"]
    return dict(error)


async def create_pk_table(client: httpx.AsyncClient, name: str, **extra: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "columns": [{"name": "id", "type": "BIGINT"}, {"name": "v", "type": "STRING"},
                    {"name": "amount", "type": "DECIMAL(10, 2)"}, {"name": "day", "type": "DATE"},
                    {"name": "at", "type": "TIMESTAMP(3)"}, {"name": "raw", "type": "BYTES"}],
        "primary_key": ["id"],
        "bucket_count": 2,
        **extra,
    }
    response = await client.post(f"/v1/databases/{DATABASE}/tables", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


# ---- health, readiness, OpenAPI ----

@pytest.mark.asyncio
async def test_health_ready_and_openapi(gateway: httpx.AsyncClient) -> None:
    health = await gateway.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["uptime_ms"] >= 0
    uuid.UUID(health.headers["x-request-id"])
    assert (await gateway.get("/ready")).json() == {"status": "ready"}
    document = (await gateway.get("/v1/openapi.json")).json()
    assert document["openapi"].startswith("3.1")
    assert "/v1/databases/{db}/tables/{name}/rows:upsert" in document["paths"]
    paths = document["paths"]
    table = "/v1/databases/{db}/tables/{name}"
    assert "patch" in paths[table] and "patch" in paths["/v1/databases/{db}"]
    assert "get" in paths[f"{table}/schema"] and "get" in paths[f"{table}/schemas/{{schema_id}}"]
    assert set(paths[f"{table}/partitions/{{partition}}"]) == {"get", "delete"}
    assert "post" in paths[f"{table}/prefix-lookup"]
    log_parameters = {p["name"] for p in paths[f"{table}/log"]["get"]["parameters"]}
    assert {"bucket", "partition", "start_offset", "end_offset", "limit"} <= log_parameters
    assert "ErrorEnvelope" in document["components"]["schemas"]
    assert (await gateway.get("/openapi.json")).status_code == 404


@pytest.mark.asyncio
async def test_ready_is_503_outside_the_lifespan(server: ServerProcess) -> None:
    app = create_app(server.address, {})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        assert_error(await client.get("/ready"), 503, "unavailable")
        assert (await client.get("/health")).status_code == 200


@pytest.mark.asyncio
async def test_a_client_request_id_is_echoed(gateway: httpx.AsyncClient) -> None:
    mine = str(uuid.uuid4())
    response = await gateway.get("/v1/databases/nope_db", headers={"x-request-id": mine})
    assert assert_error(response, 404, "database_not_found")["request_id"] == mine
    other = await gateway.get("/health", headers={"x-request-id": "not-a-uuid"})
    assert other.headers["x-request-id"] != "not-a-uuid"


# ---- catalog ----

@pytest.mark.asyncio
async def test_databases(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwdb")
    created = await gateway.post("/v1/databases", json={"name": name, "comment": "c", "properties": {"k": "v"}})
    assert created.status_code == 201, created.text
    assert created.json()["name"] == name and created.json()["comment"] == "c"
    assert name in (await gateway.get("/v1/databases")).json()["databases"]
    assert (await gateway.get(f"/v1/databases/{name}")).json()["properties"] == {"k": "v"}
    assert_error(await gateway.post("/v1/databases", json={"name": name}), 409, "database_already_exists")
    assert (await gateway.post("/v1/databases", json={"name": name, "ignore_if_exists": True})).status_code == 201
    table = {"name": "t", "columns": [{"name": "id", "type": "INT"}]}
    assert (await gateway.post(f"/v1/databases/{name}/tables", json=table)).status_code == 201
    assert_error(await gateway.delete(f"/v1/databases/{name}?cascade=false"), 409, "database_not_empty")
    assert (await gateway.delete(f"/v1/databases/{name}?cascade=true")).status_code == 204
    assert_error(await gateway.get(f"/v1/databases/{name}"), 404, "database_not_found")
    assert_error(await gateway.delete(f"/v1/databases/{name}"), 404, "database_not_found")
    assert (await gateway.delete(f"/v1/databases/{name}?ignore_if_not_exists=true")).status_code == 204


@pytest.mark.asyncio
async def test_tables(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwt")
    info = await create_pk_table(gateway, name, properties={"table.log.ttl": "2h"}, comment="orders")
    assert info["name"] == name and info["primary_key"] == ["id"] and info["bucket_count"] == 2
    assert [c["type"] for c in info["columns"]] == [
        "BIGINT NOT NULL", "STRING", "DECIMAL(10, 2)", "DATE", "TIMESTAMP(3)", "BYTES"
    ]
    assert info["properties"]["table.log.ttl"] == "2h" and info["comment"] == "orders"
    assert name in (await gateway.get(f"/v1/databases/{DATABASE}/tables")).json()["tables"]
    fetched = (await gateway.get(f"/v1/databases/{DATABASE}/tables/{name}")).json()
    assert fetched["table_id"] == info["table_id"]
    again = {"name": name, "columns": [{"name": "id", "type": "INT"}]}
    assert_error(await gateway.post(f"/v1/databases/{DATABASE}/tables", json=again), 409, "table_already_exists")
    # a nested type by name and by Fluss's JSON type object
    nested = {"name": unique_name("gwn"), "columns": [
        {"name": "tags", "type": "ARRAY<STRING>"}, {"name": "m", "type": {"type": "MAP", "key_type": {"type": "STRING"},
                                                                       "value_type": {"type": "INTEGER"}}},
        {"name": "r", "type": "ROW<a INT, b STRING NOT NULL>"},
    ]}
    made = await gateway.post(f"/v1/databases/{DATABASE}/tables", json=nested)
    assert made.status_code == 201, made.text
    assert [c["type"] for c in made.json()["columns"]] == ["ARRAY<STRING>", "MAP<STRING NOT NULL, INT>",
                                                           "ROW<a INT, b STRING NOT NULL>"]
    assert (await gateway.delete(f"/v1/databases/{DATABASE}/tables/{name}")).status_code == 204
    assert_error(await gateway.get(f"/v1/databases/{DATABASE}/tables/{name}"), 404, "table_not_found")
    assert_error(await gateway.delete(f"/v1/databases/{DATABASE}/tables/{name}"), 404, "table_not_found")
    assert_error(await gateway.get("/v1/databases/no_such_db/tables"), 404, "database_not_found")


@pytest.mark.asyncio
@pytest.mark.parametrize(("body", "fragment"), [
    ({"name": "x", "columns": [{"name": "id", "type": "INTT"}]}, "unknown type 'INTT'"),
    ({"name": "x", "columns": [{"name": "id", "type": "DECIMAL(10"}]}, "invalid type"),
    ({"name": "x", "columns": [{"name": "id", "type": "INT"}], "primary_key": ["nope"]}, "nope"),
    ({"name": "x", "columns": []}, "columns"),
    ({"name": "x", "columns": [{"name": "id", "type": "INT"}], "bucket_count": "two"}, "bucket_count"),
    ({"name": "x", "columns": [{"name": "id", "type": "INT"}], "surprise": 1}, "surprise"),
])
async def test_invalid_table_definitions_are_400(gateway: httpx.AsyncClient, body: dict[str, Any], fragment: str) -> None:
    error = assert_error(await gateway.post(f"/v1/databases/{DATABASE}/tables", json=body), 400, "invalid_argument")
    assert fragment in error["message"]


@pytest.mark.asyncio
async def test_partitions(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwp")
    body = {"name": name, "columns": [{"name": "id", "type": "INT"}, {"name": "day", "type": "STRING"}],
            "primary_key": ["id", "day"], "partition_keys": ["day"]}
    assert (await gateway.post(f"/v1/databases/{DATABASE}/tables", json=body)).status_code == 201
    base = f"/v1/databases/{DATABASE}/tables/{name}/partitions"
    assert (await gateway.post(base, json={"spec": {"day": "d1"}})).status_code == 201
    assert_error(await gateway.post(base, json={"spec": {"day": "d1"}}), 409, "partition_already_exists")
    (partition,) = (await gateway.get(base)).json()["partitions"]
    assert partition["name"] == "d1" and partition["spec"] == {"day": "d1"}
    rows = f"/v1/databases/{DATABASE}/tables/{name}/rows:upsert"
    assert (await gateway.post(rows, json={"rows": [{"id": 1, "day": "d1"}]})).status_code == 200
    assert_error(await gateway.post(rows, json={"rows": [{"id": 1, "day": "d9"}]}), 404, "partition_not_found")
    lookup = await gateway.post(f"/v1/databases/{DATABASE}/tables/{name}/lookup", json={"keys": [[1, "d1"]]})
    assert lookup.json() == {"rows": [{"id": 1, "day": "d1"}]}
    assert (await gateway.delete(f"{base}/d1")).status_code == 204
    assert (await gateway.get(base)).json()["partitions"] == []
    assert_error(await gateway.delete(f"{base}/d1"), 404, "partition_not_found")


# ---- rows ----

@pytest.mark.asyncio
async def test_upsert_lookup_delete_and_pyfluss_reads_it(gateway: httpx.AsyncClient, fluss: Any) -> None:
    name = unique_name("gwrows")
    await create_pk_table(gateway, name)
    base = f"/v1/databases/{DATABASE}/tables/{name}"
    raw = base64.b64encode(b"\x00\x01").decode()
    rows = [
        {"id": 1, "v": "one", "amount": "12.50", "day": "2024-05-01", "at": "2024-05-01T10:00:00.123", "raw": raw},
        {"id": 2, "v": None, "amount": 3, "at": 1714557600000},
    ]
    written = await gateway.post(f"{base}/rows:upsert", json={"rows": rows})
    assert written.status_code == 200, written.text
    assert written.json() == {"written": 2}
    # acknowledged means written: pyfluss reads the rows back at once
    table = await fluss.get_table(pyfluss.TablePath(DATABASE, name))
    found = await table.new_lookup().create_lookuper().lookup({"id": 1})
    assert found["v"] == "one" and str(found["amount"]) == "12.50" and found["raw"] == b"\x00\x01"
    looked = (await gateway.post(f"{base}/lookup", json={"keys": [{"id": 1}, {"id": 2}, [3]]})).json()["rows"]
    assert looked[0] == {"id": 1, "v": "one", "amount": "12.50", "day": "2024-05-01",
                         "at": "2024-05-01T10:00:00.123000", "raw": raw}
    assert looked[1]["amount"] == "3.00" and looked[1]["at"] == "2024-05-01T10:00:00" and looked[1]["v"] is None
    assert looked[2] is None
    deleted = await gateway.post(f"{base}/rows:delete", json={"keys": [{"id": 1}]})
    assert deleted.json() == {"deleted": 1}
    assert await table.new_lookup().create_lookuper().lookup({"id": 1}) is None
    assert (await gateway.post(f"{base}/lookup", json={"keys": [[1], [2]]})).json()["rows"][0] is None


@pytest.mark.asyncio
async def test_append_and_arrow_bodies(gateway: httpx.AsyncClient, fluss: Any) -> None:
    name = unique_name("gwlog")
    body = {"name": name, "columns": [{"name": "id", "type": "INT"}, {"name": "msg", "type": "STRING"}],
            "bucket_count": 1}
    assert (await gateway.post(f"/v1/databases/{DATABASE}/tables", json=body)).status_code == 201
    base = f"/v1/databases/{DATABASE}/tables/{name}"
    appended = await gateway.post(f"{base}/rows:append", json={"rows": [{"id": 1, "msg": "a"}, {"id": 2}]})
    assert appended.json() == {"written": 2}, appended.text
    sink = pa.BufferOutputStream()
    batch = pa.record_batch({"id": pa.array([3], pa.int32()), "msg": ["c"]})
    with pa.ipc.new_stream(sink, batch.schema) as stream:
        stream.write_batch(batch)
    arrow = await gateway.post(f"{base}/rows:append", content=sink.getvalue().to_pybytes(),
                               headers={"content-type": "application/vnd.apache.arrow.stream"})
    assert arrow.json() == {"written": 1}, arrow.text
    table = await fluss.get_table(pyfluss.TablePath(DATABASE, name))
    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe_buckets({0: pyfluss.EARLIEST_OFFSET})
    records = await poll_records(scanner, 3)
    assert [(r.row["id"], r.row["msg"]) for r in records] == [(1, "a"), (2, None), (3, "c")]
    # a log table takes no upserts, deletes or lookups; a PK table no appends
    assert_error(await gateway.post(f"{base}/rows:upsert", json={"rows": [{"id": 1}]}), 400, "invalid_argument")
    assert_error(await gateway.post(f"{base}/lookup", json={"keys": [[1]]}), 400, "invalid_argument")
    pk = unique_name("gwpk")
    await create_pk_table(gateway, pk)
    wrong = await gateway.post(f"/v1/databases/{DATABASE}/tables/{pk}/rows:append", json={"rows": [{"id": 1}]})
    assert_error(wrong, 400, "invalid_argument")
    bad_arrow = await gateway.post(f"{base}/rows:append", content=b"not arrow",
                                   headers={"content-type": "application/vnd.apache.arrow.stream"})
    assert_error(bad_arrow, 400, "invalid_argument")
    assert_error(await gateway.post(f"{base}/rows:append", content=b"x", headers={"content-type": "text/csv"}),
                 415, "unsupported_media_type")


@pytest.mark.asyncio
@pytest.mark.parametrize(("rows", "fragment"), [
    ([{"id": "one"}], "column 'id'"),
    ([{"id": True}], "column 'id'"),
    ([{"id": 1, "amount": "lots"}], "not a decimal"),
    ([{"id": 1, "day": "May 1st"}], "ISO-8601 date"),
    ([{"id": 1, "raw": "***"}], "base64"),
    ([{"id": 1, "nope": 1}], "no columns ['nope']"),
    ([{"v": "no key"}], "NOT NULL"),
    ([{"id": 1 << 70}], "out of range"),
    ({"id": 1}, "array"),
    ([7], "must be an object"),
])
async def test_values_that_do_not_convert_are_400(gateway: httpx.AsyncClient, rows: Any, fragment: str) -> None:
    name = unique_name("gwbad")
    await create_pk_table(gateway, name)
    response = await gateway.post(f"/v1/databases/{DATABASE}/tables/{name}/rows:upsert", json={"rows": rows})
    assert fragment in assert_error(response, 400, "invalid_argument")["message"]
    looked = await gateway.post(f"/v1/databases/{DATABASE}/tables/{name}/lookup", json={"keys": [[1]]})
    assert looked.json() == {"rows": [None]}  # nothing was written


# ---- protocol errors ----

@pytest.mark.asyncio
async def test_malformed_json_unknown_routes_and_wrong_methods(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwerr")
    await create_pk_table(gateway, name)
    base = f"/v1/databases/{DATABASE}/tables/{name}"
    for path in ("/v1/databases", f"{base}/rows:upsert", f"{base}/lookup"):
        response = await gateway.post(path, content=b"{not json", headers={"content-type": "application/json"})
        assert "malformed JSON" in assert_error(response, 400, "invalid_argument")["message"], path
    assert_error(await gateway.post(f"{base}/rows:upsert", json={"rowz": []}), 400, "invalid_argument")
    assert_error(await gateway.get("/v2/nothing"), 404, "not_found")
    wrong = await gateway.put("/v1/databases")
    assert_error(wrong, 405, "method_not_allowed")
    assert "GET" in wrong.headers["allow"]
    assert_error(await gateway.delete("/health"), 405, "method_not_allowed")
    assert_error(await gateway.get(f"{base}/rows:upsert"), 405, "method_not_allowed")
    assert_error(await gateway.post(f"/v1/databases/{DATABASE}/tables/nope/rows:upsert", json={"rows": []}),
                 404, "table_not_found")
    assert_error(await gateway.post("/v1/databases/nope_db/tables/nope/lookup", json={"keys": []}),
                 404, "table_not_found")
    assert_error(await gateway.delete(f"/v1/databases/{DATABASE}?cascade=maybe"), 400, "invalid_argument")


@pytest.mark.asyncio
async def test_a_body_over_the_limit_is_413(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwbig")
    await create_pk_table(gateway, name)
    path = f"/v1/databases/{DATABASE}/tables/{name}/rows:upsert"
    big = json.dumps({"rows": [{"id": i, "v": "x" * 100} for i in range(1000)]}).encode()
    assert len(big) > 64 * 1024
    assert "64kb" not in assert_error(await gateway.post(path, content=big), 413, "limit_exceeded")["message"]
    received: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while it streams
        for start in range(0, len(big), 8192):
            received.append(start)
            yield big[start:start + 8192]

    assert_error(await gateway.post(path, content=chunks()), 413, "limit_exceeded")
    # a route whose JSON body FastAPI parses itself refuses it the same way
    assert_error(await gateway.post("/v1/databases", content=chunks()), 413, "limit_exceeded")
    assert_error(await gateway.post("/v1/databases", content=big), 413, "limit_exceeded")
    looked = await gateway.post(f"/v1/databases/{DATABASE}/tables/{name}/lookup", json={"keys": [[0]]})
    assert looked.json() == {"rows": [None]}
