"""A serving process's cycle collector: start-up's objects frozen, the youngest generation collected less
often; and in a real server process under load, few young collections (``python_gc_*`` metrics)."""

from __future__ import annotations

import asyncio
import gc
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.server.collector import YOUNG_GENERATION_THRESHOLD, tune_for_serving
from tests.server_process import ServerProcess, free_port


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_serving_freezes_what_lives_and_collects_the_young_generation_less_often(restored_collector: None) -> None:
    assert gc.get_freeze_count() == 0
    alive = [[index] for index in range(1000)]  # containers alive at start-up
    _, middle, oldest = gc.get_threshold()
    tune_for_serving()
    assert gc.get_freeze_count() >= len(alive)
    assert gc.get_threshold() == (YOUNG_GENERATION_THRESHOLD, middle, oldest)
    assert gc.get_threshold()[0] > 700  # CPython's default
    cycle: list[object] = []
    cycle.append(cycle)  # new cycles are still collected
    del cycle
    assert gc.collect() >= 1


BUCKETS = 32


def _young_collections(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    (line,) = [line for line in body.splitlines() if line.startswith('python_gc_collections_total{generation="0"}')]
    return float(line.rsplit(" ", 1)[1])


async def _upsert(address: str, rows: int) -> None:
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", "collected")
        schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=BUCKETS))
        writer = (await connection.get_table(path)).new_upsert().create_writer()
        for round_ in range(2):  # a load, then an update of every row
            for start in range(0, rows, 10_000):
                ids = list(range(start, start + 10_000))
                writer.upsert_arrow_batch(pa.table({"id": ids, "v": [f"v{i}.{round_}" for i in ids]}))
        await writer.flush()


def test_a_loaded_server_process_runs_few_young_collections(tmp_path: Path) -> None:
    """A load and an update of 300 000 rows over 32 buckets cost a server with CPython's default threshold
    ~70 young collections; the serving process runs none or a few."""
    metrics_port = free_port()
    server = ServerProcess(tmp_path / "data", {"kv.snapshot.interval": "0s",
                                               "metrics.reporter.prometheus.port": str(metrics_port)}).start()
    try:
        before = _young_collections(metrics_port)
        asyncio.run(_upsert(server.address, 300_000))
        assert _young_collections(metrics_port) - before <= 10
    finally:
        assert server.stop() == 0, server.log_text()[-3000:]
