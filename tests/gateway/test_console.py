"""The operator's console against a real server, over httpx: every page answers with what the cluster holds
(leaders, ISR, offsets, row counts and sizes, snapshots and leases, tiering, ACLs), charts come from the
server's real Prometheus endpoint, and on a secured server the console asks for a login, shows what the
user's ACLs allow and lets only users the cluster allows change ACLs (a form from another site never)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pyarrow as pa
import pytest
import pytest_asyncio

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.gateway.app import create_app
from strom.security.acl import AclFilter, Principal, ResourceType
from tests.conftest import unique_name
from tests.gateway.support import served
from tests.gateway.test_gateway_security import as_user
from tests.integration.security_support import SECURE_CONFIG, strom_config
from tests.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]

KV = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
LOG = pa.schema([("id", pa.int64()), ("day", pa.string())])


@pytest.fixture(scope="module")
def metered_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    process = ServerProcess(tmp_path_factory.mktemp("console") / "data",
                            {"metrics.reporter.prometheus.port": str(port), "kv.snapshot.interval": "500ms"})
    process.start()
    yield process, port
    assert process.stop() == 0, process.log_text()[-3000:]


@pytest_asyncio.fixture
async def console(metered_server: tuple[ServerProcess, int]) -> AsyncIterator[httpx.AsyncClient]:
    server, port = metered_server
    app = create_app(server.address, {"gateway.console.metrics-endpoints": f"127.0.0.1:{port}",
                                      "gateway.console.metrics-interval": "200ms"})
    async with served(app) as client:
        yield client


def cells(html: str, row_attribute: str) -> dict[str, list[str]]:
    """The text of each cell of the rows carrying ``row_attribute`` (data-bucket, data-server, ...), by value."""
    found = {}
    for value, body in re.findall(rf'<tr {row_attribute}="([^"]+)"[^>]*>(.*?)</tr>', html, flags=re.S):
        found[value] = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)]
    return found


async def _tables(server: ServerProcess) -> tuple[TablePath, TablePath]:
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        kv_path, log_path = TablePath("fluss", unique_name("console_kv")), TablePath("fluss", unique_name("console_log"))
        await admin.create_table(kv_path, TableDescriptor(Schema.from_arrow(KV, primary_key=["id"]), bucket_count=2,
                                                          comment="orders by id"))
        await admin.create_table(log_path, TableDescriptor(Schema.from_arrow(LOG), partition_keys=("day",),
                                                           bucket_count=1))
        await admin.create_partition(log_path, {"day": "d1"})
        kv = await connection.get_table(kv_path)
        writer = kv.new_upsert().create_writer()
        await writer.upsert_batch(pa.table({"id": list(range(100)), "v": ["x"] * 100}, schema=KV))
        log_table = await connection.get_table(log_path)
        appender = log_table.new_append().create_writer()
        await appender.write_arrow_batch(pa.table({"id": [1, 2, 3], "day": ["d1"] * 3}, schema=LOG))
    return kv_path, log_path


async def test_every_page_shows_the_cluster(console: httpx.AsyncClient, metered_server: tuple[ServerProcess, int]) -> None:
    server, _ = metered_server
    kv_path, log_path = await _tables(server)
    async with await Connection.create(server.address) as connection:
        server_id = next(n.id for n in await connection.get_admin().get_server_nodes()
                         if n.server_type == "TabletServer")

    assert (await console.get("/console", follow_redirects=False)).headers["location"] == "/console/"
    overview = await console.get("/console/")
    assert overview.status_code == 200 and overview.headers["content-type"].startswith("text/html")
    assert "GREEN" in overview.text and '<meta http-equiv="refresh" content="10">' in overview.text
    servers = cells(overview.text, "data-server")
    assert list(servers) == [str(server_id)]
    assert servers[str(server_id)][1] == "up"
    leaders = int(servers[str(server_id)][5])
    assert leaders >= 3, "the two KV buckets and the partition's bucket are led by the one server"
    assert "every bucket has a leader and a full ISR" in overview.text

    tables = (await console.get("/console/tables")).text
    assert str(kv_path) in tables and str(log_path) in tables

    page = await console.get(f"/console/tables/{kv_path.database_name}/{kv_path.table_name}")
    assert page.status_code == 200 and "orders by id" in page.text and "BIGINT NOT NULL" in page.text
    buckets = cells(page.text, "data-bucket")
    assert sorted(buckets) == ["0", "1"]
    rows = 0
    for cells_of_bucket in buckets.values():
        leader, _epoch, replicas, isr, log_start, high_watermark, count, log_size, kv_size, _snapshot = cells_of_bucket[1:]
        assert (leader, replicas, isr, log_start) == (str(server_id), str(server_id), str(server_id), "0")
        assert int(high_watermark) == int(count) > 0
        assert log_size.endswith("B") and log_size != "0 B" and kv_size != "-"
        rows += int(count)
    assert rows == 100

    partitioned = await console.get(f"/console/tables/{log_path.database_name}/{log_path.table_name}?partition=d1")
    assert cells(partitioned.text, "data-bucket")["0"][0] == "d1"
    assert cells(partitioned.text, "data-bucket")["0"][7] == "3", "the high watermark after 3 appends"

    missing = await console.get("/console/tables/fluss/no_such_table")
    assert missing.status_code == 404 and "no_such_table" in missing.text
    no_partition = await console.get(f"/console/tables/{log_path.database_name}/{log_path.table_name}?partition=zz")
    assert no_partition.status_code == 404

    for path, marker in (("/console/tiering", "No lake-enabled tables"), ("/console/snapshots", str(kv_path)),
                         ("/console/remote-log", "No table has log segments in remote storage yet"),
                         ("/console/rebalance", "No rebalance has run"), ("/console/acls", "ACLs"),
                         ("/console/configs", 'data-key="kv.snapshot.interval"'),
                         ("/console/metrics", "Scraping http://127.0.0.1:")):
        answer = await console.get(path)
        assert answer.status_code == 200, (path, answer.text[:2000])
        assert marker in answer.text, path
    assert "?refresh=0" not in (await console.get("/console/?refresh=0")).text
    assert (await console.get("/console/static/console.css")).headers["content-type"].startswith("text/css")


async def test_snapshots_show_the_latest_snapshot_and_the_leases_pinning_it(
    console: httpx.AsyncClient, metered_server: tuple[ServerProcess, int]
) -> None:
    server, _ = metered_server
    kv_path, _ = await _tables(server)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        for _ in range(100):  # kv.snapshot.interval is 500 ms
            snapshots = await admin.get_latest_kv_snapshots(kv_path)
            if all(s is not None for s in snapshots.snapshots.values()):
                break
            await asyncio.sleep(0.2)
        lease = admin.create_kv_snapshot_lease(unique_name("console-lease"), 60_000)
        pins = {snapshots.table_bucket(b): s.snapshot_id for b, s in snapshots.snapshots.items() if s is not None}
        await lease.acquire_snapshots(pins)
        try:
            page = (await console.get("/console/snapshots")).text
        finally:
            await lease.drop()
    assert lease.lease_id in page
    for bucket, snapshot_id in pins.items():
        assert f"b{bucket.bucket} → #{snapshot_id}" in page
    snapshot_table = page.split('id="snapshots"', 1)[1]
    table_rows = [row for row in re.findall(r"<tr>(.*?)</tr>", snapshot_table, re.S) if str(kv_path) in row]
    assert len(table_rows) == 2 and all(lease.lease_id in row for row in table_rows)


async def test_charts_come_from_the_server_s_prometheus_endpoint(
    console: httpx.AsyncClient, metered_server: tuple[ServerProcess, int]
) -> None:
    server, _ = metered_server
    async with await Connection.create(server.address) as connection:
        path = TablePath("fluss", unique_name("console_rate"))
        await connection.get_admin().create_table(path, TableDescriptor(Schema.from_arrow(KV, primary_key=["id"])))
        writer = (await connection.get_table(path)).new_upsert().create_writer()
        lookuper = (await connection.get_table(path)).new_lookup().create_lookuper()
        for round_ in range(15):  # traffic over ~3 s, several scrapes apart
            await writer.upsert_batch(pa.table({"id": [round_], "v": ["r"]}, schema=KV))
            await lookuper.lookup({"id": round_})  # type: ignore[union-attr]
            await asyncio.sleep(0.2)
    page = (await console.get("/console/metrics")).text
    write_chart = re.search(r'<figure class="chart" id="chart-write-requests-per-second">(.*?)</figure>', page, re.S)
    assert write_chart is not None, page[:3000]
    assert "<polyline" in write_chart.group(1) and "PUT_KV" in write_chart.group(1)
    lookup_chart = re.search(r'id="chart-lookup-and-scan-requests-per-second">(.*?)</figure>', page, re.S)
    assert lookup_chart is not None and "LOOKUP" in lookup_chart.group(1)
    overview = (await console.get("/console/")).text
    assert 'id="chart-write-requests-per-second"' in overview


async def test_without_metrics_endpoints_the_pages_say_how_to_chart(metered_server: tuple[ServerProcess, int]) -> None:
    server, _ = metered_server
    app = create_app(server.address, {})
    async with served(app) as client:
        page = (await client.get("/console/metrics")).text
    assert "gateway.console.metrics-endpoints" in page and 'id="chart-write-requests-per-second"' not in page
    assert 'id="chart-this-gateway-s-requests-per-second--by-route"' in page, "the gateway's own are charted"



# ---- on a secured server ----

@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("console_secure") / "data", SECURE_CONFIG)
    process.start()
    yield process
    assert process.stop() == 0, process.log_text()[-3000:]


@pytest_asyncio.fixture
async def secure_console(secure_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(secure_server.address, {})
    async with served(app) as client:
        yield client


async def _acls_of(server: ServerProcess, principal: str) -> list[Any]:
    async with await Connection.create(strom_config(server, "admin")) as connection:
        return await connection.get_admin().list_acls(AclFilter(principal=Principal.parse(principal)))


async def test_a_secured_console_asks_for_a_login_and_only_allowed_users_change_acls(
    secure_console: httpx.AsyncClient, secure_server: ServerProcess
) -> None:
    anonymous = await secure_console.get("/console/")
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Basic")
    assert (await secure_console.get("/console/", auth=as_user("admin", "wrong"))).status_code == 401
    page = await secure_console.get("/console/", auth=as_user("admin"))
    assert page.status_code == 200 and "admin · " in page.text

    principal = f"User:{unique_name('reader')}"
    form = {"principal": principal, "resource_type": "DATABASE", "resource_name": "fluss", "operation": "READ",
            "host": "*"}
    refused = await secure_console.post("/console/acls", data=form, auth=as_user("alice"))
    assert refused.status_code == 403 and "Not added" in refused.text
    assert await _acls_of(secure_server, principal) == []

    forged = await secure_console.post("/console/acls", data=form, auth=as_user("admin"),
                                       headers={"origin": "http://evil.example"})
    assert forged.status_code == 403 and "evil.example" in forged.text
    assert await _acls_of(secure_server, principal) == [], "a form from another site changes nothing"

    added = await secure_console.post("/console/acls", data=form, auth=as_user("admin"),
                                      headers={"origin": "http://gw"})
    assert added.status_code == 200 and f"Added {principal} READ on DATABASE fluss" in added.text
    (binding,) = await _acls_of(secure_server, principal)
    assert binding.resource.type is ResourceType.DATABASE and binding.resource.name == "fluss"
    listed = (await secure_console.get("/console/acls", auth=as_user("admin"))).text
    assert principal in listed

    bad = await secure_console.post("/console/acls", data={**form, "operation": "FLY"}, auth=as_user("admin"))
    assert bad.status_code == 400 and "Not added" in bad.text

    removed = await secure_console.post("/console/acls/remove", data=form, auth=as_user("admin"))
    assert removed.status_code == 200 and "Removed 1 ACL entries" in removed.text
    assert await _acls_of(secure_server, principal) == []


async def test_the_configuration_page_shows_settings_changed_at_run_time(
    console: httpx.AsyncClient, metered_server: tuple[ServerProcess, int]
) -> None:
    server, _ = metered_server
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        await admin.alter_cluster_configs({"coordinator.producer-offsets.ttl": "3d"})
        try:
            page = (await console.get("/console/configs")).text
        finally:
            await admin.alter_cluster_configs(reset_configs=["coordinator.producer-offsets.ttl"])
    rows = cells(page, "data-key")
    assert rows["coordinator.producer-offsets.ttl"][1:] == ["3d", "DYNAMIC_SERVER_CONFIG"]
    assert rows["kv.snapshot.interval"][1:] == ["500ms", "INITIAL_SERVER_CONFIG"]
