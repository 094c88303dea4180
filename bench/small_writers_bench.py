"""Many small writers: N independent clients each upserting 1–20 rows and waiting for the durable
acknowledgement, strom against PostgreSQL in one run.

Workload: a table with an ``id BIGINT`` primary key and a 100-character string. Each of ``--connections``
writers (default 100) loops: pick 1–20 distinct random keys from ``--keys`` (default 1 M), sorted (so
PostgreSQL's row locks are always taken in the same order and concurrent upserts cannot deadlock), upsert
them with fresh payloads, wait for the acknowledgement, repeat — for ``--seconds`` after ``--warmup``.

* strom (a ``strom server`` child process on loopback, 2 buckets, ``table.changelog.image`` FULL — the
  default — and, with ``--wal``, WAL too): every writer has its own :class:`strom.client.Connection`
  (its own TCP connection, metadata and idempotent writer id, as 100 independent clients would) and
  sends each request with ``UpsertWriter.upsert_batch``, which returns once the rows are fsynced in the
  changelog and applied to RocksDB.
* PostgreSQL (the throw-away cluster of :mod:`bench.peers_bench`; fsync and synchronous_commit on): every
  writer has its own psycopg ``AsyncConnection`` in autocommit mode and sends each request as one
  prepared ``INSERT … SELECT FROM unnest($1::bigint[], $2::text[]) ON CONFLICT (id) DO UPDATE``, which
  returns once the commit record is flushed.

Both sides are driven by the same harness: ``--processes`` client processes (default 2) each run an
asyncio loop with ``connections / processes`` writer tasks. The machine has 2 cores that the server
shares, and a writer spends far longer waiting for its acknowledgement than encoding its request, so a
few asyncio processes model many mostly-idle clients without a thread or process per client; more client
processes than cores would only steal CPU from the server. strom's client costs more CPU per request than
psycopg's (Arrow batch, KV batch encoding), so the client side handicaps strom rather than flatters it.
Client CPU time per request is printed for both so the reader can tell.

Latency is measured per request from just before it is encoded until its acknowledgement. Printed: rows/s,
acknowledged requests/s, p50/p99 latency, and strom ÷ PostgreSQL ratios. ``--strom-address`` drives an
already running server instead (for profiling it).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from bench.harness import BenchServer, median, percentile, report
from bench.peers_bench import BenchPostgres, postgres_binaries, postgres_unavailable
from strom.client import Connection, Schema, TableDescriptor, TablePath

BUCKETS = 2
PAYLOAD_CHARS = 100
PAYLOAD_POOL = 4096
ROWS_MIN, ROWS_MAX = 1, 20
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
PG_UPSERT = (
    "INSERT INTO kv (id, payload) SELECT * FROM unnest(%s::bigint[], %s::text[]) "
    "ON CONFLICT (id) DO UPDATE SET payload = EXCLUDED.payload"
)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one client process runs (picklable, sent to spawned processes)."""

    target: str  # "strom" or "postgres"
    address: str  # strom HOST:PORT, or a PostgreSQL conninfo string
    table: str
    writers: int
    keys: int
    warmup_s: float
    seconds: float
    seed: int


@dataclass(slots=True)
class Measured:
    rows: int = 0
    requests: int = 0
    latencies_us: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    errors: int = 0


def payloads(seed: int) -> list[str]:
    raw = random.Random(seed).randbytes(PAYLOAD_POOL * PAYLOAD_CHARS * 3 // 4)
    text = base64.b64encode(raw).decode()
    return [text[i * PAYLOAD_CHARS : (i + 1) * PAYLOAD_CHARS] for i in range(PAYLOAD_POOL)]


def next_request(rng: random.Random, plan: Plan, pool: list[str]) -> tuple[list[int], list[str]]:
    ids = sorted(rng.sample(range(plan.keys), rng.randint(ROWS_MIN, ROWS_MAX)))
    return ids, [pool[rng.randrange(PAYLOAD_POOL)] for _ in ids]


Send = Any  # an async callable taking (ids, payloads) that returns once the upsert is acknowledged


async def open_strom(plan: Plan) -> tuple[Send, Any]:
    """One independent strom client: its own Connection, table handle and (idempotent) writer."""
    connection = await Connection.create(plan.address)
    table = await connection.get_table(TablePath("fluss", plan.table))
    writer = table.new_upsert().create_writer()

    def send(ids: list[int], texts: list[str]) -> Any:
        arrays = [pa.array(ids, pa.int64()), pa.array(texts, pa.string())]
        return writer.upsert_batch(pa.record_batch(arrays, schema=ARROW_SCHEMA))

    return send, connection.close


async def open_postgres(plan: Plan) -> tuple[Send, Any]:
    """One psycopg connection in autocommit mode: each upsert is its own durable transaction."""
    import psycopg

    connection = await psycopg.AsyncConnection.connect(plan.address, autocommit=True)
    cursor = connection.cursor()

    def send(ids: list[int], texts: list[str]) -> Any:
        return cursor.execute(PG_UPSERT, (ids, texts), prepare=True)

    return send, connection.close


async def write_loop(plan: Plan, index: int, send: Send, start: float, out: Measured) -> None:
    rng, pool = random.Random(plan.seed * 100_003 + index), payloads(plan.seed * 100_003 + index)
    measure_from, stop_at = start + plan.warmup_s, start + plan.warmup_s + plan.seconds
    while True:
        ids, texts = next_request(rng, plan, pool)
        begin = time.monotonic()
        if begin >= stop_at:
            return
        try:
            await send(ids, texts)
        except Exception:  # counted and printed: a run with errors is not a number to quote
            out.errors += 1
            continue
        end = time.monotonic()
        if begin >= measure_from and end <= stop_at:
            out.rows += len(ids)
            out.requests += 1
            out.latencies_us.append((end - begin) * 1e6)


async def run_process(plan: Plan, index: int, barrier: Any) -> Measured:
    """Connect every writer of this process, line up with the other processes, then write."""
    opener = open_strom if plan.target == "strom" else open_postgres
    opened = await asyncio.gather(*(opener(plan) for _ in range(plan.writers)))
    await asyncio.to_thread(barrier.wait)  # every process has connected all its writers
    out = Measured()
    start, cpu_start = time.monotonic(), time.process_time()
    first = index * 100_000
    await asyncio.gather(*(write_loop(plan, first + i, send, start, out) for i, (send, _c) in enumerate(opened)))
    out.cpu_s = time.process_time() - cpu_start
    for _send, close in opened:
        await close()
    return out


def process_main(plan: Plan, index: int, barrier: Any, results: Any) -> None:
    try:
        results.put((index, run_process_sync(plan, index, barrier)))
    except BaseException as exc:
        barrier.abort()
        results.put((index, exc))


def run_process_sync(plan: Plan, index: int, barrier: Any) -> Measured:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run_process(plan, index, barrier))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_process(plan, index, barrier))


def drive(plan: Plan, connections: int, processes: int) -> Measured:
    """Run ``connections`` writers split over ``processes`` client processes; merge what they measured."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    results = context.Queue()
    share = [connections // processes + (1 if i < connections % processes else 0) for i in range(processes)]
    children = [
        context.Process(target=process_main, args=(Plan(**{**asdict(plan), "writers": n}), i, barrier, results))
        for i, n in enumerate(share)
    ]
    for child in children:
        child.start()
    merged = Measured()
    for _ in children:
        _index, measured = results.get()
        if isinstance(measured, BaseException):
            for child in children:
                child.kill()
            raise RuntimeError(f"a client process failed: {measured!r}") from measured
        merged.rows += measured.rows
        merged.requests += measured.requests
        merged.latencies_us += measured.latencies_us
        merged.cpu_s += measured.cpu_s
        merged.errors += measured.errors
    for child in children:
        child.join()
    return merged


# ---------------------------------------------------------------------------------------------- setup


async def create_strom_table(address: str, name: str, image: str) -> None:
    schema = Schema.from_arrow(ARROW_SCHEMA, primary_key=["id"])
    async with await Connection.create(address) as connection:
        descriptor = TableDescriptor(schema, bucket_count=BUCKETS, properties={"table.changelog.image": image})
        await connection.get_admin().create_table(TablePath("fluss", name), descriptor, ignore_if_exists=True)


def run_strom(args: argparse.Namespace, images: list[str], round_: int) -> dict[str, Measured]:
    results = {}

    def measure(address: str) -> None:
        for image in images:
            name = f"small_writers_{image.lower()}_{round_}"
            asyncio.run(create_strom_table(address, name, image))
            plan = Plan("strom", address, name, 0, args.keys, args.warmup, args.seconds, seed=round_ + 1)
            results[image] = drive(plan, args.connections, args.processes)

    if args.strom_address:
        measure(args.strom_address)
    else:
        with BenchServer({"kv.snapshot.interval": "0s"}) as server:
            measure(server.address)
    return results


def run_postgres(args: argparse.Namespace, round_: int) -> Measured:
    bin_dir = postgres_binaries()
    assert bin_dir is not None
    with BenchPostgres(bin_dir) as pg:
        with pg.connect() as connection:
            connection.execute("CREATE TABLE kv (id BIGINT PRIMARY KEY, payload TEXT NOT NULL)")
            connection.commit()
            connection.autocommit = True
            # room for every client connection besides this one (the default is 100)
            connection.execute(f"ALTER SYSTEM SET max_connections = {args.connections + 20}")
        pg._run(str(pg.bin_dir / "pg_ctl"), "-D", str(pg.data), "-w", "-t", "60", "restart")
        conninfo = f"host=127.0.0.1 port={pg.port} user=bench dbname=postgres"
        plan = Plan("postgres", conninfo, "kv", 0, args.keys, args.warmup, args.seconds, seed=round_ + 1)
        return drive(plan, args.connections, args.processes)


# ------------------------------------------------------------------------------------------------ main


def line(label: str, measured: Measured, seconds: float, peer: Measured | None = None) -> tuple[str, str]:
    rows_s, acks_s = measured.rows / seconds, measured.requests / seconds
    lat = measured.latencies_us
    p50, p99 = (median(lat) / 1000, percentile(lat, 0.99) / 1000) if lat else (float("nan"), float("nan"))
    cpu_us = measured.cpu_s / max(measured.requests, 1) * 1e6
    text = f"{rows_s:,.0f} rows/s  {acks_s:,.0f} acks/s  p50 {p50:.1f} ms  p99 {p99:.1f} ms  client CPU {cpu_us:.0f} µs/req"
    if measured.errors:
        text += f"  ERRORS {measured.errors}"
    if peer is not None and peer.requests and lat:
        text += (f"  | strom/PG rows/s {rows_s / (peer.rows / seconds):.2f}, "
                 f"p99 {percentile(lat, 0.99) / percentile(peer.latencies_us, 0.99):.2f}")
    return label, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2, help="client processes sharing the connections")
    parser.add_argument("--keys", type=int, default=1_000_000, help="key space the random keys come from")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured time per system")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured time before it")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--wal", action="store_true", help="also measure a table.changelog.image=WAL table")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--strom-address", help="drive this running strom server instead of starting one")
    args = parser.parse_args()
    missing = None if args.skip_postgres else postgres_unavailable()
    if missing:
        print(f"small_writers_bench: PostgreSQL half skipped, {missing}.")
    images = ["FULL", "WAL"] if args.wal else ["FULL"]
    for round_ in range(args.rounds):
        strom = run_strom(args, images, round_)
        pg = None if (missing or args.skip_postgres) else run_postgres(args, round_)
        lines = []
        if pg is not None:
            lines.append(line("PostgreSQL INSERT … ON CONFLICT, autocommit", pg, args.seconds))
        for image in images:
            lines.append(line(f"strom upsert_batch, {image} image", strom[image], args.seconds, pg))
        report(f"{args.connections} small writers (1–{ROWS_MAX} random rows of {args.keys:,} keys per request, "
               f"acknowledged when durable), {args.processes} client process(es), {args.seconds:.0f} s, "
               f"round {round_ + 1}/{args.rounds}", lines)


if __name__ == "__main__":
    main()
