"""Leases at scale: acquiring 10 000 buckets end to end, and the stored size of a 100 000-bucket lease.

The 10 000 snapshots are real snapshot records in the server's metadata store (inserted while the server
is down, then loaded on start), so the acquire below checks and pins existing snapshots exactly as it
would after 10 000 buckets had each taken one.
"""

from __future__ import annotations

import asyncio
import random
import time

import pyarrow as pa

from bench.harness import BenchServer, median, report
from strom.client import Connection, Schema, TableBucket, TableDescriptor, TablePath
from strom.coordinator.kv_snapshot_leases import KvSnapshotLease, encode_lease
from strom.ids import TableBucket as Bucket
from strom.kv.snapshot import CompletedKvSnapshot, SnapshotFile
from strom.metadata.sqlite_store import SqliteMetadataStore
from strom.metadata.store import KvSnapshotRecord

BUCKETS = 10_000
ROUNDS = 5


async def create_table(address: str) -> int:
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(pa.schema([("id", pa.int64())]), primary_key=["id"])
        path = TablePath("fluss", "leased")
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=BUCKETS))
        return (await connection.get_table(path)).table_info.table_id


def insert_snapshots(server: BenchServer, table_id: int) -> None:
    store = SqliteMetadataStore(str(server.data_dir / "metadata.sqlite"))
    for bucket in range(BUCKETS):
        location = f"{server.data_dir}/remote/kv/fluss/leased-{table_id}/{bucket}/snap-0"
        snapshot = CompletedKvSnapshot(
            Bucket(table_id, bucket), 0, 1, 1, (SnapshotFile(f"{location}/MANIFEST", "MANIFEST", 1, False),),
            f"{location}/_METADATA", 1, 0,
        )
        store.add_kv_snapshot(KvSnapshotRecord(table_id, None, bucket, 0, snapshot.to_json()))
    store.close()


async def acquire_rounds(address: str, table_id: int) -> list[float]:
    pins = {TableBucket(table_id, bucket): 0 for bucket in range(BUCKETS)}
    times = []
    async with await Connection.create(address) as connection:
        admin = connection.get_admin()
        for round_ in range(ROUNDS):
            lease = admin.create_kv_snapshot_lease(f"bench-{round_}", 3_600_000)
            start = time.perf_counter()
            result = await lease.acquire_snapshots(pins)
            times.append(time.perf_counter() - start)
            assert not result.unavailable_snapshots, "every snapshot exists, so every pin must succeed"
            await lease.drop()
    return times


def main() -> None:
    with BenchServer({"max.bucket.num": str(BUCKETS), "kv.snapshot.interval": "0s"}) as server:
        table_id = asyncio.run(create_table(server.address))
        server.stop()
        insert_snapshots(server, table_id)
        server.start()
        times = asyncio.run(acquire_rounds(server.address, table_id))
    rng = random.Random(1)
    same = KvSnapshotLease("x", 0, {Bucket(1, b): 42 for b in range(100_000)})
    varied = KvSnapshotLease("x", 0, {Bucket(1, b): rng.randint(0, 10_000) for b in range(100_000)})
    report(
        "KV snapshot leases",
        [
            ("acquire 10 000 buckets, end to end (median of 5)", f"{median(times) * 1000:.1f} ms (target < 100 ms)"),
            ("  fastest / slowest", f"{min(times) * 1000:.1f} / {max(times) * 1000:.1f} ms"),
            ("stored size, 100 000 buckets, one snapshot id", f"{len(encode_lease(same)):,} bytes"),
            ("stored size, 100 000 buckets, random ids 0..10 000", f"{len(encode_lease(varied)):,} bytes (ZooKeeper node limit: 1 MB)"),
        ],
    )


if __name__ == "__main__":
    main()
