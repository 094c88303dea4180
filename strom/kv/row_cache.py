"""A write-through cache of current rows, shared by a tablet server's primary-key buckets, bounded by bytes.

Every old-value read of a put (the FULL changelog, partial updates, merge engines, auto-increment, deletes)
and every lookup asks the cache before RocksDB: reading a key's current value from RocksDB costs several
times more than the rest of an update (docs/benchmarks.md). The cache holds exactly what RocksDB holds for
the keys it has: a bucket writes through it after each successful RocksDB write (applied batches, changelog
replay), fills it from RocksDB on a lookup's miss, and drops a deleted key. Each open bucket instance has a
token of its own, so a bucket that is closed, reopened, restored from a snapshot or dropped never sees
another instance's entries. Values are the stored bytes (schema id + row), so a schema change invalidates
nothing.

Eviction is by generation, an approximate LRU that costs one plain dict operation per key (the loops run in C, kv_loops.py): each bucket has
a young and an old dict; writes, fills and hits in the old one go to the young one; when the young
dicts of all buckets together would pass half the bound, every young dict becomes old and the old ones
are dropped whole. A key used at least once per generation stays. Each generation stays within half the
bound, and the byte count charges every write (it only ever over-counts): memory stays within the bound. A bucket whose reads of existing keys mostly miss
(its working set is far larger than the cache) bypasses the cache for a while (:meth:`RowCache.record_misses`),
so a cold cache costs next to nothing. Used on the event loop only.

A bucket instance that opened on an empty RocksDB (a new table, or one rebuilt from its changelog) is
*complete* while the cache has lost none of its keys: every key RocksDB holds is then in the cache, so a
key the cache lacks does not exist and is not looked for in RocksDB. A load of new keys reads nothing
(docs/benchmarks.md). The first entry the bucket loses without RocksDB losing it (a rotation that drops
its old generation, a batch too large to keep, a bypass) ends that for the instance's life.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from strom.kv import kv_loops

ENTRY_OVERHEAD_BYTES = 128
"""What an entry costs beyond its key and value bytes: the dict slot and two bytes objects' headers,
rounded up (tracemalloc measures ~100 bytes)."""
JUDGE_EVERY_KEYS = 20_000
"""A bucket's hit share is judged after this many reads of keys that exist."""
MIN_HIT_SHARE = 0.25
"""Below this share of hits among existing keys, a bucket of a full cache bypasses it: a hit saves a
RocksDB read (2–4 µs here), a miss costs the cache's lookup and upkeep."""
BYPASS_KEYS = 2_000_000
"""Keys a bypassing bucket reads before it tries the cache again (from empty)."""
ADD_SLICE_KEYS = 4096
"""Rows :meth:`ReplayedRows.add` puts in one call of the C loop (~0.5 ms here, the GIL held)."""
DEFAULT_SHARE_OF_MEMORY = 8
DEFAULT_MAX_BYTES = 4 << 30


def default_capacity_bytes() -> int:
    """An eighth of the machine's memory, at most 4 GiB (``kv.row-cache.size`` unset)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 256 << 20
    return min(total // DEFAULT_SHARE_OF_MEMORY, DEFAULT_MAX_BYTES)


@dataclass(slots=True)
class _Bucket:
    young: dict[bytes, bytes] = field(default_factory=dict)
    old: dict[bytes, bytes] = field(default_factory=dict)
    young_bytes: int = 0
    old_bytes: int = 0
    hits: int = 0
    found: int = 0
    """Hits and misses of keys RocksDB had, since the last judgement."""


class RowCache:
    """Current rows of many buckets, within ``capacity_bytes`` (0 caches nothing)."""

    def __init__(self, capacity_bytes: int) -> None:
        assert capacity_bytes >= 0
        self.capacity_bytes = capacity_bytes
        self._tokens = itertools.count(1)
        self._buckets: dict[int, _Bucket] = {}
        self._young_bytes = 0
        self._old_bytes = 0
        self._bypass: dict[int, int] = {}
        """Buckets bypassing the cache, with how many more keys they read before trying it again."""
        self._complete: set[int] = set()
        """Buckets whose every RocksDB key is cached: a key they lack does not exist."""
        self.hits = 0
        self.misses = 0
        self.bypassed = 0
        """How often a bucket started bypassing the cache."""

    @property
    def size_bytes(self) -> int:
        return self._young_bytes + self._old_bytes

    @property
    def entries(self) -> int:
        """Entries held, counted per generation (a row used again since the last rotation counts in both):
        cheap enough for every metrics scrape, unlike a union of millions of keys."""
        return sum(len(b.young) + len(b.old) for b in self._buckets.values())

    def register(self) -> int:
        """A token for a newly opened bucket instance."""
        return next(self._tokens)

    def mark_complete(self, token: int) -> None:
        """The bucket instance's RocksDB is empty and every write to it will come through here: until it
        loses an entry, what the cache lacks does not exist."""
        if self.capacity_bytes:
            self._complete.add(token)

    def is_complete(self, token: int) -> bool:
        return token in self._complete

    def get_many(self, token: int, keys: Sequence[bytes]) -> tuple[list[bytes | None], list[int]] | None:
        """The cached values of ``keys`` (None where not cached) and the positions to read from RocksDB:
        those not cached, none for a complete bucket (they do not exist). None while the bucket bypasses
        the cache (read RocksDB, and put nothing)."""
        bypass = self._bypass.get(token)
        if bypass is not None:
            if bypass > len(keys):
                self._bypass[token] = bypass - len(keys)
                return None
            del self._bypass[token]  # try the cache again, from empty
        bucket = self._buckets.get(token)
        if bucket is None:
            if token in self._complete:
                self.hits += len(keys)
                return [None] * len(keys), []
            self.misses += len(keys)
            return [None] * len(keys), list(range(len(keys)))
        values, missing, promoted = kv_loops.cache_get_many(
            bucket.young, bucket.old, keys, self.capacity_bytes // 2 - self._young_bytes, ENTRY_OVERHEAD_BYTES
        )
        bucket.young_bytes += promoted
        self._young_bytes += promoted
        if token in self._complete:  # answered whole: an absent key is known absent
            self.hits += len(keys)
            return values, []
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        return values, missing

    def record_misses(self, token: int, hits: int, found: int) -> None:
        """After a read: ``hits`` keys came from the cache, ``found`` others existed in RocksDB. A bucket whose
        existing keys mostly miss (its working set is far larger than the cache) stops using the cache for
        a while: looking it up and keeping it current would cost more than the hits save. Keys that exist
        nowhere (new keys) say nothing either way."""
        bucket = self._buckets.get(token)
        if bucket is None:
            return
        bucket.hits += hits
        bucket.found += found
        judged = bucket.hits + bucket.found
        if judged < JUDGE_EVERY_KEYS:
            return
        if self.size_bytes < self.capacity_bytes // 4:  # still filling: misses are expected, keep counting
            if judged > 4 * JUDGE_EVERY_KEYS:
                bucket.hits //= 2
                bucket.found //= 2
            return
        hit_share = bucket.hits / judged
        bucket.hits = bucket.found = 0
        if hit_share < MIN_HIT_SHARE:
            self.forget(token)
            self._bypass[token] = BYPASS_KEYS
            self.bypassed += 1

    def put_many(self, token: int, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """Record what RocksDB now holds for ``keys`` (None: deleted), later positions winning."""
        if not self.capacity_bytes or token in self._bypass:
            return  # a bypassing bucket holds nothing here
        bucket = self._buckets.get(token)
        if bucket is None:
            bucket = self._buckets[token] = _Bucket()
        half = self.capacity_bytes // 2
        incoming = kv_loops.entry_bytes(keys, values, ENTRY_OVERHEAD_BYTES)
        if self._young_bytes + incoming > half:
            self._rotate()  # each generation stays within half the bound
        keep = incoming <= half  # a batch larger than that only invalidates what it changes
        if not keep:
            self._complete.discard(token)
        young_delta, old_delta = kv_loops.cache_put_many(
            bucket.young, bucket.old, keys, values, keep, ENTRY_OVERHEAD_BYTES
        )
        bucket.young_bytes += young_delta
        bucket.old_bytes += old_delta
        self._young_bytes += young_delta
        self._old_bytes += old_delta

    def _rotate(self) -> None:
        """Every young generation becomes old; the old ones are dropped whole."""
        for token, bucket in self._buckets.items():
            if bucket.old:
                self._complete.discard(token)
            bucket.old, bucket.young = bucket.young, {}
            bucket.old_bytes, bucket.young_bytes = bucket.young_bytes, 0
        self._old_bytes, self._young_bytes = self._young_bytes, 0

    def replayed_rows(self) -> ReplayedRows:
        """A collector for a replay off the loop, bounded by what one generation holds (:meth:`adopt`)."""
        return ReplayedRows(self.capacity_bytes // 2)

    def adopt(self, token: int, rows: ReplayedRows) -> bool:
        """Take whole, as a new bucket instance's young generation, the rows its changelog replay collected
        off the loop (:class:`ReplayedRows`); True if kept (a bucket whose RocksDB was empty is complete then,
        once marked so). One dict handed over: the loop does not put the rows one by one."""
        if not self.capacity_bytes or token in self._bypass or rows.overflowed or token in self._buckets:
            return False
        half = self.capacity_bytes // 2
        if rows.size_bytes > half:
            return False
        if self._young_bytes + rows.size_bytes > half:
            self._rotate()  # each generation stays within half the bound
        self._buckets[token] = _Bucket(young=rows.rows, young_bytes=rows.size_bytes)
        self._young_bytes += rows.size_bytes
        return True

    def forget(self, token: int) -> None:
        """Drop a bucket instance's entries (it closed, or its data is gone)."""
        self._complete.discard(token)
        bucket = self._buckets.pop(token, None)
        if bucket is not None:
            self._young_bytes -= bucket.young_bytes
            self._old_bytes -= bucket.old_bytes

    def close(self, token: int) -> None:
        """A bucket instance closed: nothing of it stays."""
        self.forget(token)
        self._bypass.pop(token, None)


class ReplayedRows:
    """The rows a bucket's changelog replay on its opener thread writes (a follower that now leads, a crashed
    bucket), collected there in a dict of its own as the cache would hold them, for :meth:`RowCache.adopt`
    (:meth:`RowCache.replayed_rows` makes one). Past ``limit_bytes`` (what a cache generation may hold) they
    are dropped: the bucket then starts without them, and one whose RocksDB was empty cannot be complete."""

    __slots__ = ("limit_bytes", "overflowed", "rows", "size_bytes")

    def __init__(self, limit_bytes: int) -> None:
        self.rows: dict[bytes, bytes] = {}
        self.size_bytes = 0
        self.limit_bytes = limit_bytes
        self.overflowed = limit_bytes <= 0

    def add(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """What one write of the replay put into RocksDB (None: deleted), later positions winning. In slices:
        the C loop holds the GIL, which the event loop's thread takes between them."""
        for start in range(0, len(keys), ADD_SLICE_KEYS):
            if self.overflowed:
                return
            end = start + ADD_SLICE_KEYS
            added, _old = kv_loops.cache_put_many(self.rows, {}, keys[start:end], values[start:end], True,
                                                  ENTRY_OVERHEAD_BYTES)
            self.size_bytes += added
            if self.size_bytes > self.limit_bytes:
                self.overflowed, self.rows, self.size_bytes = True, {}, 0


__all__ = ["ReplayedRows", "RowCache", "default_capacity_bytes"]
