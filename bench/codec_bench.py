"""Micro-benchmark: pure-Python vs native CompactedRow codec (strom.records.row_batches).

Rows of (BIGINT NOT NULL, STRING, DOUBLE, BIGINT, STRING) with 16- and 18-character strings, the
shape of the ingest benchmarks. Prints rows/s of each path and the speed-up, best of ``--repeat``
runs, and checks that both paths produced identical output.

    .venv/bin/python bench/codec_bench.py [--rows 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

from strom.records import row_batches
from strom.records.compacted import CompactedRowEncoder
from strom.records.types import BigIntType, DoubleType, RowType, StringType

ROW_TYPE = RowType.of(
    ("id", BigIntType(nullable=False)),
    ("name", StringType()),
    ("score", DoubleType()),
    ("counter", BigIntType()),
    ("label", StringType()),
)
KEY_INDEXES = [0]
BUCKETS = 16


def make_rows(count: int, seed: int = 42) -> list[bytes]:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    encoder = CompactedRowEncoder(ROW_TYPE)
    return [
        encoder.encode(
            [
                i,
                "".join(rng.choices(alphabet, k=16)),
                rng.random() * 1000,
                rng.randint(-(2**40), 2**40),
                "".join(rng.choices(alphabet, k=18)),
            ]
        )
        for i in range(count)
    ]


def best_time(call: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = call()
        best = min(best, time.perf_counter() - start)
    return best, result


def report(name: str, count: int, python_seconds: float, native_seconds: float) -> None:
    python_rate, native_rate = count / python_seconds, count / native_seconds
    print(
        f"{name:<32} python {python_rate:>12,.0f} rows/s   native {native_rate:>12,.0f} rows/s"
        f"   x{native_rate / python_rate:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not row_batches.NATIVE_AVAILABLE:
        raise SystemExit("strom.records._rowcodec is not built: run `pip install -e .`")
    count, repeat = args.rows, args.repeat
    rows = make_rows(count)
    stored = [b"\x01\x00" + row for row in rows]  # schema id + row, as RocksDB holds them
    print(f"{count:,} rows of {ROW_TYPE}, best of {repeat}")

    py_s, py_batch = best_time(lambda: row_batches.decode_rows_python(rows, ROW_TYPE), repeat)
    c_s, c_batch = best_time(lambda: row_batches.decode_rows(rows, ROW_TYPE), repeat)
    assert c_batch.equals(py_batch), "decode differs"
    report("decode rows -> Arrow", count, py_s, c_s)

    py_s, py_stored = best_time(lambda: row_batches.decode_rows_python(stored, ROW_TYPE, offset=2), repeat)
    c_s, c_stored = best_time(lambda: row_batches.decode_rows(stored, ROW_TYPE, offset=2), repeat)
    assert c_stored.equals(py_stored), "decode of stored values differs"
    report("decode stored values (offset 2)", count, py_s, c_s)

    py_s, py_rows = best_time(lambda: row_batches.encode_batch_python(py_batch, ROW_TYPE)[0], repeat)
    c_s, c_rows = best_time(lambda: row_batches.encode_batch(py_batch, ROW_TYPE)[0], repeat)
    assert c_rows == py_rows == rows, "encode differs"
    report("encode Arrow -> rows", count, py_s, c_s)

    def python_encode() -> Any:
        return row_batches.encode_batch_python(py_batch, ROW_TYPE, KEY_INDEXES, KEY_INDEXES, BUCKETS)

    def native_encode() -> Any:
        return row_batches.encode_batch(py_batch, ROW_TYPE, KEY_INDEXES, KEY_INDEXES, BUCKETS)

    py_s, py_full = best_time(python_encode, repeat)
    c_s, c_full = best_time(native_encode, repeat)
    assert c_full == py_full, "encode with keys and buckets differs"
    report("encode rows + keys + buckets", count, py_s, c_s)


if __name__ == "__main__":
    main()
