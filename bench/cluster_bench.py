"""Durable upsert ingest into a cluster with 1 and with N tablet servers, against PostgreSQL with N writer
connections, in one run on this machine.

Each cluster is local (``strom.server.local_cluster.LocalCluster``: ZooKeeper, a coordinator, the tablet servers as
processes); a primary-key table of ``--buckets`` buckets spreads over its tablet servers. ``--writers``
client processes upsert disjoint key ranges in pipelined Arrow batches of ``--batch`` rows (strom's client;
a write counts when it is acknowledged, i.e. fsynced in the changelog and applied to RocksDB). The
one-process ``strom server`` does the same as the reference. With 1 tablet server every bucket's work runs
on one event loop, one core; with N (``--tablet-servers``, default: this machine's cores), on N. PostgreSQL
(a throw-away cluster, as in peers_bench, durable commits) takes the same rows from N writer processes, one
connection each, per batch COPY into a temporary table + ``INSERT … ON CONFLICT DO UPDATE`` + COMMIT. Then 3
tablet servers with replication factor 1 and 3: what acknowledging only writes held by every in-sync
replica costs.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from bench.harness import BenchServer, report
from bench.peers_bench import BenchPostgres, postgres_binaries, postgres_unavailable
from strom.client import Connection, Schema, TableDescriptor, TablePath, WriteResultHandle
from strom.server.local_cluster import LocalCluster

FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("score", pa.int64())])
PATH = TablePath("fluss", "ingest")


async def create(address: str, buckets: int, replication_factor: int = 1) -> None:
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(FIELDS, ["id"])
        properties = {"table.replication.factor": str(replication_factor)}
        await connection.get_admin().create_table(PATH, TableDescriptor(schema, bucket_count=buckets, properties=properties))


Ready = Callable[[], None]
"""What a writer calls once it is connected and about to write: the clock starts when every writer has."""

Acks = list[tuple[float, int]]
"""A writer's acknowledgements: ``(time.monotonic(), rows)`` as each batch was acknowledged (or each lookup
answered). ``time.monotonic`` is the machine's one clock (CLOCK_MONOTONIC), so the writers' lists merge."""

Target = Callable[[Any, int, int, int, Ready], Acks]
"""A writer's work: ``target(where, first, count, batch, ready)`` over keys ``[first, first + count)``."""

STEADY_FROM, STEADY_TO = 0.25, 0.75
"""The steady rate is measured between these shares of all rows acknowledged: it leaves out the start, when
the first batches are in flight and none is acknowledged yet, and the end, when writers that are done leave
the others' servers idle (with N processes the slowest of them sets that end)."""


def write_range(address: str, first: int, count: int, batch: int, ready: Ready) -> Acks:
    """Upsert keys ``[first, first + count)`` in pipelined Arrow batches of ``batch`` rows, made before the clock
    starts: the client's work is measured, not the making of its rows (the same for PostgreSQL's writers)."""
    tables = []
    for start in range(first, first + count, batch):
        ids = list(range(start, min(first + count, start + batch)))
        tables.append(pa.table({"id": ids, "name": [f"name-{i}" for i in ids], "score": ids}))
    acks: Acks = []

    async def acknowledged(handle: WriteResultHandle, rows: int) -> None:
        await handle.wait()
        acks.append((time.monotonic(), rows))

    async def run() -> None:
        async with await Connection.create(address) as connection:
            writer = (await connection.get_table(PATH)).new_upsert().create_writer()
            ready()
            waits = [asyncio.ensure_future(acknowledged(writer.upsert_arrow_batch(table), table.num_rows))
                     for table in tables]
            await writer.flush()
            await asyncio.gather(*waits)

    asyncio.run(run())
    return acks


WRITERS_READY_S = 120.0
WRITER_SILENT_S = 1.0


def _writer(ready: Any, finished: Any, target: Target, where: Any, first: int, count: int, batch: int) -> None:
    """A writer process: ``target`` waits for the others once connected, so that the clock measures the work
    and not the interpreters' start; once done it puts the CPU seconds its work took and its acknowledgements
    to ``finished`` (its exit is not measured)."""
    started = [0.0]

    def wait_for_the_others() -> None:
        ready.wait(WRITERS_READY_S)
        started[0] = time.process_time()

    acks = target(where, first, count, batch, wait_for_the_others)
    finished.put((time.process_time() - started[0], acks))


def steady_rate(acks: Acks, total: int) -> float:
    """Rows per second between :data:`STEADY_FROM` and :data:`STEADY_TO` of ``total`` rows acknowledged, over
    every writer's acknowledgements; 0.0 when the acknowledgements are too coarse to tell (one batch holds
    that half)."""
    done, first, last, first_done, last_done = 0, None, None, 0, 0
    for at, rows in sorted(acks):
        done += rows
        if first is None and done >= STEADY_FROM * total:
            first, first_done = at, done
        if done >= STEADY_TO * total:
            last, last_done = at, done
            break
    if first is None or last is None or last <= first:
        return 0.0
    return (last_done - first_done) / (last - first)


class Measured(NamedTuple):
    """What :func:`run_writers_probed` measured."""

    rate: float
    """Rows per second from the moment every writer was ready until the last one was done."""
    seconds: float
    """Those seconds."""
    grown: list[float]
    """How much each of the probe's counters grew over them, followed by the writers' own CPU seconds."""
    steady_rate: float
    """Rows per second over the middle half of the acknowledgements (:func:`steady_rate`)."""


def run_writers(target: Target, where: Any, rows: int, writers: int, batch: int) -> float:
    """Rows per second of ``writers`` processes running ``target(where, first, count, batch, ready)`` over
    disjoint key ranges of ``rows`` keys in total, from the moment all of them are connected and ready until
    the last one is done."""
    return run_writers_probed(target, where, rows, writers, batch, lambda: []).rate


def run_writers_probed(
    target: Target, where: Any, rows: int, writers: int, batch: int, probe: Callable[[], list[float]],
) -> Measured:
    """:func:`run_writers`, also returning the measured seconds, how much each of ``probe()``'s counters (CPU
    seconds, say) grew over exactly those seconds, and the steady rate."""
    share = rows // writers
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(writers + 1)
    finished = context.Queue()
    processes = [context.Process(target=_writer, args=(ready, finished, target, where, w * share, share, batch))
                 for w in range(writers)]
    for process in processes:
        process.start()
    ready.wait(WRITERS_READY_S)  # BrokenBarrierError when a writer died before it got there
    before = probe()
    start = time.perf_counter()
    writers_cpu_s: list[float] = []
    acks: Acks = []
    while len(writers_cpu_s) < writers:
        try:
            cpu_s, writer_acks = finished.get(timeout=WRITER_SILENT_S)
        except queue.Empty:
            failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            assert not failed, f"a writer failed with {failed[0]}"
            continue
        writers_cpu_s.append(cpu_s)
        acks.extend(writer_acks)
    seconds = time.perf_counter() - start
    grown = [after - earlier for after, earlier in zip(probe(), before, strict=True)] + [sum(writers_cpu_s)]
    for process in processes:
        process.join()
        assert process.exitcode == 0, f"a writer failed with {process.exitcode}"
    return Measured(share * writers / seconds, seconds, grown, steady_rate(acks, share * writers))


def ingest(address: str, rows: int, writers: int, batch: int) -> float:
    """Rows per second of ``writers`` processes upserting ``rows`` keys in total, until all acknowledged."""
    return run_writers(write_range, address, rows, writers, batch)


def postgres_write_range(port: int, first: int, count: int, batch: int, ready: Ready) -> Acks:
    """One PostgreSQL connection upserting keys ``[first, first + count)``, one durable transaction per batch
    (its COPY text made before the clock starts)."""
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user="bench", dbname="postgres") as connection, \
            connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE stage (id BIGINT, name TEXT, score BIGINT) ON COMMIT DELETE ROWS")
        connection.commit()
        payloads = [("".join(f"{i}\tname-{i}\t{i}\n" for i in range(start, end)).encode(), end - start)
                    for start in range(first, first + count, batch) for end in [min(first + count, start + batch)]]
        acks: Acks = []
        ready()
        for payload, rows in payloads:
            with cursor.copy("COPY stage (id, name, score) FROM STDIN") as copy:
                copy.write(payload)
            cursor.execute("INSERT INTO ingest SELECT id, name, score FROM stage ON CONFLICT (id) DO UPDATE "
                           "SET name = EXCLUDED.name, score = EXCLUDED.score")
            connection.commit()
            acks.append((time.monotonic(), rows))
        return acks


@contextmanager
def postgres_ingest_table() -> Iterator[BenchPostgres | None]:
    """A throw-away PostgreSQL holding an empty ``ingest`` table; None (and a message) without PostgreSQL."""
    missing = postgres_unavailable()
    bin_dir = postgres_binaries()
    if missing is not None or bin_dir is None:
        print(f"PostgreSQL skipped: {missing}")
        yield None
        return
    with BenchPostgres(bin_dir) as pg:
        with pg.connect() as connection:
            connection.execute("CREATE TABLE ingest (id BIGINT PRIMARY KEY, name TEXT, score BIGINT)")
            connection.commit()
        yield pg


def measure_postgres(rows: int, writers: int, batch: int) -> float | None:
    """Rows/s of ``writers`` PostgreSQL connections (processes) upserting ``rows`` keys; None without PostgreSQL."""
    with postgres_ingest_table() as pg:
        return None if pg is None else run_writers(postgres_write_range, pg.port, rows, writers, batch)


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
    parser.add_argument("--tablet-servers", type=int, default=os.cpu_count() or 2,
                        help="N: the larger cluster, and the default number of writers")
    parser.add_argument("--writers", type=int, default=None, help="writer processes (default: N)")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--buckets", type=int, default=None, help="buckets of the table (default: 2 N)")
    parser.add_argument("--no-replication", action="store_true", help="skip the replication-factor comparison")
    args = parser.parse_args()
    n = args.tablet_servers
    writers = args.writers or n
    buckets = args.buckets or 2 * n
    with BenchServer({"kv.snapshot.interval": "0s"}) as server:
        asyncio.run(create(server.address, buckets))
        single = ingest(server.address, args.rows, writers, args.batch)
    one = measure_cluster(1, args.rows, writers, args.batch, buckets)
    many = measure_cluster(n, args.rows, writers, args.batch, buckets)
    postgres = measure_postgres(args.rows, writers, args.batch)
    lines = [
        ("strom server (one process)", f"{single:,.0f} rows/s"),
        ("cluster, 1 tablet server", f"{one:,.0f} rows/s"),
        (f"cluster, {n} tablet servers", f"{many:,.0f} rows/s"),
        ("1 tablet server / one process", f"{one / single:.2f}"),
        (f"{n} tablet servers / 1 tablet server", f"{many / one:.2f} (0.7 N = {0.7 * n:.1f})"),
    ]
    if postgres is not None:
        lines += [
            (f"PostgreSQL, {writers} connections", f"{postgres:,.0f} rows/s"),
            (f"cluster, {n} tablet servers / PostgreSQL", f"{many / postgres:.2f}"),
            ("strom server / PostgreSQL", f"{single / postgres:.2f}"),
        ]
    if not args.no_replication:
        three_rf1 = measure_cluster(3, args.rows, writers, args.batch, buckets)
        three_rf3 = measure_cluster(3, args.rows, writers, args.batch, buckets, replication_factor=3)
        lines += [
            ("cluster, 3 tablet servers, replication factor 1", f"{three_rf1:,.0f} rows/s"),
            ("cluster, 3 tablet servers, replication factor 3", f"{three_rf3:,.0f} rows/s"),
            ("replication factor 3 / 1", f"{three_rf3 / three_rf1:.2f}"),
        ]
    report(f"durable upsert ingest, {writers} writer processes, {buckets} buckets, {os.cpu_count()} cores (same run)",
           lines)


if __name__ == "__main__":
    main()
