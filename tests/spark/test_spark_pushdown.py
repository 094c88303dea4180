"""Filter pushdown through Spark: primary-key lookups, partition pruning, filters Spark keeps, projections."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from strom.records.types import BigIntType, DateType, IntType, StringType
from tests.spark.support import Fluss
from tests.spark.test_spark_batch_read import load as load_plain

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]


def load(spark: Any, cluster: Fluss, table: str, **options: str) -> Any:
    """A read with filter pushdown on (the test session enables Spark's setting)."""
    return load_plain(spark, cluster, table, **{"read.filter-pushdown": "true", **options})


def planned(cluster: Fluss, table: str, filters: list[Any], **options: str) -> tuple[list[Any], list[Any]]:
    """What the reader plans for ``filters`` as Spark would push them: (partitions, filters kept for Spark)."""
    from strom.spark import FlussPushdownDataSource

    source = FlussPushdownDataSource(cluster.options(table, **options))
    reader = source.reader(source.schema())
    kept = list(reader.pushFilters(filters))
    return list(reader.partitions()), kept


def plan_text(frame: Any) -> str:
    """The physical plan's text: filters the source took are absent from Spark's Filter node."""
    return str(frame._jdf.queryExecution().executedPlan().toString())


def rows_read(frame: Any) -> int:
    """After ``frame`` ran: the rows the source handed Spark (the scan node's numOutputRows metric)."""
    scan = frame._jdf.queryExecution().executedPlan().collectLeaves().head()
    return int(scan.metrics().apply("numOutputRows").value())


def test_primary_key_equality_becomes_a_lookup(spark: Any, cluster: Fluss) -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThan

    from strom.spark.partitions import KeyLookupPartition

    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=3)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(500)])
    cluster.delete(table, [{"id": 7}])
    frame = load(spark, cluster, table)

    equal, greater = EqualTo(("id",), 42), GreaterThan(("score",), 1)
    partitions, kept = planned(cluster, table, [equal, greater])
    assert partitions == [KeyLookupPartition(((42,),))]  # one key read, not three buckets scanned
    assert kept == [greater]
    query = frame.where("id = 42")
    rows = query.collect()
    assert [(r.id, r.name, r.score, r._change_type) for r in rows] == [(42, "n42", 42, "+I")]
    assert rows_read(query) == 1  # O(keys), where a scan hands Spark all 499 rows:
    scan = frame.where("name = 'n42'")
    assert len(scan.collect()) == 1 and rows_read(scan) == 499
    keys = frame.where("id in (1, 2, 3, 7, 9999)")
    assert sorted(r.id for r in keys.collect()) == [1, 2, 3] and rows_read(keys) == 3
    assert frame.where("id = 7").collect() == []  # deleted
    assert frame.where("id = 100000").collect() == []  # never written
    assert [r.name for r in frame.where("id = 42 and score > 100").collect()] == []
    assert [r.name for r in frame.where("id = 42 and score = 42").collect()] == ["n42"]


def test_key_lookups_on_a_table_of_not_null_columns(spark: Any, cluster: Fluss) -> None:
    """A DataFrame of typed sources has NOT NULL columns, and so has a table made from it: its keys are
    looked up without the other columns, which a key alone leaves null."""
    columns = [(name, type_.copy(nullable=False)) for name, type_ in PK_COLUMNS]
    table = cluster.create_table(columns, primary_key=["id"], bucket_count=3)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i * 10} for i in range(50)])
    frame = load(spark, cluster, table)
    query = frame.where("id = 42")
    assert [(r.id, r.name, r.score) for r in query.collect()] == [(42, "n42", 420)]
    assert rows_read(query) == 1
    assert sorted(r.id for r in frame.where("id in (1, 2, 99)").collect()) == [1, 2]


def test_in_list_on_the_key_looks_up_each_key(spark: Any, cluster: Fluss) -> None:
    from pyspark.sql.datasource import EqualTo, In

    from strom.spark.partitions import KeyLookupPartition

    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=3)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(200)])
    frame = load(spark, cluster, table)

    partitions, kept = planned(cluster, table, [In(("id",), (3, 5, 999, 3))])
    assert [type(p) for p in partitions] == [KeyLookupPartition] and kept == []
    assert sorted(partitions[0].keys) == [(3,), (5,), (999,)]
    assert sorted(r.id for r in frame.where("id in (3, 5, 999)").collect()) == [3, 5]
    # two conjuncts on the key intersect
    partitions, _ = planned(cluster, table, [In(("id",), (1, 2, 3)), EqualTo(("id",), 2)])
    assert partitions == [KeyLookupPartition(((2,),))]
    assert [r.id for r in frame.where("id in (1, 2, 3) and id = 2").collect()] == [2]
    assert frame.where("id in (1, 2) and id = 3").collect() == []


def test_composite_and_partitioned_keys_need_every_key_column(spark: Any, cluster: Fluss) -> None:
    from pyspark.sql.datasource import EqualTo, In

    from strom.spark.partitions import KeyLookupPartition, KvStatePartition

    days = [{"day": "d1"}, {"day": "d2"}, {"day": "d3"}]
    table = cluster.create_table(
        [("id", IntType()), ("day", StringType()), ("score", BigIntType())],
        primary_key=["id", "day"], partition_keys=["day"], partitions=days, bucket_count=2,
    )
    cluster.upsert(table, [{"id": i, "day": f"d{1 + i % 3}", "score": i} for i in range(30)])
    frame = load(spark, cluster, table)

    partitions, kept = planned(cluster, table, [EqualTo(("id",), 4), In(("day",), ("d2", "d9"))])
    assert [type(p) for p in partitions] == [KeyLookupPartition] and kept == []
    assert [(r.id, r.day, r.score) for r in frame.where("id = 4 and day in ('d2', 'd9')").collect()] == [(4, "d2", 4)]
    assert frame.where("id = 4 and day = 'd1'").collect() == []
    # the key alone (no partition) is not a lookup: the partition is pruned instead
    id_only = EqualTo(("id",), 4)
    partitions, kept = planned(cluster, table, [id_only])
    assert kept == [id_only] and all(isinstance(p, KvStatePartition) for p in partitions)


def test_partition_filters_prune_partitions(spark: Any, cluster: Fluss) -> None:
    from pyspark.sql.datasource import EqualTo, In

    from strom.spark.partitions import LogTailPartition

    days = [{"day": "d1"}, {"day": "d2"}, {"day": "d3"}]
    table = cluster.create_table(
        [("id", IntType()), ("day", StringType())], partition_keys=["day"], partitions=days, bucket_count=2
    )
    cluster.append(table, [{"id": i, "day": f"d{1 + i % 3}"} for i in range(30)])
    frame = load(spark, cluster, table)
    all_partitions, _ = planned(cluster, table, [])
    assert len({p.bucket.partition_id for p in all_partitions if isinstance(p, LogTailPartition)}) == 3

    equal = EqualTo(("day",), "d2")
    partitions, kept = planned(cluster, table, [equal])
    assert kept == [equal]  # Spark re-checks it; the pruning only skips partitions
    assert len({p.bucket.partition_id for p in partitions}) == 1
    assert sorted(r.id for r in frame.where("day = 'd2'").collect()) == list(range(1, 30, 3))
    partitions, _ = planned(cluster, table, [In(("day",), ("d1", "d3", "nope"))])
    assert len({p.bucket.partition_id for p in partitions}) == 2
    assert len(frame.where("day in ('d1', 'd3', 'nope')").collect()) == 20
    partitions, _ = planned(cluster, table, [EqualTo(("day",), "nope")])
    assert partitions == []
    assert frame.where("day = 'nope'").collect() == []


def test_filters_on_other_columns_are_kept_by_spark(spark: Any, cluster: Fluss) -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThan

    from strom.spark.partitions import KvStatePartition

    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i % 4} for i in range(40)])
    frame = load(spark, cluster, table)

    by_name, by_score = EqualTo(("name",), "n3"), GreaterThan(("id",), 30)
    partitions, kept = planned(cluster, table, [by_name, by_score])
    assert kept == [by_name, by_score] and all(isinstance(p, KvStatePartition) for p in partitions)
    assert [r.id for r in frame.where("name = 'n3'").collect()] == [3]
    assert sorted(r.id for r in frame.where("id > 30 and score = 1").collect()) == [33, 37]
    assert sorted(r.id for r in frame.where("id = 3 or id = 5").collect()) == [3, 5]
    assert sorted(r.id for r in frame.where("id <> 3 and id < 5").collect()) == [0, 1, 2, 4]


def test_nulls_and_values_needing_conversion_are_left_to_spark(spark: Any, cluster: Fluss) -> None:
    from pyspark.sql.datasource import EqualTo, In

    from strom.spark.partitions import KeyLookupPartition

    table = cluster.create_table(
        [("day", DateType()), ("code", StringType()), ("n", BigIntType()), ("note", StringType())],
        primary_key=["day", "code"], bucket_count=2,
    )
    base = datetime.date(2024, 1, 1)
    cluster.upsert(table, [
        {"day": base + datetime.timedelta(days=i), "code": f"c{i % 2}", "n": i, "note": None if i % 2 else "x"}
        for i in range(10)
    ])
    frame = load(spark, cluster, table)

    day = base + datetime.timedelta(days=3)
    partitions, kept = planned(cluster, table, [EqualTo(("day",), day), EqualTo(("code",), "c1")])
    assert partitions == [KeyLookupPartition(((day, "c1"),))] and kept == []
    lookup = frame.where("day = date'2024-01-04' and code = 'c1'")
    rows = lookup.collect()
    assert [(r.day, r.code, r.n, r.note) for r in rows] == [(day, "c1", 3, None)]
    assert rows_read(lookup) == 1  # Spark passed the DATE literal as a datetime.date: a lookup
    # a NULL in the list, a value of another type, a null test: not lookups, still right
    with_null = In(("code",), ("c1", None))
    _, kept = planned(cluster, table, [EqualTo(("day",), day), with_null])
    assert with_null in kept
    wrong_type = EqualTo(("code",), 1)
    _, kept = planned(cluster, table, [EqualTo(("day",), day), wrong_type])
    assert wrong_type in kept
    assert [r.n for r in frame.where("day = date'2024-01-04' and code in ('c1', null)").collect()] == [3]
    assert frame.where("day = date'2024-01-04' and code = null").collect() == []
    assert sorted(r.n for r in frame.where("note is null and code = 'c1'").collect()) == [1, 3, 5, 7, 9]
    timestamp_key = frame.where("day = timestamp'2024-01-04 00:00:00' and code = 'c1'")
    assert [r.n for r in timestamp_key.collect()] == [3]


def test_spark_pushes_the_filters_and_projections_read_the_right_columns(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=4)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i * 10} for i in range(20)])
    frame = load(spark, cluster, table)

    query = frame.where("id in (4, 6) and score > 0").select("score", "name")
    spark_filter = [line for line in plan_text(query).splitlines() if "Filter (" in line]
    assert len(spark_filter) == 1 and "score" in spark_filter[0] and "id#" not in spark_filter[0]
    assert query.rdd.getNumPartitions() == 1  # one lookup task instead of one scan per bucket
    assert frame.where("score > 0").rdd.getNumPartitions() == 4
    assert sorted(tuple(r) for r in query.collect()) == [(40, "n4"), (60, "n6")]
    assert query.columns == ["score", "name"]
    assert [tuple(r) for r in frame.select("name").where("id = 5").collect()] == [("n5",)]


def test_pushdown_can_be_switched_off_per_read(spark: Any, cluster: Fluss) -> None:
    from strom.spark import FlussDataSource, FlussPushdownDataSource
    from strom.spark.reader import FlussBatchReader, FlussFilteringReader

    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(10)])
    source = FlussPushdownDataSource(cluster.options(table, **{"read.filter-pushdown": "false"}))
    assert type(source.reader(source.schema())) is FlussBatchReader
    source = FlussPushdownDataSource(cluster.options(table))
    assert type(source.reader(source.schema())) is FlussFilteringReader
    source = FlussDataSource(cluster.options(table))  # registered by hand: no pushdown unless asked
    assert type(source.reader(source.schema())) is FlussBatchReader
    frame = load(spark, cluster, table, **{"read.filter-pushdown": "false"})
    assert [r.name for r in frame.where("id = 4").collect()] == ["n4"]


def test_a_session_without_the_pushdown_setting_reads_through_the_plain_source(spark: Any, cluster: Fluss) -> None:
    """What a newcomer gets with ``spark.dataSource.register(FlussDataSource)`` in a fresh session (Spark's
    setting off): reads work, filters are applied by Spark."""
    from strom.spark import PUSHDOWN_SETTING

    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(10)])
    spark.conf.set(PUSHDOWN_SETTING, "false")
    try:
        assert [r.name for r in load_plain(spark, cluster, table).where("id = 4").collect()] == ["n4"]
    finally:
        spark.conf.set(PUSHDOWN_SETTING, "true")


def test_log_table_filters_skip_the_batches_that_cannot_match(spark: Any, cluster: Fluss) -> None:
    from pyspark.sql.datasource import GreaterThanOrEqual, LessThan, StringStartsWith

    from strom.spark.pushdown import push

    columns = [("id", IntType()), ("name", StringType())]
    table = cluster.create_table(columns, bucket_count=1, properties={"table.statistics.columns": "*"})
    for first in range(0, 2000, 100):  # 20 log batches of 100 ids each, with their statistics
        cluster.append(table, [{"id": i, "name": f"n{i:04d}"} for i in range(first, first + 100)])
    frame = load(spark, cluster, table)
    query = frame.where("id >= 1234 and id < 1240")
    assert sorted(r.id for r in query.collect()) == list(range(1234, 1240))
    assert rows_read(query) == 100  # one batch of the 20 reached Spark, which filters its rows
    prefixed = frame.where("name like 'n199%'")
    assert sorted(r.id for r in prefixed.collect()) == list(range(1990, 2000)) and rows_read(prefixed) == 100
    assert frame.where("id > 5000").collect() == []
    assert len(frame.where("id % 2 = 0").collect()) == 1000  # nothing to push: every batch is read

    filters = [GreaterThanOrEqual(("id",), 5), LessThan(("id",), 9.5), StringStartsWith(("name",), "n")]
    pushed, kept = push(cluster.describe(table), filters, allow_lookup=True)
    assert kept == filters  # Spark still checks every row
    assert pushed.log_predicate is not None  # id >= 5 and name starts with n; 9.5 is no INT: not pushed
