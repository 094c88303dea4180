"""RowCache on its own: the byte bound, eviction by generation (a key used once per generation stays),
write-through and deletes, and the bypass of a bucket whose existing keys mostly miss."""

from __future__ import annotations

from strom.kv import row_cache
from strom.kv.row_cache import ENTRY_OVERHEAD_BYTES, RowCache

PER_ENTRY = 8 + 100 + ENTRY_OVERHEAD_BYTES


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def cached(cache: RowCache, token: int, i: int) -> bytes | None:
    found = cache.get_many(token, [key(i)])
    assert found is not None
    return found[0][0]


def test_the_bound_holds_and_keys_used_every_generation_stay() -> None:
    cache = RowCache(PER_ENTRY * 100)
    hot, cold = cache.register(), cache.register()
    cache.put_many(hot, [key(i) for i in range(10)], [b"h" * 100] * 10)
    for round_ in range(20):  # a stream of new keys in another bucket, the hot keys read every round
        cache.put_many(cold, [key(1000 + 10 * round_ + i) for i in range(10)], [b"c" * 100] * 10)
        assert all(cached(cache, hot, i) == b"h" * 100 for i in range(10))
        assert cache.size_bytes <= cache.capacity_bytes
    assert cached(cache, cold, 1000) is None, "a key not used for two generations is gone"
    cache.put_many(hot, [key(3)], [None])  # a delete drops it from every generation
    assert cached(cache, hot, 3) is None
    cache.put_many(hot, [key(4)], [b"new" * 10])  # a write shadows the older value
    assert cached(cache, hot, 4) == b"new" * 10
    cache.close(hot)
    cache.close(cold)
    assert cache.size_bytes == 0 and cache.entries == 0


def test_a_batch_larger_than_the_cache_leaves_nothing_behind() -> None:
    cache = RowCache(PER_ENTRY * 10)
    token = cache.register()
    cache.put_many(token, [key(i) for i in range(50)], [b"x" * 100] * 50)
    assert cache.size_bytes <= cache.capacity_bytes


def test_a_bucket_whose_existing_keys_mostly_miss_bypasses_the_cache_for_a_while(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(row_cache, "JUDGE_EVERY_KEYS", 100)
    monkeypatch.setattr(row_cache, "BYPASS_KEYS", 500)
    cache = RowCache(PER_ENTRY * 20)
    token = cache.register()
    cache.put_many(token, [key(i) for i in range(10)], [b"x" * 100] * 10)  # half of the bound: judged
    cache.record_misses(token, hits=0, found=0)  # keys that exist nowhere: no judgement
    assert cache.get_many(token, [key(1)]) is not None
    cache.record_misses(token, hits=5, found=95)  # existing keys, 5 % hits
    assert cache.bypassed == 1 and cache.entries == 0
    assert cache.get_many(token, [key(i) for i in range(400)]) is None  # bypassing: read RocksDB
    cache.put_many(token, [key(1)], [b"y" * 100])  # and nothing is kept
    assert cache.entries == 0
    assert cache.get_many(token, [key(i) for i in range(200)]) is not None  # 600 keys later it tries again
    cache.put_many(token, [key(1)], [b"z" * 100])
    assert cached(cache, token, 1) == b"z" * 100


def test_a_complete_bucket_answers_every_key_until_it_loses_an_entry() -> None:
    cache = RowCache(PER_ENTRY * 20)
    nothing = RowCache(0)
    token = nothing.register()
    nothing.mark_complete(token)
    assert not nothing.is_complete(token)  # a cache that holds nothing is never complete
    kept, too_large, bypassing = cache.register(), cache.register(), cache.register()
    for token in (kept, too_large, bypassing):
        cache.mark_complete(token)
    cache.put_many(kept, [key(1)], [b"x" * 100])
    assert cache.get_many(kept, [key(1), key(2)]) == ([b"x" * 100, None], [])  # key 2 is known absent
    cache.put_many(kept, [key(1)], [None])  # a delete keeps it complete
    assert cache.get_many(kept, [key(1)]) == ([None], [])
    cache.put_many(too_large, [key(i) for i in range(15)], [b"x" * 100] * 15)  # over half the bound: not kept
    assert not cache.is_complete(too_large)
    assert cache.get_many(too_large, [key(1)]) == ([None], [0])  # so it reads RocksDB again
    cache.forget(bypassing)
    assert not cache.is_complete(bypassing)
    cache.close(kept)
    assert not cache.is_complete(kept)


def test_rows_collected_off_the_loop_are_adopted_whole_within_a_generation() -> None:
    """A new bucket's replay on its opener thread collects its rows (ReplayedRows); the cache takes them as
    the instance's young generation, within the bound, or not at all."""
    cache = RowCache(PER_ENTRY * 40)
    other = cache.register()
    cache.put_many(other, [key(i) for i in range(15)], [b"o" * 100] * 15)
    rows = cache.replayed_rows()
    rows.add([key(i) for i in range(12)], [b"x" * 100] * 12)
    rows.add([key(3), key(4)], [None, b"y" * 100])  # later writes win; a delete drops the row
    assert not rows.overflowed and len(rows.rows) == 11
    token = cache.register()
    assert cache.adopt(token, rows)
    assert cache.size_bytes <= cache.capacity_bytes
    assert cached(cache, token, 4) == b"y" * 100 and cached(cache, token, 3) is None
    assert cached(cache, other, 1) == b"o" * 100, "the other bucket's entries moved to the old generation"
    assert not cache.adopt(token, rows), "an instance that holds entries adopts nothing"

    too_many = row_cache.ReplayedRows(PER_ENTRY * 5)
    too_many.add([key(i) for i in range(6)], [b"x" * 100] * 6)
    assert too_many.overflowed and not too_many.rows
    assert not cache.adopt(cache.register(), too_many)
    assert not cache.adopt(RowCache(0).register(), row_cache.ReplayedRows(0))
