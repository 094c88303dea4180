"""The per-key loops of a bucket's reads and writes: compiled (``native/kvloops.c``) with Python references.

A 10 000-key PutKv or Lookup batch asks the row cache for every key, writes every new value through it and
reads the keys the cache lacks from RocksDB in key order. As bytecode loops these took ~15 % of a tablet
server's time in a cache-hot FULL update (py-spy, docs/benchmarks.md); the C module runs each as one
call per batch. Each ``*_python`` function is the reference: the compiled one returns exactly the same,
and everything uses the reference when the module was built without a C compiler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from strom.records import positions

try:
    import strom.kv._kvloops as native
except ImportError:  # built without a C compiler
    native = None

NATIVE_AVAILABLE = native is not None

CacheValues = tuple[list[bytes | None], list[int], int]


def cache_get_many_python(
    young: dict[bytes, bytes], old: dict[bytes, bytes], keys: Sequence[bytes], room: int, overhead: int
) -> CacheValues:
    """One bucket's cached values of ``keys`` (None where not cached), the positions not cached, and the
    bytes promoted: a key found in the old generation moves to the young one while ``room`` allows."""
    young_get, old_get = young.get, old.get
    values: list[bytes | None] = []
    missing: list[int] = []
    promoted = 0
    for position, key in enumerate(keys):
        value = young_get(key)
        if value is None:
            value = old_get(key)
            if value is None:
                missing.append(position)
            else:
                cost = len(key) + len(value) + overhead
                if promoted + cost <= room:
                    young[key] = value
                    promoted += cost
        values.append(value)
    return values, missing, promoted


def cache_put_many_python(
    young: dict[bytes, bytes],
    old: dict[bytes, bytes],
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    keep: bool,
    overhead: int,
) -> tuple[int, int]:
    """Write a batch through one bucket's generations (None deletes; without ``keep`` every key is only
    dropped); returns the change of the young and of the old generation's bytes."""
    if len(keys) != len(values):
        raise ValueError("keys and values differ in length")
    young_delta = old_delta = 0
    for key, value in zip(keys, values):  # noqa: B905 - lengths checked above, as the C loop does
        if value is None or not keep:
            gone = young.pop(key, None)
            if gone is not None:
                young_delta -= len(key) + len(gone) + overhead
            gone = old.pop(key, None)
            if gone is not None:
                old_delta -= len(key) + len(gone) + overhead
        else:
            young[key] = value  # shadows an older value in the old generation
            young_delta += len(key) + len(value) + overhead
    return young_delta, old_delta


def entry_bytes_python(keys: Sequence[bytes], values: Sequence[bytes | None], overhead: int) -> int:
    """What the cache charges for storing a batch: its key and value bytes plus ``overhead`` per key."""
    return sum(map(len, keys)) + sum(len(v) for v in values if v is not None) + len(keys) * overhead


def overlay_python(values: list[bytes | None], keys: Sequence[bytes], index: dict[bytes, bytes | None]) -> None:
    """Replace ``values[i]`` with ``index[keys[i]]`` wherever the key is in ``index`` (the pre-write buffer
    over what the cache and RocksDB hold)."""
    if len(keys) != len(values):
        raise ValueError("keys and values differ in length")
    for position, key in enumerate(keys):
        if key in index:
            values[position] = index[key]


def index_update_python(index: dict[bytes, bytes | None], keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
    """``index[keys[i]] = values[i]`` in order, later positions winning."""
    if len(keys) != len(values):
        raise ValueError("keys and values differ in length")
    index.update(zip(keys, values))  # noqa: B905 - lengths checked above, as the C loop does


def read_in_key_order_python(
    get_many: Callable[[list[bytes]], list[bytes | None]], keys: Sequence[bytes]
) -> list[bytes | None]:
    """``get_many`` of ``keys`` sorted by their bytes, answered in the order given."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    found = get_many([keys[position] for position in order])
    values: list[bytes | None] = [None] * len(keys)
    for position, value in zip(order, found, strict=True):
        values[position] = value
    return values


def in_key_order_python(
    keys: Sequence[bytes], values: Sequence[bytes | None]
) -> tuple[list[bytes], list[bytes | None]]:
    """``keys`` and their ``values`` sorted by key bytes, stably: a key written twice keeps its writes in
    the order given, so the later one still wins when the pairs go into one RocksDB write batch."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys and {len(values)} values differ in length")
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return [keys[position] for position in order], [values[position] for position in order]


def in_key_order_native(
    keys: Sequence[bytes], values: Sequence[bytes | None]
) -> tuple[list[bytes], list[bytes | None]]:
    assert native is not None
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys and {len(values)} values differ in length")
    sorted_keys, order = native.key_order(keys)
    return sorted_keys, positions.take(values, order)


def read_in_key_order_native(
    get_many: Callable[[list[bytes]], list[bytes | None]], keys: Sequence[bytes]
) -> list[bytes | None]:
    assert native is not None
    sorted_keys, order = native.key_order(keys)
    result: list[bytes | None] = positions.unsort(get_many(sorted_keys), order)
    return result


if native is not None:
    cache_get_many: Callable[..., CacheValues] = native.cache_get_many
    cache_put_many: Callable[..., tuple[int, int]] = native.cache_put_many
    overlay: Callable[[list[bytes | None], Sequence[bytes], dict[bytes, bytes | None]], None] = native.overlay
    index_update: Callable[[dict[bytes, bytes | None], Sequence[bytes], Sequence[bytes | None]], None] = (
        native.index_update)
    entry_bytes: Callable[..., int] = native.entry_bytes
    read_in_key_order = read_in_key_order_native
    in_key_order: Callable[..., tuple[list[bytes], list[bytes | None]]] = in_key_order_native
else:
    cache_get_many = cache_get_many_python
    cache_put_many = cache_put_many_python
    overlay = overlay_python
    index_update = index_update_python
    entry_bytes = entry_bytes_python
    read_in_key_order = read_in_key_order_python
    in_key_order = in_key_order_python

__all__ = ["NATIVE_AVAILABLE", "cache_get_many", "cache_put_many", "entry_bytes", "in_key_order", "index_update",
           "overlay", "read_in_key_order"]
