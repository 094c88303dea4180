"""The gateway's reads beyond key lookups: prefix lookups (a bucket key that is a prefix of the primary key)
and log reads by offset range (a log table's records, a primary-key table's changelog), against a real
server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pyarrow as pa
import pytest
import pytest_asyncio

from strom.gateway.app import create_app
from strom.gateway.log_routes import MAX_LOG_RECORDS
from strom.gateway.options import GatewayLimits
from tests.conftest import unique_name
from tests.gateway.support import served
from tests.gateway.test_gateway import DATABASE, assert_error
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]


@pytest_asyncio.fixture
async def gateway(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(server.address, {})
    async with served(app) as client:
        yield client


async def create(gateway: httpx.AsyncClient, name: str, columns: list[tuple[str, str]], **extra: Any) -> str:
    body = {"name": name, "columns": [{"name": n, "type": t} for n, t in columns], **extra}
    created = await gateway.post(f"/v1/databases/{DATABASE}/tables", json=body)
    assert created.status_code == 201, created.text
    return f"/v1/databases/{DATABASE}/tables/{name}"


# ---- prefix lookups ----

async def test_prefix_lookup(gateway: httpx.AsyncClient) -> None:
    base = await create(gateway, unique_name("gwprefix"), [("user", "INT"), ("item", "STRING"), ("qty", "INT")],
                        primary_key=["user", "item"], bucket_keys=["user"], bucket_count=3)
    rows = [{"user": 1, "item": i, "qty": n} for n, i in enumerate("abc")] + [{"user": 2, "item": "z", "qty": 9}]
    assert (await gateway.post(f"{base}/rows:upsert", json={"rows": rows})).status_code == 200
    found = await gateway.post(f"{base}/prefix-lookup", json={"columns": ["user"], "keys": [[1], {"user": 2}, [3]]})
    assert found.status_code == 200, found.text
    first, second, third = found.json()["rows"]
    assert sorted(first, key=lambda r: r["item"]) == rows[:3]
    assert second == [rows[3]] and third == []

    def refused(body: Any) -> Any:
        return gateway.post(f"{base}/prefix-lookup", json=body)

    too_many = {"columns": ["user"], "keys": [[i] for i in range(GatewayLimits().prefix_lookup_max_prefixes + 1)]}
    assert_error(await refused(too_many), 400, "limit_exceeded")
    assert_error(await refused({"columns": ["item"], "keys": [["a"]]}), 400, "invalid_argument")  # not the bucket key
    assert_error(await refused({"columns": ["nope"], "keys": [[1]]}), 400, "invalid_argument")
    assert_error(await refused({"columns": [], "keys": [[1]]}), 400, "invalid_argument")
    assert_error(await refused({"columns": ["user"], "keys": [["one"]]}), 400, "invalid_argument")
    assert_error(await refused({"columns": ["user"], "keys": [[1, 2]]}), 400, "invalid_argument")
    assert_error(await refused({"keys": [[1]]}), 400, "invalid_argument")
    assert (await refused({"columns": ["user"], "keys": []})).json() == {"rows": []}
    log = await create(gateway, unique_name("gwprefixlog"), [("user", "INT")])
    assert_error(await gateway.post(f"{log}/prefix-lookup", json={"columns": ["user"], "keys": [[1]]}),
                 400, "invalid_argument")


async def test_prefix_lookup_of_a_partitioned_table(gateway: httpx.AsyncClient) -> None:
    base = await create(gateway, unique_name("gwprefixp"), [("day", "STRING"), ("user", "INT"), ("item", "STRING")],
                        primary_key=["day", "user", "item"], partition_keys=["day"], bucket_keys=["user"])
    assert (await gateway.post(f"{base}/partitions", json={"spec": {"day": "d1"}})).status_code == 201
    rows = [{"day": "d1", "user": 1, "item": "a"}, {"day": "d1", "user": 1, "item": "b"}]
    assert (await gateway.post(f"{base}/rows:upsert", json={"rows": rows})).status_code == 200
    body = {"columns": ["day", "user"], "keys": [["d1", 1], {"day": "d2", "user": 1}]}
    found = (await gateway.post(f"{base}/prefix-lookup", json=body)).json()["rows"]
    assert sorted(found[0], key=lambda r: r["item"]) == rows and found[1] == []


# ---- log reads ----

async def test_log_reads_of_a_log_table(gateway: httpx.AsyncClient) -> None:
    base = await create(gateway, unique_name("gwlogread"), [("id", "INT"), ("at", "DATE")], bucket_count=1)
    log = f"{base}/log"
    for start in (0, 3):
        rows = [{"id": i, "at": f"2024-01-0{i + 1}"} for i in range(start, start + 3)]
        assert (await gateway.post(f"{base}/rows:append", json={"rows": rows})).status_code == 200

    everything = await gateway.get(log, params={"bucket": 0})
    assert everything.status_code == 200, everything.text
    answer = everything.json()
    assert answer["next_offset"] == 6 and answer["high_watermark"] == 6
    assert [r["offset"] for r in answer["records"]] == list(range(6))
    assert {r["change_type"] for r in answer["records"]} == {"+A"}
    assert answer["records"][4]["row"] == {"id": 4, "at": "2024-01-05"}
    assert all(r["timestamp"] > 0 for r in answer["records"])

    # a limit, then going on from next_offset, reads the same records in pieces
    pieces: list[dict[str, Any]] = []
    offset = 0
    while offset < 6:
        piece = (await gateway.get(log, params={"bucket": 0, "start_offset": offset, "limit": 4})).json()
        assert len(piece["records"]) == min(4, 6 - offset)
        pieces += piece["records"]
        offset = piece["next_offset"]
    assert pieces == answer["records"]
    ranged = (await gateway.get(log, params={"bucket": 0, "start_offset": 2, "end_offset": 4})).json()
    assert [r["offset"] for r in ranged["records"]] == [2, 3] and ranged["next_offset"] == 4
    caught_up = (await gateway.get(log, params={"bucket": 0, "start_offset": 6})).json()
    assert caught_up == {"records": [], "next_offset": 6, "high_watermark": 6}

    for params, code in (
        ({"bucket": 1}, "invalid_argument"),
        ({"bucket": -1}, "invalid_argument"),
        ({}, "invalid_argument"),
        ({"bucket": 0, "start_offset": 4, "end_offset": 2}, "invalid_argument"),
        ({"bucket": 0, "start_offset": 7}, "invalid_argument"),
        ({"bucket": 0, "end_offset": 99}, "invalid_argument"),
        ({"bucket": 0, "limit": 0}, "invalid_argument"),
        ({"bucket": 0, "limit": MAX_LOG_RECORDS + 1}, "limit_exceeded"),
        ({"bucket": 0, "partition": "p"}, "invalid_argument"),
    ):
        assert_error(await gateway.get(log, params=params), 400, code)
    assert_error(await gateway.get(f"/v1/databases/{DATABASE}/tables/nope/log", params={"bucket": 0}),
                 404, "table_not_found")


async def test_log_reads_of_a_primary_key_tables_changelog(gateway: httpx.AsyncClient) -> None:
    base = await create(gateway, unique_name("gwchangelog"), [("id", "BIGINT"), ("v", "STRING"),
                                                              ("amount", "DECIMAL(10, 2)")],
                        primary_key=["id"], bucket_count=1)
    assert (await gateway.post(f"{base}/rows:upsert", json={"rows": [{"id": 1, "v": "a", "amount": "1.50"}]})).status_code == 200
    assert (await gateway.post(f"{base}/rows:upsert", json={"rows": [{"id": 1, "v": "b"}]})).status_code == 200
    assert (await gateway.post(f"{base}/rows:delete", json={"keys": [[1]]})).status_code == 200
    answer = (await gateway.get(f"{base}/log", params={"bucket": 0})).json()
    assert [(r["offset"], r["change_type"], r["row"]["v"]) for r in answer["records"]] == [
        (0, "+I", "a"), (1, "-U", "a"), (2, "+U", "b"), (3, "-D", "b")
    ]
    assert answer["records"][0]["row"] == {"id": 1, "v": "a", "amount": "1.50"}
    assert answer["next_offset"] == answer["high_watermark"] == 4
    tail = (await gateway.get(f"{base}/log", params={"bucket": 0, "start_offset": 1, "limit": 2})).json()
    assert [r["change_type"] for r in tail["records"]] == ["-U", "+U"] and tail["next_offset"] == 3
    # a column added since: the old records read with it null
    added = await gateway.patch(base, json={"add_columns": [{"name": "tag", "type": "STRING"}]})
    assert added.status_code == 200, added.text
    again = (await gateway.get(f"{base}/log", params={"bucket": 0})).json()
    assert again["records"][0]["row"] == {"id": 1, "v": "a", "amount": "1.50", "tag": None}


async def test_log_reads_of_a_partition(gateway: httpx.AsyncClient) -> None:
    base = await create(gateway, unique_name("gwlogpart"), [("id", "INT"), ("day", "STRING")],
                        partition_keys=["day"], bucket_count=1)
    for day in ("d1", "d2"):
        assert (await gateway.post(f"{base}/partitions", json={"spec": {"day": day}})).status_code == 201
    rows = [{"id": 1, "day": "d1"}, {"id": 2, "day": "d2"}, {"id": 3, "day": "d2"}]
    assert (await gateway.post(f"{base}/rows:append", json={"rows": rows})).status_code == 200
    d2 = (await gateway.get(f"{base}/log", params={"bucket": 0, "partition": "d2"})).json()
    assert [r["row"]["id"] for r in d2["records"]] == [2, 3] and d2["high_watermark"] == 2
    assert_error(await gateway.get(f"{base}/log", params={"bucket": 0}), 400, "invalid_argument")
    assert_error(await gateway.get(f"{base}/log", params={"bucket": 0, "partition": "d9"}), 404, "partition_not_found")


# ---- request limits (Fluss's gateway.rest.* options) ----

async def test_request_limits_follow_fluss_s_options_and_refuse_before_writing(server: ServerProcess) -> None:
    limits = {"gateway.rest.write.max-rows": "3", "gateway.rest.lookup.max-keys": "2",
              "gateway.rest.prefix-lookup.max-prefixes": "1", "gateway.rest.prefix-lookup.max-rows-per-prefix": "2"}
    app = create_app(server.address, limits)
    async with served(app) as gateway:
        base = await create(gateway, unique_name("gwlimits"), [("user", "INT"), ("item", "STRING")],
                            primary_key=["user", "item"], bucket_keys=["user"])
        four = [{"user": 1, "item": i} for i in "abcd"]
        refused = await gateway.post(f"{base}/rows:upsert", json={"rows": four})
        assert_error(refused, 400, "limit_exceeded")
        assert "gateway.rest.write.max-rows=3" in refused.json()["error"]["message"]
        schema = pa.schema([("user", pa.int32()), ("item", pa.string())])
        body = _stream(pa.table({"user": [1] * 4, "item": list("abcd")}, schema=schema))
        arrow = await gateway.post(f"{base}/rows:upsert", content=body,
                                   headers={"content-type": "application/vnd.apache.arrow.stream"})
        assert_error(arrow, 400, "limit_exceeded")
        found = await gateway.post(f"{base}/prefix-lookup", json={"columns": ["user"], "keys": [[1]]})
        assert found.json() == {"rows": [[]]}, "a refused write wrote nothing"

        assert (await gateway.post(f"{base}/rows:upsert", json={"rows": four[:3]})).status_code == 200
        assert_error(await gateway.post(f"{base}/rows:delete", json={"keys": [[1, i] for i in "abcd"]}),
                     400, "limit_exceeded")
        assert_error(await gateway.post(f"{base}/lookup", json={"keys": [[1, "a"], [1, "b"], [1, "c"]]}),
                     400, "limit_exceeded")
        assert len((await gateway.post(f"{base}/lookup", json={"keys": [[1, "a"], [1, "b"]]})).json()["rows"]) == 2
        assert_error(await gateway.post(f"{base}/prefix-lookup", json={"columns": ["user"], "keys": [[1], [2]]}),
                     400, "limit_exceeded")
        many = await gateway.post(f"{base}/prefix-lookup", json={"columns": ["user"], "keys": [[1]]})
        assert_error(many, 400, "limit_exceeded")  # three rows under user 1, two answered at most
        assert "gateway.rest.prefix-lookup.max-rows-per-prefix" in many.json()["error"]["message"]

    with pytest.raises(ValueError, match=r"gateway\.rest\.lookup\.max-keys"):
        create_app(server.address, {"gateway.rest.lookup.max-keys": "0"})
    with pytest.raises(ValueError, match=r"gateway\.rest\.write\.max-request-bytes"):
        create_app(server.address, {"gateway.rest.write.max-request-bytes": "lots"})


async def test_default_limits_are_fluss_s(gateway: httpx.AsyncClient) -> None:
    base = await create(gateway, unique_name("gwdefaults"), [("id", "INT")], primary_key=["id"])
    keys = [[i] for i in range(GatewayLimits().lookup_max_keys + 1)]
    assert GatewayLimits() == GatewayLimits(32 * 1024 * 1024, 10_000, 128, 16, 1_000)
    assert_error(await gateway.post(f"{base}/lookup", json={"keys": keys}), 400, "limit_exceeded")
    assert len((await gateway.post(f"{base}/lookup", json={"keys": keys[:-1]})).json()["rows"]) == 128


async def test_strom_s_earlier_body_limit_name_still_works(server: ServerProcess, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(server.address, {"gateway.max-body-size": "1kb"})
    assert "deprecated: use gateway.rest.write.max-request-bytes" in caplog.text
    async with served(app) as gateway:
        assert_error(await gateway.post("/v1/databases", content=b"x" * 2048), 413, "limit_exceeded")


# ---- Arrow lookups ----

def _stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return sink.getvalue().to_pybytes()


async def test_lookups_take_and_answer_arrow(gateway: httpx.AsyncClient) -> None:
    base = await create(gateway, unique_name("gwarrowlookup"), [("id", "BIGINT"), ("v", "STRING"), ("n", "INT")],
                        primary_key=["id"], bucket_count=2)
    rows = [{"id": i, "v": f"v{i}", "n": i * 10} for i in range(6)]
    assert (await gateway.post(f"{base}/rows:upsert", json={"rows": rows})).status_code == 200

    arrow = "application/vnd.apache.arrow.stream"
    keys = pa.table({"id": pa.array([4, 99, 1], pa.int64())})
    answered = await gateway.post(f"{base}/lookup", content=_stream(keys), headers={"content-type": arrow})
    assert answered.status_code == 200 and answered.headers["content-type"] == arrow, answered.text
    found = pa.ipc.open_stream(answered.content).read_all()
    assert found.column_names == ["id", "v", "n"]
    assert found.to_pylist() == [rows[4], rows[1]], "the rows of the keys that exist, in key order"

    as_json_keys = await gateway.post(f"{base}/lookup", json={"keys": [[2], [3], [100]]}, headers={"accept": arrow})
    assert pa.ipc.open_stream(as_json_keys.content).read_all().to_pylist() == [rows[2], rows[3]]
    plain = await gateway.post(f"{base}/lookup", json={"keys": [[2], [100]]})
    assert plain.json() == {"rows": [rows[2], None]}, "without Accept the JSON answer keeps key order and nulls"

    wrong = pa.table({"id": pa.array([1], pa.int64()), "v": pa.array(["x"])})
    assert_error(await gateway.post(f"{base}/lookup", content=_stream(wrong), headers={"content-type": arrow}),
                 400, "invalid_argument")
    assert_error(await gateway.post(f"{base}/lookup", content=b"not arrow", headers={"content-type": arrow}),
                 400, "invalid_argument")
    too_many = pa.table({"id": pa.array(range(GatewayLimits().lookup_max_keys + 1), pa.int64())})
    assert_error(await gateway.post(f"{base}/lookup", content=_stream(too_many), headers={"content-type": arrow}),
                 400, "limit_exceeded")
