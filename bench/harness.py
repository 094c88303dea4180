"""Shared bench plumbing: a strom server in a child process, timing helpers, result printing.

Benchmarks are not tests: they print what they measured and ratios against a raw ceiling measured in the
same run, and never assert timings.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import rocksdict

from strom.client import Connection, Table, TableDescriptor, TablePath
from strom.records import row_batches
from strom.records.kv_batch import SCHEMA_ID
from strom.records.schema import Schema
from strom.zk.zookeeper_server import free_port  # the benches' import of it too

READY_TIMEOUT_S = 30.0
RAW_BATCH_ROWS = 10_000


async def create_loaded_table(connection: Connection, path: TablePath, rows: pa.Table, buckets: int,
                              batch_rows: int) -> Table:
    """A new primary-key table (``id`` the key) holding ``rows``, upserted in Arrow batches of ``batch_rows``
    and flushed: every row acknowledged when it returns."""
    schema = Schema.from_arrow(rows.schema, primary_key=["id"])
    await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=buckets))
    table = await connection.get_table(path)
    writer = table.new_upsert().create_writer()
    for batch in rows.to_batches(max_chunksize=batch_rows):
        writer.upsert_arrow_batch(batch)
    await writer.flush()
    return table


class BenchServer:
    """``strom server`` on a free loopback port with a throw-away data directory (a context manager)."""

    def __init__(self, config: dict[str, str] | None = None, data_dir: Path | None = None, workers: int = 1) -> None:
        """``workers`` > 1: ``strom server --workers N`` (a coordinator and N tablet-server processes)."""
        self._temporary = None if data_dir else tempfile.TemporaryDirectory(prefix="strom-bench-")
        self.data_dir = data_dir or Path(self._temporary.name) / "data"  # type: ignore[union-attr]
        self.config = config or {}
        self.workers = workers
        self.port = free_port() if workers == 1 else 0  # workers: every port free, the bootstrap one printed
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> BenchServer:
        command = [sys.executable, "-m", "strom.cli.main", "server", "--bind", self.address,
                   "--data-dir", str(self.data_dir), "--log-level", "WARNING"]
        for key, value in self.config.items():
            command += ["-D", f"{key}={value}"]
        if self.workers > 1:
            return self._start_workers(command)
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the bench server did not start")

    def _start_workers(self, command: list[str]) -> BenchServer:
        """Started once the supervisor prints its bootstrap address (after every worker has registered)."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir.parent / "supervisor.log"
        with log_path.open("wb") as log:
            self.process = subprocess.Popen([*command, "--workers", str(self.workers)], stdout=log, stderr=log)
        deadline = time.monotonic() + READY_TIMEOUT_S * 2
        while time.monotonic() < deadline:
            found = re.search(r"strom listening on \S+:(\d+) with", log_path.read_text())
            if found:
                self.port = int(found.group(1))
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"the bench workers did not start:\n{log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            self.process.wait(60)

    def rss_bytes(self) -> tuple[int, int]:
        """Current and peak resident memory of the server process."""
        assert self.process is not None
        current = peak = 0
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
        return current, peak

    def __enter__(self) -> BenchServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._temporary is not None:
            self._temporary.cleanup()


def _stat_fields(pid: int, thread: int | None = None) -> list[str]:
    """The fields of Linux's ``/proc/<pid>/stat`` (``thread``: ``/proc/<pid>/task/<thread>/stat``, that thread's
    alone) after the command name (which may hold spaces and ")")."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    return Path(path).read_text().rsplit(")", 1)[1].split()


def _cpu_s(fields: list[str]) -> float:
    """User + system CPU seconds of :func:`_stat_fields`."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, all its threads together."""
    return _cpu_s(_stat_fields(pid))


def _every_stat_fields() -> dict[int, list[str]]:
    """:func:`_stat_fields` of every process, from one pass over ``/proc``."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = _stat_fields(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    return stats


def _descendants(pid: int, stats: dict[int, list[str]]) -> set[int]:
    """``pid`` and every process in ``stats`` below it (field 1 of each is its parent's pid)."""
    tree = {pid}
    grown = True
    while grown:
        children = {child for child, fields in stats.items() if int(fields[1]) in tree} - tree
        tree |= children
        grown = bool(children)
    return tree


def process_tree(pid: int) -> set[int]:
    """``pid`` and every live descendant: a ``--workers N`` server is a supervisor, a coordinator and N
    tablet servers."""
    return _descendants(pid, _every_stat_fields())


def process_tree_cpu_s(pid: int) -> float:
    """:func:`process_cpu_s` of ``pid`` and every live descendant, from the same pass over ``/proc``."""
    stats = _every_stat_fields()
    return sum(_cpu_s(stats[member]) for member in _descendants(pid, stats) if member in stats)


QUIET_CORE_FRACTION = 0.05
QUIET_WINDOW_S = 0.5
QUIET_TIMEOUT_S = 120.0


def wait_for_quiet(pid: int) -> float:
    """Wait until ``pid`` and its descendants use under :data:`QUIET_CORE_FRACTION` of a core over
    :data:`QUIET_WINDOW_S` (or :data:`QUIET_TIMEOUT_S` passed); the seconds waited. A latency measured right
    after a bulk write otherwise measures the write's leftovers (RocksDB's flushes and compactions, a
    database's background writers) competing for the cores, not the request path."""
    start = time.monotonic()
    before = process_tree_cpu_s(pid)
    while time.monotonic() - start < QUIET_TIMEOUT_S:
        time.sleep(QUIET_WINDOW_S)
        after = process_tree_cpu_s(pid)
        if after - before < QUIET_CORE_FRACTION * QUIET_WINDOW_S:
            break
        before = after
    return time.monotonic() - start


def threads_run_ns_and_wakeups(pids: set[int]) -> tuple[int, int]:
    """Nanoseconds on a CPU (``schedstat``, exact where ``stat``'s ticks are 10 ms) and context switches
    (each one a wake-up or a preemption), summed over every thread of ``pids``."""
    run_ns = switches = 0
    for pid in pids:
        try:
            threads = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for thread in threads:
            try:
                run_ns += int((thread / "schedstat").read_text().split()[0])
                status = (thread / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                    switches += int(line.split()[1])
    return run_ns, switches


def serving_processes(pid: int) -> list[int]:
    """The processes of a server that serve tablets: each ``tablet-server`` below ``pid`` of a ``--workers N``
    server, or ``pid`` itself (the one-process server)."""
    servers = []
    for member in sorted(process_tree(pid)):
        try:
            command = Path(f"/proc/{member}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tablet-server" in command:
            servers.append(member)
    return servers or [pid]


def main_thread_run_and_wait_s(pid: int) -> tuple[float, float]:
    """Seconds process ``pid``'s main thread (a server's event loop) has run on a CPU, and has waited on a
    run queue while it could have run (``/proc/<pid>/schedstat``): whether a loop that is not busy lacked work
    or lacked a CPU. The wait is NaN where the kernel keeps no schedstat."""
    try:
        run_ns, wait_ns = Path(f"/proc/{pid}/schedstat").read_text().split()[:2]
    except FileNotFoundError:  # a kernel built without schedstat: the thread's ticks, and no wait measured
        return _cpu_s(_stat_fields(pid, thread=pid)), math.nan
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle or waiting for I/O), summed over its cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def report(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n== {title}")
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")


def load_raw_rocksdb(rows: pa.Table, schema: Schema, directory: str) -> tuple[rocksdict.Rdict, list[bytes], float]:
    """A RocksDB in ``directory`` holding exactly the keys and stored values strom would store for
    ``rows`` (primary key: column 0); returns it, the keys, and the WriteBatch put rate (rows/s)."""
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    db = rocksdict.Rdict(f"{directory}/db", options)
    batch = rows.combine_chunks().to_batches()[0]
    values, keys, _ = row_batches.encode_batch(batch, schema.row_type, key_indexes=[0], value_prefix=SCHEMA_ID.pack(1))
    assert keys is not None
    start = time.perf_counter()
    for offset in range(0, len(keys), RAW_BATCH_ROWS):
        write = rocksdict.WriteBatch(raw_mode=True)
        for key, value in zip(keys[offset : offset + RAW_BATCH_ROWS], values[offset : offset + RAW_BATCH_ROWS], strict=True):
            write.put(key, value)
        db.write(write)
    rate = len(keys) / (time.perf_counter() - start)
    return db, keys, rate
