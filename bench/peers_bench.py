"""strom against PostgreSQL: the same rows, the same batches, measured side by side in one run.

Workload: ``id BIGINT`` primary key and a 100-character incompressible string (base64 of random bytes),
written in 10 000-row batches, every write acknowledged only once durable; then read back by key.

strom (a ``strom server`` child process on loopback, 2 buckets; ``--workers 1,2`` compares the one-process
server with ``strom server --workers 2`` in one run):
* strom's client, Arrow batches (``upsert_arrow_batch``, pipelined): load (new keys), then update every
  row (new payloads), into a table with ``table.changelog.image=FULL`` (the default) and one with ``WAL``;
* pyfluss, the official client, row by row (``writer.upsert(dict)``, it has no batch upsert), load only;
* batched lookups, ``Lookuper.lookup_arrow`` of 1 000 keys; single lookups through strom's asyncio
  lookuper and its blocking lookuper, p50/p99;
* all of it twice: with the row cache at its default (it holds the whole table: cache-hot) and with a
  16 MiB row cache (a tenth of the table: cache-cold).

PostgreSQL (a throw-away cluster started by this bench with the installed server binaries; fsync,
synchronous_commit and full_page_writes at their defaults, i.e. on):
* per 10 000 rows one transaction: COPY into a temporary table, ``INSERT … SELECT … ON CONFLICT (id) DO
  UPDATE``, COMMIT (the WAL flushed before the commit returns); load, then update;
* batched lookups ``SELECT … WHERE id = ANY($1)`` of 1 000 keys; single lookups with a prepared
  ``SELECT … WHERE id = $1``, p50/p99.

Before the lookups each server is left to go quiet (under 5 % of a core for half a second: RocksDB's flushes
and compactions after the writes; PostgreSQL's after its VACUUM ANALYZE), and the wait is printed: a latency
taken while the writes' leftovers share the two cores measures those, not the request path.

Floor: a blocking Python socket's round trip to a uvloop echo server, p50/p99 — what any single lookup
between a Python client and a Python server pays here before doing any work.

Both clients start from the same Arrow batches and connect over TCP loopback. Throughput ratios are
strom rows/s ÷ PostgreSQL rows/s; latencies are printed side by side. Without PostgreSQL's server
binaries (Debian's ``postgresql`` package) or psycopg (``pip install -e '.[bench]'``) the PostgreSQL half
is skipped with a message.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import glob
import io
import multiprocessing
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from bench.harness import BenchServer, free_port, median, percentile, report, wait_for_quiet
from bench.ingest_bench import pyfluss_client
from strom.client import Connection, Lookuper, Schema, TableDescriptor, TablePath

BATCH_ROWS = 10_000
LOOKUP_KEYS = 1_000
PAYLOAD_CHARS = 100
BUCKETS = 2


def make_rows(count: int, seed: int) -> pa.Table:
    """``count`` rows: ids 0..count-1 and 100-character base64 strings of random bytes (75 bytes each)."""
    raw = random.Random(seed).randbytes(count * PAYLOAD_CHARS * 3 // 4)
    data = base64.b64encode(raw)  # 75 bytes -> exactly 100 characters, so row i is data[100 i : 100 (i + 1)]
    offsets = np.arange(0, (count + 1) * PAYLOAD_CHARS, PAYLOAD_CHARS, dtype=np.int32)
    payload = pa.StringArray.from_buffers(count, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))
    return pa.table({"id": pa.array(np.arange(count, dtype=np.int64)), "payload": payload})


# ---------------------------------------------------------------------------------------------- strom


async def strom_writes(address: str, load: pa.Table, update: pa.Table, name: str, image: str) -> tuple[float, float]:
    """Rows/s of the load (new keys) and of the update (every key again) through strom's client."""
    schema = Schema.from_arrow(load.schema, primary_key=["id"])
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", name)
        descriptor = TableDescriptor(schema, bucket_count=BUCKETS, properties={"table.changelog.image": image})
        await connection.get_admin().create_table(path, descriptor)
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        rates = []
        for rows in (load, update):
            batches = rows.to_batches(max_chunksize=BATCH_ROWS)
            start = time.perf_counter()
            for batch in batches:
                writer.upsert_arrow_batch(batch)  # pipelined; flush() returns once every batch is durable
            await writer.flush()
            rates.append(rows.num_rows / (time.perf_counter() - start))
        return rates[0], rates[1]


async def pyfluss_load(address: str, rows: pa.Table, name: str) -> float:
    """pyfluss row by row into a new table, as the ingest bench measures it."""
    schema = Schema.from_arrow(rows.schema, primary_key=["id"])
    return await pyfluss_client(address, rows, schema, BUCKETS, name)


async def strom_lookups(address: str, name: str, lookups: list[int], singles: int) -> tuple[float, list[float], list[float]]:
    async with await Connection.create(address) as connection:
        table = await connection.get_table(TablePath("fluss", name))
        lookuper = table.new_lookup().create_lookuper()
        assert isinstance(lookuper, Lookuper)
        keys = pa.table({"id": pa.array(lookups, pa.int64())})
        start = time.perf_counter()
        for offset in range(0, len(lookups), LOOKUP_KEYS):
            found = await lookuper.lookup_arrow(keys.slice(offset, LOOKUP_KEYS))
            assert found.num_rows == min(LOOKUP_KEYS, len(lookups) - offset)
        batched = len(lookups) / (time.perf_counter() - start)
        latencies = []
        for key in lookups[:singles]:
            begin = time.perf_counter_ns()
            await lookuper.lookup({"id": key})
            latencies.append((time.perf_counter_ns() - begin) / 1000)

        def blocking() -> list[float]:
            measured = []
            with table.new_lookup().create_blocking_lookuper() as blocking_lookuper:
                for key in lookups[:singles]:
                    begin = time.perf_counter_ns()
                    blocking_lookuper.lookup({"id": key})
                    measured.append((time.perf_counter_ns() - begin) / 1000)
            return measured

        return batched, latencies, await asyncio.to_thread(blocking)


COLD_CACHE = "16mb"
"""The row cache of the cache-cold run: a tenth of what 1 M rows take, so most old values and lookups go to
RocksDB (the hot run leaves ``kv.row-cache.size`` at its default, which holds the whole table)."""


def run_strom(load: pa.Table, update: pa.Table, lookups: list[int], singles: int, round_: int,
              row_cache: str | None = None, binding: str = "auto", workers: int = 1) -> dict[str, Any]:
    results: dict[str, Any] = {}
    config = {"kv.snapshot.interval": "0s", "kv.rocksdb.binding": binding,
              **({"kv.row-cache.size": row_cache} if row_cache else {})}
    with BenchServer(config, workers=workers) as server:
        for image in ("FULL", "WAL"):
            name = f"peers_{image.lower()}_{round_}"
            results[image] = asyncio.run(strom_writes(server.address, load, update, name, image))
        results["pyfluss"] = asyncio.run(pyfluss_load(server.address, load, f"peers_pyfluss_{round_}"))
        assert server.process is not None
        results["quiet_wait_s"] = wait_for_quiet(server.process.pid)  # the writes' compactions, as below
        results["lookups"] = asyncio.run(strom_lookups(server.address, f"peers_full_{round_}", lookups, singles))
    return results


def _echo_server(port: int, ready: Any) -> None:
    """A uvloop TCP echo server (the event loop strom's server runs on), for the round-trip floor."""
    import uvloop

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    async def serve() -> None:
        await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", port)
        ready.set()
        await asyncio.sleep(3600)

    uvloop.run(serve())


def python_round_trips(count: int) -> list[float]:
    """Latencies (µs) of a blocking Python socket sending 64 bytes to a Python echo server and reading
    them back over loopback: the floor under any single lookup between a Python client and server here."""
    port = free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_echo_server, args=(port, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the echo server did not start")
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            message = b"x" * 64
            latencies = []
            for _ in range(count):
                begin = time.perf_counter_ns()
                sock.sendall(message)
                received = 0
                while received < len(message):
                    received += len(sock.recv(4096))
                latencies.append((time.perf_counter_ns() - begin) / 1000)
            return latencies
    finally:
        server.kill()
        server.join()


# ------------------------------------------------------------------------------------------ PostgreSQL


def postgres_binaries() -> Path | None:
    """The bin directory of the newest installed PostgreSQL server (Debian's layout, then PATH)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
                        if Path(p).parent.parent.name.isdigit() else 0)
    for initdb in reversed(candidates):
        directory = Path(initdb).parent
        if (directory / "pg_ctl").exists() and (directory / "postgres").exists():
            return directory
    initdb_on_path = shutil.which("initdb")
    if initdb_on_path:
        directory = Path(os.path.realpath(initdb_on_path)).parent
        if (directory / "pg_ctl").exists():
            return directory
    return None


class BenchPostgres:
    """A throw-away PostgreSQL cluster in a temporary directory on a free loopback port (a context manager).

    initdb refuses to run as root, so as root the cluster belongs to the ``postgres`` system user that
    Debian's package creates, and the server binaries run through ``runuser``.
    """

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="strom-bench-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.sockets.mkdir()
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")  # KeyError when there is no such user: handled by the caller
            for path in (self.root, self.sockets):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.started = False

    def _run(self, *command: str) -> None:
        subprocess.run([*self.prefix, *command], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> BenchPostgres:
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "bench", "--auth=trust",
                  "--encoding=UTF8", "--no-locale", "--no-sync")
        options = " ".join([
            f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-k {self.sockets}",
            # the update pass rewrites every row: room for it without a forced checkpoint mid-pass
            "-c shared_buffers=512MB", "-c max_wal_size=8GB", "-c checkpoint_timeout=30min",
        ])
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l",
                  str(self.root / "server.log"), "-w", "-t", "60", "start")
        self.started = True
        return self

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="bench", dbname="postgres")

    def postmaster_pid(self) -> int:
        """The server's first process (its first line of ``postmaster.pid``); every backend descends from it."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        if self.started:
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.started = False

    def __enter__(self) -> BenchPostgres:
        try:
            return self.start()
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


COPY_OPTIONS = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")


def copy_text(batch: pa.RecordBatch) -> bytes:
    """The batch in COPY's text format (base64 has no tab, newline or backslash to escape)."""
    sink = io.BytesIO()
    pacsv.write_csv(batch, sink, COPY_OPTIONS)
    return sink.getvalue()


def postgres_upserts(connection: Any, rows: pa.Table) -> float:
    """Rows/s: per batch COPY into the temporary table, INSERT … ON CONFLICT DO UPDATE, COMMIT."""
    start = time.perf_counter()
    with connection.cursor() as cursor:
        for batch in rows.to_batches(max_chunksize=BATCH_ROWS):
            with cursor.copy("COPY stage (id, payload) FROM STDIN") as copy:
                copy.write(copy_text(batch))
            cursor.execute("INSERT INTO kv (id, payload) SELECT id, payload FROM stage "
                           "ON CONFLICT (id) DO UPDATE SET payload = EXCLUDED.payload")
            connection.commit()  # stage is emptied at commit (ON COMMIT DELETE ROWS)
    return rows.num_rows / (time.perf_counter() - start)


def run_postgres(pg: BenchPostgres, load: pa.Table, update: pa.Table, lookups: list[int], singles: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with pg.connect() as connection:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS kv")
            cursor.execute("CREATE TABLE kv (id BIGINT PRIMARY KEY, payload TEXT NOT NULL)")
            cursor.execute("CREATE TEMPORARY TABLE IF NOT EXISTS stage (id BIGINT, payload TEXT) ON COMMIT DELETE ROWS")
        connection.commit()
        results["write"] = (postgres_upserts(connection, load), postgres_upserts(connection, update))
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE kv")
            results["quiet_wait_s"] = wait_for_quiet(pg.postmaster_pid())  # as for strom: the writes' leftovers
            start = time.perf_counter()
            for offset in range(0, len(lookups), LOOKUP_KEYS):
                cursor.execute("SELECT id, payload FROM kv WHERE id = ANY(%s::bigint[])",
                               (lookups[offset : offset + LOOKUP_KEYS],), prepare=True)
                found = cursor.fetchall()
                assert len(found) == len(set(lookups[offset : offset + LOOKUP_KEYS]))
            batched = len(lookups) / (time.perf_counter() - start)
            latencies = []
            for key in lookups[:singles]:
                begin = time.perf_counter_ns()
                cursor.execute("SELECT id, payload FROM kv WHERE id = %s", (key,), prepare=True)
                cursor.fetchone()
                latencies.append((time.perf_counter_ns() - begin) / 1000)
        results["lookups"] = (batched, latencies)
    return results


# ------------------------------------------------------------------------------------------------ main


def postgres_unavailable() -> str | None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[bench]')"
    if postgres_binaries() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl; Debian: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run initdb as"
    return None


def main() -> None:
    global BUCKETS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=100_000)
    parser.add_argument("--singles", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--bindings", default="auto",
                        help="strom's RocksDB bindings to measure, comma-separated (native,rocksdict: an A/B in one "
                             "run, alternating each round); default: the server's own choice")
    parser.add_argument("--workers", default="1",
                        help="`strom server --workers N` for each N, comma-separated (1,2: both in one run, "
                             "alternating each round); with --bindings, one of the two lists has one entry")
    parser.add_argument("--buckets", type=int, default=BUCKETS, help="buckets of every strom table")
    parser.add_argument("--no-cold", action="store_true", help="skip the cache-cold strom runs")
    args = parser.parse_args()
    BUCKETS = args.buckets
    worker_counts = [int(n) for n in args.workers.split(",")]
    bindings = args.bindings.split(",")
    if len(worker_counts) > 1 and len(bindings) > 1:
        parser.error("compare bindings or worker counts in one run, not both")
    # each strom variant measured: (label, binding, workers)
    variants = ([(binding, binding, worker_counts[0]) for binding in bindings] if len(worker_counts) == 1
                else [(f"workers={n}", bindings[0], n) for n in worker_counts])
    missing = postgres_unavailable()
    if missing:
        print(f"peers_bench: skipped, {missing}.")
        return
    load, update = make_rows(args.rows, seed=11), make_rows(args.rows, seed=12)
    rng = random.Random(13)
    lookups = [rng.randrange(args.rows) for _ in range(args.lookups)]
    singles = min(args.singles, args.lookups)
    hot: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
    cold: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
    postgreses, round_trips = [], []
    bin_dir = postgres_binaries()
    assert bin_dir is not None
    for round_ in range(args.rounds):
        for label, binding, workers in variants:
            hot[label].append(run_strom(load, update, lookups, singles, round_, binding=binding, workers=workers))
            if not args.no_cold:
                cold[label].append(run_strom(load, update, lookups, singles, round_, COLD_CACHE, binding, workers))
        round_trips.append(python_round_trips(singles))
        with BenchPostgres(bin_dir) as pg:
            postgreses.append(run_postgres(pg, load, update, lookups, singles))

    def med(values: list[float]) -> float:
        return median(values)

    def spread(values: list[float]) -> str:
        return f" (rounds {min(values):,.0f}–{max(values):,.0f})" if len(values) > 1 else ""

    pg_load = med([r["write"][0] for r in postgreses])
    pg_update = med([r["write"][1] for r in postgreses])
    pg_batched = med([r["lookups"][0] for r in postgreses])
    pg_lat = [x for r in postgreses for x in r["lookups"][1]]
    lines = [
        ("PostgreSQL COPY + INSERT ON CONFLICT, load",
         f"{pg_load:,.0f} rows/s{spread([r['write'][0] for r in postgreses])}"),
        ("PostgreSQL COPY + INSERT ON CONFLICT, update",
         f"{pg_update:,.0f} rows/s{spread([r['write'][1] for r in postgreses])}"),
    ]
    lines += [("PostgreSQL = ANY of 1 000 keys", f"{pg_batched:,.0f} keys/s{spread([r['lookups'][0] for r in postgreses])}"),
              ("single lookups p50 / p99: PostgreSQL prepared SELECT",
               f"{median(pg_lat):.0f} / {percentile(pg_lat, 0.99):.0f} µs")]
    for label, _, _ in variants:
        tag = "" if label == "auto" else f" [{label}]"
        stroms, colds = hot[label], cold[label]
        for runs, cache in ((stroms, "row cache hot"), (colds, f"row cache cold ({COLD_CACHE})")):
            if not runs:
                continue
            for image in ("FULL", "WAL"):
                for index, (what, pg_rate) in enumerate((("load", pg_load), ("update", pg_update))):
                    rates = [r[image][index] for r in runs]
                    rate = med(rates)
                    lines.append((f"strom client, Arrow batches, {image} image, {what}, {cache}{tag}",
                                  f"{rate:,.0f} rows/s  strom/PostgreSQL {rate / pg_rate:.2f}{spread(rates)}"))
        official = [r["pyfluss"] for r in stroms]
        lines.append((f"pyfluss row by row (FULL image), load{tag}",
                      f"{med(official):,.0f} rows/s  strom/PostgreSQL {med(official) / pg_load:.2f}{spread(official)}"))
        batched = [r["lookups"][0] for r in stroms]
        lines.append((f"strom lookup_arrow of 1 000 keys, row cache hot{tag}",
                      f"{med(batched):,.0f} keys/s  strom/PostgreSQL {med(batched) / pg_batched:.2f}{spread(batched)}"))
        if colds:
            cold_batched = med([r["lookups"][0] for r in colds])
            lines.append((f"strom lookup_arrow of 1 000 keys, row cache cold{tag}",
                          f"{cold_batched:,.0f} keys/s  strom/PostgreSQL {cold_batched / pg_batched:.2f}"))
        for label, index in (("strom asyncio lookuper", 1), ("strom blocking lookuper", 2)):
            latencies = [x for r in stroms for x in r["lookups"][index]]
            lines.append((f"single lookups p50 / p99: {label}{tag}",
                          f"{median(latencies):.0f} / {percentile(latencies, 0.99):.0f} µs"))
    waits = [r["quiet_wait_s"] for runs in hot.values() for r in runs]
    lines.append(("waited for the servers to go quiet before lookups, median: strom / PostgreSQL",
                  f"{median(waits):.1f} / {median([r['quiet_wait_s'] for r in postgreses]):.1f} s"))
    floor = [x for trips in round_trips for x in trips]
    lines.append(("floor: Python socket round trip to a uvloop echo server, p50 / p99",
                  f"{median(floor):.0f} / {percentile(floor, 0.99):.0f} µs"))
    report(f"strom against PostgreSQL, {args.rows:,} rows (id BIGINT PK + 100-char string), {BATCH_ROWS:,}-row "
           f"batches, durable; {args.lookups:,} lookups, {singles:,} singles; {args.rounds} round(s)", lines)


if __name__ == "__main__":
    main()
