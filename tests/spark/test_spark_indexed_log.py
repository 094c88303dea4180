"""Log tables in a row format (INDEXED, COMPACTED) through Spark: a batch read and a lake tiering round decode the IndexedRow
records with strom's log scanner, so they see the same rows as for an ARROW log table."""

from __future__ import annotations

from typing import Any

import pytest

from strom.records.types import DecimalType, IntType, StringType, TimestampType
from tests.spark.support import Fluss
from tests.spark.tiering_support import FAST_TIERING, create_lake_table, lake_rows, tier_once

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(300)]

COLUMNS = [
    ("id", IntType()),
    ("day", StringType()),
    ("amount", DecimalType(10, 2)),
    ("seen", TimestampType(6)),
]


def rows(start: int, end: int) -> list[dict[str, Any]]:
    from datetime import datetime, timedelta
    from decimal import Decimal

    return [
        {
            "id": i,
            "day": f"d{1 + i % 2}",
            "amount": None if i % 5 == 0 else Decimal(i) / 4,
            "seen": datetime(2024, 1, 1) + timedelta(microseconds=i * 1_000_001),
        }
        for i in range(start, end)
    ]


def as_tuples(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(record[name] for name, _ in COLUMNS) for record in records)


@pytest.mark.parametrize("log_format", ["INDEXED", "COMPACTED"])
def test_batch_read_of_a_row_log_table_returns_every_record(spark: Any, cluster: Fluss, log_format: str) -> None:
    table = cluster.create_table(COLUMNS, bucket_count=3, properties={"table.log.format": log_format})
    cluster.append(table, rows(0, 60))

    reader = spark.read.format("fluss")
    for key, value in cluster.options(table).items():
        reader = reader.option(key, value)
    frame = reader.load()

    assert frame.columns == [name for name, _ in COLUMNS]
    assert sorted(tuple(r) for r in frame.collect()) == as_tuples(rows(0, 60))
    assert sorted(r.id for r in frame.where("day = 'd2'").select("id").collect()) == list(range(1, 60, 2))


@pytest.mark.parametrize("log_format", ["INDEXED", "COMPACTED"])
def test_a_row_log_table_tiers_every_record_once(spark: Any, server_factory: Any, log_format: str) -> None:
    cluster = Fluss(server_factory(FAST_TIERING).address)
    table = create_lake_table(cluster, COLUMNS, bucket_count=2, properties={"table.log.format": log_format})
    cluster.append(table, rows(0, 40))
    tier_once(spark, cluster)
    cluster.append(table, rows(40, 70))
    tier_once(spark, cluster)

    assert lake_rows(cluster, table, [name for name, _ in COLUMNS]) == as_tuples(rows(0, 70))
