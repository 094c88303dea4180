"""The gateway's own metrics, FIP-49's families as Fluss's gateway declares them: requests by route
template and status, their durations in FIP-49's buckets, the process's; served at /metrics, on a listener
of their own when asked, off when disabled, and charted by the console."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from strom.gateway.app import create_app
from tests.conftest import unique_name
from tests.gateway.support import served
from tests.gateway.test_gateway import DATABASE
from tests.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]

UPSERT = "/v1/databases/{db}/tables/{name}/rows:upsert"


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


@pytest_asyncio.fixture
async def gateway(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(server.address, {"gateway.console.metrics-interval": "200ms",
                                      "gateway.rest.write.max-request-bytes": "1kb"})
    async with served(app) as client:
        yield client


async def test_requests_are_counted_by_route_template_status_and_cluster(gateway: httpx.AsyncClient) -> None:
    name = unique_name("gwmetrics")
    created = await gateway.post(f"/v1/databases/{DATABASE}/tables", json={
        "name": name, "columns": [{"name": "id", "type": "INT"}], "primary_key": ["id"]})
    assert created.status_code == 201
    for i in range(3):
        assert (await gateway.post(f"/v1/databases/{DATABASE}/tables/{name}/rows:upsert",
                                   json={"rows": [{"id": i}]})).status_code == 200
    assert (await gateway.post(f"/v1/databases/{DATABASE}/tables/{name}/rows:upsert",
                               json={"rows": [{"id": "x"}]})).status_code == 400
    assert (await gateway.post(f"/v1/databases/{DATABASE}/tables/{name}/rows:upsert",
                               content=b"{" + b" " * 2048 + b"}")).status_code == 413
    assert (await gateway.get("/v1/nothing/here")).status_code == 404
    assert (await gateway.get("/health")).status_code == 200

    text = (await gateway.get("/metrics")).text
    counted = samples(text, "fluss_gateway_rest_requests_total")

    def count(method: str, operation: str, code: str, cluster: str = "default") -> float:
        key = tuple(sorted({"cluster": cluster, "method": method, "operation": operation, "code": code}.items()))
        return counted.get(key, 0.0)

    assert count("POST", UPSERT, "200") == 3 and count("POST", UPSERT, "400") == 1
    assert count("POST", "unmatched", "413", "none") == 1, "a body refused before routing has no route"
    assert count("GET", "unmatched", "404", "none") == 1
    assert count("GET", "/health", "200", "none") == 1
    assert not any(name in dict(labels)["operation"] for labels in counted), "no raw paths, only templates"
    buckets = samples(text, "fluss_gateway_rest_request_duration_seconds_bucket")
    upserts = {dict(labels)["le"]: value for labels, value in buckets.items() if dict(labels)["operation"] == UPSERT}
    assert list(upserts) == ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5",
                             "5.0", "10.0", "30.0", "60.0", "+Inf"]
    assert upserts["+Inf"] == 4
    assert samples(text, "process_cpu_seconds_total"), "the process's own families"
    assert "/metrics" not in (await gateway.get("/v1/openapi.json")).json()["paths"]


async def test_the_console_charts_the_gateway_s_own_requests(gateway: httpx.AsyncClient) -> None:
    for _ in range(15):
        assert (await gateway.get("/v1/databases")).status_code == 200
        await asyncio.sleep(0.1)
    page = (await gateway.get("/console/metrics")).text
    chart = re.search(r'id="chart-this-gateway-s-requests-per-second--by-route">(.*?)</figure>', page, re.S)
    assert chart is not None and "<polyline" in chart.group(1) and "/v1/databases" in chart.group(1)


async def test_metrics_off_and_on_a_listener_of_their_own(server: ServerProcess) -> None:
    app = create_app(server.address, {"gateway.metrics.enabled": "false"})
    async with served(app) as client:
        assert (await client.get("/metrics")).status_code == 404

    port = free_port()
    app = create_app(server.address, {"gateway.metrics.exporter.prometheus.listen": f"127.0.0.1:{port}"})
    async with served(app) as client:
        assert (await client.get("/ready")).status_code == 200

        def scrape() -> Any:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                return answer.read().decode()

        text = await asyncio.to_thread(scrape)
        assert samples(text, "fluss_gateway_rest_requests_total")
    with pytest.raises(OSError):
        await asyncio.to_thread(scrape)  # closed with the gateway

    with pytest.raises(ValueError, match=r"gateway\.metrics\.enabled"):
        create_app(server.address, {"gateway.metrics.enabled": "maybe"})
