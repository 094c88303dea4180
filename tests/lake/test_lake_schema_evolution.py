"""ADD COLUMN on a lake-enabled table: the lake table gains the nullable column when the strom table did
(Delta appends it, Iceberg places it before the system columns), rows tiered before read it as null — also
those a later round carries over when it rewrites their file (copy-on-write) — and a snapshot from before
the column reads it as null too (a union read right after the ALTER). DuckDB reads the evolved table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.lake.formats import lake_format
from strom.records import types as t
from tests.lake.duckdb_reader import iceberg_rows, rows_of
from tests.lake.paimon_reader import pypaimon_rows
from tests.lake.support import row_tuples, table_info, write_split

BEFORE = [("id", t.IntType(nullable=False)), ("name", t.StringType())]
AFTER = [*BEFORE, ("score", t.BigIntType())]


def duck(table: Any, lake: str, query: str) -> list[tuple[Any, ...]]:
    """DuckDB's read (pypaimon 2.1.0's for Paimon, which DuckDB cannot read)."""
    if lake == "paimon":
        return [tuple(row) for row in pypaimon_rows(table.catalog_options["warehouse"], table.identifier, ["id", "name", "score"])]
    if lake == "iceberg":
        return iceberg_rows(table.iceberg().metadata_location, query)
    return rows_of(table.uri, query)


@pytest.mark.parametrize("lake", ["delta", "iceberg", "paimon"])
def test_an_added_column_reaches_the_lake_and_older_rows_read_it_as_null(tmp_path: Path, lake: str) -> None:
    old_info = table_info(tmp_path, BEFORE, ["id"], lake=lake, bucket_count=1)
    old_table = lake_format(old_info).table(old_info)
    first = old_table.commit([write_split(old_table, 0, pa.record_batch(
        {"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]}), [0, 1])], {})

    new_info = table_info(tmp_path, AFTER, ["id"], lake=lake, bucket_count=1)
    table = lake_format(new_info).table(new_info)  # the lake table gains `score`
    assert lake_format(new_info).table(new_info) is not None, "evolving twice is a no-op"
    stale = pa.Table.from_batches(list(table.read_bucket(first, 0, None)), schema=new_info.schema.arrow_schema)
    assert row_tuples(stale, ["id", "name", "score"]) == [(1, "a", None), (2, "b", None)], "the old snapshot"

    rows = pa.record_batch({"id": pa.array([1, 3], pa.int32()), "name": ["a2", "c"], "score": pa.array([10, 30], pa.int64())})
    upsert = write_split(table, 0, rows, [2, 3], deleted_keys=pa.table({"id": pa.array([1, 3], pa.int32())}))
    version = table.commit([upsert], {})  # rewrites the first file: row 2 is carried over without a score
    expected = [(1, "a2", 10), (2, "b", None), (3, "c", 30)]
    back = pa.Table.from_batches(list(table.read_bucket(version, 0, None)), schema=new_info.schema.arrow_schema)
    assert row_tuples(back, ["id", "name", "score"]) == expected
    assert sorted(duck(table, lake, "SELECT id, name, score FROM lake")) == expected
    assert "score" in table.read().column_names
