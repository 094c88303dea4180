"""Primary-key equality filters in Spark: point lookups instead of a scan of the whole table.

A primary-key table of ``--rows`` rows (the Spark bench's five columns, 2 buckets, ``table.changelog.image=
WAL``) is loaded with strom's client (pipelined Arrow upserts: it is the fixture, not what is measured), and
once its KV snapshots cover every row Spark runs, through the ``fluss`` source registered with
``strom.spark.register`` (Python filter pushdown on):

* ``WHERE id = k`` and ``WHERE id IN (k1, …, k10)`` with pushdown: the connector turns them into key lookups;
* the same queries with ``read.filter-pushdown=false``: the connector reads the whole table (leased snapshot)
  and Spark filters the rows.

Rows read from strom are Spark's own accounting: the ``numOutputRows`` metric of the query's ``BatchScan``
node in that query's execution (what the Python data source handed to Spark; it filters nothing itself
beyond the lookups). Times are wall-clock ``collect()`` times, best of ``--repeat`` after
one warm-up; strom's client looking up the same keys directly is shown for scale (Spark's fixed cost of a
job is most of the pushed-down time).

    .venv/bin/python -m bench.spark_pushdown_bench [--rows 10000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from bench.harness import BenchServer, report, timed
from bench.spark_bench import random_strings, snapshots_cover_everything
from strom.client import Connection, Schema, TableDescriptor, TablePath

BUCKETS = 2
LOAD_BATCH_ROWS = 65_536
SNAPSHOT_WAIT_S_MAX = 900.0
TABLE = "pushdown_bench"


def row_chunks(count: int, seed: int = 7) -> Iterator[pa.RecordBatch]:
    """The Spark bench's columns, ``LOAD_BATCH_ROWS`` at a time (10 M rows at once would need GBs)."""
    rng = np.random.default_rng(seed)
    for start in range(0, count, LOAD_BATCH_ROWS):
        size = min(LOAD_BATCH_ROWS, count - start)
        yield pa.record_batch({
            "id": pa.array(np.arange(start, start + size, dtype=np.int64)),
            "k": random_strings(rng, size, 16),
            "v1": pa.array(rng.random(size)),
            "v2": pa.array(rng.integers(0, 1 << 40, size=size, dtype=np.int64)),
            "s": random_strings(rng, size, 18),
        })


async def load(address: str, count: int) -> float:
    """Create the table and upsert ``count`` rows through strom's client; returns the load's seconds."""
    async with await Connection.create(address) as connection:
        chunks = row_chunks(count)
        first = next(chunks)
        schema = Schema.from_arrow(first.schema, primary_key=["id"])
        descriptor = TableDescriptor(schema, bucket_count=BUCKETS, properties={"table.changelog.image": "WAL"})
        await connection.get_admin().create_table(TablePath("fluss", TABLE), descriptor)
        writer = (await connection.get_table(TablePath("fluss", TABLE))).new_upsert().create_writer()
        start = time.perf_counter()
        writer.upsert_arrow_batch(first)
        for index, batch in enumerate(chunks, start=1):
            handle = writer.upsert_arrow_batch(batch)
            if index % 8 == 0:
                await handle.wait()  # the client's loop runs while we wait; keeps the queue short
        await writer.flush()
        return time.perf_counter() - start


async def client_lookup(address: str, keys: list[int]) -> float:
    """Seconds for strom's client to look ``keys`` up (connection and table already open)."""
    async with await Connection.create(address) as connection:
        lookuper = (await connection.get_table(TablePath("fluss", TABLE))).new_lookup().create_lookuper()
        request = pa.table({"id": pa.array(keys, pa.int64())})
        await lookuper.lookup_arrow(request)  # type: ignore[union-attr]
        start = time.perf_counter()
        found = await lookuper.lookup_arrow(request)  # type: ignore[union-attr]
        elapsed = time.perf_counter() - start
        assert found.num_rows == len(keys), found.num_rows
        return elapsed


def rows_scanned(df: Any) -> int:
    """``numOutputRows`` of the ``BatchScan`` node in ``df``'s last execution (Spark's count of the rows the
    source produced)."""
    plan = df._jdf.queryExecution().executedPlan()
    pending = [plan]
    while pending:
        node = pending.pop()
        if node.nodeName() == "AdaptiveSparkPlan":
            pending.append(node.finalPhysicalPlan())
            continue
        if node.nodeName().startswith("BatchScan"):
            return int(node.metrics().apply("numOutputRows").value())
        children = node.children().iterator()
        while children.hasNext():
            pending.append(children.next())
    raise RuntimeError(f"no BatchScan in the plan:\n{plan}")


def measure(df: Any, repeat: int, expected: int) -> tuple[float, int]:
    rows = df.collect()  # warm-up: Python workers started, imports loaded
    assert len(rows) == expected, (len(rows), expected)
    seconds = min(timed(df.collect) for _ in range(repeat))
    return seconds, rows_scanned(df)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from pyspark.sql import functions as F

    from bench.spark_bench import local_spark
    from strom.spark import register

    rng = np.random.default_rng(11)
    one = int(rng.integers(0, args.rows))
    ten = sorted(int(k) for k in rng.choice(args.rows, size=10, replace=False))
    results: list[tuple[str, str]] = []
    with BenchServer({"kv.snapshot.interval": "5s", "kv.snapshot.num-retained": "1"}) as server:
        load_s = asyncio.run(load(server.address, args.rows))
        deadline = time.monotonic() + SNAPSHOT_WAIT_S_MAX
        while not asyncio.run(snapshots_cover_everything(server.address, TABLE)):
            if time.monotonic() > deadline:
                raise SystemExit("the KV snapshots did not catch up with the load")
            time.sleep(1.0)
        results.append(("load (strom client, WAL image)", f"{load_s:7.2f} s  {args.rows / load_s:>12,.0f} rows/s"))
        spark = local_spark("strom-spark-pushdown-bench")
        register(spark)
        try:
            options = {"bootstrap.servers": server.address, "table": f"fluss.{TABLE}"}
            for label, keys in ((f"id = {one}", [one]), ("id IN (10 keys)", ten)):
                condition = F.col("id") == keys[0] if len(keys) == 1 else F.col("id").isin(keys)
                for pushdown in ("true", "false"):
                    df = (
                        spark.read.format("fluss").options(**options).option("read.filter-pushdown", pushdown)
                        .load().where(condition)
                    )
                    repeat = args.repeat if pushdown == "true" else max(1, args.repeat - 1)
                    seconds, scanned = measure(df, repeat, len(keys))
                    mode = "pushdown (key lookups)" if pushdown == "true" else "no pushdown (full scan)"
                    results.append((
                        f"{label}: {mode}",
                        f"{seconds:7.2f} s  rows read from strom {scanned:>12,}",
                    ))
                lookup_s = asyncio.run(client_lookup(server.address, keys))
                results.append((f"{label}: strom client lookup_arrow", f"{lookup_s * 1000:7.2f} ms"))
        finally:
            spark.stop()
    report(f"Spark primary-key filters, {args.rows:,}-row table, {BUCKETS} buckets, local[2]", results)


if __name__ == "__main__":
    main()
