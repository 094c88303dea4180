"""What closing a primary-key bucket's RocksDB holds the event loop: on the loop, and on a closer thread.

A leader that starts to follow drops its KV state: RocksDB is flushed (its WAL is off: the changelog is the
write-ahead record, so a flush makes the next open replay nothing) and closed. On the loop that held every
other bucket of the server for the whole flush; ``KvTablet.close_soon`` hands the flush and the close to a
thread (``ReplicaManager.kv_closer``). One bucket in-process, ``--rows`` rows put through ``KvTablet`` (a
new bucket: its vector memtable, and the same bucket reopened and updated: the skip list), then closed
each way, alternating, in one run. Reported: the event loop's longest stall while the close ran (a
coroutine ticking every millisecond), and the close's own duration.

    python -m bench.kv_close_bench [--rows 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.harness import report
from bench.kv_write_path_bench import VALUE_BYTES, put_all, table_info
from strom.kv.kv_tablet import KvConfig, KvTablet
from strom.kv.rocksdb import RocksDbOptions
from strom.kv.row_cache import RowCache
from strom.kv.row_format import TableRowFormat
from strom.log.log_tablet import LogConfig, LogTablet
from strom.records.compacted import CompactedRowEncoder

TICK_S = 0.001
LOG_CONFIG = LogConfig(segment_size_bytes_max=1 << 30, flush_interval_messages=1, writer_expiration_ms=60_000)


async def _longest_stall(stop: asyncio.Event) -> float:
    """The longest time the loop took to come back to a coroutine that sleeps TICK_S, until ``stop``."""
    longest = 0.0
    while not stop.is_set():
        begin = time.perf_counter()
        await asyncio.sleep(TICK_S)
        longest = max(longest, time.perf_counter() - begin - TICK_S)
    return longest


def _open(directory: Path, row_cache: RowCache, writer: ThreadPoolExecutor) -> tuple[LogTablet, KvTablet]:
    info = table_info()
    log = LogTablet.open(directory / "log", LOG_CONFIG)
    return log, KvTablet(directory / "kv", log, TableRowFormat(info), KvConfig.for_table(info, RocksDbOptions()),
                         row_cache=row_cache, writer=writer)


async def close_run(directory: Path, rows: int, off_loop: bool, writer: ThreadPoolExecutor,
                    closer: ThreadPoolExecutor) -> dict[str, tuple[float, float]]:
    """(longest loop stall, close duration) in seconds, for the new bucket and the reopened one."""
    row_format = TableRowFormat(table_info())
    keys = [row_format.encode_key([i, None]) for i in range(rows)]
    payload = os.urandom(VALUE_BYTES // 2).hex()[:100]
    encoder = CompactedRowEncoder(row_format.row_type)
    values = [encoder.encode([i, payload]) for i in range(rows)]
    measured: dict[str, tuple[float, float]] = {}
    for case in ("new bucket, vector memtable", "reopened, skip list"):
        log, kv = _open(directory, RowCache(1 << 30), writer)
        await put_all(kv, keys, values)
        stop = asyncio.Event()
        ticker = asyncio.ensure_future(_longest_stall(stop))
        await asyncio.sleep(0.05)
        begin = time.perf_counter()
        if off_loop:
            await asyncio.wrap_future(kv.close_soon(closer))
        else:
            kv.close()
        took = time.perf_counter() - begin
        stop.set()
        measured[case] = (await ticker, took)
        log.close()
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[bool, list[dict[str, tuple[float, float]]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="strom-bench-") as root, ThreadPoolExecutor(2) as writer, \
            ThreadPoolExecutor(1) as closer:
        for round_ in range(args.rounds):
            for off_loop in (False, True):
                directory = Path(root) / f"{round_}-{off_loop}"
                results[off_loop].append(asyncio.run(close_run(directory, args.rows, off_loop, writer, closer)))
    lines = []
    for case in results[False][0]:
        for off_loop, label in ((False, "on the loop"), (True, "on a closer thread")):
            stalls = [run[case][0] for run in results[off_loop]]
            took = [run[case][1] for run in results[off_loop]]
            lines.append((f"{case}, close {label}: longest loop stall / close",
                          f"{statistics.median(stalls) * 1000:,.1f} ms / {statistics.median(took) * 1000:,.0f} ms"))
    report(f"closing a bucket's RocksDB, {args.rows:,} rows, median of {args.rounds}", lines)


if __name__ == "__main__":
    main()
