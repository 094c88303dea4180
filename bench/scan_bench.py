"""Server-side KV scans (ScanKv) vs raw rocksdict iteration of the same bucket data, and server memory.

The raw ceiling iterates the values of a RocksDB holding the same stored values, in-process. The server
path is a full ScanKv of a one-bucket table through strom's client, rows decoded into Arrow batches.
Memory: the server's resident size is sampled while scanning a table, then a table ten times larger; a
scan holds one iterator and one batch, so the second scan should need no more memory than the first.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import threading
import time

import pyarrow as pa

from bench.harness import BenchServer, create_loaded_table, load_raw_rocksdb, report
from bench.ingest_bench import make_rows
from strom.client import Connection, Schema, TablePath


def raw_iteration(rows: pa.Table, schema: Schema) -> float:
    directory = tempfile.mkdtemp(prefix="strom-raw-")
    try:
        db, _keys, _rate = load_raw_rocksdb(rows, schema, directory)
        db.flush()
        start = time.perf_counter()
        count = sum(1 for _ in db.values())
        rate = count / (time.perf_counter() - start)
        db.close()
        return rate
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def load(address: str, rows: pa.Table, name: str) -> None:
    async with await Connection.create(address) as connection:
        await create_loaded_table(connection, TablePath("fluss", name), rows, buckets=1, batch_rows=20_000)


async def scan(address: str, name: str) -> tuple[int, float]:
    async with await Connection.create(address) as connection:
        table = await connection.get_table(TablePath("fluss", name))
        scanner = table.new_scan().create_bucket_batch_scanner(table.bucket(0))
        count = 0
        start = time.perf_counter()
        async for batch in scanner:
            count += batch.num_rows
        return count, count / (time.perf_counter() - start)


def scan_with_memory(server: BenchServer, name: str) -> tuple[int, float, int]:
    """Scan while sampling the server's resident memory; returns rows, rows/s and the peak RSS growth."""
    baseline, _ = server.rss_bytes()
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server.rss_bytes()[0])
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        count, rate = asyncio.run(scan(server.address, name))
    finally:
        done.set()
        sampler.join()
    return count, rate, peak[0] - baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    small_rows = make_rows(args.rows // 10, seed=5)
    rows = make_rows(args.rows, seed=6)
    schema = Schema.from_arrow(rows.schema, primary_key=["id"])
    raw = raw_iteration(rows, schema)
    with BenchServer({"kv.snapshot.interval": "0s"}) as server:
        asyncio.run(load(server.address, small_rows, "scan_small"))
        asyncio.run(load(server.address, rows, "scan_large"))
        scan_with_memory(server, "scan_small")  # warm-up: first-use allocations are not the scan's
        small_count, _small_rate, small_growth = scan_with_memory(server, "scan_small")
        count, rate, growth = scan_with_memory(server, "scan_large")
    assert count == args.rows and small_count == args.rows // 10
    report(
        f"full ScanKv of a {args.rows:,}-row bucket",
        [
            ("raw rocksdict value iteration (ceiling)", f"{raw:,.0f} rows/s"),
            ("ScanKv through the server, Arrow batches", f"{rate:,.0f} rows/s  ratio {rate / raw:.2f} (target ≥ 0.5)"),
            (f"server RSS growth scanning {args.rows // 10:,} rows", f"{small_growth / 2**20:.1f} MiB"),
            (f"server RSS growth scanning {args.rows:,} rows", f"{growth / 2**20:.1f} MiB (flat: a session holds one batch)"),
        ],
    )


if __name__ == "__main__":
    main()
