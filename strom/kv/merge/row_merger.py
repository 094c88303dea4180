"""Merge engines: how a write to an existing key becomes the key's new row, and the changelog of a batch.

The default engine (last write wins) is not here: :mod:`strom.kv.changelog` has it, with its C loop. The
engines here decode rows, so they run per row in Python, as strategies of the one changelog emitter. Their rules are Fluss's (``server/kv/rowmerger``):

- ``first_row``: the first row of a key stays; later writes change nothing and write no changelog.
- ``versioned``: a row replaces the stored one if its version column is >= the stored version (a null
  version is the smallest); otherwise nothing changes.
- ``aggregation``: each column folds the new value into the stored one with its aggregate function;
  an update always writes -U/+U, even if the result equals the stored row, as Fluss does.

A new key is inserted as written (+I) by every engine. Partial updates are refused by first_row and
versioned, and aggregate only the target columns of an aggregation table. Deletes reach an engine only
with ``table.delete.behavior=allow``, which only aggregation accepts: a full delete removes the row, a
partial one nulls the target columns and removes the row once nothing else is left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from strom.errors import InvalidTargetColumnError, UnsupportedMergeOperationError
from strom.kv.changelog import RowMerge
from strom.kv.merge import aggregators
from strom.kv.merge.options import MergeEngine, MergeOptions
from strom.kv.row_format import SCHEMA_ID_SIZE_BYTES, TableRowFormat


class RowMerger:
    """One table's merge engine; shared by the table's buckets, called on the event loop only. Its rule for a
    batch is a per-row strategy of the changelog emitter (:func:`strom.kv.changelog.emit`)."""

    def configure(self, target_columns: Sequence[int] | None) -> RowMerge:
        """The rule for a batch writing ``target_columns`` (None or empty: full rows)."""
        raise NotImplementedError


def _no_partial_update(engine: MergeEngine, target_columns: Sequence[int] | None) -> None:
    if target_columns:
        raise UnsupportedMergeOperationError(f"Partial update is not supported for the {engine.value} merge engine.")


class _KeepOld:
    def merge(self, old: bytes, new: bytes) -> bytes:
        return old

    def delete(self, old: bytes) -> bytes | None:
        raise AssertionError("deletes never reach first_row or versioned (table.delete.behavior=allow is refused)")


class FirstRowMerger(RowMerger):
    """``first_row``: deduplication; the first row of a key is kept."""

    def configure(self, target_columns: Sequence[int] | None) -> RowMerge:
        _no_partial_update(MergeEngine.FIRST_ROW, target_columns)
        return _KeepOld()


class _KeepNewerVersion(_KeepOld):
    def __init__(self, row_format: TableRowFormat, version_index: int) -> None:
        self._decode = row_format.decode_stored
        self._index = version_index

    def _version(self, stored: bytes) -> Any:
        value = self._decode(stored)[self._index]
        return (0, 0) if value is None else (1, value)  # a null version is below every version

    def merge(self, old: bytes, new: bytes) -> bytes:
        return new if self._version(new) >= self._version(old) else old


class VersionedMerger(RowMerger):
    """``versioned``: the row with the greater (or equal) version column wins, in any arrival order."""

    def __init__(self, row_format: TableRowFormat, version_index: int) -> None:
        self._rule = _KeepNewerVersion(row_format, version_index)

    def configure(self, target_columns: Sequence[int] | None) -> RowMerge:
        _no_partial_update(MergeEngine.VERSIONED, target_columns)
        return self._rule


class _Aggregate:
    """Aggregates the target columns (every column for a full-row write); others keep the old value."""

    def __init__(
        self, row_format: TableRowFormat, aggregates: Sequence[aggregators.Aggregator], targets: frozenset[int] | None
    ) -> None:
        self._format = row_format
        count = len(aggregates)
        keep_old: aggregators.Aggregator = lambda old, new: old  # noqa: E731
        self._steps: list[Callable[[Any, Any], Any]] = [
            aggregates[i] if targets is None or i in targets else keep_old for i in range(count)
        ]
        keys = set(row_format.primary_key_indexes)
        self._deleted = [] if targets is None else [i for i in sorted(targets) if i not in keys]
        self._kept = [] if targets is None else [i for i in range(count) if i not in targets]

    def merge(self, old: bytes, new: bytes) -> bytes:
        old_values = self._format.decode_stored(old)
        new_values = self._format.decode_stored(new)
        merged = [step(o, n) for step, o, n in zip(self._steps, old_values, new_values, strict=True)]
        return new[:SCHEMA_ID_SIZE_BYTES] + self._format.encode_row(merged)

    def delete(self, old: bytes) -> bytes | None:
        if not self._deleted and not self._kept:  # a full-row delete
            return None
        values = list(self._format.decode_stored(old))
        if all(values[i] is None for i in self._kept):
            return None  # nothing but the deleted columns would remain
        for i in self._deleted:
            values[i] = None
        return old[:SCHEMA_ID_SIZE_BYTES] + self._format.encode_row(values)


class AggregationMerger(RowMerger):
    """``aggregation``: each column has an aggregate function (``fields.<column>.agg``)."""

    def __init__(self, row_format: TableRowFormat, options: MergeOptions) -> None:
        assert len(options.functions) == len(row_format.row_type.fields)
        self._format = row_format
        self._aggregates = [
            aggregators.create(function.name, field.type, function.parameters)
            for function, field in zip(options.functions, row_format.row_type.fields, strict=True)
        ]
        self._full = _Aggregate(row_format, self._aggregates, None)
        self._partial: dict[tuple[int, ...], _Aggregate] = {}  # bounded by the distinct target sets written

    def configure(self, target_columns: Sequence[int] | None) -> RowMerge:
        if not target_columns:
            return self._full
        key = tuple(sorted(set(target_columns)))
        rule = self._partial.get(key)
        if rule is None:
            self._check_targets(key)
            if len(self._partial) >= 64:
                self._partial.clear()
            rule = self._partial[key] = _Aggregate(self._format, self._aggregates, frozenset(key))
        return rule

    def _check_targets(self, targets: tuple[int, ...]) -> None:
        """Fluss's rules for a partial aggregate: the key is among the targets, every other column is
        nullable (a partial write leaves the non-targets of a new key null)."""
        fields = self._format.row_type.fields
        keys = self._format.primary_key_indexes
        if any(i < 0 or i >= len(fields) for i in targets):
            raise InvalidTargetColumnError(f"Target columns {list(targets)} are outside the table's {len(fields)} columns.")
        if not set(keys) <= set(targets):
            names = [fields[i].name for i in keys]
            raise InvalidTargetColumnError(f"The target write columns must contain the primary key columns {names}.")
        for i, field in enumerate(fields):
            if i not in keys and not field.type.nullable:
                raise InvalidTargetColumnError(
                    "Partial aggregate requires all columns except primary key to be nullable, "
                    f"but column {field.name} is NOT NULL."
                )


def create_row_merger(options: MergeOptions, row_format: TableRowFormat) -> RowMerger | None:
    """The merger of a table's merge engine; None for the default engine (KvTablet's own fast path)."""
    if options.engine is None:
        return None
    if options.engine is MergeEngine.FIRST_ROW:
        return FirstRowMerger()
    if options.engine is MergeEngine.VERSIONED:
        assert options.version_column_index is not None
        return VersionedMerger(row_format, options.version_column_index)
    return AggregationMerger(row_format, options)
