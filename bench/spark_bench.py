"""Spark connector throughput, against Spark reading and writing the same rows as Parquet in the same run.

Rows: ``id BIGINT`` (primary key), ``k STRING(16)``, ``v1 DOUBLE``, ``v2 BIGINT``, ``s STRING(18)``, written as
a two-file Parquet dataset (the ceiling's source) and, through ``df.write.format("fluss")``, into a
primary-key table of two buckets on a strom server in a child process. Once the table's KV snapshots cover
every row, it is read back through the connector (snapshot strategy: leased snapshot, empty changelog tail):

* write: ``spark.read.parquet(…).write.format("fluss")`` rows/s, against the same read into Spark's noop sink,
  and against strom's own client upserting the same rows (``upsert_arrow_batch``, pipelined) in the same run,
  which is the server's durable upsert rate: that ratio is the connector's own overhead. Both into a table with
  ``table.changelog.image=FULL`` (the default) and one with ``WAL``;
* read into ``count()``, against ``spark.read.parquet(…).count()`` (which Parquet answers from its footers, so
  this ratio shows the connector's whole decode cost);
* read into ``write.parquet``, against a Parquet-to-Parquet copy of the same rows, and against a Python data
  source that yields the same Parquet files' rows as pyarrow reads them (the most a Python data source gets
  from Spark on this machine, whatever its storage).

Spark runs ``local[2]``. Each read is timed best of ``--repeat`` after one warm-up (Python workers started),
alternating with its ceiling so both see the same background load.

    .venv/bin/python -m bench.spark_bench [--rows 2000000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from bench.harness import BenchServer, report, timed
from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.spark.bucket_reader import READ_BATCH_ROWS_MAX

BUCKETS = 2
SNAPSHOT_WAIT_S_MAX = 600.0
ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)


def random_strings(rng: np.random.Generator, count: int, width: int) -> pa.Array:
    codes = ALPHABET[rng.integers(0, len(ALPHABET), size=(count, width))]
    return pa.array(codes.view(f"S{width}").ravel()).cast(pa.string())


def make_rows(count: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": pa.array(np.arange(count, dtype=np.int64)),
        "k": random_strings(rng, count, 16),
        "v1": pa.array(rng.random(count)),
        "v2": pa.array(rng.integers(0, 1 << 40, size=count, dtype=np.int64)),
        "s": random_strings(rng, count, 18),
    })


def write_dataset(rows: pa.Table, directory: Path, files: int) -> None:
    directory.mkdir(parents=True)
    step = -(-rows.num_rows // files)
    for index in range(files):
        pq.write_table(rows.slice(index * step, step), directory / f"part-{index}.parquet")


CLIENT_BATCH_ROWS = 65_536


async def create_table(address: str, name: str, rows: pa.Table, image: str = "FULL") -> None:
    async with await Connection.create(address) as connection:
        schema = Schema.from_arrow(rows.schema, primary_key=["id"])
        descriptor = TableDescriptor(schema, bucket_count=BUCKETS, properties={"table.changelog.image": image})
        await connection.get_admin().create_table(TablePath("fluss", name), descriptor)


async def client_upsert(address: str, name: str, rows: pa.Table) -> float:
    """Seconds for strom's client to upsert ``rows`` (pipelined Arrow batches) until all are durable."""
    async with await Connection.create(address) as connection:
        writer = (await connection.get_table(TablePath("fluss", name))).new_upsert().create_writer()
        start = time.perf_counter()
        for batch in rows.to_batches(max_chunksize=CLIENT_BATCH_ROWS):
            writer.upsert_arrow_batch(batch)
        await writer.flush()
        return time.perf_counter() - start


async def snapshots_cover_everything(address: str, name: str) -> bool:
    async with await Connection.create(address) as connection:
        admin = connection.get_admin()
        path = TablePath("fluss", name)
        high = await admin.list_offsets(path, list(range(BUCKETS)), OffsetSpec.latest())
        latest = (await admin.get_latest_kv_snapshots(path)).snapshots
        return all(high[b] == 0 or ((s := latest.get(b)) is not None and s.log_offset >= high[b]) for b in high)


class ParquetArrowSource(DataSource):
    """``arrow-parquet``: each Parquet file of option ``path`` as one partition, read with pyarrow and yielded
    as Arrow batches; the cost of the Python data source path itself, without strom."""

    @classmethod
    def name(cls) -> str:
        return "arrow-parquet"

    def schema(self) -> str:
        return "id long, k string, v1 double, v2 long, s string"

    def reader(self, schema: Any) -> DataSourceReader:
        return ParquetArrowReader(sorted(str(f) for f in Path(self.options["path"]).glob("*.parquet")))


class ParquetArrowReader(DataSourceReader):
    def __init__(self, files: list[str]) -> None:
        self._files = files

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(file) for file in self._files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from pq.read_table(partition.value).to_batches(max_chunksize=READ_BATCH_ROWS_MAX)


def local_spark(name: str) -> Any:
    """A ``local[2]`` session for benchmarks: no UI, no progress bar, workers on this interpreter (and able
    to import ``bench``)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName(name)
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def best(repeat: int, action: Any) -> float:
    action()  # warm-up: Python workers start, imports load
    return min(timed(action) for _ in range(repeat))


def best_pair(repeat: int, ceiling: Any, action: Any) -> tuple[float, float]:
    """Best times of ``ceiling`` and ``action``, run alternately after one warm-up of each."""
    ceiling()
    action()
    times = [(timed(ceiling), timed(action)) for _ in range(repeat)]
    return min(t for t, _ in times), min(t for _, t in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from strom.spark import register

    work = Path(tempfile.mkdtemp(prefix="strom-spark-bench-"))
    rows = make_rows(args.rows)
    write_dataset(rows, work / "source", files=BUCKETS)
    spark = local_spark("strom-spark-bench")
    register(spark)  # the fluss source, with Python filter pushdown enabled
    spark.dataSource.register(ParquetArrowSource)
    try:
        with BenchServer({"kv.snapshot.interval": "2s", "kv.snapshot.num-retained": "1"}) as server:
            options = {"bootstrap.servers": server.address}
            source = spark.read.parquet(str(work / "source"))
            noop_s = best(args.repeat, lambda: source.write.format("noop").mode("overwrite").save())

            writes: dict[str, tuple[float, float]] = {}
            for image in ("FULL", "WAL"):
                client_runs: list[float] = []
                spark_runs: list[float] = []
                for round_ in range(args.repeat):  # alternating, so both see the same background load
                    name = f"client_{image}_{round_}".lower()
                    asyncio.run(create_table(server.address, name, rows, image))
                    client_runs.append(asyncio.run(client_upsert(server.address, name, rows)))
                    name = f"spark_{image}_{round_}".lower()
                    asyncio.run(create_table(server.address, name, rows, image))
                    writer = source.write.format("fluss").options(**options, table=f"fluss.{name}").mode("append")
                    spark_runs.append(timed(writer.save))
                writes[image] = (min(client_runs), min(spark_runs))

            table = f"spark_full_{args.repeat - 1}"
            deadline = time.monotonic() + SNAPSHOT_WAIT_S_MAX
            while not asyncio.run(snapshots_cover_everything(server.address, table)):
                if time.monotonic() > deadline:
                    raise SystemExit("the KV snapshots did not catch up with the writes")
                time.sleep(0.5)
            fluss = spark.read.format("fluss").options(**options, table=f"fluss.{table}").load().drop("_change_type")
            assert fluss.count() == args.rows

            parquet_count_s, fluss_count_s = best_pair(args.repeat, source.count, fluss.count)
            parquet_copy_s, fluss_copy_s = best_pair(
                args.repeat,
                lambda: source.write.mode("overwrite").parquet(str(work / "copy-parquet")),
                lambda: fluss.write.mode("overwrite").parquet(str(work / "copy-fluss")),
            )
            arrow = spark.read.format("arrow-parquet").option("path", str(work / "source")).load()
            parquet_copy_2_s, arrow_copy_s = best_pair(
                args.repeat,
                lambda: source.write.mode("overwrite").parquet(str(work / "copy-parquet")),
                lambda: arrow.write.mode("overwrite").parquet(str(work / "copy-arrow")),
            )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    n = args.rows

    def rate(seconds: float) -> str:
        return f"{seconds:7.2f} s  {n / seconds:>12,.0f} rows/s"

    lines = [("write: parquet -> noop sink (ceiling)", rate(noop_s))]
    for image, (client_s, spark_s) in writes.items():
        lines += [
            (f"write: strom client upsert, {image} image", f"{rate(client_s)}  ratio {noop_s / client_s:.2f}"),
            (
                f"write: parquet -> fluss PK table, {image} image",
                f"{rate(spark_s)}  ratio {noop_s / spark_s:.2f}  of client {client_s / spark_s:.2f}",
            ),
        ]
    lines += [
        ("read count(): parquet (footers only)", rate(parquet_count_s)),
        ("read count(): fluss PK table (snapshot)", f"{rate(fluss_count_s)}  ratio {parquet_count_s / fluss_count_s:.2f}"),
        ("read -> write.parquet: parquet copy", rate(parquet_copy_s)),
        ("read -> write.parquet: fluss PK table", f"{rate(fluss_copy_s)}  ratio {parquet_copy_s / fluss_copy_s:.2f}"),
        ("read -> write.parquet: parquet copy (again)", rate(parquet_copy_2_s)),
        (
            "read -> write.parquet: Python source, pyarrow",
            f"{rate(arrow_copy_s)}  ratio {parquet_copy_2_s / arrow_copy_s:.2f}",
        ),
    ]
    report(f"Spark connector, {n:,} rows, {BUCKETS} buckets, local[2] (best of {args.repeat})", lines)
    print("  ratio = ceiling time / connector time (1.00 = as fast as Spark on Parquet); of client = client time / Spark time")


if __name__ == "__main__":
    main()
