"""Building strom tables and lake rounds for the lake tests (no server: TableInfo is built directly)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from strom.ids import TableBucket
from strom.lake.format import LakeTable, LakeWriteResult
from strom.lake.formats import lake_format
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


@dataclass
class Model:
    """The expected lake state of a primary-key table: key -> row, with the bucket and last offset."""

    key_names: list[str]
    rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    next_offset: dict[tuple[str | None, int], int] = field(default_factory=dict)

    def offset(self, partition: str | None, bucket: int) -> int:
        value = self.next_offset.get((partition, bucket), 0)
        self.next_offset[(partition, bucket)] = value + 1
        return value


def pk_round(
    table: LakeTable,
    model: Model,
    rng: random.Random,
    partitions: list[str | None],
    bucket_of: Callable[[dict[str, Any]], int],
    make_row: Callable[[str | None, int, random.Random], dict[str, Any]],
    key_space: int,
    changes_max: int = 6,
) -> list[LakeWriteResult]:
    """One round: per (partition, bucket) up to ``changes_max`` inserts, updates and deletes (some of keys
    never stored), folded as the tiering task folds a changelog: every touched key deleted, the last rows
    appended. ``bucket_of`` gives a row's bucket, as strom's clients assign it."""
    results = []
    base = table.latest_snapshot_id()
    for partition in partitions:
        for bucket in range(table.layout.info.bucket_count):
            touched: dict[tuple[Any, ...], dict[str, Any] | None] = {}
            for _ in range(rng.randint(0, changes_max)):
                row = make_row(partition, rng.randrange(key_space), rng)
                key = tuple(row[k] for k in model.key_names)
                if bucket_of(row) != bucket:
                    continue
                deleted = rng.random() < 0.3
                offset = model.offset(partition, bucket)
                touched[key] = None if deleted else {**row, "__bucket": bucket, "__offset": offset}
            if not touched:
                continue
            schema = table.layout.table_schema
            keys = pa.Table.from_pylist([dict(zip(model.key_names, k, strict=True)) for k in touched],
                                        schema=pa.schema([schema.field(n) for n in model.key_names]))
            upserts = [r for r in touched.values() if r is not None]
            batch = pa.RecordBatch.from_pylist([{n: r[n] for n in schema.names} for r in upserts], schema=schema)
            writer = table.writer(TableBucket(TABLE_ID, bucket, None if partition is None else 1), partition, base)
            try:
                writer.delete_keys(keys)
                writer.append(batch, int64s([r["__offset"] for r in upserts]), int64s([7_000] * len(upserts)))
                results.append(writer.complete())
            finally:
                writer.close()
            for key, row in touched.items():
                if row is None:
                    model.rows.pop(key, None)
                else:
                    model.rows[key] = row
    return results


def create_concurrently(info: TableInfo, creators: int) -> list[BaseException]:
    """Open (creating) the lake copy of ``info`` from ``creators`` threads at once; the errors they hit."""
    start = threading.Barrier(creators)
    errors: list[BaseException] = []

    def create() -> None:
        start.wait()
        try:
            lake_format(info).table(info)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(creators)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def commit_concurrently(table: LakeTable, results: Sequence[LakeWriteResult]) -> list[int | Exception]:
    """Commit each result from its own thread at once (properties: its index); each one's new snapshot id
    or the ``LakeCommitConflictError`` it got."""
    from strom.lake.format import OFFSETS_PROPERTY, LakeCommitConflictError

    start = threading.Barrier(len(results))
    outcomes: list[int | Exception] = []

    def commit(index: int) -> None:
        start.wait()
        try:
            outcomes.append(table.commit([results[index]], {OFFSETS_PROPERTY: str(index)}))
        except LakeCommitConflictError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(results))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
