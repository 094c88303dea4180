"""Turning Arrow rows into what the wire carries: encoded rows, key bytes, bucket ids, partitions."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from strom.client.layout import TableLayout
from strom.records import row_arrow, row_batches


@dataclass(slots=True)
class EncodedRows:
    """Parallel lists, one entry per input row."""

    rows: list[bytes] | None
    keys: list[bytes] | None
    buckets: list[int]


def to_record_batch(layout: TableLayout, rows: Sequence[Mapping[str, Any] | Sequence[Any]]) -> pa.RecordBatch:
    """A batch of the table's schema from dict rows (missing nullable columns are null) or positional rows."""
    names = layout.column_names
    as_dicts = [row if isinstance(row, Mapping) else dict(zip(names, row, strict=True)) for row in rows]
    unknown = {key for row in as_dicts for key in row} - set(names)
    if unknown:
        raise ValueError(f"table {layout.info.path} has no columns {sorted(unknown)}")
    return pa.RecordBatch.from_pylist(as_dicts, schema=layout.arrow_schema)


def conform(
    layout: TableLayout, data: pa.RecordBatch | pa.Table, unwritten: Collection[str] = ()
) -> pa.RecordBatch:
    """The batch with the table's exact Arrow schema (columns by name, lossless casts). Columns in
    ``unwritten`` (outside a partial update's targets) and an auto-increment column may be absent: they
    are sent as nulls, which the server does not write."""
    if isinstance(data, pa.Table):
        data = _table_to_batch(data)
    if data.schema.equals(layout.arrow_schema):
        return data
    optional = set(unwritten) | set(layout.info.schema.auto_increment_columns)
    missing = [name for name in layout.column_names if name not in data.schema.names and name not in optional]
    if missing:
        raise ValueError(f"the batch lacks columns {missing} of table {layout.info.path}")
    columns = []
    for field in layout.arrow_schema:
        if field.name not in data.schema.names:
            columns.append(pa.nulls(data.num_rows, field.type))
            continue
        column = data.column(data.schema.get_field_index(field.name))
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=layout.arrow_schema)


def _table_to_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0]


def encode(layout: TableLayout, batch: pa.RecordBatch, *, with_rows: bool, with_keys: bool) -> EncodedRows:
    """Encode a conformed batch; buckets come from the bucket key (or are left to the caller when none)."""
    if layout.kv_format == "COMPACTED" and layout.key_lake_format is None:  # the C path knows Fluss's keys only
        fast_rows, fast_keys, fast_buckets = row_batches.encode_batch(
            batch,
            layout.row_type if with_rows else layout.key_row_type,  # keys alone: the other columns are null
            key_indexes=layout.key_indexes if with_keys else None,
            bucket_key_indexes=layout.bucket_key_indexes or None,
            bucket_count=layout.bucket_count if layout.bucket_key_indexes else None,
        )
        return EncodedRows(fast_rows if with_rows else None, fast_keys, fast_buckets or [])
    values = row_arrow.record_batch_to_values(batch, layout.row_type)
    rows = [layout.row_encoder.encode(v) for v in values] if with_rows else None
    keys = [layout.key_encoder.encode(v) for v in values] if with_keys else None
    buckets: list[int] = []
    if layout.bucket_key_indexes:
        if with_keys and layout.bucket_key_indexes == layout.key_indexes:
            assert keys is not None
            buckets = [layout.bucket_of(key, layout.bucket_count) for key in keys]
        else:
            encoder = layout.bucket_key_encoder
            buckets = [layout.bucket_of(encoder.encode(v), layout.bucket_count) for v in values]
    return EncodedRows(rows, keys, buckets)


def partition_names(layout: TableLayout, batch: pa.RecordBatch) -> list[str] | None:
    """Each row's partition name (values of the partition keys joined by ``$``), None if unpartitioned."""
    if not layout.partition_keys:
        return None
    columns = [batch.column(index).to_pylist() for index in layout.partition_key_indexes]
    names = []
    for values in zip(*columns, strict=True):
        if any(value is None for value in values):
            raise ValueError(f"partition key columns {layout.partition_keys} must not be null")
        names.append("$".join(str(value) for value in values))
    return names
