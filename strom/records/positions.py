"""Lists rearranged by positions as a sort gives them (a numpy ``int64`` array, or any buffer of native
``Py_ssize_t``): gathered (:func:`take`) or put back (:func:`unsort`).

A batched lookup sorts its keys by bucket on the client and its answers back; a bucket reads and writes
RocksDB in key order. As bytecode list comprehensions these cost ~0.05 µs an item, a tenth of a cache-hot
batched lookup's client time (docs/benchmarks.md); ``native/rowcodec.c`` runs each as one call. Each
``*_python`` function is the reference, used where the module was built without a C compiler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strom.records.rowcodec_native import native


def _positions(items: Sequence[Any], order: Any) -> memoryview:
    positions = memoryview(order).cast("B").cast("q")  # Py_ssize_t on the 64-bit platforms strom runs on
    if len(positions) != len(items):
        raise ValueError("items and order differ in length")
    if any(not 0 <= position < len(items) for position in positions):
        raise ValueError("order holds a position out of range")
    return positions


def take_python(items: Sequence[Any], order: Any) -> list[Any]:
    """``[items[order[0]], items[order[1]], …]``. Raises ValueError for an order of another length or a
    position out of range."""
    return [items[position] for position in _positions(items, order)]


def unsort_python(items: Sequence[Any], order: Any) -> list[Any]:
    """``items[i]`` placed at position ``order[i]``: :func:`take`'s inverse. A position given twice keeps the
    later item and leaves a hole, answered as None. Raises as :func:`take` does."""
    result: list[Any] = [None] * len(items)
    for item, position in zip(items, _positions(items, order), strict=True):
        result[position] = item
    return result


take = native.take if native is not None else take_python
unsort = native.unsort if native is not None else unsort_python
