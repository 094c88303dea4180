"""GetMetadata with ZooKeeper slowed down: the active coordinator (answering from memory) against a tablet
server (reading the metadata store for each request), in one run, through the same slow ZooKeeper; and the
coordinator's answers while a table creation waits on that ZooKeeper (its store calls run on store threads,
so the event loop goes on answering).

A local cluster of one coordinator and one tablet server, both reaching ZooKeeper through one proxy; a table
of 4 buckets. The proxy then delays every chunk it forwards by ``--delay-ms`` (500: a ZooKeeper round trip
takes about a second), and a client asks each server GetMetadata for the table, one request at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.harness import report
from strom.client import Connection, TablePath
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.cluster.test_cluster_processes import create_table
from tests.cluster.test_metadata_cache import ZooKeeperProxiedCluster


def _percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


async def _timed_metadata(address: str, path: TablePath, more: Callable[[int], bool]) -> list[float]:
    """Latencies of GetMetadata of ``path`` from ``address``, one request at a time while ``more(done)``."""
    host, _, port = address.rpartition(":")
    connection = await RpcConnection.connect(host, int(port))
    request = pb.MetadataRequest()
    request.table_path.add(database_name=path.database_name, table_name=path.table_name)
    samples: list[float] = []
    try:
        while more(len(samples)):
            started = time.perf_counter()
            answer = await connection.request(ApiKey.GET_METADATA, request, timeout_ms=60_000)
            samples.append(time.perf_counter() - started)
            assert len(answer.table_metadata) == 1
    finally:
        await connection.close()
    return samples


async def _latencies(address: str, path: TablePath, count: int) -> list[float]:
    return await _timed_metadata(address, path, lambda done: done < count)


async def _latencies_during_creation(bootstrap: str, coordinator: str, path: TablePath) -> list[float]:
    """GetMetadata of ``path`` from the coordinator, one request at a time, for as long as the creation of
    another table takes."""
    async with await Connection.create(bootstrap) as connection:
        creation = asyncio.ensure_future(create_table(connection, buckets=1))
        samples = await _timed_metadata(coordinator, path, lambda _done: not creation.done())
        await creation
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delay-ms", type=int, default=500)
    parser.add_argument("--coordinator-requests", type=int, default=200)
    parser.add_argument("--tablet-server-requests", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        local = ZooKeeperProxiedCluster(Path(directory) / "cluster", 1, {"kv.snapshot.interval": "0s"},
                                        proxied=("coordinator-1", "tablet-server-1"))
        try:
            local.start()

            async def prepare() -> TablePath:
                async with await Connection.create(local.bootstrap) as connection:
                    deadline = time.monotonic() + 30
                    while not any(n.server_type == "TabletServer" for n in await connection.get_admin().get_server_nodes()):
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.2)
                    return await create_table(connection, buckets=4)

            path = asyncio.run(prepare())
            coordinator = local.member("coordinator", 1).address
            tablet_server = local.member("tablet-server", 1).address
            asyncio.run(_latencies(coordinator, path, 3))  # what the coordinator remembers: read once
            assert local.proxy is not None
            local.proxy.slow(args.delay_ms / 1000)
            from_memory = asyncio.run(_latencies(coordinator, path, args.coordinator_requests))
            from_store = asyncio.run(_latencies(tablet_server, path, args.tablet_server_requests))
            creation_started = time.perf_counter()
            during_creation = asyncio.run(_latencies_during_creation(local.bootstrap, coordinator, path))
            creation_s = time.perf_counter() - creation_started
            local.proxy.heal()
        finally:
            local.stop()
            if local.proxy is not None:
                local.proxy.close()
    rows = []
    for name, samples in (("coordinator, from memory", from_memory), ("tablet server, from the store", from_store),
                          (f"coordinator, during a {creation_s:.1f} s table creation", during_creation)):
        rows.append((name, f"{len(samples)} requests, p50 {_percentile(samples, 0.5) * 1000:.2f} ms, "
                           f"p99 {_percentile(samples, 0.99) * 1000:.2f} ms"))
    ratio = _percentile(from_store, 0.99) / _percentile(from_memory, 0.99)
    rows.append(("p99 store / memory", f"{ratio:.0f}x"))
    report(f"GetMetadata with ZooKeeper delayed {args.delay_ms} ms per chunk", rows)


if __name__ == "__main__":
    main()
