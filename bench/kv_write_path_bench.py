"""How a PutKv batch reaches RocksDB, and what the compiled per-batch loops save: same-run A/Bs.

Part 1, RocksDB alone (rocksdict, one fresh database per variant, 10 000-key batches of Fluss BIGINT keys —
varints, so key order is not id order — and 110-byte values, two passes: new keys, then every key again;
the options a bucket opens with):
* ``WriteBatch`` built with rocksdict's per-key ``put`` calls, then ``db.write`` (what a bucket does), the
  build and the write timed apart — what a compiled batch builder could save is the build's share;
* the same with the batch sorted by key first (RocksDB inserts a sorted batch into the memtable faster);
* SST ingestion: each batch written sorted into an SST file (``SstFileWriter``) and ingested;
* whether ``db.write`` and a multi-get release the GIL: the progress a spinning Python thread makes
  during each, as a share of its progress alone.

Part 2, one bucket in-process (``KvTablet.prepare_put`` + the log's fsync + the apply it triggers, the server's
per-batch work without the network; cache-hot, default ``FULL`` image): load of new keys, update of every
key, and ``lookup`` of 1 000 keys, each with the compiled kv loops (``strom.kv._kvloops``) and with their
Python references, alternating, in the same run.

    python -m bench.kv_write_path_bench [--rows 300000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

import rocksdict

from bench.harness import report
from strom.ids import TablePath
from strom.kv import kv_loops
from strom.kv.kv_tablet import KvConfig, KvTablet
from strom.kv.rocksdb import RocksDbOptions, open_rocksdb
from strom.kv.row_cache import RowCache
from strom.kv.row_format import TableRowFormat
from strom.log.log_tablet import LogConfig, LogTablet
from strom.metadata.table_info import TableInfo
from strom.records.compacted import CompactedRowEncoder
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import BigIntType, StringType

BATCH = 10_000
VALUE_BYTES = 110
LOOKUP_KEYS = 1_000


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


# ------------------------------------------------------------------------------------ part 1: RocksDB


def rocksdb_variant(root: Path, name: str, keys: list[bytes], values: list[bytes], how: str) -> dict[str, float]:
    """µs per row of building and of writing the batches, over two passes (load, then update)."""
    db = open_rocksdb(root / name, RocksDbOptions())
    write_options = rocksdict.WriteOptions()
    write_options.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at runtime
    build = write = 0.0
    sst = str(root / f"{name}.sst")
    try:
        for _pass in range(2):
            for start in range(0, len(keys), BATCH):
                batch_keys, batch_values = keys[start:start + BATCH], values[start:start + BATCH]
                begin = time.perf_counter()
                if how != "unsorted":
                    order = sorted(range(len(batch_keys)), key=batch_keys.__getitem__)
                    batch_keys = [batch_keys[i] for i in order]
                    batch_values = [batch_values[i] for i in order]
                if how == "sst":
                    writer = rocksdict.SstFileWriter(options=rocksdict.Options(raw_mode=True))
                    writer.open(sst)
                    for key, value in zip(batch_keys, batch_values, strict=True):
                        writer[key] = value
                    writer.finish()
                    built = time.perf_counter()
                    db.ingest_external_file([sst])
                else:
                    batch = rocksdict.WriteBatch(raw_mode=True)
                    for key, value in zip(batch_keys, batch_values, strict=True):
                        batch.put(key, value)
                    built = time.perf_counter()
                    db.write(batch, write_options)
                build += built - begin
                write += time.perf_counter() - built
    finally:
        db.close()
    rows = 2 * len(keys)
    return {"build_us": build / rows * 1e6, "write_us": write / rows * 1e6}


def gil_share(call: Callable[[], Any]) -> float:
    """A spinning thread's progress during ``call`` relative to its progress alone in as much time."""
    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        time.sleep(0.05)
        alone_start, begin = counter[0], time.perf_counter()
        time.sleep(0.1)
        alone_rate = (counter[0] - alone_start) / (time.perf_counter() - begin)
        during_start, begin = counter[0], time.perf_counter()
        call()
        during_rate = (counter[0] - during_start) / (time.perf_counter() - begin)
    finally:
        stop.set()
        thread.join()
    return during_rate / alone_rate


def part_rocksdb(rows: int) -> None:
    keys = [varint(i) for i in range(rows)]
    values = [os.urandom(VALUE_BYTES) for _ in range(rows)]
    with tempfile.TemporaryDirectory(prefix="strom-bench-") as directory:
        root = Path(directory)
        results = {how: rocksdb_variant(root, how, keys, values, how) for how in ("unsorted", "sorted", "sst")}
        db = open_rocksdb(root / "gil", RocksDbOptions())
        try:
            write_options = rocksdict.WriteOptions()
            write_options.disable_wal = True  # type: ignore[method-assign,assignment]
            big = rocksdict.WriteBatch(raw_mode=True)
            for key, value in zip(keys, values, strict=True):
                big.put(key, value)
            write_share = gil_share(lambda: db.write(big, write_options))
            read_share = gil_share(lambda: db.get(sorted(keys)))
        finally:
            db.close()
    lines = [(f"{how}: build + write/ingest (us per row)",
              f"{r['build_us']:.2f} + {r['write_us']:.2f} = {r['build_us'] + r['write_us']:.2f}")
             for how, r in results.items()]
    lines += [("a Python thread's progress during db.write", f"{write_share:.0%}"),
              ("a Python thread's progress during a multi-get", f"{read_share:.0%}")]
    report(f"RocksDB alone, {rows} keys x 2 passes, 10 000-key batches", lines)


# --------------------------------------------------------------------------------- part 2: one bucket


def table_info() -> TableInfo:
    schema = Schema.of([("id", BigIntType()), ("payload", StringType())], primary_key=["id"])
    descriptor = TableDescriptor(schema, bucket_count=1, properties={})
    return TableInfo(1, TablePath("bench", "kv"), 1, descriptor.to_json(), 0, 0)


@contextmanager
def python_loops() -> Iterator[None]:
    with patch.object(kv_loops, "cache_get_many", kv_loops.cache_get_many_python), \
            patch.object(kv_loops, "cache_put_many", kv_loops.cache_put_many_python), \
            patch.object(kv_loops, "entry_bytes", kv_loops.entry_bytes_python), \
            patch.object(kv_loops, "read_in_key_order", kv_loops.read_in_key_order_python):
        yield


async def bucket_run(directory: Path, rows: int) -> dict[str, float]:
    info = table_info()
    row_format = TableRowFormat(info)
    encoder = CompactedRowEncoder(row_format.row_type)
    keys = [row_format.encode_key([i, None]) for i in range(rows)]
    payloads = [os.urandom(VALUE_BYTES // 2).hex()[:100] for _ in range(rows)]
    loads = [encoder.encode([i, payloads[i]]) for i in range(rows)]
    updates = [encoder.encode([i, payloads[i][::-1]]) for i in range(rows)]
    config = LogConfig(segment_size_bytes_max=1 << 30, flush_interval_messages=1, writer_expiration_ms=60_000)
    log = LogTablet.open(directory / "log", config)
    kv = KvTablet(directory / "kv", log, row_format, KvConfig.for_table(info, RocksDbOptions()),
                  row_cache=RowCache(1 << 30))
    rates: dict[str, float] = {}
    try:
        for name, values in (("load", loads), ("update", updates)):
            begin = time.perf_counter()
            for start in range(0, rows, BATCH):
                result = kv.prepare_put(keys[start:start + BATCH], values[start:start + BATCH], 1, None, -1, -1, 0)
                await kv.acknowledgement(result)  # committed, and applied as the high watermark passed it
            rates[name] = rows / (time.perf_counter() - begin)
        begin = time.perf_counter()
        for start in range(0, rows, LOOKUP_KEYS):
            kv.lookup(keys[start:start + LOOKUP_KEYS])
        rates["lookup"] = rows / (time.perf_counter() - begin)
    finally:
        kv.close()
        log.close()
    return rates


def part_bucket(rows: int, rounds: int) -> None:
    measured: dict[str, list[dict[str, float]]] = {"compiled": [], "python": []}
    with tempfile.TemporaryDirectory(prefix="strom-bench-") as directory:
        for round_ in range(rounds):
            for variant in ("compiled", "python"):
                path = Path(directory) / f"{variant}{round_}"
                if variant == "python":
                    with python_loops():
                        measured[variant].append(asyncio.run(bucket_run(path, rows)))
                else:
                    measured[variant].append(asyncio.run(bucket_run(path, rows)))
    lines = []
    for step in ("load", "update", "lookup"):
        compiled = max(r[step] for r in measured["compiled"])
        python = max(r[step] for r in measured["python"])
        lines.append((f"{step} (rows/s): compiled loops / Python loops",
                      f"{compiled:,.0f} / {python:,.0f} = {compiled / python:.2f}"))
    report(f"One bucket in-process, {rows} rows, cache-hot, FULL image, best of {rounds}", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not kv_loops.NATIVE_AVAILABLE:
        raise SystemExit("strom.kv._kvloops is not built (no C compiler at install): nothing to compare")
    part_rocksdb(args.rows)
    part_bucket(args.rows, args.rounds)


if __name__ == "__main__":
    main()
