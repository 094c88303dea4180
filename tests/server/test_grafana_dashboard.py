"""The Grafana dashboard in dashboards/grafana/strom.json against what a real server and a real gateway
export: every metric its queries name exists, and every ``strom_*`` family of the server and every
``fluss_gateway_*`` family of the gateway is on it (a new metric needs a panel)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa

from strom.client import Connection, Schema, TableDescriptor, TablePath
from tests.conftest import unique_name
from tests.gateway.support import served
from tests.server_process import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "grafana" / "strom.json"
METRIC = re.compile(r"\bstrom_[a-z0-9_]+")
GATEWAY_METRIC = re.compile(r"\bfluss_gateway_[a-z0-9_]+")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def _queries(node: Any) -> list[str]:
    """Every PromQL expression of the dashboard (panel targets and template variables)."""
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        if node.get("type") == "query" and isinstance(node.get("query"), str):
            found.append(node["query"])
        return found + [q for value in node.values() for q in _queries(value)]
    if isinstance(node, list):
        return [q for value in node for q in _queries(value)]
    return []


def _exported(port: int) -> dict[str, str]:
    """Metric family → type, from the ``# TYPE`` lines a scrape returns."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (strom_\S+) (\w+)$", text, re.MULTILINE)}


def test_the_dashboard_uses_every_strom_metric_and_no_other(server_factory: Any) -> None:
    port = free_port()
    server = server_factory({"metrics.reporter.prometheus.port": str(port), "kv.snapshot.interval": "0s"})

    async def write() -> None:
        async with await Connection.create(server.address) as connection:
            path = TablePath("fluss", unique_name("dashboard"))
            fields = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
            await connection.get_admin().create_table(path, TableDescriptor(Schema.from_arrow(fields, ["id"])))
            writer = (await connection.get_table(path)).new_upsert().create_writer()
            await writer.upsert_batch(pa.table({"id": [1, 2], "v": ["a", "b"]}))

    asyncio.run(write())
    exported = _exported(port)  # a counter's family is named with its _total suffix in the text format
    named = set()
    for query in _queries(json.loads(DASHBOARD.read_text())):
        for name in METRIC.findall(query):
            assert name in exported, f"the dashboard queries {name}, which no strom server exports"
            named.add(name)
    assert set(exported) - named == set(), "metric families without a panel on the dashboard"


def test_the_dashboard_uses_every_gateway_metric_and_no_other(server: Any) -> None:
    from strom.gateway.app import create_app

    async def scrape() -> str:
        app = create_app(server.address, {})
        async with served(app) as client:
            assert (await client.get("/v1/databases")).status_code == 200
            return (await client.get("/metrics")).text

    text = asyncio.run(scrape())
    exported = {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (fluss_gateway_\S+) (\w+)$", text, re.MULTILINE)}
    assert exported, "the gateway exports FIP-49's families"
    named = set()
    for query in _queries(json.loads(DASHBOARD.read_text())):
        for name in GATEWAY_METRIC.findall(query):
            family = next((name.removesuffix(suffix) for suffix in HISTOGRAM_SERIES
                           if name.endswith(suffix) and exported.get(name.removesuffix(suffix)) == "histogram"), name)
            assert family in exported, f"the dashboard queries {name}, which the gateway does not export"
            named.add(family)
    assert set(exported) - named == set(), "gateway metric families without a panel on the dashboard"
