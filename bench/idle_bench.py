"""What an idle server costs: CPU and wake-ups per second of ``strom server --workers N`` with no client
requests, against the one-process server (``--workers 1``) measured in the same run.

An idle server is not free: its processes watch their membership, check their replicas, record high
watermarks, sweep idle connections. That matters beyond the CPU. On a machine with few cores each wake-up can land on the core a
request needs, and every poll holds its process's GIL while a request waits for it, so a busy idle loop
shows up in the tail of single-lookup latency (docs/benchmarks.md).

For each N: a throw-away server, a primary-key table of ``--buckets`` buckets (every worker leads some), a
settling pause, then ``--seconds`` of nothing. Counted over every thread of the server's process tree: time
on a CPU (``/proc/<tid>/schedstat``) and context switches (each a wake-up or a preemption).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import pyarrow as pa

from bench.harness import BenchServer, process_tree, report, threads_run_ns_and_wakeups
from strom.client import Connection, Schema, TableDescriptor, TablePath

SETTLE_S = 3.0


async def create_table(address: str, buckets: int) -> None:
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
        await connection.get_admin().create_table(TablePath("fluss", "idle"), TableDescriptor(schema, bucket_count=buckets))


def idle_cost(workers: int, buckets: int, seconds: float) -> tuple[float, float]:
    """CPU milliseconds and wake-ups per second of an idle server's process tree."""
    with BenchServer({"kv.snapshot.interval": "0s"}, workers=workers) as server:
        asyncio.run(create_table(server.address, buckets))
        time.sleep(SETTLE_S)
        assert server.process is not None
        pids = process_tree(server.process.pid)
        run_ns, switches = threads_run_ns_and_wakeups(pids)
        time.sleep(seconds)
        run_ns_after, switches_after = threads_run_ns_and_wakeups(pids)
    return (run_ns_after - run_ns) / 1e6 / seconds, (switches_after - switches) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="comma-separated N of strom server --workers N")
    parser.add_argument("--buckets", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    measured = {n: idle_cost(n, args.buckets, args.seconds) for n in counts}
    base_cpu, base_wakeups = measured[counts[0]]
    rows = [(f"--workers {n}: CPU, wake-ups (× --workers {counts[0]})",
             f"{cpu_ms:6.1f} ms/s ({cpu_ms / base_cpu:.1f}×), {wakeups:6.1f}/s ({wakeups / base_wakeups:.1f}×)")
            for n, (cpu_ms, wakeups) in measured.items()]
    report(f"an idle server, {args.buckets} buckets, {args.seconds:.0f} s", rows)


if __name__ == "__main__":
    main()
