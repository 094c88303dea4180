"""Log tables: durable append + fetch through the server vs Arrow IPC write + read of the same batches.

The raw ceiling serialises the same record batches as Arrow IPC (ZSTD, the table's default
compression) into memory and reads them back. The server path appends them with strom's client
(pipelined, acknowledged after fsync) and fetches them back with the log scanner.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import pyarrow as pa

from bench.harness import BenchServer, median, report
from bench.ingest_bench import make_rows
from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath

BATCH_ROWS = 10_000


def raw_ipc(batches: list[pa.RecordBatch]) -> tuple[float, float]:
    rows = sum(b.num_rows for b in batches)
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    start = time.perf_counter()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    buffer = sink.getvalue()
    write_rate = rows / (time.perf_counter() - start)
    start = time.perf_counter()
    read = pa.ipc.open_stream(buffer).read_all()
    read.combine_chunks()
    read_rate = rows / (time.perf_counter() - start)
    return write_rate, read_rate


async def server_log(address: str, batches: list[pa.RecordBatch], name: str) -> tuple[float, float]:
    rows = sum(b.num_rows for b in batches)
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", name)
        schema = Schema.from_arrow(batches[0].schema)
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        start = time.perf_counter()
        for batch in batches:
            writer.append_arrow_batch(batch)
        await writer.flush()
        append_rate = rows / (time.perf_counter() - start)
        end = (await connection.get_admin().list_offsets(path, [0], OffsetSpec.latest()))[0]
        scanner = table.new_scan().create_log_scanner()
        read = 0
        start = time.perf_counter()
        async for scan_batch in scanner.read_range(table.bucket(0), 0, end):
            read += scan_batch.batch.num_rows
        fetch_rate = read / (time.perf_counter() - start)
        assert read == rows
        return append_rate, fetch_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batches = make_rows(args.rows, seed=4).to_batches(max_chunksize=BATCH_ROWS)
    raw_write, raw_read, appends, fetches = [], [], [], []
    with BenchServer({"kv.snapshot.interval": "0s"}) as server:
        for round_ in range(args.rounds):
            write_rate, read_rate = raw_ipc(batches)
            raw_write.append(write_rate)
            raw_read.append(read_rate)
            append_rate, fetch_rate = asyncio.run(server_log(server.address, batches, f"log_{round_}"))
            appends.append(append_rate)
            fetches.append(fetch_rate)
    report(
        f"log table, {args.rows:,} rows in {BATCH_ROWS:,}-row batches (median of {args.rounds})",
        [
            ("Arrow IPC write, zstd (ceiling)", f"{median(raw_write):,.0f} rows/s"),
            ("strom append, durable", f"{median(appends):,.0f} rows/s  ratio {median(appends) / median(raw_write):.2f}"),
            ("Arrow IPC read (ceiling)", f"{median(raw_read):,.0f} rows/s"),
            ("strom fetch (log scanner)", f"{median(fetches):,.0f} rows/s  ratio {median(fetches) / median(raw_read):.2f}"),
        ],
    )


if __name__ == "__main__":
    main()
