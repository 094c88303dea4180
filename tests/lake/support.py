"""Building strom tables and lake rounds for the lake tests (no server: TableInfo is built directly)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from strom.ids import TableBucket
from strom.lake.format import LakeTable, LakeWriteResult
from strom.metadata.store import TableRecord
from strom.metadata.table_info import TableInfo
from strom.records import types as t
from strom.records.schema import Schema, TableDescriptor

TABLE_ID = 7


def table_info(
    warehouse: Path | str,
    columns: Sequence[tuple[str, t.DataType]],
    primary_key: Sequence[str] | None = None,
    partition_keys: Sequence[str] = (),
    table_id: int = TABLE_ID,
    name: str = "orders",
    bucket_count: int = 2,
    properties: Mapping[str, str] | None = None,
    lake: str = "delta",
    bucket_keys: Sequence[str] = (),
) -> TableInfo:
    """A lake-enabled table as the coordinator stores it (format ``lake``, warehouse in the table
    properties)."""
    descriptor = TableDescriptor(
        Schema.of(list(columns), list(primary_key) if primary_key else None),
        partition_keys=tuple(partition_keys),
        bucket_count=bucket_count,
        bucket_keys=tuple(bucket_keys),
        properties={
            "table.datalake.enabled": "true",
            "table.datalake.format": lake,
            f"table.datalake.{lake}.warehouse": str(warehouse),
            **(properties or {}),
        },
    )
    return TableInfo.from_record(TableRecord(table_id, "fluss", name, descriptor.to_json(), 1, 0, 0))


def int64s(values: Sequence[int]) -> pa.Array:
    return pa.array(np.asarray(values, dtype=np.int64))


def write_split(
    table: LakeTable,
    bucket: int,
    rows: pa.RecordBatch | None = None,
    offsets: Sequence[int] = (),
    timestamps: Sequence[int] | None = None,
    deleted_keys: pa.Table | None = None,
    partition_name: str | None = None,
    base_snapshot_id: int | None = None,
) -> LakeWriteResult:
    """One split as a Spark task writes it: delete the touched keys, append the new rows, complete."""
    base = table.latest_snapshot_id() if base_snapshot_id is None else base_snapshot_id
    partition_id = None if partition_name is None else 1
    writer = table.writer(TableBucket(TABLE_ID, bucket, partition_id), partition_name, base)
    try:
        if deleted_keys is not None:
            writer.delete_keys(deleted_keys)
        if rows is not None:
            stamps = timestamps if timestamps is not None else [1_000] * rows.num_rows
            writer.append(rows, int64s(offsets), int64s(stamps))
        return writer.complete()
    finally:
        writer.close()


def row_tuples(table: pa.Table, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    return sorted(zip(*(table.column(name).to_pylist() for name in columns), strict=True))
