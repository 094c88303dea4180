"""Durable primary-key upsert ingest through the server vs raw RocksDB puts of the same rows.

Three paths write the same rows (id BIGINT PK, k STRING, v1 DOUBLE, v2 BIGINT, s STRING):
* pyfluss, the official client, row by row (``writer.upsert(dict)``), then ``flush()``;
* strom's client, Arrow batches (``upsert_arrow_batch``, pipelined), into a table with the default
  ``table.changelog.image=FULL`` and into one with ``WAL`` (no old-value reads), each loaded (new keys)
  and then updated (the same keys again);
* the raw ceiling: rocksdict ``WriteBatch`` of the same key and value bytes, 10 000 per batch, in-process,
  no server, WAL not synced (the peers table's "RocksDB sync=False" row).
Every server write is acknowledged only after the changelog is fsynced. Ratios are server / raw.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time

import pyarrow as pa

from bench.harness import BenchServer, load_raw_rocksdb, median, report
from strom.client import Connection, Schema, TableDescriptor, TablePath

BATCH_ROWS = 10_000


def make_rows(count: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return pa.table({
        "id": pa.array(range(count), pa.int64()),
        "k": ["".join(rng.choices(alphabet, k=16)) for _ in range(count)],
        "v1": [rng.random() for _ in range(count)],
        "v2": [rng.randint(0, 1 << 40) for _ in range(count)],
        "s": ["".join(rng.choices(alphabet, k=18)) for _ in range(count)],
    })


def raw_rocksdb(rows: pa.Table, schema: Schema) -> float:
    """Rows/s of WriteBatch puts of exactly the key and value bytes the server stores."""
    directory = tempfile.mkdtemp(prefix="strom-raw-")
    try:
        db, _keys, rate = load_raw_rocksdb(rows, schema, directory)
        db.close()
        return rate
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def strom_client(
    address: str, rows: pa.Table, schema: Schema, buckets: int, name: str, image: str = "FULL"
) -> tuple[float, float]:
    """Rows/s loading ``rows`` into a new table, then updating every one of them."""
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", name)
        properties = {"table.changelog.image": image}
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=buckets, properties=properties))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        batches = rows.to_batches(max_chunksize=BATCH_ROWS * buckets)
        rates = []
        for _pass in ("load", "update"):
            start = time.perf_counter()
            for batch in batches:
                writer.upsert_arrow_batch(batch)  # pipelined: up to 4 chunks in flight
            await writer.flush()
            rates.append(rows.num_rows / (time.perf_counter() - start))
        return rates[0], rates[1]


async def pyfluss_client(address: str, rows: pa.Table, schema: Schema, buckets: int, name: str) -> float:
    import fluss

    async with await Connection.create(address) as connection:
        await connection.get_admin().create_table(
            TablePath("fluss", name), TableDescriptor(schema, bucket_count=buckets)
        )
    connection = await fluss.FlussConnection.create(fluss.Config({"bootstrap.servers": address}))
    try:
        table = await connection.get_table(fluss.TablePath("fluss", name))
        writer = table.new_upsert().create_writer()
        records = rows.to_pylist()
        start = time.perf_counter()
        for record in records:
            writer.upsert(record)
        await writer.flush()
        return len(records) / (time.perf_counter() - start)
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--buckets", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = make_rows(args.rows, seed=1)
    schema = Schema.from_arrow(rows.schema, primary_key=["id"])
    raw, official = [], []
    strom: dict[str, list[tuple[float, float]]] = {"FULL": [], "WAL": []}
    with BenchServer({"kv.snapshot.interval": "0s"}) as server:
        for round_ in range(args.rounds):
            raw.append(raw_rocksdb(rows, schema))
            for image, results in strom.items():
                name = f"ingest_strom_{image.lower()}_{round_}"
                results.append(asyncio.run(strom_client(server.address, rows, schema, args.buckets, name, image)))
            official.append(asyncio.run(pyfluss_client(server.address, rows, schema, args.buckets, f"ingest_py_{round_}")))
    raw_rate, official_rate = median(raw), median(official)
    lines = [("raw rocksdict WriteBatch (ceiling)", f"{raw_rate:,.0f} rows/s")]
    for image, results in strom.items():
        for index, what in enumerate(("load", "update")):
            rate = median([r[index] for r in results])
            lines.append((f"strom client, Arrow batches, durable, {image} image, {what}",
                          f"{rate:,.0f} rows/s  ratio {rate / raw_rate:.2f}"))
    lines += [
        ("pyfluss, row by row, durable", f"{official_rate:,.0f} rows/s  ratio {official_rate / raw_rate:.2f}"),
        ("targets (peers.md)", "beat PostgreSQL (0.17 of raw), reach Redis MSET (0.3 of raw)"),
    ]
    report(f"PK upsert ingest, {args.rows:,} rows, {args.buckets} buckets (median of {args.rounds})", lines)


if __name__ == "__main__":
    main()
