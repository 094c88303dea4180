"""Single lookups beside a client whose batched lookups or updates miss the row cache, in one run: what a
cold read costs everyone else on the server.

A ``strom server`` (``--workers 1``, a 16 MiB row cache) holds a small table, whose rows the cache keeps,
and a large one (``--rows``, 1 M by default, ~150 MB), which it cannot. One client looks the small table's
keys up one at a time through the blocking lookuper (``--singles`` of them; p50, p90, p99, p99.9 and the
longest): alone, then while another process keeps looking up 1 000 random keys of the large table with
``lookup_arrow`` (``--beside lookups``), or keeps updating 10 000 random rows of it at a time, pipelined,
with the table's FULL changelog (``--beside updates``: each update reads the rows' old values), and so on
for ``--rounds`` rounds. The single lookups alone are the ceiling; the others say how far a cold reader
moves them. A RocksDB read of keys no cache holds takes milliseconds; where it runs on the event loop,
every request that arrives meanwhile waits for it.
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


UPDATE_ROWS = 10_000
UPDATE_BATCHES = 10
"""Batches a cold updater sends before it waits for their acknowledgements."""


def cold_updater(address: str, rows: int, stop: Any, rows_written: Any) -> None:
    """Upsert 10 000 random rows of the large table at a time (new payloads), until ``stop`` is set."""
    async def run() -> None:
        rng = np.random.default_rng(4)
        payloads = make_rows(UPDATE_ROWS, seed=6).column("payload")
        batches = [pa.table({"id": pa.array(rng.integers(0, rows, UPDATE_ROWS), pa.int64()), "payload": payloads})
                   for _ in range(UPDATE_BATCHES)]
        async with await Connection.create(address) as connection:
            writer = (await connection.get_table(BIG)).new_upsert().create_writer()
            count = 0
            while not stop.is_set():
                for batch in batches:
                    writer.upsert_arrow_batch(batch)  # pipelined; flush waits for their acknowledgements
                await writer.flush()
                count += UPDATE_ROWS * UPDATE_BATCHES
            rows_written.value = count

    asyncio.run(run())


NEIGHBOURS = {"lookups": ("cold lookup_arrow", "keys/s", cold_reader),
              "updates": ("cold FULL updates", "rows/s", cold_updater)}


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
    parser.add_argument("--beside", default="lookups,updates", help="the cold neighbours, in each round")
    args = parser.parse_args()
    neighbours = [NEIGHBOURS[name] for name in args.beside.split(",")]
    keys = random.Random(7).choices(range(SMALL_ROWS), k=args.singles)
    context = multiprocessing.get_context("spawn")
    lines = []
    with BenchServer({"kv.snapshot.interval": "0s", "kv.row-cache.size": COLD_CACHE}) as server:
        asyncio.run(load(server.address, args.rows))
        for round_ in range(1, args.rounds + 1):
            lines.append((f"round {round_}: alone", describe(asyncio.run(single_lookups(server.address, keys)))))
            for label, unit, neighbour in neighbours:
                stop, done = context.Event(), context.Value("q", 0)
                cold = context.Process(target=neighbour, args=(server.address, args.rows, stop, done))
                cold.start()
                try:
                    time.sleep(COLD_WARM_UP_S)
                    started = time.perf_counter()
                    beside = asyncio.run(single_lookups(server.address, keys))
                    seconds = time.perf_counter() - started + COLD_WARM_UP_S
                finally:
                    stop.set()
                    cold.join()
                assert cold.exitcode == 0, f"the {label} process failed with {cold.exitcode}"
                lines.append((f"round {round_}: beside {label}", describe(beside)))
                lines.append((f"round {round_}: the {label} themselves", f"{done.value / seconds:,.0f} {unit}"))
    report(f"single lookups beside cold neighbours: {args.rows:,} cold rows, {COLD_CACHE} row cache, "
           f"{args.singles:,} singles", lines)


if __name__ == "__main__":
    main()
