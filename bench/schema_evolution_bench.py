"""What reading rows of an earlier schema costs after ALTER TABLE ADD COLUMN, in one run on one server.

Two primary-key tables end with the same columns (``id BIGINT`` key, ``name STRING``, ``score BIGINT``,
then ``email STRING``) and the same ``--rows`` rows: *current* was created with all four columns, *altered*
got ``email`` by AlterTable after every row was written, so each of its stored values and changelog batches
is of schema 1 and is upgraded when read. Measured on both: lookups in batches of ``--lookup-batch`` keys
(the server upgrades RocksDB values), a full ScanKv (values upgraded as the scan streams), and reading the
whole changelog (FetchLog re-encodes each schema-1 batch in the current schema).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import pyarrow as pa

from bench.harness import BenchServer, report
from strom.client import Column, Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.records.types import StringType

BUCKETS = 2
BASE = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("score", pa.int64())])
FULL = BASE.append(pa.field("email", pa.string()))


async def create_and_fill(connection: Connection, name: str, fields: pa.Schema, rows: int, batch: int) -> TablePath:
    path = TablePath("fluss", name)
    schema = Schema.from_arrow(fields, ["id"])
    await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=BUCKETS))
    writer = (await connection.get_table(path)).new_upsert().create_writer()
    for first in range(0, rows, batch):
        ids = list(range(first, min(rows, first + batch)))
        columns = {"id": ids, "name": [f"name-{i}" for i in ids], "score": ids}
        if "email" in fields.names:
            columns["email"] = pa.nulls(len(ids), pa.string())
        writer.upsert_arrow_batch(pa.table(columns))
    await writer.flush()
    return path


async def lookups(connection: Connection, path: TablePath, rows: int, count: int, batch: int) -> float:
    lookuper = (await connection.get_table(path)).new_lookup().create_lookuper()
    keys = [(i * 7919) % rows for i in range(count)]
    start = time.perf_counter()
    for first in range(0, count, batch):
        found = await lookuper.lookup_arrow(pa.table({"id": keys[first:first + batch]}))
        assert found.num_rows == len(keys[first:first + batch])
    return count / (time.perf_counter() - start)


async def scan(connection: Connection, path: TablePath, rows: int) -> float:
    table = await connection.get_table(path)
    start = time.perf_counter()
    read = await (await table.new_scan().create_batch_scanner()).to_arrow()
    elapsed = time.perf_counter() - start
    assert read.num_rows == rows and read.column_names == FULL.names
    return rows / elapsed


async def changelog(connection: Connection, path: TablePath, rows: int) -> float:
    table = await connection.get_table(path)
    ends = await connection.get_admin().list_offsets(path, list(range(BUCKETS)), OffsetSpec.latest())
    scanner = table.new_scan().create_log_scanner()
    seen = 0
    start = time.perf_counter()
    for bucket in range(BUCKETS):
        async for change in scanner.read_range(table.bucket(bucket), 0, ends[bucket]):
            assert change.batch.num_columns == len(FULL)
            seen += change.batch.num_rows
    elapsed = time.perf_counter() - start
    assert seen == rows
    return rows / elapsed


async def run(address: str, rows: int, batch: int, lookup_count: int, lookup_batch: int) -> None:
    async with await Connection.create(address) as connection:
        current = await create_and_fill(connection, "current", FULL, rows, batch)
        altered = await create_and_fill(connection, "altered", BASE, rows, batch)
        await connection.get_admin().alter_table(altered, add_columns=[Column("email", StringType())])
        results = {}
        for name, path in (("current", current), ("altered", altered)):
            results[name] = (
                await lookups(connection, path, rows, lookup_count, lookup_batch),
                await scan(connection, path, rows),
                await changelog(connection, path, rows),
            )
    lines = []
    for index, what in enumerate(("lookups", "ScanKv", "changelog read")):
        now, old = results["current"][index], results["altered"][index]
        unit = "keys/s" if index == 0 else "rows/s"
        lines += [
            (f"{what}, rows of the current schema", f"{now:,.0f} {unit}"),
            (f"{what}, rows of schema 1 upgraded", f"{old:,.0f} {unit}"),
            (f"{what}: upgraded / current", f"{old / now:.2f}"),
        ]
    report("reading rows of an earlier schema (same server, same run)", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--lookups", type=int, default=50_000)
    parser.add_argument("--lookup-batch", type=int, default=500)
    args = parser.parse_args()
    with BenchServer() as server:
        asyncio.run(run(server.address, args.rows, args.batch, args.lookups, args.lookup_batch))


if __name__ == "__main__":
    main()
