"""Folding a primary-key bucket's changelog, and merging it over a KV snapshot.

A bucket's state at offset E is its snapshot (state at the snapshot's log offset S) with the changelog
``[S, E)`` applied. The fold keeps, per primary key, only the last change: +I/+U make the key's row that
change's row, -D removes it, and -U is skipped (it carries the *old* row and is always followed by its
+U). The merge then streams the snapshot in key order, drops every key the fold touched, and finally adds
the fold's live rows. The fold holds the changelog tail in memory, so it is bounded by the tail's size,
not the table's; rows are kept as Arrow batches and indexed, never copied into Python objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from strom.client.layout import TableLayout
from strom.records.compacted import CompactedKeyEncoder
from strom.records.log_batch import ChangeType
from strom.records.row_arrow import column_values
from strom.records.types import RowType

DELETED = -1
CHANGE_TYPE_NAMES = ("+A", "+I", "-U", "+U", "-D")
"""Short strings of ``ChangeType`` values, indexed by the byte the log stores."""
assert (ChangeType.APPEND_ONLY, ChangeType.INSERT, ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER, ChangeType.DELETE) == (
    0, 1, 2, 3, 4
), "CHANGE_TYPE_NAMES is indexed by the stored byte"
_CHANGE_TYPE_ARRAY = pa.array(CHANGE_TYPE_NAMES, pa.string())


class KeyEncoder:
    """Primary-key bytes of Arrow rows, identical to the bytes writers send and RocksDB stores."""

    def __init__(self, layout: TableLayout) -> None:
        key_fields = tuple(layout.row_type.fields[i] for i in layout.key_indexes)
        self._names = [f.name for f in key_fields]
        self._encoder = CompactedKeyEncoder(RowType(key_fields), range(len(key_fields)))

    def keys(self, batch: pa.RecordBatch) -> list[bytes]:
        columns = [column_values(batch.column(name)) for name in self._names]
        encode = self._encoder.encode_key
        return [encode(values) for values in zip(*columns, strict=True)]


def change_type_column(change_types: bytes | ChangeType, row_count: int) -> pa.Array:
    """The ``+I``/``-U``/``+U``/``-D`` strings of a batch: one byte per row, or one type for all rows."""
    if isinstance(change_types, ChangeType):
        return pa.repeat(CHANGE_TYPE_NAMES[change_types], row_count).cast(pa.string())
    assert len(change_types) == row_count, (len(change_types), row_count)
    return _CHANGE_TYPE_ARRAY.take(pa.array(np.frombuffer(change_types, dtype=np.uint8)))


class ChangelogFold:
    """The last change per primary key over a run of changelog batches, added in offset order."""

    def __init__(self, layout: TableLayout) -> None:
        self._key_encoder = KeyEncoder(layout)
        self._schema = layout.arrow_schema
        self._batches: list[pa.RecordBatch] = []
        self._row_count = 0
        self._latest: dict[bytes, int] = {}
        """Key -> index of its last +I/+U row among all added rows, or DELETED."""
        self._deletions: dict[bytes, int] = {}
        """Key -> index of its last -D row (its primary-key values name the deleted key)."""
        self._offsets: list[np.ndarray] = []
        self._timestamps: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self._latest)

    def add(self, batch: pa.RecordBatch, change_types: bytes, base_offset: int = -1, commit_timestamp: int = -1) -> None:
        """Fold in the next changelog rows; ``base_offset`` and ``commit_timestamp`` (of the log batch) are
        kept for :meth:`changes` (-1: unknown)."""
        assert len(change_types) == batch.num_rows, "one change type per row"
        keys = self._key_encoder.keys(batch)
        latest = self._latest
        base = self._row_count
        for index, (key, change) in enumerate(zip(keys, change_types, strict=True)):
            if change == ChangeType.DELETE:
                latest[key] = DELETED
                self._deletions[key] = base + index
            elif change != ChangeType.UPDATE_BEFORE:
                assert change in (ChangeType.INSERT, ChangeType.UPDATE_AFTER, ChangeType.APPEND_ONLY), change
                latest[key] = base + index
        self._batches.append(batch)
        self._row_count += batch.num_rows
        rows = batch.num_rows
        offsets = np.arange(base_offset, base_offset + rows, dtype=np.int64) if base_offset >= 0 else np.full(rows, -1, np.int64)
        self._offsets.append(offsets)
        self._timestamps.append(np.full(rows, commit_timestamp, np.int64))

    def untouched(self, keys: Sequence[bytes]) -> pa.Array | None:
        """A mask of the snapshot rows whose key the changelog did not touch; None when it touched none."""
        latest = self._latest
        if not latest:
            return None
        mask = [key not in latest for key in keys]
        return None if all(mask) else pa.array(mask, pa.bool_())

    def live_rows(self, batch_rows_max: int) -> Iterator[pa.RecordBatch]:
        """Every key's last row unless it was deleted, at most ``batch_rows_max`` rows per batch."""
        indexes = sorted(index for index in self._latest.values() if index != DELETED)
        if not indexes:
            return
        table = pa.Table.from_batches(self._batches, schema=self._schema)
        for start in range(0, len(indexes), batch_rows_max):
            chunk = pa.array(indexes[start : start + batch_rows_max], pa.int64())
            yield from table.take(chunk).combine_chunks().to_batches()

    def changes(self) -> FoldedChanges:
        """The fold as a lake writer applies it: the live rows (with their offsets and commit timestamps)
        and the rows naming every touched key, live or deleted (an upsert replaces, a delete removes)."""
        live = np.fromiter((i for i in self._latest.values() if i != DELETED), np.int64)
        live.sort()
        deleted = np.fromiter(
            (self._deletions[key] for key, index in self._latest.items() if index == DELETED), np.int64
        )
        table = pa.Table.from_batches(self._batches, schema=self._schema)
        offsets = np.concatenate(self._offsets) if self._offsets else np.empty(0, np.int64)
        timestamps = np.concatenate(self._timestamps) if self._timestamps else np.empty(0, np.int64)
        return FoldedChanges(
            rows=table.take(pa.array(live)),
            offsets=pa.array(offsets[live]),
            timestamps=pa.array(timestamps[live]),
            touched=table.take(pa.array(np.sort(np.concatenate([live, deleted])))),
        )


@dataclass(frozen=True, slots=True)
class FoldedChanges:
    rows: pa.Table
    """The last +I/+U row of every key the changelog left live, in offset order."""
    offsets: pa.Array
    timestamps: pa.Array
    touched: pa.Table
    """One row per key the changelog touched (live or deleted); its primary-key columns name the key."""


def merge_snapshot(
    snapshot: Iterable[tuple[list[bytes], pa.RecordBatch]], fold: ChangelogFold
) -> Iterator[pa.RecordBatch]:
    """Snapshot batches without the rows the changelog replaced or deleted (the fold adds those later)."""
    for keys, batch in snapshot:
        mask = fold.untouched(keys)
        kept = batch if mask is None else batch.filter(mask)
        if kept.num_rows:
            yield kept
