"""Durable upsert ingest into a cluster with 1 and with 2 tablet servers, in one run on this machine.

Each cluster is local (``strom.server.local_cluster.LocalCluster``: ZooKeeper, a coordinator, the tablet servers as
processes); a primary-key table of ``--buckets`` buckets spreads over its tablet servers. ``--writers``
client processes upsert disjoint key ranges in pipelined Arrow batches of ``--batch`` rows (strom's client;
a write counts when it is acknowledged, i.e. fsynced in the changelog and applied to RocksDB). The
one-process ``strom server`` does the same as the reference. With 1 tablet server every bucket's work runs
on one event loop, one core; with 2, on two. Then 3 tablet servers with replication factor 1 and 3: what
acknowledging only writes held by every in-sync replica costs.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bench.harness import BenchServer, report
from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.server.local_cluster import LocalCluster

FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("score", pa.int64())])
PATH = TablePath("fluss", "ingest")


async def create(address: str, buckets: int, replication_factor: int = 1) -> None:
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(FIELDS, ["id"])
        properties = {"table.replication.factor": str(replication_factor)}
        await connection.get_admin().create_table(PATH, TableDescriptor(schema, bucket_count=buckets, properties=properties))


def write_range(address: str, first: int, count: int, batch: int) -> None:
    async def run() -> None:
        async with await Connection.create(address) as connection:
            writer = (await connection.get_table(PATH)).new_upsert().create_writer()
            for start in range(first, first + count, batch):
                ids = list(range(start, min(first + count, start + batch)))
                writer.upsert_arrow_batch(pa.table({"id": ids, "name": [f"name-{i}" for i in ids], "score": ids}))
            await writer.flush()

    asyncio.run(run())


def ingest(address: str, rows: int, writers: int, batch: int) -> float:
    """Rows per second of ``writers`` processes upserting ``rows`` keys in total, until all acknowledged."""
    share = rows // writers
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=write_range, args=(address, w * share, share, batch)) for w in range(writers)]
    start = time.perf_counter()
    for process in processes:
        process.start()
    for process in processes:
        process.join()
        assert process.exitcode == 0, f"a writer failed with {process.exitcode}"
    return share * writers / (time.perf_counter() - start)


def measure_cluster(
    tablet_servers: int, rows: int, writers: int, batch: int, buckets: int, replication_factor: int = 1
) -> float:
    with tempfile.TemporaryDirectory(prefix="strom-cluster-bench-") as directory:
        cluster = LocalCluster(Path(directory), tablet_servers, {"kv.snapshot.interval": "0s"}).start()
        try:
            deadline = time.monotonic() + 30
            while True:  # tablet servers register asynchronously
                try:
                    asyncio.run(create(cluster.bootstrap, buckets, replication_factor))
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            return ingest(cluster.bootstrap, rows, writers, batch)
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--buckets", type=int, default=4)
    args = parser.parse_args()
    with BenchServer({"kv.snapshot.interval": "0s"}) as server:
        asyncio.run(create(server.address, args.buckets))
        single = ingest(server.address, args.rows, args.writers, args.batch)
    one = measure_cluster(1, args.rows, args.writers, args.batch, args.buckets)
    two = measure_cluster(2, args.rows, args.writers, args.batch, args.buckets)
    three_rf1 = measure_cluster(3, args.rows, args.writers, args.batch, args.buckets)
    three_rf3 = measure_cluster(3, args.rows, args.writers, args.batch, args.buckets, replication_factor=3)
    report(f"durable upsert ingest, {args.writers} writer processes, {args.buckets} buckets (same run)", [
        ("strom server (one process)", f"{single:,.0f} rows/s"),
        ("cluster, 1 tablet server", f"{one:,.0f} rows/s"),
        ("cluster, 2 tablet servers", f"{two:,.0f} rows/s"),
        ("1 tablet server / one process", f"{one / single:.2f}"),
        ("2 tablet servers / 1 tablet server", f"{two / one:.2f}"),
        ("cluster, 3 tablet servers, replication factor 1", f"{three_rf1:,.0f} rows/s"),
        ("cluster, 3 tablet servers, replication factor 3", f"{three_rf3:,.0f} rows/s"),
        ("replication factor 3 / 1", f"{three_rf3 / three_rf1:.2f}"),
    ])


if __name__ == "__main__":
    main()
