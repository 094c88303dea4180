"""The ``$binlog`` read form of a primary-key table: one row per change with the row before and after it.

Fluss's ``$binlog`` virtual table turns the changelog into rows of ``_change_type`` (``insert``, ``update``,
``delete``), ``_log_offset``, ``_commit_timestamp``, ``before`` and ``after`` (the table's row as a struct,
null where there is none). An update is the changelog's ``-U``/``+U`` pair folded into one row, carrying the
``-U``'s offset and commit time.

A split log range owns the pairs whose ``-U`` lies in it: a range starting on the ``+U`` of a pair whose
``-U`` sits before it skips that ``+U``, and a range ending right after a ``-U`` reads one record past its
end for the ``+U`` (a write request's changes are one log batch, so that record is always there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from strom.client.log_scanner import ScanBatch
from strom.client.table import TableLayout
from strom.records.log_batch import ChangeType
from strom.spark.errors import FlussConnectorError
from strom.spark.options import BINLOG_SUFFIX
from strom.spark.type_mapping import metadata_type, to_spark_batch, to_spark_type
from strom.table_properties import CHANGELOG_IMAGE

if TYPE_CHECKING:
    from pyspark.sql import types as st

CHANGE_TYPE = "_change_type"
LOG_OFFSET = "_log_offset"
COMMIT_TIMESTAMP = "_commit_timestamp"
BEFORE = "before"
AFTER = "after"
BINLOG_COLUMNS = (CHANGE_TYPE, LOG_OFFSET, COMMIT_TIMESTAMP, BEFORE, AFTER)

INSERT, UPDATE, DELETE = "insert", "update", "delete"
_NAMES = pa.array([INSERT, UPDATE, DELETE], pa.string())
_INSERT_CODE, _UPDATE_CODE, _DELETE_CODE = 0, 1, 2



def check_binlog_table(layout: TableLayout) -> None:
    """Refuse tables whose changelog cannot give a before/after form.

    Raises:
        FlussConnectorError: a log table (no changes, only appends), or a WAL-image table (updates log no
            old row, and inserts are logged as updates).
    """
    path = layout.info.path
    if not layout.primary_key:
        raise FlussConnectorError(
            f"'{path}{BINLOG_SUFFIX}': the $binlog form exists only for primary-key tables; '{path}' is a log table "
            "(read it without the suffix)"
        )
    if layout.info.options.changelog_image == "WAL":
        raise FlussConnectorError(
            f"'{path}{BINLOG_SUFFIX}': table '{path}' has {CHANGELOG_IMAGE}=WAL, whose changelog keeps no old rows "
            "and logs inserts as updates; read its changelog instead (no suffix, scan.startup.mode=earliest)"
        )


def binlog_schema(layout: TableLayout, metadata_columns: tuple[str, ...] = ()) -> st.StructType:
    """``_change_type``, ``_log_offset``, ``_commit_timestamp``, ``before``, ``after``, then ``metadata_columns``
    (only ``_bucket`` can add anything: the others are part of the form)."""
    from pyspark.sql import types as st

    row = st.StructType(
        [st.StructField(f.name, to_spark_type(f.type), f.type.nullable) for f in layout.row_type.fields]
    )
    schema = st.StructType([
        st.StructField(CHANGE_TYPE, st.StringType(), False),
        st.StructField(LOG_OFFSET, st.LongType(), False),
        st.StructField(COMMIT_TIMESTAMP, st.TimestampType(), False),
        st.StructField(BEFORE, row, True),
        st.StructField(AFTER, row, True),
    ])
    for name in metadata_columns:
        schema = schema.add(st.StructField(name, metadata_type(name), True))
    return schema


@dataclass(slots=True)
class _Pending:
    """A ``-U`` read at the end of what has been seen so far, waiting for its ``+U``."""

    row: pa.RecordBatch
    offset: int
    timestamp_ms: int


class BinlogAssembler:
    """Turns one bucket's change batches, in offset order, into ``$binlog`` rows in Spark's layout.

    ``target`` is the Spark Arrow schema of the output (the five binlog columns, then ``_bucket`` if asked).
    """

    def __init__(self, layout: TableLayout, target: pa.Schema, bucket: int, first_offset: int) -> None:
        self._layout = layout
        self._target = target
        self._bucket = bucket
        self._row_target = pa.schema(list(target.field(BEFORE).type))
        self._next_offset = first_offset
        self._owned_start = first_offset
        self._pending: _Pending | None = None

    @property
    def awaiting_update_after(self) -> bool:
        """Whether the last record seen is a ``-U`` whose ``+U`` has not been seen yet."""
        return self._pending is not None

    def add(self, scan_batch: ScanBatch) -> pa.RecordBatch | None:
        """The binlog rows completed by ``scan_batch`` (None if it completes none)."""
        types = np.frombuffer(scan_batch.change_types or b"", dtype=np.uint8)
        rows = scan_batch.batch
        if len(types) != rows.num_rows:
            raise FlussConnectorError(f"{scan_batch.bucket}: a primary-key table's changelog batch has no change types")
        base = scan_batch.base_offset
        offsets = np.arange(base, base + rows.num_rows, dtype=np.int64)
        timestamps = np.full(rows.num_rows, scan_batch.commit_timestamp, dtype=np.int64)
        if self._pending is not None:
            pending = self._pending
            rows = pa.concat_batches([pending.row, rows])
            types = np.concatenate([np.array([ChangeType.UPDATE_BEFORE], np.uint8), types])
            offsets = np.concatenate([np.array([pending.offset], np.int64), offsets])
            timestamps = np.concatenate([np.array([pending.timestamp_ms], np.int64), timestamps])
            self._pending = None
        elif len(types) and types[0] == ChangeType.UPDATE_AFTER and offsets[0] == self._owned_start:
            # the +U of a pair whose -U lies before this range: the previous range emits that update
            rows, types, offsets, timestamps = rows.slice(1), types[1:], offsets[1:], timestamps[1:]
        self._next_offset = scan_batch.next_offset
        if len(types) and types[-1] == ChangeType.UPDATE_BEFORE:
            last = len(types) - 1
            self._pending = _Pending(rows.slice(last, 1), int(offsets[last]), int(timestamps[last]))
            rows, types, offsets, timestamps = rows.slice(0, last), types[:last], offsets[:last], timestamps[:last]
        if not len(types):
            return None
        return self._assemble(rows, types, offsets, timestamps)

    def _assemble(self, rows: pa.RecordBatch, types: np.ndarray, offsets: np.ndarray, timestamps: np.ndarray) -> pa.RecordBatch:
        before_marks = types == ChangeType.UPDATE_BEFORE
        after_marks = types == ChangeType.UPDATE_AFTER
        follows_before = np.zeros(len(types), dtype=bool)
        follows_before[1:] = before_marks[:-1]
        broken = np.flatnonzero(after_marks != follows_before)
        if len(broken):
            at = int(broken[0])
            raise FlussConnectorError(
                f"changelog of bucket {self._bucket} at offset {int(offsets[at])}: an update's -U and +U records are "
                "not adjacent, so the $binlog form cannot pair them"
            )
        known = np.isin(types, (ChangeType.INSERT, ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER, ChangeType.DELETE))
        if not known.all():
            at = int(np.flatnonzero(~known)[0])
            raise FlussConnectorError(
                f"changelog of bucket {self._bucket} at offset {int(offsets[at])}: change type {int(types[at])} has no "
                "$binlog form"
            )
        events = np.flatnonzero(~after_marks)  # one output row per +I, -D and -U (with the +U after it)
        event_types = types[events]
        codes = np.where(
            event_types == ChangeType.INSERT, _INSERT_CODE,
            np.where(event_types == ChangeType.DELETE, _DELETE_CODE, _UPDATE_CODE),
        )
        has_before = event_types != ChangeType.INSERT
        has_after = event_types != ChangeType.DELETE
        before_index = np.where(has_before, events, 0)
        after_index = np.where(event_types == ChangeType.UPDATE_BEFORE, events + 1, events)
        after_index = np.where(has_after, after_index, 0)
        spark_rows = to_spark_batch(rows, self._layout.row_type, self._row_target)
        columns = [
            _NAMES.take(pa.array(codes, pa.int8())),
            pa.array(offsets[events], pa.int64()),
            pa.array(timestamps[events] * 1000, pa.int64()).cast(pa.timestamp("us")),
            self._struct(spark_rows, before_index, has_before),
            self._struct(spark_rows, after_index, has_after),
        ]
        for name in self._target.names[len(BINLOG_COLUMNS):]:
            assert name == "_bucket", name
            columns.append(pa.repeat(pa.scalar(self._bucket, pa.int32()), len(events)))
        columns = [column.cast(self._target.field(i).type) for i, column in enumerate(columns)]
        return pa.RecordBatch.from_arrays(columns, schema=self._target)

    def _struct(self, rows: pa.RecordBatch, indices: np.ndarray, present: np.ndarray) -> pa.Array:
        taken = rows.take(pa.array(indices, pa.int64()))
        return pa.StructArray.from_arrays(
            taken.columns, fields=list(self._row_target), mask=pa.array(~present, pa.bool_())
        )
