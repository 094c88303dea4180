"""Splitting large buckets: a 2-bucket log table read with one Spark partition per bucket against the same
read split by ``scan.maxRecordsPerPartition``, in the same run, on ``local[4]``.

The table (``id BIGINT`` as bucket key, ``k STRING(16)``, ``v1 DOUBLE``, ``v2 BIGINT``, ``s STRING(18)``) is
appended through strom's client into a server in a child process. Each read goes into Spark's noop sink
(every row crosses from the Python workers into the JVM), timed best of ``--repeat`` after one warm-up,
alternating the two forms so both see the same background load. Both forms must count the same rows.

    .venv/bin/python -m bench.spark_split_bench [--rows 10000000] [--split-rows 1000000] [--repeat 2] [--remote]

With ``--remote`` the server copies the log to remote storage (16 MiB segments, two kept locally per bucket)
before the reads, so the tasks read remote segments straight from storage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.harness import BenchServer, report, timed
from bench.spark_bench import make_rows
from strom.client import Connection, Schema, TableDescriptor, TablePath

BUCKETS = 2
APPEND_BATCH_ROWS = 65_536
TABLE = "split_bench"


REMOTE_CONFIG = {"log.segment.file-size": "16mb", "remote.log.task-interval-duration": "500ms",
                 "remote.log.task-max-upload-segments": "1000", "kv.snapshot.interval": "0s"}


def wait_for_remote(server: BenchServer) -> None:
    """Until every bucket keeps two local segments: the rest is read from remote storage."""
    deadline = time.monotonic() + 600
    while len(list(server.data_dir.joinpath("tablets").rglob("*.log"))) > 2 * BUCKETS:
        assert time.monotonic() < deadline, "the segments were never copied"
        time.sleep(0.5)


async def load_table(address: str, rows: pa.Table, remote: bool = False) -> float:
    """Create the log table and append ``rows``; seconds the appends took."""
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(rows.schema)
        properties = {"table.log.tiered.local-segments": "2"} if remote else {}
        descriptor = TableDescriptor(schema, bucket_count=BUCKETS, bucket_keys=("id",), properties=properties)
        path = TablePath("fluss", TABLE)
        await connection.get_admin().create_table(path, descriptor)
        writer = (await connection.get_table(path)).new_append().create_writer()
        start = time.perf_counter()
        for batch in rows.to_batches(max_chunksize=APPEND_BATCH_ROWS):
            writer.append_arrow_batch(batch)
        await writer.flush()
        return time.perf_counter() - start


def local_spark(cores: int) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores}]").appName("spark-split-bench")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--split-rows", type=int, default=1_000_000, help="scan.maxRecordsPerPartition")
    parser.add_argument("--cores", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--remote", action="store_true",
                        help="remote log storage on: the reads go to remote segments (all but two per bucket)")
    args = parser.parse_args()

    from strom.spark import FlussDataSource

    rows = make_rows(args.rows)
    config = REMOTE_CONFIG if args.remote else {}
    with BenchServer(config) as server:
        load_s = asyncio.run(load_table(server.address, rows, args.remote))
        if args.remote:
            wait_for_remote(server)
        spark = local_spark(args.cores)
        spark.dataSource.register(FlussDataSource)
        options = {"bootstrap.servers": server.address, "table": f"fluss.{TABLE}"}

        def frame(split: bool) -> Any:
            extra = {"scan.maxRecordsPerPartition": str(args.split_rows)} if split else {}
            return spark.read.format("fluss").options(**options, **extra).load()

        partitions = {split: frame(split).rdd.getNumPartitions() for split in (False, True)}
        counts = {split: frame(split).count() for split in (False, True)}
        assert counts[False] == counts[True] == args.rows, counts

        def read(split: bool) -> None:
            frame(split).write.format("noop").mode("overwrite").save()

        read(False)
        read(True)
        times = [(timed(lambda: read(False)), timed(lambda: read(True))) for _ in range(args.repeat)]
        whole_s, split_s = min(t for t, _ in times), min(t for _, t in times)
        spark.stop()

    report(
        f"Split reads: {args.rows:,} rows, {BUCKETS}-bucket log table{' in remote segments' if args.remote else ''}, "
        f"local[{args.cores}] on {os.cpu_count()} CPUs",
        [
            ("append (strom client)", f"{load_s:.2f} s, {args.rows / load_s / 1e6:.2f} M rows/s"),
            (f"read -> noop, one partition per bucket ({partitions[False]} tasks)",
             f"{whole_s:.2f} s, {args.rows / whole_s / 1e6:.2f} M rows/s"),
            (f"read -> noop, scan.maxRecordsPerPartition={args.split_rows:,} ({partitions[True]} tasks)",
             f"{split_s:.2f} s, {args.rows / split_s / 1e6:.2f} M rows/s"),
            ("speed-up", f"{whole_s / split_s:.2f}x"),
        ],
    )


if __name__ == "__main__":
    main()
