"""A write-through cache of current rows, shared by a tablet server's primary-key buckets, bounded by bytes.

Every old-value read of a put (the FULL changelog, partial updates, merge engines, auto-increment, deletes)
and every lookup asks the cache before RocksDB: reading a key's current value from RocksDB costs several
times more than the rest of an update (docs/benchmarks.md). The cache holds exactly what RocksDB holds for
the keys it has: a bucket writes through it after each successful RocksDB write (applied batches, changelog
replay), fills it from RocksDB on a miss, and drops a deleted key. Each open bucket instance has a token of
its own, so a bucket that is closed, reopened, restored from a snapshot or dropped never sees another
instance's entries. Values are the stored bytes (schema id + row), so a schema change invalidates nothing.

Eviction is least-recently-used: within a bucket by entry (an ordered dict), across buckets by the bucket
used longest ago. A full cache updates the keys it holds on every write but admits other keys only one in
:data:`ADMIT_ONE_IN`, so a working set larger than the cache does not pay an eviction per write; a bucket
whose existing keys mostly miss bypasses the cache for a while (:meth:`RowCache.record_misses`), so a
cold cache costs next to nothing. Used on the event loop only.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from collections.abc import Sequence

ENTRY_OVERHEAD_BYTES = 128
"""What an entry costs beyond its key and value bytes: the dict slot, the ordered dict's link and two bytes
objects' headers (measured with tracemalloc: 110–130 bytes)."""
ADMIT_ONE_IN = 8
"""Once the cache is full, one in this many keys it does not hold is admitted: a key space larger than the
cache then costs little eviction churn, and a new hot set still moves in (over a few rounds)."""
JUDGE_EVERY_KEYS = 20_000
"""A bucket's hit share is judged after this many reads of keys that exist."""
MIN_HIT_SHARE = 0.25
"""Below this share of hits among existing keys, a bucket with a full cache bypasses it: a hit saves a
RocksDB read (2–4 µs here), a miss costs the cache's lookup and upkeep (~1–2 µs with a large cache)."""
BYPASS_KEYS = 2_000_000
"""Keys a bypassing bucket reads before it tries the cache again (from empty)."""
DEFAULT_SHARE_OF_MEMORY = 8
DEFAULT_MAX_BYTES = 4 << 30


def default_capacity_bytes() -> int:
    """An eighth of the machine's memory, at most 4 GiB (``kv.row-cache.size`` unset)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 256 << 20
    return min(total // DEFAULT_SHARE_OF_MEMORY, DEFAULT_MAX_BYTES)


class RowCache:
    """Current rows of many buckets, within ``capacity_bytes`` (0 caches nothing)."""

    def __init__(self, capacity_bytes: int) -> None:
        assert capacity_bytes >= 0
        self.capacity_bytes = capacity_bytes
        self._tokens = itertools.count(1)
        self._buckets: OrderedDict[int, OrderedDict[bytes, bytes]] = OrderedDict()
        """By token, least recently used first; each bucket's entries least recently used first."""
        self._bucket_bytes: dict[int, int] = {}
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0
        self._skipped = 0
        self._windows: dict[int, list[int]] = {}
        """Per bucket: hits and RocksDB-found misses since the last judgement."""
        self._bypass: dict[int, int] = {}
        """Buckets bypassing the cache, with how many more keys they read before trying it again."""
        self.bypassed = 0
        """How often a bucket started bypassing the cache."""

    @property
    def entries(self) -> int:
        return sum(len(entries) for entries in self._buckets.values())

    def register(self) -> int:
        """A token for a newly opened bucket instance."""
        return next(self._tokens)

    def get_many(self, token: int, keys: Sequence[bytes]) -> tuple[list[bytes | None], list[int]] | None:
        """The cached values of ``keys`` (None where not cached) and the positions of those not cached; None
        while the bucket bypasses the cache (read RocksDB, and put nothing)."""
        bypass = self._bypass.get(token)
        if bypass is not None:
            if bypass > len(keys):
                self._bypass[token] = bypass - len(keys)
                return None
            del self._bypass[token]  # try the cache again, from empty
        entries = self._buckets.get(token)
        if entries is None:
            self.misses += len(keys)
            return [None] * len(keys), list(range(len(keys)))
        self._buckets.move_to_end(token)
        get, touch = entries.get, entries.move_to_end
        values: list[bytes | None] = []
        missing: list[int] = []
        for position, key in enumerate(keys):
            value = get(key)
            if value is None:
                missing.append(position)
            else:
                touch(key)
            values.append(value)
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        return values, missing

    def record_misses(self, token: int, hits: int, found: int) -> None:
        """After a read: ``hits`` keys came from the cache, ``found`` others existed in RocksDB. A bucket whose
        existing keys mostly miss (its working set is far larger than the cache) stops using the cache for
        a while: looking it up and keeping it current would cost more than the hits save. Keys that exist
        nowhere (new keys) say nothing either way."""
        window = self._windows.setdefault(token, [0, 0])
        window[0] += hits
        window[1] += found
        if window[0] + window[1] < JUDGE_EVERY_KEYS:
            return
        hit_share = window[0] / (window[0] + window[1])
        window[0] = window[1] = 0
        if hit_share < MIN_HIT_SHARE and self.size_bytes >= self.capacity_bytes * 9 // 10:
            self.forget(token)
            self._bypass[token] = BYPASS_KEYS
            self.bypassed += 1

    def put_many(self, token: int, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """Record what RocksDB now holds for ``keys`` (None: deleted), later positions winning."""
        if not self.capacity_bytes or token in self._bypass:
            return  # a bypassing bucket holds nothing here
        entries = self._buckets.get(token)
        if entries is None:
            entries = self._buckets[token] = OrderedDict()
            self._bucket_bytes[token] = 0
        else:
            self._buckets.move_to_end(token)
        change = 0
        pop = entries.pop
        full = self.size_bytes >= self.capacity_bytes * 95 // 100
        skipped = self._skipped
        for key, value in zip(keys, values, strict=True):
            old = pop(key, None)
            if old is not None:
                change -= len(key) + len(old) + ENTRY_OVERHEAD_BYTES
            elif full:
                skipped += 1
                if skipped % ADMIT_ONE_IN:
                    continue  # a full cache admits a key it does not hold only now and then
            if value is not None:
                entries[key] = value
                change += len(key) + len(value) + ENTRY_OVERHEAD_BYTES
        self._skipped = skipped
        self._bucket_bytes[token] += change
        self.size_bytes += change
        if self.size_bytes > self.capacity_bytes:
            self._evict()

    def _evict(self) -> None:
        """Drop least recently used entries, from the bucket used longest ago first, down to 95 %."""
        target = self.capacity_bytes * 95 // 100
        while self.size_bytes > target and self._buckets:
            token, entries = next(iter(self._buckets.items()))
            freed = 0
            while entries and self.size_bytes - freed > target:
                key, value = entries.popitem(last=False)
                freed += len(key) + len(value) + ENTRY_OVERHEAD_BYTES
            self._bucket_bytes[token] -= freed
            self.size_bytes -= freed
            if not entries:
                self.forget(token)

    def forget(self, token: int) -> None:
        """Drop a bucket instance's entries (it closed, or its data is gone)."""
        entries = self._buckets.pop(token, None)
        if entries is not None:
            self.size_bytes -= self._bucket_bytes.pop(token)
        self._windows.pop(token, None)

    def close(self, token: int) -> None:
        """A bucket instance closed: nothing of it stays."""
        self.forget(token)
        self._bypass.pop(token, None)


__all__ = ["RowCache", "default_capacity_bytes"]
