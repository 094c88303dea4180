"""Resident memory of ``strom server`` under a steady mixed load: does it plateau?

The load repeats, for ``--seconds``: upserts into a primary-key table over a bounded key space (so the
state stops growing once every key exists), lookups, appends to a log table, a changelog poll, a full
KV scan of a small table, a snapshot lease acquired and dropped, and a new connection opened and closed.
RSS is sampled every ``--sample-seconds``; the report gives it over time and its growth rate in the
first and the second half. A plateau shows as a second-half rate near zero (allocator noise aside).

Not a test: it prints what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import pyarrow as pa

from bench.harness import BenchServer
from strom.client import Connection, Schema, TableDescriptor, TablePath

KEYS = 50_000


async def _load(address: str, seconds: float, sample_s: float, server: BenchServer) -> list[tuple[float, int]]:
    rng = random.Random(5)
    samples: list[tuple[float, int]] = []
    async with await Connection.create(address) as connection:
        admin = connection.get_admin()
        pk_schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
        log_schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]))
        await admin.create_table(TablePath("fluss", "soak_pk"), TableDescriptor(pk_schema, bucket_count=2))
        await admin.create_table(TablePath("fluss", "soak_small"), TableDescriptor(pk_schema, bucket_count=1))
        await admin.create_table(TablePath("fluss", "soak_log"), TableDescriptor(log_schema, bucket_count=2))
        pk = await connection.get_table(TablePath("fluss", "soak_pk"))
        small = await connection.get_table(TablePath("fluss", "soak_small"))
        log_table = await connection.get_table(TablePath("fluss", "soak_log"))
        upsert = pk.new_upsert().create_writer()
        append = log_table.new_append().create_writer()
        await small.new_upsert().create_writer().upsert_batch(pa.table({"id": list(range(2_000)), "v": ["s"] * 2_000}))
        lookuper = pk.new_lookup().create_lookuper()
        scanner = log_table.new_scan().create_log_scanner()
        scanner.subscribe_buckets({0: 0, 1: 0})
        start = time.monotonic()
        next_sample = start
        round_ = 0
        while (now := time.monotonic()) - start < seconds:
            if now >= next_sample:
                samples.append((now - start, server.rss_bytes()[0]))
                next_sample += sample_s
            round_ += 1
            ids = rng.sample(range(KEYS), 1_000)
            await upsert.upsert_batch(pa.table({"id": ids, "v": [f"{i}-{round_}" * 5 for i in ids]}))
            for key in ids[:50]:
                await lookuper.lookup({"id": key})
            await append.write_arrow_batch(pa.table({"id": ids, "v": ["log"] * len(ids)}))
            await scanner.poll(10)
            if round_ % 10 == 0:
                batch_scanner = await small.new_scan().create_batch_scanner()
                async for _batch in batch_scanner:
                    pass
                snapshots = await admin.get_latest_kv_snapshots(TablePath("fluss", "soak_pk"))
                pins = {snapshots.table_bucket(b): s.snapshot_id for b, s in snapshots.snapshots.items() if s is not None}
                lease = admin.create_kv_snapshot_lease(f"soak-{round_}", 60_000)
                if pins:
                    await lease.acquire_snapshots(pins)
                await lease.drop()
                async with await Connection.create(address) as churn:
                    await churn.get_admin().list_databases()
        samples.append((time.monotonic() - start, server.rss_bytes()[0]))
    return samples


def _rate_mb_per_min(samples: list[tuple[float, int]]) -> float:
    (t0, r0), (t1, r1) = samples[0], samples[-1]
    return (r1 - r0) / (1 << 20) / max(t1 - t0, 1e-9) * 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    args = parser.parse_args()
    with BenchServer({"kv.snapshot.interval": "5s"}) as server:
        samples = asyncio.run(_load(server.address, args.seconds, args.sample_seconds, server))
    half = len(samples) // 2
    print(f"memory soak: {args.seconds:.0f} s of mixed load, RSS every {args.sample_seconds:.0f} s")
    for elapsed, rss in samples:
        print(f"  {elapsed:7.1f} s  {rss / (1 << 20):8.1f} MB")
    print(f"RSS growth, first half:  {_rate_mb_per_min(samples[: half + 1]):+.2f} MB/min")
    print(f"RSS growth, second half: {_rate_mb_per_min(samples[half:]):+.2f} MB/min")


if __name__ == "__main__":
    main()
