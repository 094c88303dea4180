"""Reading a log from remote segments vs from local segments, same run: the same rows appended to two
servers, one with remote log storage on (``remote.log.task-interval-duration``, small segments, two kept
locally), one without; then each log is read whole with strom's log scanner, alternating, best of
``--rounds``. The remote read goes: FetchLog (answered with ``remote_log_fetch_info``), then the client reads
the segment files straight from ``remote.data.dir`` (a local directory here, so this measures the read path,
not a network).

    .venv/bin/python -m bench.remote_log_bench [--rows 10000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import pyarrow as pa

from bench.harness import BenchServer, report
from bench.ingest_bench import make_rows
from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath

BATCH_ROWS = 10_000
SEGMENT_SIZE = "16mb"
TABLE = TablePath("fluss", "remote_bench")


async def load(address: str, batches: list[pa.RecordBatch]) -> int:
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(batches[0].schema)
        await connection.get_admin().create_table(TABLE, TableDescriptor(
            schema, bucket_count=1, properties={"table.log.tiered.local-segments": "2"}))
        table = await connection.get_table(TABLE)
        writer = table.new_append().create_writer()
        for batch in batches:
            writer.append_arrow_batch(batch)
        await writer.flush()
        return (await connection.get_admin().list_offsets(TABLE, [0], OffsetSpec.latest()))[0]


async def read_all(address: str, end: int) -> float:
    async with await Connection.create(address) as connection:
        table = await connection.get_table(TABLE)
        scanner = table.new_scan().create_log_scanner()
        rows = 0
        start = time.perf_counter()
        async for scan_batch in scanner.read_range(table.bucket(0), 0, end):
            rows += scan_batch.batch.num_rows
        elapsed = time.perf_counter() - start
        assert rows == end, (rows, end)
        return rows / elapsed


def local_start(server: BenchServer) -> int:
    segments = sorted(server.data_dir.joinpath("tablets").rglob("*.log"))
    return min(int(path.stem) for path in segments) if segments else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batches = make_rows(args.rows, seed=7).to_batches(max_chunksize=BATCH_ROWS)
    base = {"kv.snapshot.interval": "0s", "log.segment.file-size": SEGMENT_SIZE}
    with BenchServer(base) as local_server:
        remote_config = {**base, "remote.log.task-interval-duration": "500ms",
                         "remote.log.task-max-upload-segments": "1000"}
        with BenchServer(remote_config) as remote_server:
            end = asyncio.run(load(local_server.address, batches))
            assert asyncio.run(load(remote_server.address, batches)) == end
            deadline = time.monotonic() + 600
            segments = len(list(remote_server.data_dir.joinpath("tablets").rglob("*.log")))
            while local_start(remote_server) == 0 or segments > 2:
                assert time.monotonic() < deadline, "the segments were never copied"
                time.sleep(0.5)
                segments = len(list(remote_server.data_dir.joinpath("tablets").rglob("*.log")))
            remote_share = local_start(remote_server) / end
            local_rates, remote_rates = [], []
            for _ in range(args.rounds):
                local_rates.append(asyncio.run(read_all(local_server.address, end)))
                remote_rates.append(asyncio.run(read_all(remote_server.address, end)))
            remote_bytes = sum(p.stat().st_size for p in Path(remote_server.data_dir.parent).rglob("*.log")
                               if "/remote/" in str(p))
    best_local, best_remote = max(local_rates), max(remote_rates)
    report(
        f"reading a {args.rows:,}-row log, {SEGMENT_SIZE} segments (best of {args.rounds}; "
        f"{remote_share:.0%} of it only in remote storage, {remote_bytes / 1e6:,.0f} MB there)",
        [
            ("local segments (log scanner)", f"{best_local:,.0f} rows/s  ratio 1.00"),
            ("remote segments (log scanner)", f"{best_remote:,.0f} rows/s  ratio {best_remote / best_local:.2f}"),
        ],
    )


if __name__ == "__main__":
    main()
