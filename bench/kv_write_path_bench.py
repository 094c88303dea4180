"""How a PutKv batch reaches RocksDB through each binding: same-run A/Bs.

Part 1, RocksDB alone (one fresh database per variant, 10 000-key batches of Fluss BIGINT keys — varints, so
key order is not id order — and 110-byte values, two passes: new keys, then every key again; the options a
bucket opens with):
* rocksdict: a ``WriteBatch`` built with per-key ``put`` calls, then ``db.write`` (the fallback binding);
* strom's native binding: ``write(keys, values, …)``, the batch built in C and written without the GIL,
  unsorted and sorted by key;
* whether each binding's write and multi-get release the GIL: the progress a spinning Python thread makes
  during each, as a share of its progress alone;
* overlap: a write of a batch on a second thread beside as much Python work on the calling thread, the time
  of doing both in turn divided by the time of doing them together (1.0: no overlap; 2.0: perfect).

Part 2, one bucket in-process (``KvTablet.prepare_put`` + the log's fsync + the apply it triggers, the server's
per-batch work without the network; cache-hot, default ``FULL`` image, four puts in flight as a server has
them): load of new keys, update of every key, and ``lookup`` of 1 000 keys, with rocksdict, with the native
binding writing on the loop, and with the native binding and a writer thread (what a server does), in the
same run, alternating.

    python -m bench.kv_write_path_bench [--rows 300000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import rocksdict

from bench.harness import report
from strom.ids import TablePath
from strom.kv import rocksdb
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
IN_FLIGHT = 4


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
    native = how != "rocksdict"
    rocksdb.use_binding("native" if native else "rocksdict")
    db: Any = open_rocksdb(root / name, RocksDbOptions())
    raw = None if native else db._db  # rocksdict's own Rdict, as the fallback binding writes it
    write_options = rocksdict.WriteOptions()
    write_options.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at runtime
    build = write = 0.0
    try:
        for _pass in range(2):
            for start in range(0, len(keys), BATCH):
                batch_keys, batch_values = keys[start:start + BATCH], values[start:start + BATCH]
                begin = time.perf_counter()
                if how == "native sorted":
                    order = sorted(range(len(batch_keys)), key=batch_keys.__getitem__)
                    batch_keys = [batch_keys[i] for i in order]
                    batch_values = [batch_values[i] for i in order]
                if native:
                    built = time.perf_counter()
                    db.write(batch_keys, batch_values, (), ())
                else:
                    batch = rocksdict.WriteBatch(raw_mode=True)
                    for key, value in zip(batch_keys, batch_values, strict=True):
                        batch.put(key, value)
                    built = time.perf_counter()
                    raw.write(batch, write_options)
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


def python_work(seconds: float) -> Callable[[], None]:
    """Pure Python work of about ``seconds`` (calibrated once)."""
    begin, count = time.perf_counter(), 0
    while time.perf_counter() - begin < 0.05:
        sum(range(1_000))
        count += 1
    loops = int(count * seconds / (time.perf_counter() - begin))

    def work() -> None:
        for _ in range(loops):
            sum(range(1_000))

    return work


def overlap(write: Callable[[], None]) -> float:
    """Time of ``write`` then as much Python work, over the time of both at once (the write on a thread)."""
    begin = time.perf_counter()
    write()
    write_s = time.perf_counter() - begin
    work = python_work(write_s)
    begin = time.perf_counter()
    write()
    work()
    serial = time.perf_counter() - begin
    begin = time.perf_counter()
    thread = threading.Thread(target=write)
    thread.start()
    work()
    thread.join()
    return serial / (time.perf_counter() - begin)


def gil_and_overlap(root: Path, binding: str, keys: list[bytes], values: list[bytes]) -> tuple[float, float, float]:
    """(progress during a write, progress during a multi-get, overlap of a write) of one binding."""
    rocksdb.use_binding(binding)
    db: Any = open_rocksdb(root / f"gil-{binding}", RocksDbOptions())
    try:
        if binding == "native":
            def write() -> None:
                db.write(keys, values, (), ())
        else:
            write_options = rocksdict.WriteOptions()
            write_options.disable_wal = True  # type: ignore[method-assign,assignment]

            def write() -> None:  # the whole write path of the binding: the batch is built, then written
                batch = rocksdict.WriteBatch(raw_mode=True)
                for key, value in zip(keys, values, strict=True):
                    batch.put(key, value)
                db._db.write(batch, write_options)
        ordered = sorted(keys)
        return gil_share(write), gil_share(lambda: db.multi_get(ordered, sorted=True)), overlap(write)
    finally:
        db.close()


def part_rocksdb(rows: int) -> None:
    keys = [varint(i) for i in range(rows)]
    values = [os.urandom(VALUE_BYTES) for _ in range(rows)]
    before = rocksdb.binding()
    with tempfile.TemporaryDirectory(prefix="strom-bench-") as directory:
        root = Path(directory)
        variants = ("rocksdict", "native", "native sorted")
        results = {how: rocksdb_variant(root, how.replace(" ", "-"), keys, values, how) for how in variants}
        shares = {binding: gil_and_overlap(root, binding, keys, values) for binding in ("rocksdict", "native")}
    rocksdb.use_binding(before)
    lines = [(f"{how}: build + write (us per row)",
              f"{r['build_us']:.2f} + {r['write_us']:.2f} = {r['build_us'] + r['write_us']:.2f}")
             for how, r in results.items()]
    for binding, (write_share, read_share, overlapped) in shares.items():
        lines += [(f"{binding}: a Python thread's progress during a write", f"{write_share:.0%}"),
                  (f"{binding}: a Python thread's progress during a multi-get", f"{read_share:.0%}"),
                  (f"{binding}: write beside equal Python work, serial / overlapped", f"{overlapped:.2f}")]
    report(f"RocksDB alone, {rows} keys x 2 passes, 10 000-key batches", lines)


# --------------------------------------------------------------------------------- part 2: one bucket


def table_info() -> TableInfo:
    schema = Schema.of([("id", BigIntType()), ("payload", StringType())], primary_key=["id"])
    descriptor = TableDescriptor(schema, bucket_count=1, properties={})
    return TableInfo(1, TablePath("bench", "kv"), 1, descriptor.to_json(), 0, 0)


async def put_all(kv: KvTablet, keys: list[bytes], values: list[bytes]) -> float:
    """Seconds to put every key in BATCH-key puts, IN_FLIGHT at a time, each acknowledged (committed, and
    applied as the watermark passes it)."""
    begin = time.perf_counter()
    in_flight: list[asyncio.Future[None]] = []
    for start in range(0, len(keys), BATCH):
        result = kv.prepare_put(keys[start:start + BATCH], values[start:start + BATCH], 1, None, -1, -1, 0)
        in_flight.append(kv.acknowledgement(result))
        if len(in_flight) >= IN_FLIGHT:
            await in_flight.pop(0)
    await asyncio.gather(*in_flight)
    return time.perf_counter() - begin


async def bucket_run(directory: Path, rows: int, writer: ThreadPoolExecutor | None) -> dict[str, float]:
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
                  row_cache=RowCache(1 << 30), writer=writer)
    rates: dict[str, float] = {}
    try:
        for name, values in (("load", loads), ("update", updates)):
            rates[name] = rows / await put_all(kv, keys, values)
        begin = time.perf_counter()
        for start in range(0, rows, LOOKUP_KEYS):
            kv.lookup(keys[start:start + LOOKUP_KEYS])
        rates["lookup"] = rows / (time.perf_counter() - begin)
    finally:
        kv.close()
        log.close()
    return rates


VARIANTS = ("rocksdict", "native, write on the loop", "native, writer thread")


def part_bucket(rows: int, rounds: int) -> None:
    measured: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    before = rocksdb.binding()
    with tempfile.TemporaryDirectory(prefix="strom-bench-") as directory, ThreadPoolExecutor(2) as writer:
        for round_ in range(rounds):
            for index, variant in enumerate(VARIANTS):
                rocksdb.use_binding("rocksdict" if index == 0 else "native")
                path = Path(directory) / f"{index}-{round_}"
                measured[variant].append(asyncio.run(bucket_run(path, rows, writer if index == 2 else None)))
    rocksdb.use_binding(before)
    lines = []
    for step in ("load", "update", "lookup"):
        best = {variant: max(r[step] for r in measured[variant]) for variant in VARIANTS}
        base = best["rocksdict"]
        lines.append((f"{step} (rows/s): " + " / ".join(VARIANTS),
                      " / ".join(f"{best[v]:,.0f} ({best[v] / base:.2f})" for v in VARIANTS)))
    report(f"One bucket in-process, {rows} rows, cache-hot, FULL image, best of {rounds}", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not rocksdb.NATIVE_AVAILABLE:
        raise SystemExit("strom's native RocksDB binding is not built (scripts/build-rocksdb.sh): nothing to compare")
    part_rocksdb(args.rows)
    part_bucket(args.rows, args.rounds)


if __name__ == "__main__":
    main()
