"""What a rebalance costs the clients: write latency while a bucket's replica is copied to a new server,
against the same probe's latency just before the move, in one run; and how fast the copy goes.

A local cluster (``LocalCluster``) of 3 tablet servers holds a log table of one bucket (replication factor
2) loaded with ``--mb`` MB. Its follower's server is tagged PERMANENT_OFFLINE, a fourth server starts, and a
rebalance (goal LEADER_DISTRIBUTION only: the drain and leaderships, no other replica moves) copies the bucket to the new server. A probe
process upserts one row into a primary-key table on the untagged servers and waits for each
acknowledgement, the whole time. The same runs with the follower fetch size at its default
(``log.replica.fetch.max-bytes-for-bucket`` 1 MB) and at 16 MB, each on a fresh cluster: the larger fetch
copies faster and holds the leader's event loop longer per fetch.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.harness import report
from strom.client import Connection, GoalType, Schema, ServerTag, TableBucket, TableDescriptor, TablePath
from strom.server.local_cluster import LocalCluster
from strom.zk.bucket_state import ZooKeeperBucketStates
from strom.zk.metadata_store import connect_kazoo, parse_location

BIG = TablePath("fluss", "big")
PROBE = TablePath("fluss", "probe")
BATCH_BYTES = 4 << 20


def probe(address: str, stop: Any, results: Any) -> None:
    """Upsert one row at a time, each acknowledged before the next; report (time, latency) pairs."""
    async def run() -> list[tuple[float, float]]:
        samples = []
        async with await Connection.create(address) as connection:
            writer = (await connection.get_table(PROBE)).new_upsert().create_writer()
            key = 0
            while not stop.is_set():
                start = time.perf_counter()
                writer.upsert({"id": key % 1000, "v": "x"})
                await writer.flush()
                samples.append((time.monotonic(), time.perf_counter() - start))
                key += 1
        return samples

    results.put(asyncio.run(run()))


async def setup(address: str, megabytes: int) -> None:
    async with await Connection.create(address) as connection:
        admin = connection.get_admin()
        log_schema = Schema.from_arrow(pa.schema([("payload", pa.binary())]))
        await admin.create_table(BIG, TableDescriptor(log_schema, bucket_count=1,
                                                      properties={"table.replication.factor": "2"}))
        writer = (await connection.get_table(BIG)).new_append().create_writer()
        rows_per_batch = BATCH_BYTES // 1000
        for _ in range(megabytes * (1 << 20) // BATCH_BYTES):  # random bytes: the log's compression keeps them
            noise = os.urandom(BATCH_BYTES)
            rows = [noise[i * 1000:(i + 1) * 1000] for i in range(rows_per_batch)]
            writer.append_arrow_batch(pa.table({"payload": pa.array(rows, pa.binary())}))
        await writer.flush()


async def tag_follower_and_create_probe(local: LocalCluster) -> int:
    """Tag the big bucket's follower, then create the probe's table (on the other servers); returns the
    big table's id."""
    async with await Connection.create(local.bootstrap) as connection:
        admin = connection.get_admin()
        table_id = (await admin.get_table_info(BIG)).table_id
        hosts, root = parse_location(local.zookeeper_address)
        client = connect_kazoo(hosts, 10_000)
        try:
            state = ZooKeeperBucketStates(client, root).get(TableBucket(table_id, 0))
        finally:
            client.stop()
            client.close()
        assert state is not None
        follower = next(r for r in state[0].replicas if r != state[0].leader)
        await admin.add_server_tag([follower], ServerTag.PERMANENT_OFFLINE)
        schema = Schema.from_arrow(pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())]), ["id"])
        await admin.create_table(PROBE, TableDescriptor(schema, bucket_count=2, properties={"table.replication.factor": "2"}))
        return table_id


async def rebalance(address: str, big_table_id: int) -> float:
    async with await Connection.create(address) as connection:
        admin = connection.get_admin()
        start = time.monotonic()
        rebalance_id = await admin.rebalance([GoalType.LEADER_DISTRIBUTION])
        while True:
            progress = await admin.list_rebalance_progress(rebalance_id)
            assert progress is not None
            if progress.status.is_final:
                assert progress.status.name == "COMPLETED", progress
                assert [m.bucket.table_id for m in progress.moves if set(m.new_replicas) != set(m.original_replicas)] \
                    == [big_table_id], progress.moves  # only the big bucket's replica moves
                return time.monotonic() - start
            await asyncio.sleep(0.1)


def latency_row(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"p50 {statistics.median(ordered) * 1000:6.1f} ms  p99 {p99 * 1000:6.1f} ms  "
            f"max {ordered[-1] * 1000:6.1f} ms  ({len(ordered)} writes)")


def run_once(fetch_size: str, megabytes: int, baseline_s: float) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="strom-rebalance-bench-") as tmp:
        local = LocalCluster(Path(tmp) / "cluster", 3, {
            "kv.snapshot.interval": "0s", "log.replica.fetch.max-bytes-for-bucket": fetch_size,
        }).start()
        try:
            time.sleep(2)  # the tablet servers register
            asyncio.run(setup(local.bootstrap, megabytes))
            big_table_id = asyncio.run(tag_follower_and_create_probe(local))
            local.start_member("tablet-server", 4)
            time.sleep(2)
            context = multiprocessing.get_context("spawn")
            stop, results = context.Event(), context.Queue()
            prober = context.Process(target=probe, args=(local.bootstrap, stop, results))
            prober.start()
            time.sleep(1.0)  # the probe connects and warms up
            before_start = time.monotonic()
            time.sleep(baseline_s)
            move_start = time.monotonic()
            move_s = asyncio.run(rebalance(local.bootstrap, big_table_id))
            move_end = time.monotonic()
            stop.set()
            samples = results.get(timeout=60)
            prober.join(30)
        finally:
            local.stop()
    before = [latency for at, latency in samples if before_start <= at < move_start]
    during = [latency for at, latency in samples if move_start <= at <= move_end]
    return [
        (f"fetch {fetch_size}: copy of {megabytes} MB", f"{move_s:6.1f} s  ({megabytes / move_s:6.1f} MB/s)"),
        (f"fetch {fetch_size}: probe before the move", latency_row(before)),
        (f"fetch {fetch_size}: probe during the move", latency_row(during)),
        (f"fetch {fetch_size}: p99 during / before", f"{_p99(during) / _p99(before):5.2f}x"),
    ]


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=200, help="MB in the bucket that moves")
    parser.add_argument("--baseline-seconds", type=float, default=5.0)
    parser.add_argument("--fetch-sizes", default="1mb,16mb")
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []
    for fetch_size in args.fetch_sizes.split(","):
        rows += run_once(fetch_size, args.mb, args.baseline_seconds)
    report(f"rebalance: a {args.mb} MB bucket copied to a new server under a one-row write probe", rows)


if __name__ == "__main__":
    main()
