"""Failover to the first lookup: how long a primary-key table's lookups stop when its leader is killed.

A 2-tablet-server cluster (ZooKeeper, a coordinator; replication factor 2) holds a one-bucket primary-key
table of ``--keys`` keys. Its leader gets SIGKILL; the clock runs from the kill until a lookup of a key
written before it answers (strom's client, retrying as it does). Three ways, in one run:

- ``standby``: ``table.kv.standby-replica.enabled=true``. The follower keeps the bucket's RocksDB warm (the
  kill waits until its ``strom_kv_standby_lag_records`` metric reads 0); the new leader promotes it.
- ``snapshot``: no standby; a KV snapshot covering every row was committed before the kill. The new leader
  downloads it (from local remote storage) and replays what came after (nothing).
- ``log``: no standby, no snapshot. The new leader replays the whole changelog into a new RocksDB.

Each also reports when the metadata first named the new leader: the election, which waits for the killed
server's ZooKeeper session to end (``zookeeper.client.session-timeout``, 4 s here) and is the same in each;
what comes after it is the new leader making its state ready.

Beside it, a small primary-key table (one bucket, replication factor 2) is looked up by another process, one
key at a time, from before the kill to the end: how many of its lookups the surviving server answered while
it made the large bucket's state ready (from the election to the large table's first lookup), and the
longest wait for one from the election on. A new leader whose restore and replay stop its event loop
answers none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import signal
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.cluster_bench import FIELDS, PATH, run_writers, write_range
from bench.harness import report
from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.client.admin import OffsetSpec
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.server.local_cluster import LocalCluster
from strom.zk.zookeeper_server import free_port

SESSION_TIMEOUT = "4s"
MODES = ("standby", "snapshot", "log")
WAIT_S = 900.0
SMALL = TablePath("fluss", "small")
SMALL_KEYS = 1_000


async def _create(address: str, standby: bool) -> None:
    async with await Connection.create(address) as connection:
        properties = {"table.replication.factor": "2"}
        if standby:
            properties["table.kv.standby-replica.enabled"] = "true"
        schema = Schema.from_arrow(FIELDS, ["id"])
        await connection.get_admin().create_table(PATH, TableDescriptor(schema, bucket_count=1, properties=properties))
        await connection.get_admin().create_table(
            SMALL, TableDescriptor(schema, bucket_count=1, properties={"table.replication.factor": "2"}))


def _probe(address: str, started: Any, stop: Any, results: Any) -> None:
    """Look up single keys of the small table until ``stop`` is set, retrying each until it is answered (its
    leader may move); put each answered lookup's (start on the monotonic clock, seconds) to ``results``."""
    async def run() -> list[tuple[float, float]]:
        answered: list[tuple[float, float]] = []
        async with await Connection.create(address) as connection:
            lookuper = (await connection.get_table(SMALL)).new_lookup().create_lookuper()
            key = 0
            started.set()
            while not stop.is_set():
                key = (key + 7) % SMALL_KEYS
                begin = time.monotonic()
                try:
                    row = await asyncio.wait_for(lookuper.lookup({"id": key}), 5)
                except Exception:
                    await asyncio.sleep(0.01)
                    continue
                assert row is not None and row["score"] == key
                answered.append((begin, time.monotonic() - begin))
        return answered

    results.put(asyncio.run(run()))


def _load(address: str, keys: int, writers: int, batch: int) -> float:
    """Rows/s of ``writers`` processes writing ``keys`` keys, all acknowledged (on both replicas)."""
    return run_writers(write_range, address, keys, writers, batch)


def _metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


async def _leader(connection: Connection) -> int:
    """The bucket's leader as the cluster's metadata names it now (-1: none)."""
    request = pb.MetadataRequest()
    request.table_path.add(database_name=PATH.database_name, table_name=PATH.table_name)
    response = await connection.bootstrap_request(ApiKey.GET_METADATA, request)
    return int(response.table_metadata[0].bucket_metadata[0].leader_id)


async def _wait_snapshot(connection: Connection, deadline: float) -> None:
    """Until the bucket's latest snapshot covers everything written."""
    table = await connection.get_table(PATH)
    table_id = table.layout.info.table_id
    (end,) = (await connection.get_admin().list_bucket_offsets(table_id, None, [0], OffsetSpec.latest())).values()
    while True:
        snapshot = (await connection.get_admin().get_latest_kv_snapshots(PATH)).snapshots.get(0)
        if snapshot is not None and snapshot.log_offset >= end:
            return
        assert time.monotonic() < deadline, "no snapshot covered the load"
        await asyncio.sleep(0.5)


async def _write_small(address: str) -> None:
    async with await Connection.create(address) as connection:
        writer = (await connection.get_table(SMALL)).new_upsert().create_writer()
        for key in range(SMALL_KEYS):
            writer.upsert({"id": key, "name": f"small-{key}", "score": key})
        await writer.flush()


def measure(mode: str, keys: int, writers: int, batch: int, probe_small: bool = True) -> dict[str, float]:
    ports = {1: free_port(), 2: free_port()}
    settings = {
        "kv.snapshot.interval": "2s" if mode == "snapshot" else "0s",
        "zookeeper.client.session-timeout": SESSION_TIMEOUT,
    }
    member_config = {f"tablet-server-{i}": {"metrics.reporter.prometheus.port": str(p)} for i, p in ports.items()}
    with tempfile.TemporaryDirectory(prefix="strom-failover-bench-") as directory:
        cluster = LocalCluster(Path(directory), 2, settings, member_config=member_config).start()
        try:
            deadline = time.monotonic() + 30
            while True:  # the tablet servers register asynchronously
                try:
                    asyncio.run(_create(cluster.bootstrap, mode == "standby"))
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            load_rate = _load(cluster.bootstrap, keys, writers, batch)
            asyncio.run(_write_small(cluster.bootstrap))

            async def prepare() -> int:
                async with await Connection.create(cluster.bootstrap) as connection:
                    if mode == "snapshot":
                        await _wait_snapshot(connection, time.monotonic() + WAIT_S)
                    return await _leader(connection)

            leader = asyncio.run(prepare())
            follower = 2 if leader == 1 else 1
            settled = time.monotonic()
            if mode == "standby":
                wait_deadline = time.monotonic() + WAIT_S
                while _metric(ports[follower], "strom_kv_standby_lag_records") != 0.0:
                    assert time.monotonic() < wait_deadline, "the standby never caught up"
                    time.sleep(0.2)
            caught_up_s = time.monotonic() - settled
            probe = keys // 2

            async def failover() -> tuple[float, float, float]:
                async with await Connection.create(cluster.bootstrap) as connection:
                    lookuper = (await connection.get_table(PATH)).new_lookup().create_lookuper()
                    assert (await lookuper.lookup({"id": probe}))["score"] == probe  # type: ignore[index]
                    killed = time.monotonic()
                    cluster.signal_member(cluster.member("tablet-server", leader), signal.SIGKILL)
                    elected = None
                    while elected is None:
                        if await _leader(connection) == follower:
                            elected = time.monotonic() - killed
                        else:
                            await asyncio.sleep(0.05)
                    while True:
                        try:
                            row = await asyncio.wait_for(lookuper.lookup({"id": probe}), WAIT_S)
                        except Exception:
                            await asyncio.sleep(0.05)
                            continue
                        assert row is not None and row["score"] == probe
                        return elected, time.monotonic() - killed, killed

            if not probe_small:
                elected_s, first_lookup_s, _killed = asyncio.run(failover())
                return {"load": load_rate, "caught_up": caught_up_s, "elected": elected_s,
                        "first_lookup": first_lookup_s}
            context = multiprocessing.get_context("spawn")
            started, stop, results = context.Event(), context.Event(), context.Queue()
            prober = context.Process(target=_probe, args=(cluster.bootstrap, started, stop, results), daemon=True)
            prober.start()
            assert started.wait(60), "the small table's prober did not start"
            time.sleep(0.5)
            elected_s, first_lookup_s, killed_at = asyncio.run(failover())
            stop.set()
            answered = results.get(timeout=60)
            prober.join(30)
            elected_at, ready_at = killed_at + elected_s, killed_at + first_lookup_s
            during = [latency for begin, latency in answered if elected_at <= begin and begin + latency <= ready_at]
            ends = [elected_at, *sorted(begin + latency for begin, latency in answered if begin + latency >= elected_at)]
            longest_wait = max((later - earlier for earlier, later in itertools.pairwise(ends)), default=0.0)
            return {"load": load_rate, "caught_up": caught_up_s, "elected": elected_s, "first_lookup": first_lookup_s,
                    "small_during": float(len(during)), "small_wait": longest_wait}
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=5_000_000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--modes", default=",".join(MODES), help="which of standby, snapshot, log, in order")
    parser.add_argument("--no-probe", action="store_true", help="leave the small table idle during the failover")
    args = parser.parse_args()
    results = {mode: measure(mode, args.keys, args.writers, args.batch, not args.no_probe)
               for mode in args.modes.split(",")}
    lines = []
    for mode, result in results.items():
        lines += [
            (f"{mode}: load (acknowledged on both replicas)", f"{result['load']:,.0f} rows/s"),
            (f"{mode}: kill -> metadata names the new leader", f"{result['elected']:.2f} s"),
            (f"{mode}: kill -> first lookup answered", f"{result['first_lookup']:.2f} s"),
            (f"{mode}: state ready after the election", f"{result['first_lookup'] - result['elected']:.2f} s"),
        ]
        if "small_during" in result:
            lines += [
                (f"{mode}: small table's lookups answered meanwhile", f"{result['small_during']:,.0f}"),
                (f"{mode}: small table's longest wait after the election", f"{result['small_wait']:.2f} s"),
            ]
        if mode == "standby":
            lines.append((f"{mode}: standby caught up, after the load", f"{result['caught_up']:.2f} s"))
    if "standby" in results:
        for other in (m for m in results if m != "standby"):
            ready = results[other]["first_lookup"] - results[other]["elected"]
            standby_ready = results["standby"]["first_lookup"] - results["standby"]["elected"]
            lines.append((f"{other} / standby, first lookup", f"{results[other]['first_lookup'] / results['standby']['first_lookup']:.1f}x"))
            lines.append((f"{other} / standby, state ready after the election", f"{ready / max(standby_ready, 1e-3):.1f}x"))
    report(f"failover to the first lookup, {args.keys:,} keys in one bucket, 2 tablet servers (same run)", lines)


if __name__ == "__main__":
    main()
