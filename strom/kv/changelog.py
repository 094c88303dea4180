"""The changelog of a PutKv batch: one emitter for every way a write becomes a key's new row.

:func:`emit` walks the batch once. For each record it finds the key's value before it (``olds``, or a write
earlier in the batch), asks the table's per-row :class:`RowMerge` strategy what the key holds afterwards,
and appends the change types and images Fluss's changelog rules give (+I for a new key, -U/+U or, with a
WAL image, +U alone for a changed one, -D for a removed one; nothing for a write that changes nothing). The
strategies: :data:`LAST_WRITE_WINS` (the default merge engine), :class:`PartialUpdate` (target columns), and
the merge engines of :mod:`strom.kv.merge.row_merger`.

Last write wins with full rows is every PutKv's common case: :func:`emit_full_rows` runs it in C
(``native/rowcodec.c``) where built, and :func:`emit` with :data:`LAST_WRITE_WINS` is the reference it must
equal (the tests compare them record for record).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from strom.errors import InvalidTargetColumnError
from strom.kv.row_format import TableRowFormat
from strom.records.log_batch import CHANGE_DELETE, CHANGE_INSERT, CHANGE_UPDATE_AFTER, CHANGE_UPDATE_PAIR
from strom.records.rowcodec_native import native

PlannedPut = tuple[bytes, list[bytes], list[bytes], list["bytes | None"]]
"""Change-type bytes, the changelog images in order, and the keys and values to store (None deletes)."""

ReadOld = Callable[[bytes], "bytes | None"]
"""A key's stored value, read when a record needs it (only deletes do, for a WAL image of full rows)."""
ReadOlds = Callable[[list[bytes]], "list[bytes | None]"]
"""The stored values of keys, in their order."""


class RowMerge(Protocol):
    """What a key holds after a write, for one batch (full rows, or one set of target columns). Stored
    values are ``schema id + row``."""

    def merge(self, old: bytes, new: bytes) -> bytes:
        """The key's row after writing ``new`` over ``old``; ``old`` itself (the same object) when the write
        changes nothing (no changelog)."""
        ...

    def delete(self, old: bytes) -> bytes | None:
        """The key's row after a delete; None removes the row."""
        ...


class _LastWriteWins:
    """The default merge engine: a write replaces the row, a delete removes it."""

    def merge(self, old: bytes, new: bytes) -> bytes:
        return new

    def delete(self, old: bytes) -> bytes | None:
        return None


LAST_WRITE_WINS: RowMerge = _LastWriteWins()


class PartialUpdate:
    """Writes of target columns: they merge into the old row; a partial delete nulls them and removes the
    row only when nothing but the key (and a server-owned auto-increment column) would remain."""

    def __init__(self, row_format: TableRowFormat, target_columns: Sequence[int], owned_column: int | None) -> None:
        self._format = row_format
        self._targets = list(target_columns)
        self._with_owned = None if owned_column is None else [*self._targets, owned_column]

    def merge(self, old: bytes, new: bytes) -> bytes:
        return self._format.merge_partial(old, new, self._targets)

    def delete(self, old: bytes) -> bytes | None:
        try:
            remaining = self._format.null_out(old, self._targets)
        except ValueError as exc:  # a NOT NULL target column cannot be nulled
            raise InvalidTargetColumnError(f"Partial delete is not possible: {exc}.") from exc
        if remaining is not None and self._with_owned is not None and self._format.null_out(old, self._with_owned) is None:
            return None  # the server-owned id goes with its key: a delete leaving only both removes the row
        return remaining


def emit(
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    olds: Sequence[bytes | None] | ReadOld,
    prefix: bytes,
    rule: RowMerge,
    *,
    ignore_deletes: bool,
    wal_image: bool,
) -> PlannedPut:
    """The changelog of one PutKv batch under ``rule``, and the keys and values to store.

    ``olds[i]``: the key's value before the batch (a key written earlier in the batch sees that write). A
    function instead (``wal_image`` with :data:`LAST_WRITE_WINS` only): old values are not read for
    upserts, which are +U whether or not the key existed, and deletes read theirs through it.
    ``ignore_deletes``: deletes change nothing (``table.delete.behavior=IGNORE``)."""
    read_old = olds if callable(olds) else None
    assert read_old is None or (wal_image and rule is LAST_WRITE_WINS), "unread olds need a WAL image of full rows"
    update = CHANGE_UPDATE_AFTER if wal_image else CHANGE_UPDATE_PAIR
    latest: dict[bytes, bytes | None] = {}
    change_types = bytearray()
    rows: list[bytes] = []
    new_keys: list[bytes] = []
    new_values: list[bytes | None] = []
    for index, (key, value) in enumerate(zip(keys, values, strict=True)):
        known = key in latest
        new: bytes | None
        if value is None:
            if ignore_deletes:
                continue
            if known:
                old = latest[key]
            elif read_old is not None:
                old = read_old(key)
            else:
                old = olds[index]  # type: ignore[index]
            if old is None:
                continue  # deleting a missing key changes nothing
            new = rule.delete(old)
            if new is None:
                change_types += CHANGE_DELETE
                rows.append(old)
            else:
                change_types += update
                rows += (new,) if wal_image else (old, new)
        elif read_old is not None:
            new = prefix + value
            change_types += CHANGE_UPDATE_AFTER
            rows.append(new)
        else:
            old = latest[key] if known else olds[index]  # type: ignore[index]
            if old is None:
                new = prefix + value
                change_types += CHANGE_INSERT
                rows.append(new)
            else:
                written = prefix + value
                new = rule.merge(old, written)
                if new is old and new is not written:  # (bytes concatenation may return an operand itself)
                    continue
                change_types += update
                rows += (new,) if wal_image else (old, new)
        latest[key] = new
        new_keys.append(key)
        new_values.append(new)
    return bytes(change_types), rows, new_keys, new_values


def emit_full_rows(
    keys: Sequence[bytes], values: Sequence[bytes | None], olds: Sequence[bytes | None], prefix: bytes,
    ignore_deletes: bool,
) -> PlannedPut:
    """:func:`emit` of full rows under :data:`LAST_WRITE_WINS` with both update images, in C when the
    module is built (the per-record loop of every PutKv)."""
    if native is not None:
        result: PlannedPut = native.plan_upserts(keys, values, olds, prefix, ignore_deletes)
        return result
    return emit(keys, values, olds, prefix, LAST_WRITE_WINS, ignore_deletes=ignore_deletes, wal_image=False)


def emit_wal_full_rows(
    keys: Sequence[bytes], values: Sequence[bytes | None], prefix: bytes, ignore_deletes: bool, read_olds: ReadOlds,
) -> PlannedPut:
    """:func:`emit` of full rows under :data:`LAST_WRITE_WINS` with a WAL image: upserts read no old value
    (each is +U of its row), so a batch without deletes is one pass with no per-row branching. The deletes'
    old values are read in one call (:func:`deletes_to_read`), not one key at a time."""
    if None not in values:
        stored_rows = [prefix + value for value in values]  # type: ignore[operator]
        return CHANGE_UPDATE_AFTER * len(stored_rows), stored_rows, list(keys), list(stored_rows)
    if ignore_deletes:
        olds: dict[bytes, bytes | None] = {}  # deletes change nothing and read nothing
    else:
        deleted = deletes_to_read(keys, values)
        olds = dict(zip(deleted, read_olds(deleted), strict=True))
    return emit(keys, values, olds.get, prefix, LAST_WRITE_WINS, ignore_deletes=ignore_deletes, wal_image=True)


def deletes_to_read(keys: Sequence[bytes], values: Sequence[bytes | None]) -> list[bytes]:
    """The keys whose old value a WAL image's batch needs: those whose first record in the batch deletes
    them (a delete after the key's own write in the batch deletes that write), each once, in batch order."""
    seen: set[bytes] = set()
    deleted = []
    for key, value in zip(keys, values, strict=True):
        if key not in seen:
            seen.add(key)
            if value is None:
                deleted.append(key)
    return deleted


__all__ = [
    "LAST_WRITE_WINS",
    "PartialUpdate",
    "PlannedPut",
    "ReadOld",
    "ReadOlds",
    "RowMerge",
    "deletes_to_read",
    "emit",
    "emit_full_rows",
    "emit_wal_full_rows",
]
