"""Conversion between encoded rows (CompactedRow / IndexedRow) and Arrow record batches.

The changelog of a primary-key table is served as Arrow built from stored rows, and the
client decodes it with the schema it derives itself, so batches always carry the exact
``types.to_arrow_type`` layout. The conversion is columnar: rows are decoded into one Python
list per column and each list becomes an Arrow array in one call, which keeps the per-column
structure a native fast path can replace.

CompactedRows go through ``row_batches`` (a C extension whose fallback and reference is the pure-Python
``arrow_python``); IndexedRows and other decoders use the pure-Python code directly. This module picks
between the two and hands the pure-Python names on, so callers import one module.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from strom.records import row_batches
from strom.records.arrow_python import (
    RowDecoder,
    RowEncoder,
    column_to_array,
    column_values,
    columns_to_record_batch,
    record_batch_to_rows_python,
    record_batch_to_values,
    rows_to_record_batch_python,
    values_to_record_batch,
)
from strom.records.compacted import CompactedRowDecoder, CompactedRowEncoder
from strom.records.types import RowType


def rows_to_record_batch(
    rows: Sequence[bytes | bytearray | memoryview],
    decoder_or_row_type: RowDecoder | RowType,
    arrow_schema: pa.Schema | None = None,
    *,
    offset: int = 0,
) -> pa.RecordBatch:
    """Decode encoded rows into one batch; a bare RowType means CompactedRow.

    ``offset`` skips that many bytes at the start of every row (2 for stored values, which begin
    with the schema id), so callers need not slice.

    Raises:
        ValueError: a row does not decode with the given type.
    """
    if isinstance(decoder_or_row_type, RowType):
        return row_batches.decode_rows(rows, decoder_or_row_type, offset=offset, arrow_schema=arrow_schema)
    if type(decoder_or_row_type) is CompactedRowDecoder:
        return row_batches.decode_rows(
            rows, decoder_or_row_type.row_type, offset=offset, arrow_schema=arrow_schema
        )
    return rows_to_record_batch_python(rows, decoder_or_row_type, arrow_schema, offset=offset)


def record_batch_to_rows(batch: pa.RecordBatch, encoder: RowEncoder) -> list[bytes]:
    """Encode every row of a batch (columns in the encoder's field order)."""
    if type(encoder) is CompactedRowEncoder:
        return row_batches.encode_rows(batch, encoder)
    return record_batch_to_rows_python(batch, encoder)


__all__ = [
    "RowDecoder",
    "RowEncoder",
    "column_to_array",
    "column_values",
    "columns_to_record_batch",
    "record_batch_to_rows",
    "record_batch_to_rows_python",
    "record_batch_to_values",
    "rows_to_record_batch",
    "rows_to_record_batch_python",
    "values_to_record_batch",
]
