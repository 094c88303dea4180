"""Lake tiering throughput and freshness, against Spark and delta-rs doing the same work in the same run.

1. **First round** of a primary-key table (``--rows``, 2 buckets, read from its KV snapshots) into each lake
   format of ``--formats`` (Delta, Iceberg, Paimon), against Spark copying the same rows from Parquet to Parquet
   (``local[2]``, same session).
2. **An update round**: ``--rows/10`` updates and ``--rows/100`` deletes tiered into the lake copy, against
   a bare delta-rs ``MERGE`` of the same changes into a copy of the same Delta table (one ceiling for both
   formats, measured in the same run). For Paimon also against pypaimon-rust writing the same rows (a batch
   write of the table with the same buckets) and the same changes (upserts and deletes by row kind) itself.
3. **Log tables into Lance** (``lance`` in ``--formats``; Lance holds log tables only): the same rows appended
   to a log table and tiered (a first round), then ``--rows/10`` more (an append round), against pylance's
   ``lance.write_dataset`` of the same rows (create, then append), in the same run.
4. **Lake lag** under continuous upserts for ``--lag-seconds`` into a second table with
   ``table.datalake.freshness`` = ``--freshness``: once a second, ``now - write time of the newest row the
   lake holds``; p50 and p99 against the freshness.

    .venv/bin/python -m bench.tiering_bench [--rows 10000000] [--lag-seconds 300] [--freshness 30s] [--formats delta,iceberg,paimon,lance]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.harness import BenchServer, report, timed
from bench.spark_bench import BUCKETS, local_spark, make_rows, snapshots_cover_everything, write_dataset
from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.config import parse_duration
from strom.tiering.driver import TieringDriver, TieringOptions

SNAPSHOT_WAIT_S_MAX = 900.0
INGEST_BATCH_ROWS = 50_000


async def create_lake_table(address: str, name: str, schema: pa.Schema, freshness: str) -> None:
    async with await Connection.create(address) as connection:
        properties = {"table.datalake.enabled": "true", "table.datalake.freshness": freshness}
        descriptor = TableDescriptor(Schema.from_arrow(schema, primary_key=["id"]), bucket_count=BUCKETS,
                                     properties=properties)
        await connection.get_admin().create_table(TablePath("fluss", name), descriptor)


async def upsert(address: str, name: str, rows: pa.Table) -> None:
    async with await Connection.create(address) as connection:
        writer = (await connection.get_table(TablePath("fluss", name))).new_upsert().create_writer()
        for batch in rows.to_batches(INGEST_BATCH_ROWS):
            await writer.upsert_batch(pa.Table.from_batches([batch]))
        await writer.flush()


async def delete(address: str, name: str, keys: pa.Table) -> None:
    async with await Connection.create(address) as connection:
        writer = (await connection.get_table(TablePath("fluss", name))).new_upsert().create_writer()
        for row in keys.to_pylist():
            writer.delete(row)
        await writer.flush()


async def create_log_table(address: str, name: str, schema: pa.Schema) -> None:
    async with await Connection.create(address) as connection:
        properties = {"table.datalake.enabled": "true", "table.datalake.freshness": "1s"}
        descriptor = TableDescriptor(Schema.from_arrow(schema), bucket_count=BUCKETS, properties=properties)
        await connection.get_admin().create_table(TablePath("fluss", name), descriptor)


async def append(address: str, name: str, rows: pa.Table) -> None:
    async with await Connection.create(address) as connection:
        writer = (await connection.get_table(TablePath("fluss", name))).new_append().create_writer()
        for batch in rows.to_batches(INGEST_BATCH_ROWS):
            writer.append_arrow_batch(batch)
        await writer.flush()


def lance_rounds(spark: Any, rows: pa.Table, more: pa.Table, work: Path) -> tuple[float, float, float, float]:
    """(first round, append round, write_dataset, write_dataset append) seconds: a log table tiered into
    Lance, and pylance writing the same rows itself."""
    import lance

    name = "tiering_bench_log"
    with BenchServer({"datalake.format": "lance"}) as server:
        asyncio.run(create_log_table(server.address, name, rows.schema))
        asyncio.run(append(server.address, name, rows))
        first_s = tier_once(spark, server.address)
        asyncio.run(append(server.address, name, more))
        append_s = tier_once(spark, server.address)
        tiered = lance.dataset(str(server.data_dir / "lake" / "fluss" / f"{name}.lance")).count_rows()
        assert tiered == rows.num_rows + more.num_rows, f"the lake holds {tiered} rows"
    target = str(work / "ceiling.lance")
    write_s = timed(lambda: lance.write_dataset(rows, target, mode="create"))
    write_append_s = timed(lambda: lance.write_dataset(more, target, mode="append"))
    return first_s, append_s, write_s, write_append_s


def paimon_ceiling(rows: pa.Table, updates: pa.Table, deleted: pa.Table, work: Path) -> tuple[float, float]:
    """(first, update) seconds of pypaimon-rust writing the rows into a primary-key table with the same
    buckets, then the updates and deletes, itself (one commit each)."""
    from pypaimon_rust.datafusion import PaimonCatalog, SQLContext

    warehouse = f"file://{work / 'paimon-ceiling'}"
    context = SQLContext()
    context.register_catalog("lake", {"warehouse": warehouse}, default_database="")
    context.set_current_catalog("lake")
    context.sql("CREATE DATABASE bench")
    context.sql(f"CREATE TABLE bench.rows (id BIGINT NOT NULL, k STRING, v1 DOUBLE, v2 BIGINT, s STRING, PRIMARY KEY (id)) "
                f"WITH ('bucket'='{BUCKETS}', 'changelog-producer'='input')")
    table = PaimonCatalog({"warehouse": warehouse}).get_table("bench.rows")

    def write(batches: list[pa.RecordBatch]) -> None:
        builder = table.new_batch_write_builder()
        writer = builder.new_write()
        for batch in batches:
            writer.write_arrow(batch)
        builder.new_commit().commit(writer.prepare_commit())

    def kinds(data: pa.Table, kind: int) -> list[pa.RecordBatch]:
        return [batch.append_column("_VALUE_KIND", pa.array(np.full(batch.num_rows, kind, np.int8)))
                for batch in data.to_batches(INGEST_BATCH_ROWS)]

    first_s = timed(lambda: write(kinds(rows, 0)))
    gone = rows.join(deleted, "id", join_type="inner").select(rows.column_names).sort_by("id")
    update_s = timed(lambda: write(kinds(updates, 0) + kinds(gone, 3)))
    return first_s, update_s


def lake_path(server: BenchServer, name: str) -> Path:
    return server.data_dir / "lake" / "fluss" / name


def tier_once(spark: Any, address: str) -> float:
    driver = TieringDriver(spark, TieringOptions(address, "bench", poll_interval_ms=100, once=True))
    return timed(driver.run)


def merge_ceiling(lake_copy: Path, changes: pa.Table, deleted: pa.Table) -> float:
    """delta-rs MERGE of the same upserts and deletes (keyed by id) into a copy of the lake table."""
    from deltalake import DeltaTable

    table = DeltaTable(str(lake_copy))
    buckets = table.to_pyarrow_table(columns=["id", "__bucket"])
    upserts = changes.join(buckets, "id").append_column("__deleted", pa.array(np.zeros(len(changes), bool)))
    gone = deleted.join(buckets, "id")
    filler = {name: pa.nulls(len(gone), changes.schema.field(name).type) for name in changes.column_names if name != "id"}
    gone = pa.table({"id": gone["id"], **filler, "__bucket": gone["__bucket"],
                     "__deleted": pa.array(np.ones(len(gone), bool))})
    source = pa.concat_tables([upserts.select(gone.column_names), gone])
    now = pa.scalar(int(time.time() * 1_000_000), pa.timestamp("us", "UTC"))
    source = source.append_column("__offset", pa.array(np.zeros(len(source), np.int64)))
    source = source.append_column("__timestamp", pa.repeat(now, len(source)))
    columns = {name: f"s.{name}" for name in changes.column_names if name != "id"}
    columns.update({"__offset": "s.__offset", "__timestamp": "s.__timestamp"})

    def merge() -> None:
        (table.merge(source, "t.id = s.id AND t.__bucket = s.__bucket", source_alias="s", target_alias="t")
         .when_matched_delete("s.__deleted")
         .when_matched_update(columns, "NOT s.__deleted")
         .execute())

    return timed(merge)


def lag_run(spark: Any, server: BenchServer, seconds: float, freshness: str) -> list[float]:
    """Lag samples (seconds) while a writer upserts continuously and the service tiers on its own."""
    from deltalake import DeltaTable

    name = "lag_bench"
    schema = pa.schema([("id", pa.int64()), ("written_ms", pa.int64())])
    asyncio.run(create_lake_table(server.address, name, schema, freshness))
    stop = threading.Event()

    def write() -> None:
        async def loop() -> None:
            async with await Connection.create(server.address) as connection:
                writer = (await connection.get_table(TablePath("fluss", name))).new_upsert().create_writer()
                key = 0
                while not stop.is_set():
                    now = int(time.time() * 1000)
                    ids = np.arange(key, key + 500, dtype=np.int64) % 100_000
                    await writer.upsert_batch(pa.table({"id": ids, "written_ms": np.full(500, now, np.int64)}))
                    await writer.flush()
                    key += 500
                    await asyncio.sleep(0.1)

        asyncio.run(loop())

    driver = TieringDriver(spark, TieringOptions(server.address, "lag-bench", poll_interval_ms=1000))
    threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=driver.run, daemon=True)]
    for thread in threads:
        thread.start()
    samples: list[float] = []
    started = time.monotonic()
    path = lake_path(server, name)
    while time.monotonic() - started < seconds:
        time.sleep(1.0)
        if not (path / "_delta_log").exists():
            continue
        newest = pc.max(DeltaTable(str(path)).to_pyarrow_table(columns=["written_ms"])["written_ms"]).as_py()
        if newest is not None:
            samples.append(time.time() - newest / 1000)
    stop.set()
    driver.stop()
    for thread in threads:
        thread.join(60)
    return samples


def _wait_for_snapshots(address: str, name: str) -> None:
    deadline = time.monotonic() + SNAPSHOT_WAIT_S_MAX
    while not asyncio.run(snapshots_cover_everything(address, name)):
        if time.monotonic() > deadline:
            raise SystemExit("the KV snapshots did not catch up with the writes")
        time.sleep(0.5)


def _changes(rows: pa.Table, count: int) -> tuple[pa.Table, pa.Table]:
    """``count / 10`` updates (v2 negated) and ``count / 100`` deletes of other keys, the same every run."""
    rng = np.random.default_rng(7)
    updated_ids = np.sort(rng.choice(count, size=count // 10, replace=False))
    updates = rows.take(pa.array(updated_ids))
    updates = updates.set_column(3, "v2", pc.negate(updates["v2"]))
    remaining = np.setdiff1d(np.arange(count), updated_ids)
    deleted = pa.table({"id": pa.array(np.sort(rng.choice(remaining, size=count // 100, replace=False)))})
    return updates, deleted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--lag-seconds", type=float, default=300.0)
    parser.add_argument("--freshness", default="30s")
    parser.add_argument("--formats", default="delta,iceberg,paimon,lance", help="lake formats to tier into, in this run")
    args = parser.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    work = Path(tempfile.mkdtemp(prefix="strom-tiering-bench-"))
    rows = make_rows(args.rows)
    updates, deleted = _changes(rows, args.rows)
    write_dataset(rows, work / "source", files=BUCKETS)
    spark = local_spark("strom-tiering-bench")
    name = "tiering_bench"
    rounds: dict[str, tuple[float, float]] = {}
    lance_s: tuple[float, float, float, float] | None = None
    paimon_s: tuple[float, float] | None = None
    merge_s = 0.0
    lag: list[float] = []
    try:
        source = spark.read.parquet(str(work / "source"))
        source.write.format("noop").mode("overwrite").save()  # warm-up: Python workers, JIT
        parquet_s = timed(lambda: source.write.mode("overwrite").parquet(str(work / "copy")))
        if "lance" in formats:
            lance_s = lance_rounds(spark, rows, rows.slice(0, args.rows // 10), work)
        if "paimon" in formats:
            paimon_s = paimon_ceiling(rows, updates, deleted, work)
        for lake in (f for f in formats if f != "lance"):
            config = {"kv.snapshot.interval": "2s", "kv.snapshot.num-retained": "1", "datalake.format": lake}
            with BenchServer(config) as server:
                asyncio.run(create_lake_table(server.address, name, rows.schema, "1s"))
                asyncio.run(upsert(server.address, name, rows))
                _wait_for_snapshots(server.address, name)
                first_s = tier_once(spark, server.address)
                if lake == "delta":
                    shutil.copytree(lake_path(server, name), work / "merge-copy")
                asyncio.run(upsert(server.address, name, updates))
                asyncio.run(delete(server.address, name, deleted))
                rounds[lake] = (first_s, tier_once(spark, server.address))
                if lake == "delta":
                    merge_s = merge_ceiling(work / "merge-copy", updates, deleted)
                    if args.lag_seconds > 0:
                        lag = lag_run(spark, server, args.lag_seconds, args.freshness)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    n = args.rows
    lines = [("first round: Spark parquet -> parquet (ceiling)", f"{parquet_s:7.2f} s  {n / parquet_s:>12,.0f} rows/s")]
    for lake, (first_s, _update_s) in rounds.items():
        lines.append((f"first round: strom tiering (KV snapshots -> {lake})",
                      f"{first_s:7.2f} s  {n / first_s:>12,.0f} rows/s  ratio {parquet_s / first_s:.2f}"))
    if merge_s:
        lines.append((f"update round: delta-rs MERGE of {n // 10:,} upserts + {n // 100:,} deletes (ceiling)",
                      f"{merge_s:7.2f} s"))
    for lake, (_first_s, update_s) in rounds.items():
        ratio = f"  ratio {merge_s / update_s:.2f}" if merge_s else ""
        lines.append((f"update round: strom tiering (changelog -> {lake})", f"{update_s:7.2f} s{ratio}"))
    if paimon_s is not None and "paimon" in rounds:
        (ceiling_first, ceiling_update), (first_s, update_s) = paimon_s, rounds["paimon"]
        lines.append(("first round: pypaimon-rust batch write of the rows (ceiling)",
                      f"{ceiling_first:7.2f} s  ratio {ceiling_first / first_s:.2f}"))
        lines.append(("update round: pypaimon-rust write of the same changes (ceiling)",
                      f"{ceiling_update:7.2f} s  ratio {ceiling_update / update_s:.2f}"))
    if "delta" in rounds and "iceberg" in rounds:
        (delta_first, delta_update), (ice_first, ice_update) = rounds["delta"], rounds["iceberg"]
        lines.append(("iceberg / delta time, first round and update round",
                      f"{ice_first / delta_first:.2f}x  {ice_update / delta_update:.2f}x"))
    if lance_s is not None:
        first_s, append_s, write_s, write_append_s = lance_s
        lines.append(("log table: pylance write_dataset of the rows (ceiling)",
                      f"{write_s:7.2f} s  {n / write_s:>12,.0f} rows/s"))
        lines.append(("log table: strom tiering (log -> lance), first round",
                      f"{first_s:7.2f} s  {n / first_s:>12,.0f} rows/s  ratio {write_s / first_s:.2f}"))
        lines.append((f"log table: pylance append of {n // 10:,} rows (ceiling)", f"{write_append_s:7.2f} s"))
        lines.append(("log table: strom tiering (log -> lance), append round",
                      f"{append_s:7.2f} s  ratio {write_append_s / append_s:.2f}"))
    if lag:
        freshness_s = parse_duration(args.freshness).total_seconds()
        p50 = statistics.median(lag)
        p99 = statistics.quantiles(lag, n=100)[98] if len(lag) >= 2 else lag[0]
        lines.append((f"lake lag (delta) over {args.lag_seconds:.0f} s of upserts, freshness {args.freshness}",
                      f"p50 {p50:6.1f} s ({p50 / freshness_s:.2f}x)  p99 {p99:6.1f} s ({p99 / freshness_s:.2f}x)"))
    report(f"Lake tiering, {n:,} rows, {BUCKETS} buckets, Spark local[2]", lines)
    print("  ratio = ceiling time / tiering time (1.00 = as fast as the ceiling); lag ratio = lag / freshness")


if __name__ == "__main__":
    main()
