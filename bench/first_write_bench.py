"""A new table and its first write: how long they take, and what they cost the server's other clients.

A new primary-key table's buckets open when the server is told to lead them (``--workers`` > 1: its
NotifyLeaderAndIsr) or on their first write (``--workers 1``): each opens its log and creates its RocksDB
(~7 ms here, mostly RocksDB's fsyncs). A ``strom server`` (``--workers``, 1 by default) holds a small table
that one process keeps looking up, one key at a time, through the blocking lookuper. Meanwhile this
process creates ``--tables`` new tables of ``--buckets`` buckets, one after another, and writes one batch of
10 000 rows into each. It reports how long each took from the start of CreateTable until the first write
was acknowledged, and the single lookups that began meanwhile, beside those that began at any other time:
every request that reaches an event loop while a bucket opens on it waits for the open.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from typing import Any

import numpy as np

from bench.harness import BenchServer, create_loaded_table, median, percentile, report
from bench.peers_bench import make_rows
from strom.client import Connection, Schema, TableDescriptor, TablePath

SMALL = TablePath("fluss", "small")
SMALL_ROWS = 10_000
FIRST_BATCH_ROWS = 10_000
BETWEEN_TABLES_S = 0.3
PROBE_WARM_UP_S = 1.0


def probe(address: str, ready: Any, stop: Any, results: Any) -> None:
    """Look up one random key of the small table after another until ``stop`` is set; put each lookup's
    (start on the monotonic clock, latency in µs) to ``results``."""
    async def table() -> Any:
        async with await Connection.create(address) as connection:
            handle = await connection.get_table(SMALL)
            rng = np.random.default_rng(5)
            timings: list[tuple[float, float]] = []
            with handle.new_lookup().create_blocking_lookuper() as lookuper:
                for key in rng.integers(0, SMALL_ROWS, 1_000):  # connect and warm up
                    lookuper.lookup({"id": int(key)})
                ready.set()
                while not stop.is_set():
                    key = int(rng.integers(0, SMALL_ROWS))
                    begin = time.monotonic()
                    lookuper.lookup({"id": key})
                    timings.append((begin, (time.monotonic() - begin) * 1e6))
            return timings

    results.put(asyncio.run(table()))


async def first_writes(address: str, tables: int, buckets: int) -> list[tuple[float, float, float]]:
    """(created, write begun, acknowledged) on the monotonic clock for each new table: from the start of
    CreateTable to the acknowledgement of its first write."""
    rows = make_rows(FIRST_BATCH_ROWS, seed=9)
    windows = []
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(rows.schema, primary_key=["id"])
        for number in range(tables):
            path = TablePath("fluss", f"new_{number}")
            created = time.monotonic()
            await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=buckets))
            writer = (await connection.get_table(path)).new_upsert().create_writer()
            begin = time.monotonic()
            writer.upsert_arrow_batch(rows)
            await writer.flush()
            windows.append((created, begin, time.monotonic()))
            await asyncio.sleep(BETWEEN_TABLES_S)
    return windows


async def load(address: str) -> None:
    async with await Connection.create(address) as connection:
        await create_loaded_table(connection, SMALL, make_rows(SMALL_ROWS, seed=5), buckets=2, batch_rows=10_000)


def describe(latencies: list[float]) -> str:
    if not latencies:
        return "none"
    latencies = sorted(latencies)
    return (f"{len(latencies):,} lookups: p50 {percentile(latencies, 0.5):,.0f}  p99 {percentile(latencies, 0.99):,.0f}"
            f"  longest {latencies[-1]:,.0f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--tables", type=int, default=5)
    parser.add_argument("--buckets", type=int, default=32)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    with BenchServer({"kv.snapshot.interval": "0s"}, workers=args.workers) as server:
        asyncio.run(load(server.address))
        ready, stop, results = context.Event(), context.Event(), context.Queue()
        prober = context.Process(target=probe, args=(server.address, ready, stop, results))
        prober.start()
        try:
            assert ready.wait(60), "the probe did not start"
            time.sleep(PROBE_WARM_UP_S)
            windows = asyncio.run(first_writes(server.address, args.tables, args.buckets))
        finally:
            stop.set()
        timings = results.get(timeout=60)
        prober.join()
    assert prober.exitcode == 0, f"the probe failed with {prober.exitcode}"
    def within(begin: float) -> bool:
        return any(created <= begin <= end for created, _write, end in windows)

    during = [latency for begin, latency in timings if within(begin)]
    other = [latency for begin, latency in timings if not within(begin)]
    whole = [(end - created) * 1000 for created, _write, end in windows]
    write = [(end - begun) * 1000 for _created, begun, end in windows]
    report(f"a new table and its first write: {args.tables} tables of {args.buckets} buckets, --workers "
           f"{args.workers}, {FIRST_BATCH_ROWS:,} rows each", [
        ("created and first write acknowledged after", f"median {median(whole):,.0f} ms  (" +
         ", ".join(f"{t:,.0f}" for t in whole) + ")"),
        ("of which the first write", f"median {median(write):,.0f} ms"),
        ("single lookups begun meanwhile", describe(during)),
        ("single lookups begun at other times", describe(other)),
    ])


if __name__ == "__main__":
    main()
