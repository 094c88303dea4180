"""RowCache on its own: the byte bound, least-recently-used eviction across buckets, admission once full,
and the bypass of a bucket whose existing keys mostly miss."""

from __future__ import annotations

from strom.kv import row_cache
from strom.kv.row_cache import ENTRY_OVERHEAD_BYTES, RowCache


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def test_the_bound_holds_and_the_bucket_used_longest_ago_loses_entries_first() -> None:
    per_entry = 8 + 100 + ENTRY_OVERHEAD_BYTES
    cache = RowCache(per_entry * 100)
    old, new = cache.register(), cache.register()
    cache.put_many(old, [key(i) for i in range(60)], [b"v" * 100] * 60)
    cache.put_many(new, [key(i) for i in range(60)], [b"w" * 100] * 60)
    assert cache.size_bytes <= cache.capacity_bytes
    values, missing = cache.get_many(new, [key(i) for i in range(60)]) or ([], [])
    assert missing == [] and values[0] == b"w" * 100, "the bucket written last kept its entries"
    _values, gone = cache.get_many(old, [key(i) for i in range(60)]) or ([], [])
    assert len(gone) >= 20
    cache.put_many(new, [key(0)], [None])  # a delete drops the entry
    assert cache.get_many(new, [key(0)]) == ([None], [0])
    cache.close(new)
    cache.close(old)
    assert cache.size_bytes == 0 and cache.entries == 0


def test_a_full_cache_admits_unknown_keys_only_now_and_then_but_updates_known_ones() -> None:
    per_entry = 8 + 100 + ENTRY_OVERHEAD_BYTES
    cache = RowCache(per_entry * 50)
    token = cache.register()
    cache.put_many(token, [key(i) for i in range(50)], [b"a" * 100] * 50)  # fills it
    held = [i for i in range(50) if cache.get_many(token, [key(i)]) != ([None], [0])]
    cache.put_many(token, [key(i) for i in held], [b"b" * 100] * len(held))
    assert all((cache.get_many(token, [key(i)]) or ([None], []))[0] == [b"b" * 100] for i in held)
    before = cache.entries
    cache.put_many(token, [key(1000 + i) for i in range(80)], [b"c" * 100] * 80)
    admitted = sum(cache.get_many(token, [key(1000 + i)]) != ([None], [0]) for i in range(80))
    assert admitted == 80 // row_cache.ADMIT_ONE_IN and cache.entries <= before


def test_a_bucket_whose_existing_keys_mostly_miss_bypasses_the_cache_for_a_while(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(row_cache, "JUDGE_EVERY_KEYS", 100)
    monkeypatch.setattr(row_cache, "BYPASS_KEYS", 500)
    cache = RowCache(1000)
    token = cache.register()
    cache.put_many(token, [key(i) for i in range(10)], [b"x" * 100] * 10)  # full
    assert cache.size_bytes >= cache.capacity_bytes * 9 // 10
    new_keys_only = [key(10_000 + i) for i in range(200)]
    cache.get_many(token, new_keys_only)
    cache.record_misses(token, hits=0, found=0)  # keys that exist nowhere: no judgement
    assert cache.get_many(token, [key(1)]) is not None
    cache.record_misses(token, hits=5, found=95)  # existing keys, 5 % hits
    assert cache.bypassed == 1 and cache.entries == 0
    assert cache.get_many(token, [key(i) for i in range(400)]) is None  # bypassing: read RocksDB
    cache.put_many(token, [key(1)], [b"y" * 100])  # and nothing is kept
    assert cache.entries == 0
    assert cache.get_many(token, [key(i) for i in range(200)]) is not None  # 600 keys later it tries again
    cache.put_many(token, [key(1)], [b"z" * 100])
    assert cache.get_many(token, [key(1)]) == ([b"z" * 100], [])
