"""Single lookups beside a client whose batched lookups miss the row cache, in one run: what a cold read
costs everyone else on the server.

A ``strom server`` (``--workers 1``, a 16 MiB row cache) holds a small table, whose rows the cache keeps,
and a large one (``--rows``, 1 M by default, ~150 MB), which it cannot. One client looks the small table's
keys up one at a time through the blocking lookuper (``--singles`` of them; p50, p90, p99, p99.9 and the
longest): alone, then while another process keeps looking up 1 000 random keys of the large table with
``lookup_arrow``, and so on for ``--rounds`` pairs. The single lookups alone are the ceiling; the pairs say
how far a cold reader moves them. A RocksDB read of keys no cache holds takes milliseconds; where it runs
on the event loop, every request that arrives meanwhile waits for it.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import time
from typing import Any

import numpy as np
import pyarrow as pa

from bench.harness import BenchServer, create_loaded_table, percentile, report
from bench.peers_bench import make_rows
from strom.client import Connection, Lookuper, TablePath

SMALL_ROWS = 10_000
BATCH_KEYS = 1_000
COLD_CACHE = "16mb"
BIG, SMALL = TablePath("fluss", "big"), TablePath("fluss", "small")
COLD_WARM_UP_S = 2.0
"""How long the cold reader runs before the single lookups start."""


def cold_reader(address: str, rows: int, stop: Any, keys_read: Any) -> None:
    """Look up 1 000 random keys of the large table at a time until ``stop`` is set."""
    async def run() -> None:
        async with await Connection.create(address) as connection:
            lookuper = (await connection.get_table(BIG)).new_lookup().create_lookuper()
            assert isinstance(lookuper, Lookuper)
            rng = np.random.default_rng(3)
            count = 0
            while not stop.is_set():
                await lookuper.lookup_arrow(pa.table({"id": pa.array(rng.integers(0, rows, BATCH_KEYS), pa.int64())}))
                count += BATCH_KEYS
            keys_read.value = count

    asyncio.run(run())


async def load(address: str, rows: int) -> None:
    big = make_rows(rows, seed=5)
    async with await Connection.create(address) as connection:
        for path, table in ((BIG, big), (SMALL, big.slice(0, SMALL_ROWS))):
            await create_loaded_table(connection, path, table, buckets=2, batch_rows=10_000)


async def single_lookups(address: str, keys: list[int]) -> list[float]:
    """Latencies (µs) of one blocking lookup after another of the small table."""
    async with await Connection.create(address) as connection:
        table = await connection.get_table(SMALL)

        def blocking() -> list[float]:
            latencies = []
            with table.new_lookup().create_blocking_lookuper() as lookuper:
                for key in keys[:1_000]:  # connect and warm up
                    lookuper.lookup({"id": key})
                for key in keys:
                    begin = time.perf_counter_ns()
                    lookuper.lookup({"id": key})
                    latencies.append((time.perf_counter_ns() - begin) / 1_000)
            return latencies

        return await asyncio.to_thread(blocking)


def describe(latencies: list[float]) -> str:
    latencies = sorted(latencies)
    return (f"p50 {percentile(latencies, 0.5):,.0f}  p90 {percentile(latencies, 0.9):,.0f}  p99 "
            f"{percentile(latencies, 0.99):,.0f}  p99.9 {percentile(latencies, 0.999):,.0f}  longest "
            f"{latencies[-1]:,.0f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the large table")
    parser.add_argument("--singles", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    keys = random.Random(7).choices(range(SMALL_ROWS), k=args.singles)
    context = multiprocessing.get_context("spawn")
    lines = []
    with BenchServer({"kv.snapshot.interval": "0s", "kv.row-cache.size": COLD_CACHE}) as server:
        asyncio.run(load(server.address, args.rows))
        for round_ in range(1, args.rounds + 1):
            lines.append((f"round {round_}: alone", describe(asyncio.run(single_lookups(server.address, keys)))))
            stop, keys_read = context.Event(), context.Value("q", 0)
            reader = context.Process(target=cold_reader, args=(server.address, args.rows, stop, keys_read))
            reader.start()
            try:
                time.sleep(COLD_WARM_UP_S)
                started = time.perf_counter()
                beside = asyncio.run(single_lookups(server.address, keys))
                seconds = time.perf_counter() - started + COLD_WARM_UP_S
            finally:
                stop.set()
                reader.join()
            assert reader.exitcode == 0, f"the cold reader failed with {reader.exitcode}"
            lines.append((f"round {round_}: beside cold lookup_arrow", describe(beside)))
            lines.append((f"round {round_}: the cold reader", f"{keys_read.value / seconds:,.0f} keys/s"))
    report(f"single lookups beside a cold batched reader: {args.rows:,} cold rows, {COLD_CACHE} row cache, "
           f"{args.singles:,} singles", lines)


if __name__ == "__main__":
    main()
