"""Batch statistics and filter pushdown on a log table, in one run against one server:

* the write cost of statistics: appends with strom's client to a table with ``table.statistics.columns =
  *`` against the same appends to a table without (rows/s, same batches, same server);
* the filtered read: a scan whose predicate selects about 1 % of the rows, pushed down (the server skips
  batches by their statistics) against the same scan unfiltered, each then filtering rows here; bytes
  fetched and rows/s of the two (results compared for equality).

Rows: ``id`` ascending (so each batch covers a narrow id range, as time-ordered data does) and a string.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import pyarrow as pa

from bench.harness import BenchServer, report
from strom.client import Connection, OffsetSpec, Predicate, Schema, TableDescriptor, TablePath, col

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batches(rows: int, batch_rows: int) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_pydict({"id": list(range(first, min(first + batch_rows, rows))),
                                    "name": [f"name-{i}" for i in range(first, min(first + batch_rows, rows))]},
                                   schema=SCHEMA)
        for first in range(0, rows, batch_rows)
    ]


async def append(address: str, name: str, data: list[pa.RecordBatch], statistics: bool) -> float:
    """Rows/s of appending ``data`` to a new table (flushed: acknowledged after fsync)."""
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", name)
        properties = {"table.statistics.columns": "*"} if statistics else {}
        await connection.get_admin().create_table(path, TableDescriptor(Schema.from_arrow(SCHEMA), bucket_count=1,
                                                                        properties=properties))
        writer = (await connection.get_table(path)).new_append().create_writer()
        start = time.perf_counter()
        for batch in data:
            writer.append_arrow_batch(batch)
        await writer.flush()
        return sum(b.num_rows for b in data) / (time.perf_counter() - start)


async def scan(address: str, name: str, predicate: Predicate, push: bool) -> tuple[float, int, list[int]]:
    """Seconds, bytes of Arrow data received, and the matching ids of a full scan of the table."""
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", name)
        table = await connection.get_table(path)
        end = (await connection.get_admin().list_offsets(path, [0], OffsetSpec.latest()))[0]
        builder = table.new_scan()
        scanner = (builder.filter(predicate) if push else builder).create_log_scanner()
        received = 0
        matching: list[int] = []
        start = time.perf_counter()
        async for scan_batch in scanner.read_range(table.bucket(0), 0, end):
            received += scan_batch.batch.nbytes
            matching += predicate.filter(scan_batch.batch).column("id").to_pylist()
        return time.perf_counter() - start, received, matching


async def run(address: str, rows: int, batch_rows: int) -> list[tuple[str, str]]:
    data = batches(rows, batch_rows)
    plain = await append(address, "plain", data, statistics=False)
    with_statistics = await append(address, "with_statistics", data, statistics=True)
    selected = (col("id") >= rows // 2) & (col("id") < rows // 2 + rows // 100)
    full_s, full_bytes, full_rows = await scan(address, "with_statistics", selected, push=False)
    pushed_s, pushed_bytes, pushed_rows = await scan(address, "with_statistics", selected, push=True)
    assert pushed_rows == full_rows and len(full_rows) == rows // 100
    return [
        ("append without statistics", f"{plain:,.0f} rows/s"),
        ("append with statistics (*)", f"{with_statistics:,.0f} rows/s ({with_statistics / plain:.2f}x)"),
        ("scan of 1 %, unfiltered", f"{full_s:.2f} s, {full_bytes / 1e6:,.1f} MB received"),
        ("scan of 1 %, pushed down", f"{pushed_s:.2f} s, {pushed_bytes / 1e6:,.1f} MB received "
                                     f"({pushed_bytes / full_bytes:.1%} of the bytes, {full_s / pushed_s:.1f}x faster)"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    args = parser.parse_args()
    with BenchServer() as server:
        rows = asyncio.run(run(server.address, args.rows, args.batch_rows))
    report(f"log table statistics and filter pushdown, {args.rows:,} rows in batches of {args.batch_rows:,}", rows)


if __name__ == "__main__":
    main()
