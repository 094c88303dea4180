"""Auto-increment columns: the server fills the column of every newly inserted key with a table-wide unique id.

As in Fluss, a primary-key table may declare one INT or BIGINT non-key column auto-increment (the schema's
``auto_increment_column``). Each bucket takes ids in segments of ``table.auto-increment.cache-size`` from a
durable per-table counter in the metadata store (``next_id``, the counter Fluss keeps in ZooKeeper), so ids
are unique across buckets and restarts; they increase roughly with time, not strictly, and a restart skips
what was left of its segment. Writers never set the column: every write must be a partial update whose
target columns leave it out, and an existing key keeps its id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa

from strom.errors import InvalidConfigError, InvalidTargetColumnError, UnknownServerError
from strom.kv.row_format import TableRowFormat
from strom.metadata.off_loop import submit
from strom.metadata.table_info import TableInfo
from strom.records import row_batches
from strom.records.kv_batch import SCHEMA_ID
from strom.records.types import IntType
from strom.table_properties import AUTO_INCREMENT_CACHE_SIZE, TableProperties, parse_long

CACHE_SIZE_DEFAULT = 100_000
INT_MAX = (1 << 31) - 1
BIGINT_MAX = (1 << 63) - 1

VECTORIZED_ROWS_MIN = 16
"""From this many new keys in one write, ids are set through Arrow (below it the per-row path is cheaper)."""

IdCounter = Callable[[str, int], int]
"""``(counter name, count) -> previous value``: reserves ``count`` ids after the returned value, durably."""


class SequenceOverflowError(UnknownServerError):
    """The auto-increment column's type has no ids left (Fluss's SequenceOverflowException, which Fluss's
    protocol has no own code for)."""


def counter_name(table: TableInfo, column_id: int) -> str:
    """The counter of one table's auto-increment column (a re-created table starts again from 1)."""
    return f"auto_increment/{table.table_id}/col_{column_id}"


def cache_size(properties: dict[str, str]) -> int:
    """``table.auto-increment.cache-size``.

    Raises:
        InvalidConfigError: not a positive integer.
    """
    raw = TableProperties(properties).text(AUTO_INCREMENT_CACHE_SIZE)
    if raw is None:
        return CACHE_SIZE_DEFAULT
    try:
        size = parse_long(raw)
    except ValueError:
        size = 0
    if size <= 0:
        raise InvalidConfigError(f"'{AUTO_INCREMENT_CACHE_SIZE}' must be a positive integer, got '{raw}'.")
    return size


@dataclass(frozen=True, slots=True)
class AutoIncrementSpec:
    """Which column is auto-increment in a table, and how ids are reserved for it."""

    column_index: int
    column_name: str
    counter: str
    cache_size: int
    max_value: int

    @classmethod
    def for_table(cls, table: TableInfo) -> AutoIncrementSpec | None:
        schema = table.schema
        if not schema.auto_increment_columns:
            return None
        [name] = schema.auto_increment_columns
        index = schema.column_names.index(name)
        column = schema.columns[index]
        max_value = INT_MAX if isinstance(column.data_type, IntType) else BIGINT_MAX
        return cls(index, name, counter_name(table, column.column_id), cache_size(table.properties), max_value)

    def check_target_columns(self, target_columns: Sequence[int] | None) -> None:
        """Writers must name their columns, and never this one (Fluss's rule).

        Raises:
            InvalidTargetColumnError: a full-row write, or target columns that include the column.
        """
        if not target_columns:
            raise InvalidTargetColumnError(
                f"The table contains an auto-increment column [{self.column_name}], but update target columns are "
                "not explicitly specified. Specify the target columns of the write and leave the auto-increment "
                "column out of them."
            )
        if self.column_index in target_columns:
            raise InvalidTargetColumnError(
                f"Auto-increment column [{self.column_name}] at index {self.column_index} must not be included in "
                "target columns: its values are assigned by the server."
            )


class IdAllocator:
    """Ids for one bucket, one reserved segment at a time. Owned by the bucket's event loop.

    The next segment is reserved ahead, on a store thread, once half of the current one is used (the first
    one when the allocator is made): a reservation is a metadata store round trip, which the event loop
    does not wait for unless ids run out faster than one round trip. Segments are used in the order they
    were reserved, so a bucket's ids only grow."""

    def __init__(self, spec: AutoIncrementSpec, counter: IdCounter) -> None:
        self._spec = spec
        self._counter = counter
        self._next = 1
        self._end = 0  # inclusive; below _next: no segment yet
        self._ahead: Future[int] | None = None
        self._reserve_ahead()

    def _reserve_ahead(self) -> None:
        if self._ahead is None:
            self._ahead = submit(self._counter, self._spec.counter, self._spec.cache_size)

    def _next_segment_start(self) -> int:
        """The segment reserved ahead (waiting for the rest of its round trip if needed); raises what the
        reservation raised, and the next call reserves again."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return self._counter(self._spec.counter, self._spec.cache_size)
        return ahead.result()

    def next_id(self) -> int:
        """Raises: SequenceOverflowError when the column's type has no ids left."""
        if self._next > self._end:
            start = self._next_segment_start()
            self._next, self._end = start + 1, start + self._spec.cache_size
        if self._end - self._next < max(1, self._spec.cache_size // 2):
            self._reserve_ahead()
        value = self._next
        if value > self._spec.max_value:
            raise SequenceOverflowError(
                f"Reached the maximum value of auto-increment column [{self._spec.column_name}] ({self._spec.max_value})."
            )
        self._next += 1
        return value


class AutoIncrementAssigner:
    """Fills the auto-increment column of the values of keys a write inserts."""

    def __init__(self, spec: AutoIncrementSpec, ids: IdAllocator, row_format: TableRowFormat) -> None:
        self.spec = spec
        self.ids = ids
        self._format = row_format
        self._prefix = SCHEMA_ID.pack(row_format.schema_id)

    def assign(
        self,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        existing: Sequence[bytes | None],
        deletes_remove: bool = True,
    ) -> list[bytes | None]:
        """``values`` (rows without schema id, None deletes) with a fresh id in every row that inserts its
        key: the key has no value in ``existing`` and none from an earlier record of the same write
        (``deletes_remove`` False: the table ignores deletes, so a delete leaves its key in place)."""
        present: dict[bytes, bool] = {}
        inserting: list[int] = []
        for position, (key, value, old) in enumerate(zip(keys, values, existing, strict=True)):
            exists = present.get(key, old is not None)
            present[key] = value is not None or (exists and not deletes_remove)
            if value is not None and not exists:
                inserting.append(position)
        if not inserting:
            return list(values)
        ids = [self.ids.next_id() for _ in inserting]
        rows = [values[position] for position in inserting]
        assigned = list(values)
        for position, row in zip(inserting, self._with_ids(rows, ids), strict=True):  # type: ignore[arg-type]
            assigned[position] = row
        return assigned

    def _with_ids(self, rows: list[bytes], ids: list[int]) -> list[bytes]:
        """``rows`` with the column set to ``ids``: through Arrow and the C row codec for COMPACTED rows
        (~0.5 µs a row against ~2.5 µs decoding and encoding each row in Python)."""
        index = self.spec.column_index
        if self._format.kv_format != "COMPACTED" or len(rows) < VECTORIZED_ROWS_MIN:
            updated = []
            for row, new_id in zip(rows, ids, strict=True):
                values = list(self._format.decode_stored(self._prefix + row))
                values[index] = new_id
                updated.append(self._format.encode_row(values))
            return updated
        batch = self._format.stored_values_to_batch([self._prefix + row for row in rows])
        field = batch.schema.field(index)
        batch = batch.set_column(index, field, pa.array(ids, field.type))
        return row_batches.encode_batch(batch, self._format.row_type)[0]
