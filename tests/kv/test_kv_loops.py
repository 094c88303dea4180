"""The compiled KV loops return exactly what their Python references return, dicts left in the same state."""

from __future__ import annotations

import copy

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from strom.kv import kv_loops

pytestmark = pytest.mark.skipif(not kv_loops.NATIVE_AVAILABLE, reason="strom.kv._kvloops was not built")
native = kv_loops.native

keys_st = st.binary(min_size=0, max_size=4)
values_st = st.one_of(st.none(), st.binary(max_size=6))
generation = st.dictionaries(keys_st, st.binary(max_size=6), max_size=8)


@settings(max_examples=300, deadline=None)
@given(young=generation, old=generation, keys=st.lists(keys_st, max_size=12), room=st.integers(-5, 80),
       overhead=st.integers(0, 10))
def test_cache_get_many_matches_the_reference(
    young: dict[bytes, bytes], old: dict[bytes, bytes], keys: list[bytes], room: int, overhead: int
) -> None:
    young_c, old_c = copy.copy(young), copy.copy(old)
    expected = kv_loops.cache_get_many_python(young, old, keys, room, overhead)
    assert native.cache_get_many(young_c, old_c, tuple(keys), room, overhead) == expected
    assert (young_c, old_c) == (young, old)


@settings(max_examples=300, deadline=None)
@given(young=generation, old=generation, writes=st.lists(st.tuples(keys_st, values_st), max_size=12),
       keep=st.booleans(), overhead=st.integers(0, 10))
def test_cache_put_many_matches_the_reference(
    young: dict[bytes, bytes], old: dict[bytes, bytes], writes: list[tuple[bytes, bytes | None]], keep: bool,
    overhead: int,
) -> None:
    keys = [key for key, _ in writes]
    values = [value for _, value in writes]
    young_c, old_c = copy.copy(young), copy.copy(old)
    expected = kv_loops.cache_put_many_python(young, old, keys, values, keep, overhead)
    assert native.cache_put_many(young_c, old_c, keys, values, keep, overhead) == expected
    assert (young_c, old_c) == (young, old)
    assert native.entry_bytes(keys, values, overhead) == kv_loops.entry_bytes_python(keys, values, overhead)


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(keys_st, max_size=40))
def test_reads_in_key_order_answer_in_the_order_given(keys: list[bytes]) -> None:
    asked: list[list[bytes]] = []

    def get_many(sorted_keys: list[bytes]) -> list[bytes | None]:
        asked.append(list(sorted_keys))
        return [key[::-1] if len(key) % 2 else None for key in sorted_keys]

    expected = kv_loops.read_in_key_order_python(get_many, keys)
    assert kv_loops.read_in_key_order_native(get_many, keys) == expected
    assert asked[0] == asked[1] == sorted(keys)  # RocksDB is asked in byte order
    assert expected == [key[::-1] if len(key) % 2 else None for key in keys]


@settings(max_examples=300, deadline=None)
@given(writes=st.lists(st.tuples(keys_st, st.one_of(st.none(), st.binary(max_size=8))), max_size=40))
def test_writes_in_key_order_keep_a_repeated_keys_writes_in_the_order_given(
    writes: list[tuple[bytes, bytes | None]]
) -> None:
    """The order a bucket's RocksDB write batch takes: byte order of keys, and for a key written twice its
    writes as given (the batch applies in order, so the later value still wins)."""
    keys = [key for key, _ in writes]
    values = [value for _, value in writes]
    expected = kv_loops.in_key_order_python(keys, values)
    assert kv_loops.in_key_order_native(keys, values) == expected
    assert expected[0] == sorted(keys)
    assert list(zip(*expected, strict=True)) == sorted(writes, key=lambda write: write[0])  # sorted() is stable
    last = dict(writes)
    assert dict(zip(*expected, strict=True)) == last


@settings(max_examples=300, deadline=None)
@given(index_writes=st.lists(st.tuples(keys_st, values_st), max_size=12),
       reads=st.lists(st.tuples(keys_st, values_st), max_size=12))
def test_the_pre_write_buffer_overlays_what_is_stored(
    index_writes: list[tuple[bytes, bytes | None]], reads: list[tuple[bytes, bytes | None]]
) -> None:
    """The index of pending writes (later writes of a key winning, deletes as None) replaces the stored
    values of the keys it holds and leaves the others."""
    keys = [key for key, _ in reads]
    stored = [value for _, value in reads]
    index_c: dict[bytes, bytes | None] = {}
    index_py: dict[bytes, bytes | None] = {}
    native.index_update(index_c, [key for key, _ in index_writes], [value for _, value in index_writes])
    kv_loops.index_update_python(index_py, [key for key, _ in index_writes], [value for _, value in index_writes])
    assert index_c == index_py == dict(index_writes)
    values_c, values_py = list(stored), list(stored)
    native.overlay(values_c, tuple(keys), index_c)
    kv_loops.overlay_python(values_py, keys, index_py)
    assert values_c == values_py == [index_c.get(key, value) for key, value in reads]


def test_bad_arguments_raise_instead_of_corrupting() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        native.cache_put_many({}, {}, [b"a"], [], True, 0)
    with pytest.raises(ValueError, match="differ in length"):
        kv_loops.cache_put_many_python({}, {}, [b"a"], [], True, 0)
    with pytest.raises(TypeError, match="keys must be bytes"):
        native.key_order([b"a", "b"])
    for in_key_order in (kv_loops.in_key_order_native, kv_loops.in_key_order_python):
        with pytest.raises(ValueError, match="differ in length"):
            in_key_order([b"a", b"b"], [b"x"])
    with pytest.raises(TypeError):
        native.cache_get_many({}, {}, [[1]], 10, 0)  # an unhashable key: the dict's own error
    for overlay, index_update in ((native.overlay, native.index_update),
                                  (kv_loops.overlay_python, kv_loops.index_update_python)):
        with pytest.raises(ValueError, match="differ in length"):
            overlay([None], [b"a", b"b"], {})
        with pytest.raises(ValueError, match="differ in length"):
            index_update({}, [b"a"], [])
    with pytest.raises(TypeError):
        native.overlay((None,), [b"a"], {})  # values must be a list: it is filled in place
    with pytest.raises(TypeError):
        native.overlay([None], [[1]], {b"a": b"x"})  # an unhashable key


long_keys_st = st.builds(lambda prefix, tail: prefix + tail, st.sampled_from([b"", b"user_000", b"user_0001", b"\x00" * 8]),
                         st.binary(max_size=12))


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.one_of(long_keys_st, keys_st), max_size=60))
def test_key_order_sorts_long_keys_sharing_their_first_bytes_stably(keys: list[bytes]) -> None:
    """Keys over 8 bytes that share their first 8, and keys that differ only by trailing zero bytes, are
    told apart by their whole bytes; equal keys keep the order given."""
    sorted_keys, order = native.key_order(keys)
    positions = list(memoryview(order).cast("n"))
    expected = sorted(range(len(keys)), key=lambda position: (keys[position], position))
    assert positions == expected
    assert sorted_keys == [keys[position] for position in expected]
