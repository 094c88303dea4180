"""The row cache changes no answer: the same random operations against a bucket with a tiny cache (constant
eviction) and one without must give the same lookups and the same changelog, record for record, across
upserts, deletes, partial updates, merge engines, a WAL image, reopening (a new bucket instance) and a
crash that loses RocksDB's memtable (the changelog replay writes through the cache). With a cache large
enough to hold the bucket, a bucket that opened empty is complete (a key the cache lacks is not looked for
in RocksDB); with one that rotates now and then, it stops being complete part way."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest.mock import patch

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings

from strom.errors import KvStorageError
from strom.kv import kv_loops, kv_tablet, rocksdb, row_cache
from strom.kv.kv_tablet import KvConfig, KvTablet
from strom.kv.rocksdb import RocksDbOptions
from strom.kv.row_cache import RowCache
from strom.kv.row_format import TableRowFormat
from strom.log.log_tablet import LogTablet
from tests.kv.conftest import BINDINGS
from tests.kv.test_kv_tablet import LOG_CONFIG, Bucket, rocksdb_settings

KEYS = 12
TINY_CACHE_BYTES = 700  # a handful of rows: nearly every read misses, every write evicts
ROTATING_CACHE_BYTES = 1_400  # about five rows a generation: complete at first, until a rotation drops some
WHOLE_CACHE_BYTES = 1 << 20  # every row: a bucket that opened empty stays complete until it reopens

TABLE_KINDS = {
    "full": {},
    "wal": {"table.changelog.image": "WAL"},
    "first_row": {"table.merge-engine": "first_row"},
    "versioned": {"table.merge-engine": "versioned", "table.merge-engine.versioned.ver-column": "score"},
}


class CachedBucket(Bucket):
    """The test's bucket, with the table's own KV options and an optional row cache."""

    def __init__(self, directory: Path, properties: dict[str, str], cache: RowCache | None) -> None:
        self.cache = cache
        super().__init__(directory, properties)
        self.config = KvConfig.for_table(self.table, RocksDbOptions(block_cache_size_bytes=1 << 20))
        self.kv.close()
        self.kv.log.close()
        self.kv = self._open()

    def _open(self) -> KvTablet:
        log = LogTablet.open(self.directory / "log", LOG_CONFIG)
        return KvTablet(self.directory / "kv", log, TableRowFormat(self.table), self.config, row_cache=self.cache)

    def crash(self) -> None:
        """Close without flushing RocksDB's memtable (its WAL is off): the reopen replays the changelog."""
        self.kv._close_db()
        self.kv.log.close()
        self.kv = self._open()


upsert = st.tuples(st.integers(0, KEYS - 1), st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 5)))
delete = st.tuples(st.integers(0, KEYS - 1), st.none())
operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(st.one_of(upsert, upsert, delete), min_size=1, max_size=6)),
        st.tuples(st.just("partial"), st.lists(upsert, min_size=1, max_size=4)),
        st.tuples(st.just("lookup"), st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=5)),
        st.tuples(st.just("reopen"), st.none()),
        st.tuples(st.just("crash"), st.none()),
    ),
    max_size=25,
)


async def apply(bucket: CachedBucket, operation: str, argument: Any) -> Any:
    """Run one operation; what it answers (errors included) is what the two buckets must agree on."""
    try:
        if operation == "put":
            return await bucket.put(*argument)
        if operation == "partial":
            return await bucket.put(*argument, target_columns=[0, 1])
        if operation == "lookup":
            return [bucket.lookup(key) for key in argument]
        if operation == "reopen":
            bucket.reopen()
        elif operation == "crash":
            bucket.crash()
        return None
    except Exception as exc:  # e.g. a partial update a merge engine refuses
        return type(exc).__name__


@pytest.mark.parametrize("kind", sorted(TABLE_KINDS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=operations)
def test_a_bucket_answers_the_same_with_and_without_the_row_cache(kind: str, script: list[tuple[str, Any]]) -> None:
    compare(kind, script)


@pytest.mark.parametrize("kind", sorted(TABLE_KINDS))
@pytest.mark.parametrize("capacity", [ROTATING_CACHE_BYTES, WHOLE_CACHE_BYTES])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=operations)
@example(script=[  # two rotations of the rotating cache drop keys 0-4 from it (not from RocksDB)
    ("put", [(0, ("a", 0))]),
    ("put", [(key, ("a", key)) for key in range(1, 5)]),
    ("put", [(key, ("a", key)) for key in range(5, 9)]),
    ("put", [(key, ("a", key)) for key in (9, 10, 11, 1)]),
    ("lookup", [0, 2, 4]),
])
def test_a_complete_bucket_answers_the_same_as_one_without_the_cache(
    kind: str, capacity: int, script: list[tuple[str, Any]]
) -> None:
    compare(kind, script, capacity)


@settings(max_examples=40, deadline=None)
@given(script=operations)
def test_a_bucket_going_in_and_out_of_bypass_answers_the_same(script: list[tuple[str, Any]]) -> None:
    """Judged every few keys and bypassing for a few reads, the cache is dropped and refilled all along."""
    with patch.object(row_cache, "JUDGE_EVERY_KEYS", 3), patch.object(row_cache, "BYPASS_KEYS", 4), \
            patch.object(row_cache, "MIN_HIT_SHARE", 0.9):
        compare("full", script)


@settings(max_examples=40, deadline=None)
@given(script=operations)
def test_the_python_loops_answer_as_the_compiled_ones(script: list[tuple[str, Any]]) -> None:
    """A build without a C compiler runs the cache on kv_loops' Python references: the same answers."""
    with patch.object(kv_loops, "cache_get_many", kv_loops.cache_get_many_python), \
            patch.object(kv_loops, "cache_put_many", kv_loops.cache_put_many_python), \
            patch.object(kv_loops, "entry_bytes", kv_loops.entry_bytes_python), \
            patch.object(kv_loops, "read_in_key_order", kv_loops.read_in_key_order_python), \
            patch.object(kv_loops, "in_key_order", kv_loops.in_key_order_python):
        compare("full", script)


def compare(kind: str, script: list[tuple[str, Any]], capacity: int = TINY_CACHE_BYTES) -> None:
    with tempfile.TemporaryDirectory() as directory:
        cache = RowCache(capacity)
        cached = CachedBucket(Path(directory) / "cached", TABLE_KINDS[kind], cache)
        plain = CachedBucket(Path(directory) / "plain", TABLE_KINDS[kind], None)
        try:
            async def run() -> None:
                for operation, argument in script:
                    assert await apply(cached, operation, argument) == await apply(plain, operation, argument)
                    assert cache.size_bytes <= capacity
                every = list(range(KEYS))
                assert [cached.lookup(k) for k in every] == [plain.lookup(k) for k in every]
                assert cached.changelog() == plain.changelog()

            asyncio.run(run())
        finally:
            cached.close()
            plain.close()


@pytest.mark.asyncio
async def test_hits_come_from_the_cache_and_a_closed_bucket_leaves_nothing_behind(tmp_path: Path) -> None:
    cache = RowCache(1 << 20)
    bucket = CachedBucket(tmp_path / "b", {}, cache)
    try:
        await bucket.put(*[(i, ("a", i)) for i in range(10)])  # written through
        assert cache.entries == 10
        before = cache.hits
        await bucket.put(*[(i, ("b", i)) for i in range(10)])  # the old values: all from the cache
        assert cache.hits - before == 10
        assert [bucket.lookup(i) for i in range(3)] == [(i, "b", i) for i in range(3)]
        await bucket.put((4, None))
        assert bucket.lookup(4) is None and cache.entries == 9
        bucket.reopen()
        assert cache.entries == 0 and cache.size_bytes == 0  # the old instance's rows are gone
        assert bucket.lookup(5) == (5, "b", 5) and cache.entries == 1  # filled on a miss
    finally:
        bucket.close()
    assert cache.size_bytes == 0


@pytest.mark.asyncio
async def test_a_bucket_that_opened_empty_reads_nothing_from_rocksdb_until_the_cache_drops_its_rows(
    tmp_path: Path,
) -> None:
    cache = RowCache(1 << 20)
    bucket = CachedBucket(tmp_path / "b", {}, cache)
    reads: list[int] = []
    try:
        assert cache.is_complete(bucket.kv._cache_token)
        read_rocksdb = bucket.kv._read_rocksdb
        with patch.object(bucket.kv, "_read_rocksdb", lambda keys: reads.append(len(keys)) or read_rocksdb(keys)):
            await bucket.put(*[(i, ("a", i)) for i in range(10)])  # new keys: known absent
            assert [bucket.lookup(i) for i in (3, 42)] == [(3, "a", 3), None]
            assert reads == []
            cache._rotate()
            cache._rotate()  # the rows are gone from the cache, not from RocksDB
            assert not cache.is_complete(bucket.kv._cache_token)
            assert bucket.lookup(3) == (3, "a", 3) and reads == [1]
        bucket.reopen()  # RocksDB holds rows now: the new instance is not complete
        assert not cache.is_complete(bucket.kv._cache_token)
        assert bucket.lookup(4) == (4, "a", 4)
    finally:
        bucket.close()


class NewCachedBucket(CachedBucket):
    """A cached bucket whose RocksDB is created by the cache-enabled open (a new table's bucket)."""

    def __init__(self, directory: Path, cache: RowCache, writer: ThreadPoolExecutor | None) -> None:
        self.writer = writer
        super().__init__(directory, {}, cache)
        self.close()
        shutil.rmtree(directory / "kv")
        self.kv = self._open()

    def _open(self) -> KvTablet:
        log = LogTablet.open(self.directory / "log", LOG_CONFIG)
        return KvTablet(self.directory / "kv", log, TableRowFormat(self.table), self.config, row_cache=self.cache,
                        writer=getattr(self, "writer", None))

    def rows_options(self) -> dict[str, str]:
        """The rows' column family's options in RocksDB's newest OPTIONS file (rewritten at every open)."""
        return rocksdb_settings(self.directory / "kv" / "rocksdb")

    def memtable(self) -> str:
        factory = self.rows_options()["memtable_factory"]
        return "vector" if "VectorRep" in factory else "skiplist" if "SkipList" in factory else factory

    def memtable_bloom_ratio(self) -> float:
        return float(self.rows_options()["memtable_prefix_bloom_size_ratio"])

    def level0_files(self) -> int:
        return int(self.kv._db.property("rocksdb.num-files-at-level0") or 0)


@pytest.mark.asyncio
@pytest.mark.parametrize("with_writer", [False, True])
@pytest.mark.parametrize("rocksdb_binding", BINDINGS, indirect=True)
async def test_a_new_bucket_writes_a_vector_memtable_until_its_reads_reach_rocksdb(
    tmp_path: Path, rocksdb_binding: str, with_writer: bool,
) -> None:
    """A new bucket whose cache holds every key reads nothing from RocksDB, so its rows go to RocksDB's
    vector memtable (an append per row, no bloom filter). Once the cache drops some of its rows, the first
    read of a key it lacks flushes and reopens RocksDB with the skip list and its bloom filter."""
    writer = ThreadPoolExecutor(1) if with_writer else None
    cache = RowCache(1 << 20)
    bucket = NewCachedBucket(tmp_path / "b", cache, writer)
    try:
        assert cache.is_complete(bucket.kv._cache_token)
        await bucket.put_acknowledged(*[(i, ("a", i)) for i in range(10)])
        await bucket.put_acknowledged(*[(i, ("b", i)) for i in range(5)])  # old values from the cache
        assert [bucket.lookup(i) for i in (3, 7, 42)] == [(3, "b", 3), (7, "a", 7), None]
        assert (bucket.memtable(), bucket.memtable_bloom_ratio(), bucket.level0_files()) == ("vector", 0.0, 0)

        cache._rotate()
        cache._rotate()  # the rows are gone from the cache, not from RocksDB
        assert bucket.lookup(8) == (8, "a", 8)  # read from RocksDB, reopened first
        assert bucket.memtable() == "skiplist" and bucket.memtable_bloom_ratio() == pytest.approx(0.1)
        assert bucket.level0_files() == 1, "the vector memtable was flushed before the reopen"
        await bucket.put_acknowledged((11, ("c", 11)), (8, None))
        assert [bucket.lookup(i) for i in (3, 8, 9, 11, 12)] == [(3, "b", 3), None, (9, "a", 9), (11, "c", 11), None]
        assert bucket.level0_files() == 1, "one switch only"

        bucket.reopen()  # an existing bucket opens with the skip list
        assert bucket.memtable() == "skiplist" and bucket.memtable_bloom_ratio() == pytest.approx(0.1)
        assert [bucket.lookup(i) for i in (4, 8, 11)] == [(4, "b", 4), None, (11, "c", 11)]
    finally:
        bucket.close()
        if writer is not None:
            writer.shutdown(wait=True)


READS = {
    "lookup of a key the cache dropped": lambda bucket: bucket.kv.lookup([bucket.key(2)]),
    "prefix lookup": lambda bucket: bucket.kv.prefix_lookup([bucket.key(2)], 10)[0],
    "limit scan": lambda bucket: bucket.kv.limit_scan(3)[0],
    "scan session": lambda bucket: list(bucket.kv.open_scan()[0])[:3],
}


@pytest.mark.asyncio
@pytest.mark.parametrize("read", list(READS))
async def test_every_read_of_rocksdb_leaves_the_vector_memtable_first(tmp_path: Path, read: str) -> None:
    """Reads that go past the row cache (single and multi-gets, prefix lookups, scans) find the rows the
    vector memtable held, through a database reopened with the skip list."""
    cache = RowCache(1 << 20)
    bucket = NewCachedBucket(tmp_path / "b", cache, None)
    try:
        await bucket.put_acknowledged(*[(i, ("a", i)) for i in range(5)])
        await bucket.put_acknowledged((2, ("b", 2)))
        if read.startswith("lookup"):
            cache._rotate()
            cache._rotate()
        assert bucket.memtable() == "vector"
        values = READS[read](bucket)
        if "scan" in read:  # the first three rows in key order (not id order: the keys are varints)
            rows = sorted((bucket.key(i), bucket.stored(i, "b" if i == 2 else "a", i)) for i in range(5))
            assert values == [stored for _key, stored in rows[:3]]
        else:
            assert values == [bucket.stored(2, "b", 2)]
        assert bucket.memtable() == "skiplist" and bucket.level0_files() == 1
    finally:
        bucket.close()


@pytest.mark.asyncio
async def test_a_lookup_read_off_the_loop_leaves_the_vector_memtable_first(tmp_path: Path) -> None:
    """A lookup of many keys the cache dropped reads RocksDB on a writer thread: the switch to the skip list
    (which closes and reopens the database) happens on the loop before that read, never under it."""
    cache = RowCache(1 << 20)
    writer = ThreadPoolExecutor(2)
    bucket = NewCachedBucket(tmp_path / "b", cache, writer)
    try:
        rows = kv_tablet.OFF_LOOP_READ_MIN_KEYS + 8
        await bucket.put_acknowledged(*[(i, ("a", i)) for i in range(rows)])
        cache._rotate()
        cache._rotate()
        assert bucket.memtable() == "vector"
        answer = bucket.kv.lookup_soon([bucket.key(i) for i in range(rows)])
        assert bucket.memtable() == "skiplist", "switched before the read left the loop"
        if rocksdb.binding() == "native":
            assert isinstance(answer, asyncio.Future)
        values = await answer if isinstance(answer, asyncio.Future) else answer
        assert values == [bucket.stored(i, "a", i) for i in range(rows)]
    finally:
        bucket.close()
        writer.shutdown(wait=True)


@pytest.mark.asyncio
async def test_a_read_waits_for_the_write_in_flight_before_it_reopens_rocksdb(tmp_path: Path) -> None:
    """The switch closes the database: a write of the bucket still running on the writer finishes first,
    and the read sees it."""
    writer = ThreadPoolExecutor(1)
    cache = RowCache(1 << 20)
    bucket = NewCachedBucket(tmp_path / "b", cache, writer)
    go = threading.Event()
    write = bucket.kv._write

    def held_write(*args: Any) -> None:
        assert go.wait(10), "the test never let the write go"
        write(*args)

    try:
        await bucket.put_acknowledged(*[(i, ("a", i)) for i in range(5)])
        with patch.object(bucket.kv, "_write", held_write):
            keys = [bucket.key(i) for i in (1, 7)]  # old values from the complete cache: RocksDB is not read
            result = bucket.kv.prepare_put(keys, [bucket.row(1, "b", 1), bucket.row(7, "b", 7)], 1, None, -1, -1, 0)
            acknowledged = bucket.kv.acknowledgement(result)
            await bucket.kv.log.wait_durable(result.next_offset)
            assert bucket.kv._applying is not None, "the write went to the writer, and waits there"
            assert bucket.memtable() == "vector"
            cache._rotate()
            cache._rotate()  # the next read of a key goes to RocksDB
            threading.Timer(0.2, go.set).start()
            assert bucket.lookup(7) == (7, "b", 7), "the read waited for the write, then reopened RocksDB"
        await acknowledged
        assert bucket.memtable() == "skiplist"
        assert [bucket.lookup(i) for i in (0, 1, 7)] == [(0, "a", 0), (1, "b", 1), (7, "b", 7)]
    finally:
        bucket.close()
        writer.shutdown(wait=True)


async def _bucket_whose_cache_dropped_its_rows(tmp_path: Path) -> NewCachedBucket:
    """A new bucket with rows 0-4 in its vector memtable, none in its cache: the next read reaches RocksDB."""
    cache = RowCache(1 << 20)
    bucket = NewCachedBucket(tmp_path / "b", cache, None)
    await bucket.put_acknowledged(*[(i, ("a", i)) for i in range(5)])
    cache._rotate()
    cache._rotate()
    assert bucket.memtable() == "vector"
    return bucket


class FlushFails:
    """A database whose next ``failures`` flushes fail (as on a full disk); the rest is the real one."""

    def __init__(self, database: Any, failures: int) -> None:
        self.database = database
        self.failures = failures

    def flush(self) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("IO error: No space left on device")
        self.database.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.database, name)


@pytest.mark.asyncio
async def test_a_failed_flush_fails_the_bucket_and_its_reopen_replays_the_changelog(tmp_path: Path) -> None:
    """A read of the vector memtable would sort it per key: a switch whose flush fails (a full disk) fails
    the bucket at once, with a clear error, and loses nothing."""
    bucket = await _bucket_whose_cache_dropped_its_rows(tmp_path)
    try:
        bucket.kv._db = FlushFails(bucket.kv._db, failures=2)  # type: ignore[assignment]
        with pytest.raises(KvStorageError, match="cannot switch to the skip list"):
            bucket.lookup(3)
        assert isinstance(bucket.kv.failed, OSError) and bucket.memtable() == "vector"
        with pytest.raises(KvStorageError, match="failed"):
            bucket.prepare((9, ("z", 9)))  # writes are refused, nothing is appended
        bucket.reopen()  # what the replica does with a failed bucket: its close cannot flush either
        assert bucket.kv.failed is None and bucket.memtable() == "skiplist"
        assert [bucket.lookup(i) for i in (0, 3, 4, 9)] == [(0, "a", 0), (3, "a", 3), (4, "a", 4), None]
    finally:
        bucket.close()


@pytest.mark.asyncio
async def test_a_failed_reopen_fails_the_bucket_until_it_is_reopened(tmp_path: Path) -> None:
    bucket = await _bucket_whose_cache_dropped_its_rows(tmp_path)
    try:
        failing_open = patch("strom.kv.kv_tablet.open_rocksdb", side_effect=OSError("IO error: No space left on device"))
        with failing_open, pytest.raises(KvStorageError, match="cannot switch to the skip list"):
            bucket.lookup(3)
        assert isinstance(bucket.kv.failed, OSError)
        with pytest.raises(KvStorageError, match="cannot switch to the skip list"):
            bucket.lookup(4)  # the database is closed: the same clear error, not a closed-database one
        with pytest.raises(KvStorageError, match="failed"):
            bucket.prepare((9, ("z", 9)))  # writes are refused, nothing is appended
        bucket.reopen()  # what the replica does with a failed bucket
        assert bucket.kv.failed is None and bucket.memtable() == "skiplist"
        assert [bucket.lookup(i) for i in (0, 3, 9)] == [(0, "a", 0), (3, "a", 3), None]
    finally:
        bucket.close()
