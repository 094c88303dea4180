"""A server restarted after kill -9: how soon it answers, and what its recovery costs the other clients.

RocksDB's WAL is off (the changelog, fsynced first, is the write-ahead record), so after a crash each
primary-key bucket's RocksDB comes back at its last flush and the changelog since is replayed into it,
~2 µs a record here. A ``strom server --workers 1`` takes ``--rows`` upserts into a table of ``--buckets``
buckets (no memtable fills, so all of them replay) and a small table, and is killed with SIGKILL. Then it is
started again on the same directory, and at once:

- one process looks up single keys of the small table through the blocking lookuper, one after another;
- this process looks up 1 000 keys of the large table (``lookup_arrow``), which waits for its buckets'
  replays.

Reported: when the small table's first lookup and the large table's were answered after the restart, and
the single lookups begun while the large table recovered beside those begun after it had (same run).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.cluster_bench import PATH, create, run_writers, write_range
from bench.first_write_bench import describe
from bench.harness import BenchServer, create_loaded_table, report
from bench.peers_bench import make_rows
from strom.client import Connection, Lookuper, TablePath

SMALL = TablePath("fluss", "small")
SMALL_ROWS = 1_000
AFTER_S = 2.0
LOOKUP_KEYS = 1_000
CONFIG = {"kv.snapshot.interval": "0s"}


def probe(address: str, stop: Any, results: Any) -> None:
    """Look up single keys of the small table from the restart on until ``stop`` is set; put each lookup's
    (start on the monotonic clock, latency in µs) to ``results``."""
    async def run() -> list[tuple[float, float]]:
        timings: list[tuple[float, float]] = []
        async with await Connection.create(address) as connection:
            handle = await connection.get_table(SMALL)
            rng = np.random.default_rng(3)
            with handle.new_lookup().create_blocking_lookuper() as lookuper:
                while not stop.is_set():
                    key = int(rng.integers(0, SMALL_ROWS))
                    begin = time.monotonic()
                    assert lookuper.lookup({"id": key}) is not None
                    timings.append((begin, (time.monotonic() - begin) * 1e6))
        return timings

    results.put(asyncio.run(run()))


async def load(address: str) -> None:
    async with await Connection.create(address) as connection:
        await create_loaded_table(connection, SMALL, make_rows(SMALL_ROWS, seed=3), buckets=1, batch_rows=SMALL_ROWS)


async def first_lookup(address: str, rows: int) -> float:
    """The large table's first lookup after the restart: when it was answered (monotonic clock)."""
    async with await Connection.create(address) as connection:
        lookuper = (await connection.get_table(PATH)).new_lookup().create_lookuper()
        assert isinstance(lookuper, Lookuper)
        keys = pa.table({"id": pa.array(np.linspace(0, rows - 1, LOOKUP_KEYS, dtype=np.int64))})
        found = await lookuper.lookup_arrow(keys)
        assert found.num_rows == keys.num_rows, "the restarted server lost rows"
        return time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--buckets", type=int, default=32)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="strom-crash-bench-") as temporary:
        data = Path(temporary) / "data"
        with BenchServer(CONFIG, data_dir=data) as server:
            asyncio.run(create(server.address, args.buckets))
            asyncio.run(load(server.address))
            run_writers(write_range, server.address, args.rows, 2, 10_000)
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()
        with BenchServer(CONFIG, data_dir=data) as server:
            restarted = time.monotonic()
            stop, results = context.Event(), context.Queue()
            prober = context.Process(target=probe, args=(server.address, stop, results))
            prober.start()
            try:
                recovered = asyncio.run(first_lookup(server.address, args.rows))
                time.sleep(AFTER_S)
            finally:
                stop.set()
            timings = results.get(timeout=60)
            prober.join()
    assert prober.exitcode == 0, f"the probe failed with {prober.exitcode}"
    first_small = min(begin + latency / 1e6 for begin, latency in timings)
    during = [latency for begin, latency in timings if begin <= recovered]
    after = [latency for begin, latency in timings if begin > recovered]
    report(f"kill -9 after {args.rows:,} upserts into {args.buckets} buckets, then a restart (--workers 1)", [
        ("the small table's first lookup answered after", f"{(first_small - restarted) * 1000:,.0f} ms"),
        ("the large table's first lookup answered after", f"{(recovered - restarted) * 1000:,.0f} ms"),
        ("single lookups of the small table begun meanwhile", describe(during)),
        ("... begun once the large table had recovered", describe(after)),
    ])


if __name__ == "__main__":
    main()
