"""What an auto-increment column costs: the same inserts into a dictionary table with and without one, and
lookups that insert missing keys against plain lookups of existing ones, in one run on one server.

Workload: ``user_id STRING`` primary key, ``uid BIGINT``, ``name STRING``; 2 buckets. Both tables are
written with the same partial update (``user_id``, ``name``) in Arrow batches of ``--batch`` rows, so the
only difference is the server filling ``uid`` (decode, set, re-encode each new row; a segment reservation
every ``table.auto-increment.cache-size`` ids). Then ``--lookups`` keys never written are looked up with
``insert_if_not_exists`` in batches of ``--lookup-batch`` (each batch a durable write), against plain
lookups of as many existing keys.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import pyarrow as pa

from bench.harness import BenchServer, report
from strom.client import Connection, Schema, TableDescriptor, TablePath

BUCKETS = 2
FIELDS = pa.schema([("user_id", pa.string()), ("uid", pa.int64()), ("name", pa.string())])


async def create(connection: Connection, name: str, auto_increment: bool) -> object:
    base = Schema.from_arrow(FIELDS, ["user_id"])
    schema = Schema(base.columns, base.primary_key, auto_increment_columns=("uid",) if auto_increment else ())
    path = TablePath("fluss", name)
    await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=BUCKETS))
    return await connection.get_table(path)


async def insert(table: object, rows: int, batch: int) -> float:
    writer = table.new_upsert().partial_update(["user_id", "name"]).create_writer()  # type: ignore[attr-defined]
    start = time.perf_counter()
    for first in range(0, rows, batch):
        ids = [f"user-{i:09d}" for i in range(first, min(rows, first + batch))]
        writer.upsert_arrow_batch(pa.table({"user_id": ids, "name": ids}))
    await writer.flush()
    return rows / (time.perf_counter() - start)


async def lookups(table: object, keys: list[str], batch: int, inserting: bool) -> float:
    builder = table.new_lookup()  # type: ignore[attr-defined]
    lookuper = (builder.insert_if_not_exists() if inserting else builder).create_lookuper()
    start = time.perf_counter()
    for first in range(0, len(keys), batch):
        found = await lookuper.lookup_many([{"user_id": key} for key in keys[first:first + batch]])
        assert all(row is not None for row in found)
    return len(keys) / (time.perf_counter() - start)


async def run(address: str, rows: int, batch: int, lookup_count: int, lookup_batch: int) -> None:
    async with await Connection.create(address) as connection:
        plain = await create(connection, "plain", auto_increment=False)
        dictionary = await create(connection, "dictionary", auto_increment=True)
        plain_rate = await insert(plain, rows, batch)
        auto_rate = await insert(dictionary, rows, batch)
        existing = [f"user-{i:09d}" for i in range(lookup_count)]
        missing = [f"new-{i:09d}" for i in range(lookup_count)]
        plain_lookups = await lookups(dictionary, existing, lookup_batch, inserting=False)
        inserting_lookups = await lookups(dictionary, missing, lookup_batch, inserting=True)
    report("auto-increment columns (same server, same run)", [
        ("inserts, plain table", f"{plain_rate:,.0f} rows/s"),
        ("inserts, auto-increment table", f"{auto_rate:,.0f} rows/s"),
        ("auto-increment / plain", f"{auto_rate / plain_rate:.2f}"),
        ("lookups of existing keys", f"{plain_lookups:,.0f} keys/s"),
        ("lookups inserting missing keys", f"{inserting_lookups:,.0f} keys/s"),
        ("inserting / plain lookups", f"{inserting_lookups / plain_lookups:.2f}"),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--lookups", type=int, default=50_000)
    parser.add_argument("--lookup-batch", type=int, default=500)
    args = parser.parse_args()
    with BenchServer() as server:
        asyncio.run(run(server.address, args.rows, args.batch, args.lookups, args.lookup_batch))


if __name__ == "__main__":
    main()
