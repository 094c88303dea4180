"""Point lookups through the server vs raw rocksdict gets of the same keys.

* batched: keys looked up 1 000 per call (strom client ``lookup_arrow``, Arrow in and out, and
  ``lookup_many``, dicts; one Lookup RPC per bucket leader) vs rocksdict multi-get of 1 000 keys — ratio
  server / raw;
* single: one key per request, sequential, over one connection — strom's asyncio client and its blocking
  lookuper (no event loop in the path) — p50 and p99 latency; the round trip itself dominates (peers.md:
  ~60 µs of VM wake-up per round trip on an idle machine).
pyfluss's lookuper batches lookups in the client with a fixed 100 ms window, which Python cannot
configure, so its single-lookup latency is that window; it is reported for completeness.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time

import pyarrow as pa

from bench.harness import BenchServer, load_raw_rocksdb, median, percentile, report
from bench.ingest_bench import make_rows
from strom.client import Connection, Schema, TableDescriptor, TablePath

BATCH_KEYS = 1_000


def raw_multiget(rows: pa.Table, schema: Schema, lookups: list[int]) -> float:
    directory = tempfile.mkdtemp(prefix="strom-raw-")
    try:
        db, keys, _rate = load_raw_rocksdb(rows, schema, directory)
        db.flush()
        wanted = [keys[i] for i in lookups]
        start = time.perf_counter()
        for offset in range(0, len(wanted), BATCH_KEYS):
            db.get(wanted[offset : offset + BATCH_KEYS])
        elapsed = time.perf_counter() - start
        db.close()
        return len(wanted) / elapsed
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def server_lookups(
    address: str, rows: pa.Table, schema: Schema, lookups: list[int], singles: int
) -> tuple[float, float, list[float], list[float]]:
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", "lookups")
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        for batch in rows.to_batches(max_chunksize=20_000):
            writer.upsert_arrow_batch(batch)
        await writer.flush()
        lookuper = table.new_lookup().create_lookuper()
        key_table = pa.table({"id": pa.array(lookups, pa.int64())})
        start = time.perf_counter()
        for offset in range(0, len(lookups), BATCH_KEYS):
            found = await lookuper.lookup_arrow(key_table.slice(offset, BATCH_KEYS))
            assert found.num_rows == min(BATCH_KEYS, len(lookups) - offset)
        batched = len(lookups) / (time.perf_counter() - start)
        keys = [{"id": i} for i in lookups]
        start = time.perf_counter()
        for offset in range(0, len(keys), BATCH_KEYS):
            rows = await lookuper.lookup_many(keys[offset : offset + BATCH_KEYS])
            assert all(row is not None for row in rows)
        batched_dicts = len(keys) / (time.perf_counter() - start)
        latencies = []
        for key in keys[:singles]:
            begin = time.perf_counter_ns()
            await lookuper.lookup(key)
            latencies.append((time.perf_counter_ns() - begin) / 1000)

        def blocking() -> list[float]:
            measured = []
            with table.new_lookup().create_blocking_lookuper() as blocking_lookuper:
                for key in keys[:singles]:
                    begin = time.perf_counter_ns()
                    blocking_lookuper.lookup(key)
                    measured.append((time.perf_counter_ns() - begin) / 1000)
            return measured

        return batched, batched_dicts, latencies, await asyncio.to_thread(blocking)


async def pyfluss_single(address: str, lookups: list[int], count: int) -> list[float]:
    import fluss

    connection = await fluss.FlussConnection.create(fluss.Config({"bootstrap.servers": address}))
    try:
        table = await connection.get_table(fluss.TablePath("fluss", "lookups"))
        lookuper = table.new_lookup().create_lookuper()
        latencies = []
        for i in lookups[:count]:
            begin = time.perf_counter_ns()
            await lookuper.lookup({"id": i})
            latencies.append((time.perf_counter_ns() - begin) / 1000)
        return latencies
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--lookups", type=int, default=100_000)
    parser.add_argument("--singles", type=int, default=20_000)
    args = parser.parse_args()
    rows = make_rows(args.rows, seed=2)
    schema = Schema.from_arrow(rows.schema, primary_key=["id"])
    rng = random.Random(3)
    lookups = [rng.randrange(args.rows) for _ in range(args.lookups)]
    raw = raw_multiget(rows, schema, lookups)
    with BenchServer({"kv.snapshot.interval": "0s"}) as server:
        batched, batched_dicts, latencies, blocking = asyncio.run(
            server_lookups(server.address, rows, schema, lookups, args.singles)
        )
        official = asyncio.run(pyfluss_single(server.address, lookups, 20))
    report(
        f"point lookups, {args.rows:,}-row table",
        [
            ("raw rocksdict multi-get of 1 000 (ceiling)", f"{raw:,.0f} keys/s"),
            ("strom, lookup_arrow of 1 000 (Arrow in/out)", f"{batched:,.0f} keys/s  ratio {batched / raw:.2f}"),
            ("strom, lookup_many of 1 000 (dicts)", f"{batched_dicts:,.0f} keys/s  ratio {batched_dicts / raw:.2f}"),
            ("  peers: PostgreSQL = ANY / Redis MGET", "292,208 / 638,610 keys/s (peers.md)"),
            ("strom, single lookups (asyncio client), p50 / p99",
             f"{median(latencies):.0f} / {percentile(latencies, 0.99):.0f} µs (target ≤ 100 / ≤ 200 µs)"),
            ("strom, single lookups (blocking lookuper), p50 / p99",
             f"{median(blocking):.0f} / {percentile(blocking, 0.99):.0f} µs (target ≤ 100 / ≤ 200 µs)"),
            ("  peers: PostgreSQL / Redis single lookups, p50 / p99", "94.6 / 174.1 µs, 108.1 / 202.4 µs (peers.md)"),
            ("pyfluss, single lookups, p50", f"{median(official) / 1000:.1f} ms (its client waits up to 100 ms to batch)"),
        ],
    )


if __name__ == "__main__":
    main()
