"""The changelog of a PutKv batch of full-row writes, planned per record in C (``native/rowcodec.c``) where
built, else by the pure-Python reference it must equal; the KV tablet's merge engines and partial updates
plan in :mod:`strom.kv.merge.row_merger` and the tablet."""

from __future__ import annotations

from collections.abc import Sequence

from strom.records.log_batch import CHANGE_DELETE, CHANGE_INSERT, CHANGE_UPDATE_PAIR
from strom.records.rowcodec_native import native

PlannedPut = tuple[bytes, list[bytes], list[bytes], list["bytes | None"]]


def plan_upserts_python(
    keys: Sequence[bytes], values: Sequence[bytes | None], olds: Sequence[bytes | None], prefix: bytes,
    ignore_deletes: bool,
) -> PlannedPut:
    """The reference of ``plan_upserts``: the changelog of one PutKv batch of full-row writes.

    ``olds[i]`` is the key's value before the batch (a key written earlier in the batch sees that
    write). Upsert of an absent key: +I new; of a present one: -U old, +U new; delete of a present key:
    -D old (unless ``ignore_deletes``); delete of an absent key: nothing. Returns the change-type bytes,
    the changelog images in order, and the keys and values to write (None deletes).
    """
    local: dict[bytes, bytes | None] = {}
    change_types = bytearray()
    rows: list[bytes] = []
    new_keys: list[bytes] = []
    new_values: list[bytes | None] = []
    for key, value, old in zip(keys, values, olds, strict=True):
        if key in local:
            old = local[key]
        if value is None:
            if old is None or ignore_deletes:
                continue
            change_types += CHANGE_DELETE
            rows.append(old)
            local[key] = None
            new_keys.append(key)
            new_values.append(None)
            continue
        new = prefix + value
        if old is None:
            change_types += CHANGE_INSERT
            rows.append(new)
        else:
            change_types += CHANGE_UPDATE_PAIR
            rows.append(old)
            rows.append(new)
        local[key] = new
        new_keys.append(key)
        new_values.append(new)
    return bytes(change_types), rows, new_keys, new_values


def plan_upserts(
    keys: Sequence[bytes], values: Sequence[bytes | None], olds: Sequence[bytes | None], prefix: bytes,
    ignore_deletes: bool,
) -> PlannedPut:
    """``plan_upserts_python`` in C when the module is built (the per-record loop of every PutKv)."""
    if native is not None:
        result: PlannedPut = native.plan_upserts(keys, values, olds, prefix, ignore_deletes)
        return result
    return plan_upserts_python(keys, values, olds, prefix, ignore_deletes)


__all__ = ["PlannedPut", "plan_upserts", "plan_upserts_python"]
