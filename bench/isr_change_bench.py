"""How long a leader takes to drop a dead follower from the ISR, and how long writes with acks = all stall.

A 3-tablet-server cluster (replication factor 3, one primary-key bucket, ``log.replica.max-silence-time``
1 s, a ZooKeeper session of 30 s so the coordinator does not act first) under a writer that upserts one row
at a time. A follower is SIGKILLed; measured: kill → the bucket's state in ZooKeeper without it (the ISR
change written: since AdjustIsr, by the coordinator at the leader's request), and the longest gap between
two acknowledged writes around the kill. The follower is restarted and rejoins between rounds.

Run it on two checkouts to compare ISR changes written by the leader itself with AdjustIsr: the figures
are bounded below by the silence time and the leader's check period (0.25 s); what AdjustIsr adds is the
round trip to the coordinator.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa

from bench.harness import report
from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.ids import TableBucket
from strom.server.local_cluster import LocalCluster
from strom.zk.bucket_state import ZooKeeperBucketStates
from strom.zk.session import connect_kazoo, parse_location

PATH = TablePath("fluss", "isr_changes")
FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])


class Writer:
    """Upserts one row at a time on a thread of its own; records each acknowledgement's time."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.acknowledged: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with await Connection.create(self.address) as connection:
            writer = (await connection.get_table(PATH)).new_upsert().create_writer()
            i = 0
            while not self._stop.is_set():
                await writer.upsert_batch(pa.table({"id": [i % 1000], "v": [str(i)]}))
                self.acknowledged.append(time.monotonic())
                i += 1

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def longest_gap(self, start: float, end: float) -> float:
        times = [t for t in self.acknowledged if start - 2 <= t <= end]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    settings = {"kv.snapshot.interval": "0s", "log.replica.max-silence-time": "1s",
                "zookeeper.client.session-timeout": "30s"}
    with tempfile.TemporaryDirectory(prefix="strom-isr-bench-") as directory:
        cluster = LocalCluster(Path(directory), 3, settings).start()
        try:
            async def create() -> int:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        async with await Connection.create(cluster.bootstrap) as connection:
                            await connection.get_admin().create_table(PATH, TableDescriptor(
                                Schema.from_arrow(FIELDS, ["id"]), bucket_count=1,
                                properties={"table.replication.factor": "3"}))
                            return (await connection.get_table(PATH)).layout.info.table_id
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)

            bucket = TableBucket(asyncio.run(create()), 0)
            hosts, root = parse_location(cluster.zookeeper_address)
            client = connect_kazoo(hosts, 10_000, login=cluster.zookeeper_login())
            states = ZooKeeperBucketStates(client, root)
            writer = Writer(cluster.bootstrap).start()
            dropped, stalls = [], []
            for _ in range(args.rounds):
                deadline = time.monotonic() + 60
                while len((state := states.get(bucket))[0].isr) < 3:  # type: ignore[index]
                    assert time.monotonic() < deadline, "the ISR did not fill up"
                    time.sleep(0.05)
                time.sleep(1.0)
                victim = next(r for r in state[0].replicas if r != state[0].leader)  # type: ignore[index]
                killed = time.monotonic()
                cluster.signal_member(cluster.member("tablet-server", victim), signal.SIGKILL)
                while victim in states.get(bucket)[0].isr:  # type: ignore[index]
                    assert time.monotonic() - killed < 60, "the dead follower stayed in the ISR"
                    time.sleep(0.005)
                dropped.append(time.monotonic() - killed)
                time.sleep(1.0)
                stalls.append(writer.longest_gap(killed, time.monotonic()))
                cluster.start_member("tablet-server", victim)
            writer.stop()
            client.stop()
        finally:
            cluster.stop()
    report(f"a dead follower leaves the ISR ({args.label}), {args.rounds} rounds, medians", [
        ("kill -> ISR without it", f"{statistics.median(dropped):.3f} s (min {min(dropped):.3f}, max {max(dropped):.3f})"),
        ("longest write stall around the kill", f"{statistics.median(stalls):.3f} s"),
        ("acknowledged writes", f"{len(writer.acknowledged)}"),
    ])


if __name__ == "__main__":
    main()
