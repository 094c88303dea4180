"""Fluss's cooperative KV back-pressure and PutKv's ``agg_mode`` through a real server.

The level-0 signal: with ``kv.backpressure.l0-slowdown-trigger`` at 1, every KV snapshot's memtable flush
leaves a level-0 file, and puts start carrying ``pressure``; strom's client pauses the bucket for it, the
metrics show it, and the official client (pyfluss) keeps writing through it. ``agg_mode`` OVERWRITE writes
past an aggregation merge engine.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, TableBucket
from strom.ids import TablePath
from strom.records.schema import Schema, TableDescriptor
from tests.conftest import unique_name
from tests.integration.pyfluss_support import create_table
from tests.server_process import free_port

pytestmark = pytest.mark.timeout(120)

FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
DEADLINE_S = 60.0


def metric(port: int, name: str, table: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{table="{table}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_level0_files_make_puts_carry_pressure_and_writers_pause(server_factory: Any) -> None:
    metrics_port = free_port()
    server = server_factory({
        "kv.backpressure.l0-slowdown-trigger": "1",
        "kv.snapshot.interval": "1s",
        "metrics.reporter.prometheus.port": str(metrics_port),
    })

    async def run() -> tuple[float, float]:
        config = {"bootstrap.servers": server.address, "client.writer.kv-backpressure.max-throttle": "20s"}
        async with await Connection.create(config) as connection:
            path = TablePath("fluss", unique_name("pressured"))
            await connection.get_admin().create_table(
                path, TableDescriptor(Schema.from_arrow(FIELDS, ["id"]), bucket_count=1))
            table = await connection.get_table(path)
            bucket = TableBucket(table.layout.info.table_id, 0)
            writer = table.new_upsert().create_writer()
            throttle = connection.write_throttle
            deadline = time.monotonic() + DEADLINE_S
            round_ = 0
            while True:
                assert time.monotonic() < deadline, "no put carried pressure though level-0 files piled up"
                ids = range(round_ * 100, round_ * 100 + 100)
                await writer.upsert_batch(pa.table({"id": list(ids), "v": [f"r{round_}"] * 100}))
                round_ += 1
                if throttle.latest.get(bucket, 0.0) > 0.0:
                    break
                await asyncio.sleep(0.6)  # a snapshot (a flush: one level-0 file) between writes
            pressure = throttle.latest[bucket]
            assert 0.0 < pressure < 1.0
            # the next write of that bucket waits max-throttle * pressure^2 before it goes out
            paused_before = throttle.paused_s
            await writer.upsert_batch(pa.table({"id": [10**6], "v": ["after"]}))
            return pressure, throttle.paused_s - paused_before

    pressure, paused = asyncio.run(run())
    assert paused > 0.0, f"the writer did not pause for pressure {pressure}"
    assert paused <= 20 * pressure * pressure + 0.5


@pytest.mark.asyncio
async def test_pyfluss_writes_through_a_pressured_server(server_factory: Any) -> None:
    """The official client reads past the optional ``pressure`` field and its writes are acknowledged."""
    server = server_factory({"kv.backpressure.l0-slowdown-trigger": "0", "kv.snapshot.interval": "1s"})
    connection = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": server.address}))
    try:
        _path, table = await create_table(connection, list(FIELDS), primary_keys=["id"])
        writer = table.new_upsert().create_writer()
        for round_ in range(4):
            for id_ in range(round_ * 10, round_ * 10 + 10):
                writer.upsert({"id": id_, "v": f"r{round_}"})
            await writer.flush()
            await asyncio.sleep(1.2)  # a snapshot flushes: level 0 passes the trigger of 0 at once
        lookuper = table.new_lookup().create_lookuper()
        assert await lookuper.lookup({"id": 35}) == {"id": 35, "v": "r3"}
    finally:
        await connection.close()


def test_overwrite_mode_bypasses_the_merge_engine(server: Any) -> None:
    """agg_mode OVERWRITE (strom's ``merge_mode("overwrite")``) replaces what the aggregation merged, and
    may delete on a table whose merge engine ignores deletes; the default mode aggregates again after."""
    fields = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("total", pa.int64())])

    async def run() -> list[Any]:
        async with await Connection.create(server.address) as connection:
            path = TablePath("fluss", unique_name("summed"))
            properties = {"table.merge-engine": "aggregation", "fields.total.agg": "sum"}
            await connection.get_admin().create_table(
                path, TableDescriptor(Schema.from_arrow(fields, ["id"]), bucket_count=1, properties=properties))
            table = await connection.get_table(path)
            lookuper = table.new_lookup().create_lookuper()
            seen = []
            summing = table.new_upsert().create_writer()
            for total in (5, 7):
                await summing.upsert_batch(pa.table({"id": [1], "total": [total]}, schema=fields))
            seen.append(await lookuper.lookup({"id": 1}))
            overwriting = table.new_upsert().merge_mode("overwrite").create_writer()
            await overwriting.upsert_batch(pa.table({"id": [1], "total": [100]}, schema=fields))
            seen.append(await lookuper.lookup({"id": 1}))
            await summing.upsert_batch(pa.table({"id": [1], "total": [1]}, schema=fields))
            seen.append(await lookuper.lookup({"id": 1}))
            overwriting.delete({"id": 1})
            await overwriting.flush()
            seen.append(await lookuper.lookup({"id": 1}))
            with pytest.raises(ValueError, match="merge engine"):
                plain = TablePath("fluss", unique_name("plain"))
                await connection.get_admin().create_table(
                    plain, TableDescriptor(Schema.from_arrow(fields, ["id"]), bucket_count=1))
                (await connection.get_table(plain)).new_upsert().merge_mode("overwrite").create_writer()
            return seen

    seen = asyncio.run(run())
    assert seen == [{"id": 1, "total": 12}, {"id": 1, "total": 100}, {"id": 1, "total": 101}, None]


def test_the_backpressure_metrics_name_the_table(server_factory: Any) -> None:
    metrics_port = free_port()
    server = server_factory({"metrics.reporter.prometheus.port": str(metrics_port)})

    async def run() -> str:
        async with await Connection.create(server.address) as connection:
            path = TablePath("fluss", unique_name("measured"))
            await connection.get_admin().create_table(
                path, TableDescriptor(Schema.from_arrow(FIELDS, ["id"]), bucket_count=2))
            writer = (await connection.get_table(path)).new_upsert().create_writer()
            await writer.upsert_batch(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))
            return str(path)

    name = asyncio.run(run())
    assert metric(metrics_port, "strom_kv_backpressure_pressure", name) == 0.0
    assert metric(metrics_port, "strom_kv_backpressure_rejections_total", name) == 0.0
    assert metric(metrics_port, "strom_kv_prewrite_buffer_bytes", name) == 0.0
