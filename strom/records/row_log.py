"""The records of a log batch in a row format (``table.log.format`` INDEXED or COMPACTED), and one decoder
for every log format.

A log table's format decides what follows the batch header (see ``log_batch``); the header itself does not
say. In an INDEXED or a COMPACTED batch the body is ``record_count`` records back to back, integers
little-endian::

    length i32 (bytes after this field) | change_type i8 | row

the row an IndexedRow (``indexed``) or a CompactedRow (``compacted``). Every record carries its change type,
also in an append-only batch (0, ``+A``); there is no Arrow message, no compression and no column
projection. A Java client writes these layouts for a log table in format INDEXED or COMPACTED.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pyarrow as pa

from strom.errors import CorruptRecordError, InvalidColumnProjectionError, InvalidTableError
from strom.records import log_batch, row_arrow
from strom.records.compacted import CompactedRowDecoder, CompactedRowEncoder
from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
from strom.records.log_batch import ChangeType, LogBatchHeader
from strom.records.types import RowType
from strom.table_properties import LOG_FORMAT, TableProperties

ARROW = "ARROW"
INDEXED = "INDEXED"
COMPACTED = "COMPACTED"
LOG_FORMATS = (ARROW, INDEXED, COMPACTED)
ROW_FORMATS = (INDEXED, COMPACTED)
"""The log formats whose records are rows (everything here but ARROW's Arrow message)."""
RowEncoder = IndexedRowEncoder | CompactedRowEncoder
RECORD_LENGTH = struct.Struct("<i")
RECORD_OVERHEAD_BYTES = RECORD_LENGTH.size + 1  # the length and the change type byte
ARROW_CONTINUATION = b"\xff\xff\xff\xff"  # how every Arrow IPC message starts; never a valid record length


def log_format(properties: dict[str, str]) -> str:
    """The table's log format, upper case (ARROW unless the property says otherwise)."""
    return TableProperties(properties).log_format


def row_encoder(log_format: str, row_type: RowType) -> RowEncoder:
    """The encoder of appended rows for a table in ``log_format``: INDEXED rows in Java's nested-DECIMAL
    layout, COMPACTED rows as the server stores them (the layout both Fluss clients read)."""
    if log_format == INDEXED:
        return IndexedRowEncoder(row_type, java_decimal_layout=True)
    if log_format == COMPACTED:
        return CompactedRowEncoder(row_type)
    raise ValueError(f"{log_format} is not a row log format")


def encode_records(rows: Sequence[bytes], change_types: bytes | None = None) -> bytes:
    """The body of a row-format batch: one record per encoded row (all ``+A`` without ``change_types``)."""
    if change_types is not None and len(change_types) != len(rows):
        raise ValueError(f"{len(change_types)} change types for {len(rows)} rows")
    parts: list[bytes] = []
    for index, row in enumerate(rows):
        change_type = ChangeType.APPEND_ONLY if change_types is None else change_types[index]
        parts.append(RECORD_LENGTH.pack(len(row) + 1))
        parts.append(bytes((change_type,)))
        parts.append(row)
    return b"".join(parts)


def build_row_batch(
    rows: Sequence[bytes],
    *,
    schema_id: int,
    change_types: bytes | None = None,
    writer_id: int = log_batch.NO_WRITER_ID,
    batch_sequence: int = log_batch.NO_BATCH_SEQUENCE,
) -> bytes:
    """A V0 log batch of row records: append-only when ``change_types`` is None, a changelog otherwise."""
    return log_batch.build_batch(
        schema_id=schema_id,
        record_count=len(rows),
        records=encode_records(rows, change_types),
        append_only=change_types is None,
        writer_id=writer_id,
        batch_sequence=batch_sequence,
    )


def split_records(
    buffer: bytes | bytearray | memoryview, position: int, header: LogBatchHeader
) -> tuple[bytes, list[memoryview]]:
    """One row-format batch's change types (one byte per record) and its rows' bytes, framing checked.

    Raises CorruptRecordError when the records do not tile the body exactly, their count disagrees with the
    header, a change type is unknown, or an append-only batch holds a record other than ``+A``.
    """
    body = memoryview(buffer)[position + header.records_offset : position + header.size_bytes]
    change_types = bytearray()
    rows: list[memoryview] = []
    cursor = 0
    end = len(body)
    while cursor < end:
        if end - cursor < RECORD_OVERHEAD_BYTES:
            raise CorruptRecordError(
                f"Row log batch at offset {header.base_offset}: truncated record at body byte {cursor}"
            )
        (length,) = RECORD_LENGTH.unpack_from(body, cursor)
        if length < 1 or cursor + RECORD_LENGTH.size + length > end:
            raise CorruptRecordError(
                f"Row log batch at offset {header.base_offset}: record {len(rows)} claims {length} bytes, "
                f"{end - cursor - RECORD_LENGTH.size} left in the batch"
            )
        change_type = body[cursor + RECORD_LENGTH.size]
        if change_type > ChangeType.DELETE or (
            header.is_append_only and change_type != ChangeType.APPEND_ONLY
        ):
            raise CorruptRecordError(
                f"Row log batch at offset {header.base_offset}: record {len(rows)} has change type {change_type}"
                + (" in an append-only batch" if header.is_append_only else "")
            )
        change_types.append(change_type)
        rows.append(body[cursor + RECORD_OVERHEAD_BYTES : cursor + RECORD_LENGTH.size + length])
        cursor += RECORD_LENGTH.size + length
    if len(rows) != header.record_count:
        raise CorruptRecordError(
            f"Row log batch at offset {header.base_offset}: {len(rows)} records, header says {header.record_count}"
        )
    return bytes(change_types), rows


class LogBatchDecoder:
    """Decodes a table's log batches into Arrow, whatever its log format (immutable, shareable).

    ``read`` returns ``(change_types, batch)`` like ``log_batch.read_arrow``: change types are None for an
    append-only batch, and the batch has the table's full Arrow schema.
    """

    __slots__ = ("_row_decoder", "arrow_schema", "log_format", "row_type")

    def __init__(self, log_format: str, row_type: RowType, arrow_schema: pa.Schema) -> None:
        if log_format not in LOG_FORMATS:
            raise ValueError(f"unknown log format {log_format!r}")
        self.log_format = log_format
        self.row_type = row_type
        self.arrow_schema = arrow_schema
        self._row_decoder: IndexedRowDecoder | CompactedRowDecoder | None = (
            IndexedRowDecoder(row_type) if log_format == INDEXED
            else CompactedRowDecoder(row_type) if log_format == COMPACTED else None
        )

    @property
    def supports_projection(self) -> bool:
        """Only ARROW batches can be cut down to some columns on the server (as in Fluss)."""
        return self.log_format == ARROW

    def read(
        self, buffer: bytes | bytearray | memoryview, position: int, header: LogBatchHeader
    ) -> tuple[bytes | None, pa.RecordBatch]:
        """Raises CorruptRecordError for a body that is not a valid batch of this format; InvalidTableError
        for an ARROW body sent to a row-format table (a writer that only knows ARROW, such as pyfluss)."""
        if self._row_decoder is None:
            return log_batch.read_arrow(buffer, position, header, self.arrow_schema)
        start = position + header.records_offset
        if header.record_count and bytes(memoryview(buffer)[start : start + 4]) == ARROW_CONTINUATION:
            raise InvalidTableError(
                f"The log batch at offset {header.base_offset} holds Arrow data, but the table's "
                f"{LOG_FORMAT} is {self.log_format}: write it with a client that encodes {self.log_format} records."
            )
        change_types, rows = split_records(buffer, position, header)
        try:
            batch = row_arrow.rows_to_record_batch(rows, self._row_decoder, self.arrow_schema)
        except (ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
            raise CorruptRecordError(
                f"{self.log_format} log batch at offset {header.base_offset} holds a row that is not of the "
                f"table's type: {exc}"
            ) from exc
        return (None if header.is_append_only else change_types), batch

    def check_projection(self, table: str) -> None:
        if not self.supports_projection:
            raise InvalidColumnProjectionError(
                f"Table '{table}' is in {self.log_format} log format and doesn't support column projection."
            )


def encode_row_batch(
    batch: pa.RecordBatch,
    encoder: RowEncoder,
    *,
    schema_id: int,
    change_types: bytes | None = None,
    writer_id: int = log_batch.NO_WRITER_ID,
    batch_sequence: int = log_batch.NO_BATCH_SEQUENCE,
) -> bytes:
    """An Arrow batch (the table's columns) as one log batch of row records (``encoder``'s format)."""
    rows = row_arrow.record_batch_to_rows(batch, encoder)
    return build_row_batch(
        rows,
        schema_id=schema_id,
        change_types=change_types,
        writer_id=writer_id,
        batch_sequence=batch_sequence,
    )
