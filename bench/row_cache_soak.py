"""Does the row cache stay within ``kv.row-cache.size``? Random updates over a key space much larger than the
cache, once with a bounded cache and once with the cache off, same run: the server's resident memory at the
end and at its peak, the cache's own size (its metric), and the write rate of each.

    .venv/bin/python -m bench.row_cache_soak [--keys 10000000] [--rows 10000000] [--cache 64mb]

Not a test: it prints what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import urllib.request

import numpy as np
import pyarrow as pa

from bench.harness import BenchServer, free_port, report
from strom.client import Connection, Schema, TableDescriptor, TablePath

BATCH_ROWS = 10_000
TABLE = TablePath("fluss", "cache_soak")


async def soak(address: str, keys: int, rows: int) -> float:
    """Upsert ``rows`` rows of random keys in ``[0, keys)``; returns rows/s."""
    rng = np.random.default_rng(3)
    payload = pa.array([b"x" * 100] * BATCH_ROWS, pa.binary()).cast(pa.string())
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())]),
                                   primary_key=["id"])
        await connection.get_admin().create_table(TABLE, TableDescriptor(schema, bucket_count=2))
        writer = (await connection.get_table(TABLE)).new_upsert().create_writer()
        start = time.perf_counter()
        for _ in range(rows // BATCH_ROWS):
            ids = pa.array(rng.integers(0, keys, BATCH_ROWS), pa.int64())
            writer.upsert_arrow_batch(pa.table({"id": ids, "v": payload}))
        await writer.flush()
        return rows / (time.perf_counter() - start)


def metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return next(float(line.split()[-1]) for line in body.splitlines() if line.startswith(name + " "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--cache", default="64mb")
    args = parser.parse_args()
    lines = []
    for cache in (args.cache, "0"):
        port = free_port()
        config = {"kv.snapshot.interval": "0s", "kv.row-cache.size": cache, "metrics.reporter.prometheus.port": str(port)}
        with BenchServer(config) as server:
            rate = asyncio.run(soak(server.address, args.keys, args.rows))
            rss, peak = server.rss_bytes()
            size = metric(port, "strom_kv_row_cache_size_bytes")
            hits, misses = metric(port, "strom_kv_row_cache_hits_total"), metric(port, "strom_kv_row_cache_misses_total")
        ratio = hits / (hits + misses) if hits + misses else 0.0
        lines.append((f"kv.row-cache.size={cache}",
                      f"{rate:,.0f} rows/s, RSS {rss / 2**20:,.0f} MiB (peak {peak / 2**20:,.0f} MiB), cache holds "
                      f"{size / 2**20:,.1f} MiB, hit rate {ratio:.1%}"))
    report(f"row cache soak: {args.rows:,} random upserts over {args.keys:,} keys (100-byte values)", lines)


if __name__ == "__main__":
    main()
