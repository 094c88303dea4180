"""The Spark connector with every merge engine: DataFrames written into first_row, versioned and aggregation
tables merge by the engine's rules (the batch read and strom's client lookups show the merged state), the
changelog a streaming read (and a batch time-range read) returns is the one the server logged, as strom's
LogScanner reads it, and deletes written through the change-type column follow ``table.delete.behavior``.

One table per engine, one bucket each (so the changelog has one order), few rows. Every written DataFrame is
coalesced to one partition: a task applies its rows in order, so repeated keys merge in the order written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from strom.client import Connection
from strom.ids import TablePath
from strom.records.types import BigIntType, DataType, IntType, StringType
from tests.conftest import unique_name
from tests.spark.support import Fluss, LogRecord, run
from tests.spark.test_spark_batch_read import load
from tests.spark.test_spark_errors import failure_line
from tests.spark.test_spark_streaming import Collector, drain, stream
from tests.spark.test_spark_write import save

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

KV_COLUMNS: list[tuple[str, DataType]] = [("id", IntType()), ("ver", BigIntType()), ("name", StringType())]
KV_SCHEMA = "id int, ver long, name string"
AGG_COLUMNS: list[tuple[str, DataType]] = [
    ("id", IntType()),
    ("total", BigIntType()),  # sum
    ("top", IntType()),  # max
    ("tags", StringType()),  # listagg with ';'
    ("email", StringType()),  # no function: last_value_ignore_nulls
]
AGG_SCHEMA = "id int, total long, top int, tags string, email string"
AGG_OPTIONS = {
    "table.merge-engine": "aggregation",
    "fields.total.agg": "sum",
    "fields.top.agg": "max",
    "fields.tags.agg": "listagg",
    "fields.tags.listagg.delimiter": ";",
}


def write(spark: Any, cluster: Fluss, table: str, rows: Sequence[tuple[Any, ...]], schema: str) -> None:
    """One ordered write task (a DataFrame of one partition) through ``df.write.format("fluss")``."""
    save(spark.createDataFrame(list(rows), schema).coalesce(1), cluster, table)


def with_changes(schema: str) -> str:
    return f"{schema}, _change_type string"


def state(spark: Any, cluster: Fluss, table: str, **options: str) -> dict[int, dict[str, Any]]:
    """The table's rows by id through a Spark batch read (every row typed +I)."""
    rows = [row.asDict() for row in load(spark, cluster, table, **options).collect()]
    assert {row.pop("_change_type") for row in rows} <= {"+I"}
    return {row["id"]: row for row in rows}


def lookups(cluster: Fluss, table: str, ids: Sequence[int]) -> dict[int, dict[str, Any] | None]:
    """The rows of ``ids`` through strom's client lookups."""

    async def look(connection: Connection) -> dict[int, dict[str, Any] | None]:
        lookuper = (await connection.get_table(TablePath.parse(table))).new_lookup().create_lookuper()
        return {key: await lookuper.lookup({"id": key}) for key in ids}

    return run(cluster.address, look)


def logged(records: Sequence[LogRecord]) -> list[tuple[str, dict[str, Any]]]:
    return [(record.change_type, record.row) for record in records]


def streamed_changelog(spark: Any, cluster: Fluss, table: str, checkpoint: Path) -> list[tuple[str, dict[str, Any]]]:
    """The changelog a streaming read from the earliest offset returns, as (change type, row)."""
    collector = Collector()
    drain(stream(spark, cluster, table, **{"scan.startup.mode": "earliest"}), collector, checkpoint)
    return [(row.pop("_change_type"), row) for row in collector.rows]


def batch_changelog(spark: Any, cluster: Fluss, table: str) -> list[tuple[str, dict[str, Any]]]:
    """The changelog a batch time-range read from the epoch returns, in log order, as (change type, row)."""
    options = {"scan.incremental.start.timestamp": "0", "read.metadata-columns": "_log_offset"}
    rows = sorted((row.asDict() for row in load(spark, cluster, table, **options).collect()),
                  key=lambda row: row.pop("_log_offset"))
    return [(row.pop("_change_type"), row) for row in rows]


def assert_changelog(spark: Any, cluster: Fluss, table: str, checkpoint: Path,
                     expected: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """Spark's streaming and batch changelogs both equal the records strom's LogScanner reads, and ``expected``."""
    records = logged(cluster.log_records(table))
    assert records == [(change, dict(row)) for change, row in expected]
    assert streamed_changelog(spark, cluster, table, checkpoint) == records
    assert batch_changelog(spark, cluster, table) == records


def test_first_row_keeps_each_keys_first_row_and_logs_only_inserts(spark: Any, cluster: Fluss, tmp_path: Path) -> None:
    table = cluster.create_table(
        KV_COLUMNS, primary_key=["id"], bucket_count=1, properties={"table.merge-engine": "first_row"}
    )
    write(spark, cluster, table, [(1, 1, "a"), (2, 1, "b"), (1, 2, "a again")], KV_SCHEMA)
    write(spark, cluster, table, [(2, 2, "b again"), (3, 1, "c")], KV_SCHEMA)
    # deletes are ignored by default; an update by change type is a write of an existing key, also ignored
    write(spark, cluster, table, [(1, 0, None, "-D"), (3, 9, "c updated", "+U"), (4, 1, "d", "+I")],
          with_changes(KV_SCHEMA))

    expected = {1: (1, "a"), 2: (1, "b"), 3: (1, "c"), 4: (1, "d")}
    assert {key: (row["ver"], row["name"]) for key, row in state(spark, cluster, table).items()} == expected
    assert {key: (row["ver"], row["name"]) for key, row in lookups(cluster, table, [1, 2, 3, 4]).items()
            if row is not None} == expected
    assert_changelog(spark, cluster, table, tmp_path / "checkpoint", [
        ("+I", {"id": key, "ver": ver, "name": name}) for key, (ver, name) in expected.items()
    ])


def test_versioned_keeps_the_newest_version_and_refuses_deletes_when_disabled(
    spark: Any, cluster: Fluss, tmp_path: Path
) -> None:
    properties = {"table.merge-engine": "versioned", "table.merge-engine.versioned.ver-column": "ver",
                  "table.delete.behavior": "disable"}
    table = cluster.create_table(KV_COLUMNS, primary_key=["id"], bucket_count=1, properties=properties)
    write(spark, cluster, table, [(1, 5, "v5"), (2, 1, "w1")], KV_SCHEMA)
    write(spark, cluster, table, [(1, 2, "v2"), (2, 3, "w3"), (2, 2, "w2")], KV_SCHEMA)  # older versions dropped
    write(spark, cluster, table, [(1, 5, "v5 again"), (1, 4, "v4"), (3, None, "no version")], KV_SCHEMA)

    expected = {1: {"id": 1, "ver": 5, "name": "v5 again"}, 2: {"id": 2, "ver": 3, "name": "w3"},
                3: {"id": 3, "ver": None, "name": "no version"}}
    assert state(spark, cluster, table) == expected
    assert state(spark, cluster, table, **{"read.strategy": "server-scan"}) == expected
    assert lookups(cluster, table, [1, 2, 3]) == expected
    changelog = [
        ("+I", {"id": 1, "ver": 5, "name": "v5"}), ("+I", {"id": 2, "ver": 1, "name": "w1"}),
        ("-U", {"id": 2, "ver": 1, "name": "w1"}), ("+U", {"id": 2, "ver": 3, "name": "w3"}),
        ("-U", {"id": 1, "ver": 5, "name": "v5"}), ("+U", {"id": 1, "ver": 5, "name": "v5 again"}),
        ("+I", {"id": 3, "ver": None, "name": "no version"}),
    ]
    assert_changelog(spark, cluster, table, tmp_path / "checkpoint", changelog)

    message = failure_line(lambda: write(spark, cluster, table, [(2, 3, "w3", "-D")], with_changes(KV_SCHEMA)))
    assert message.startswith(f"DeletionDisabledError from table '{table}'"), message
    assert state(spark, cluster, table) == expected
    assert logged(cluster.log_records(table)) == changelog


def test_aggregation_folds_written_deltas_and_logs_update_pairs(spark: Any, cluster: Fluss, tmp_path: Path) -> None:
    table = cluster.create_table(AGG_COLUMNS, primary_key=["id"], bucket_count=1, properties=AGG_OPTIONS)
    write(spark, cluster, table, [(1, 10, 3, "a", "a@x"), (2, 1, 1, "x", None)], AGG_SCHEMA)
    write(spark, cluster, table, [(1, 5, 9, "b", None), (2, 2, 0, None, "b@y")], AGG_SCHEMA)
    # the delete is ignored (the default behaviour of aggregation tables), the writer skips -U rows (nothing
    # is retracted), and +I of an existing key aggregates like any other write
    write(spark, cluster, table, [(2, None, None, None, None, "-D"), (1, 100, 100, "z", "z@x", "-U"),
                                  (1, 1, 2, "c", "c@x", "+I")], with_changes(AGG_SCHEMA))

    first = {"id": 1, "total": 10, "top": 3, "tags": "a", "email": "a@x"}
    second = {"id": 2, "total": 1, "top": 1, "tags": "x", "email": None}
    first_merged = {"id": 1, "total": 15, "top": 9, "tags": "a;b", "email": "a@x"}
    second_merged = {"id": 2, "total": 3, "top": 1, "tags": "x", "email": "b@y"}
    final = {"id": 1, "total": 16, "top": 9, "tags": "a;b;c", "email": "c@x"}
    expected = {1: final, 2: second_merged}
    assert state(spark, cluster, table) == expected
    assert state(spark, cluster, table, **{"read.strategy": "server-scan"}) == expected
    assert lookups(cluster, table, [1, 2]) == expected
    assert_changelog(spark, cluster, table, tmp_path / "checkpoint", [
        ("+I", first), ("+I", second),
        ("-U", first), ("+U", first_merged), ("-U", second), ("+U", second_merged),
        ("-U", first_merged), ("+U", final),
    ])


def test_a_write_that_creates_the_table_passes_the_merge_engine_and_the_aggregate_functions(
    spark: Any, cluster: Fluss
) -> None:
    table = f"fluss.{unique_name('spark_agg')}"
    options = {"primary.key": "id", "bucket.num": "1", "table.merge-engine": "aggregation",
               "fields.total.agg": "sum", "fields.tags.agg": "listagg", "fields.tags.listagg.delimiter": ";"}
    schema = "id int, total long, tags string"
    for rows in ([(1, 10, "a"), (2, 1, "x")], [(1, 5, "b")]):
        save(spark.createDataFrame(rows, schema).coalesce(1), cluster, table, **options)

    assert state(spark, cluster, table) == {1: {"id": 1, "total": 15, "tags": "a;b"},
                                            2: {"id": 2, "total": 1, "tags": "x"}}
    properties = cluster.describe(table).info.properties
    assert properties["table.merge-engine"] == "aggregation"
