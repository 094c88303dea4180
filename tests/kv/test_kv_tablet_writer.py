"""KvTablet with a RocksDB writer: committed batches are written off the event loop, puts are answered
once their write is done, the pre-write buffer covers the write in flight, and a checkpoint holds exactly
the offset it records."""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from strom.errors import KvStorageError
from strom.kv import kv_tablet
from strom.kv.kv_tablet import APPLIED_OFFSET_KEY, ROW_COUNT_KEY, KvTablet
from strom.kv.rocksdb import open_rocksdb
from strom.kv.row_cache import RowCache
from strom.log.log_tablet import LogTablet
from tests.kv.test_kv_tablet import LOG_CONFIG, Bucket

pytestmark = pytest.mark.asyncio


class WriterBucket(Bucket):
    def __init__(self, directory: Path, writer: ThreadPoolExecutor) -> None:
        self.writer = writer
        super().__init__(directory)

    def _open(self) -> KvTablet:
        log = LogTablet.open(self.directory / "log", LOG_CONFIG)
        return KvTablet(self.directory / "kv", log, self.format, self.config, writer=self.writer)


@pytest.fixture
def writer() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(2, thread_name_prefix="test-rocksdb-write")
    yield pool
    pool.shutdown(wait=True)


async def test_a_put_is_answered_once_its_write_is_done(tmp_path: Path, writer: ThreadPoolExecutor,
                                                        rocksdb_binding: str) -> None:
    bucket = WriterBucket(tmp_path, writer)
    try:
        puts = [bucket.put_acknowledged(*((i * 100 + j, (f"n{i}", j)) for j in range(100))) for i in range(20)]
        ends = await asyncio.gather(*puts)
        assert bucket.kv.applied_offset == max(ends) == 2_000
        assert bucket.kv.row_count == 2_000
        assert bucket.lookup(1_999) == (1_999, "n19", 99)
        # the next put reads the old values the writer wrote (or still holds in the pre-write buffer)
        await asyncio.gather(*(bucket.put_acknowledged((i, ("again", -i))) for i in range(0, 2_000, 100)))
        assert [entry[1] for entry in bucket.changelog(2_000)] == ["UPDATE_BEFORE", "UPDATE_AFTER"] * 20
        assert bucket.lookup(100) == (100, "again", -100)
    finally:
        bucket.close()
    reopened = Bucket(tmp_path)  # without a writer: the same state, nothing to replay past it
    try:
        assert reopened.kv.applied_offset == 2_040
        assert reopened.lookup(1_900) == (1_900, "again", -1_900)
    finally:
        reopened.close()


async def test_puts_overlapping_a_write_in_flight_see_its_values(tmp_path: Path, writer: ThreadPoolExecutor,
                                                                rocksdb_binding: str) -> None:
    """Writes of the same keys one after another without waiting: each changelog record compares against the
    one before it, whether that one is in RocksDB, in flight or still in the buffer."""
    bucket = WriterBucket(tmp_path, writer)
    try:
        puts = [asyncio.ensure_future(bucket.put_acknowledged(*((k, ("v", r)) for k in range(50))))
                for r in range(30)]
        await asyncio.gather(*puts)
        changes = [entry[1] for entry in bucket.changelog()]
        assert changes == ["INSERT"] * 50 + ["UPDATE_BEFORE", "UPDATE_AFTER"] * 50 * 29
        assert bucket.lookup(7) == (7, "v", 29)
        assert bucket.kv.row_count == 50
    finally:
        bucket.close()


async def test_pipelined_puts_and_deletes_of_overlapping_keys_follow_the_sequential_changelog(
        tmp_path: Path, writer: ThreadPoolExecutor, rocksdb_binding: str) -> None:
    """Many puts in flight at once, each writing and deleting keys that earlier ones wrote (some twice in
    one batch), while group commits apply some of them and leave the rest pending: the changelog is exactly
    the one of the same writes done one at a time, and RocksDB ends with each key's last write."""
    rng = random.Random(7)
    keys = 60
    bucket = WriterBucket(tmp_path, writer)
    try:
        model: dict[int, tuple[Any, ...] | None] = {}
        expected: list[tuple[str, tuple[Any, ...]]] = []
        puts = []
        for round_ in range(150):
            records = random_put(rng, round_, keys, model, expected, sizes=(1, 2, 40), deletes=0.3)
            puts.append(asyncio.ensure_future(bucket.put_acknowledged(*records)))
            if rng.random() < 0.3:
                await asyncio.sleep(0)  # let a group commit and a write happen between some of them
        await asyncio.gather(*puts)
        assert [(change, row) for _offset, change, row in bucket.changelog()] == expected
        assert {id_: bucket.lookup(id_) for id_ in range(keys)} == {id_: model.get(id_) for id_ in range(keys)}
    finally:
        bucket.close()


Record = tuple[int, tuple[str | None, int | None] | None]
"""An upsert ``(id, (name, score))`` or a delete ``(id, None)``."""


def random_put(rng: random.Random, round_: int, key_count: int, model: dict[int, tuple[Any, ...] | None],
               expected: list[tuple[str, tuple[Any, ...]]], *, sizes: tuple[int, ...], deletes: float) -> list[Record]:
    """A put of random upserts and deletes of ``key_count`` keys (some twice in the batch; its size one of
    ``sizes``); ``model`` (each key's row) and ``expected`` (the changelog) advance as the same writes done
    one at a time would make them."""
    records: list[Record] = []
    for _ in range(rng.choice(sizes)):
        id_ = rng.randrange(key_count)
        value = None if rng.random() < deletes else (f"r{round_}", rng.randrange(100))
        records.append((id_, value))
        old = model.get(id_)
        if value is None:
            if old is not None:
                expected.append(("DELETE", old))
            model[id_] = None
            continue
        new_row = (id_, *value)
        expected += [("INSERT", new_row)] if old is None else [("UPDATE_BEFORE", old), ("UPDATE_AFTER", new_row)]
        model[id_] = new_row
    return records


async def test_a_checkpoint_records_exactly_what_it_holds(tmp_path: Path, writer: ThreadPoolExecutor,
                                                          rocksdb_binding: str) -> None:
    bucket = WriterBucket(tmp_path / "bucket", writer)
    try:
        load = asyncio.gather(*(bucket.put_acknowledged(*((i * 50 + j, ("x", j)) for j in range(50)))
                                for i in range(40)))
        checkpoints = []
        for index in range(5):
            await asyncio.sleep(0)
            checkpoints.append(await bucket.kv.create_checkpoint_settled(tmp_path / f"checkpoint-{index}"))
        await load
        for checkpoint in checkpoints:
            db = open_rocksdb(checkpoint.directory, read_only=True)
            try:
                assert struct.unpack("<q", db.get_meta(APPLIED_OFFSET_KEY) or bytes(8))[0] == checkpoint.log_offset
                assert struct.unpack("<q", db.get_meta(ROW_COUNT_KEY) or bytes(8))[0] == checkpoint.row_count
                rows = db.iterator()
                held = len(rows.next(10_000))
                rows.close()
                assert held == checkpoint.row_count
            finally:
                db.close()
        assert bucket.kv.applied_offset == 2_000  # the writes held back during each checkpoint went on after it
    finally:
        bucket.close()


@pytest.mark.timeout(60)
async def test_a_checkpoint_taken_between_a_write_ending_and_its_accounting_waits_for_it(
        tmp_path: Path, rocksdb_binding: str) -> None:
    """The write in flight can be done while its accounting (a callback the loop runs next) is still queued:
    the checkpoint yields to the loop for it instead of spinning on the done write, which never lets it run."""
    with ThreadPoolExecutor(1, thread_name_prefix="test-rocksdb-write") as one_writer:
        bucket = WriterBucket(tmp_path / "bucket", one_writer)
        release = threading.Event()
        one_writer.submit(release.wait, 60)  # the writer is busy: the bucket's write waits behind this
        try:
            put = asyncio.ensure_future(bucket.put_acknowledged(*((j, ("x", j)) for j in range(50))))
            for _ in range(1_000):  # until the put is committed (its fsync on another thread) and its write queued
                if bucket.kv._applying is not None:
                    break
                await asyncio.sleep(0.01)
            write = bucket.kv._applying
            assert write is not None
            release.set()
            one_writer.submit(lambda: None).result()  # the one writer thread has finished the write (FIFO)
            await asyncio.sleep(0)  # the loop marks the write done now and queues its accounting behind this task
            assert write.done() and bucket.kv._applying is write
            checkpoint = await bucket.kv.create_checkpoint_settled(tmp_path / "checkpoint")
            assert (checkpoint.log_offset, checkpoint.row_count) == (50, 50)
            await put
        finally:
            release.set()
            bucket.close()


class FailingWrites:
    """A database whose writes fail from now on (a full disk), reads untouched."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def write(self, *args: Any) -> None:
        raise OSError("IO error: No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def test_a_failed_write_fails_the_puts_it_held_and_refuses_new_ones(
    tmp_path: Path, writer: ThreadPoolExecutor, rocksdb_binding: str
) -> None:
    bucket = WriterBucket(tmp_path, writer)
    try:
        await bucket.put_acknowledged((1, ("kept", 1)))
        real = bucket.kv._db
        bucket.kv._db = FailingWrites(real)  # type: ignore[assignment]
        with pytest.raises(KvStorageError, match="No space left"):
            await bucket.put_acknowledged((2, ("lost", 2)))
        assert bucket.kv.failed is not None
        with pytest.raises(KvStorageError, match="writes resume"):
            await bucket.put_acknowledged((3, ("refused", 3)))
        assert bucket.lookup(1) == (1, "kept", 1)
        assert bucket.lookup(2) is None
        bucket.kv._db = real  # type: ignore[assignment]
    finally:
        bucket.close()
    reopened = Bucket(tmp_path)  # the changelog has the committed put: the reopen replays it
    try:
        assert reopened.lookup(2) == (2, "lost", 2)
        assert reopened.lookup(3) is None
    finally:
        reopened.close()


# ---- lookups that read RocksDB off the loop ----

class CachedWriterBucket(WriterBucket):
    """A bucket with a writer and a row cache of its own (a tablet server's setting)."""

    def __init__(self, directory: Path, writer: ThreadPoolExecutor, cache_bytes: int = 1 << 20) -> None:
        self.cache = RowCache(cache_bytes)
        super().__init__(directory, writer)

    def _open(self) -> KvTablet:
        log = LogTablet.open(self.directory / "log", LOG_CONFIG)
        return KvTablet(self.directory / "kv", log, self.format, self.config, row_cache=self.cache,
                        writer=self.writer)

    def keys(self, ids: range | list[int]) -> list[bytes]:
        return [self.key(id_) for id_ in ids]

    def decoded(self, values: list[bytes | None]) -> list[tuple[Any, ...] | None]:
        return [None if value is None else self.format.decode_stored(value) for value in values]


class HeldReads(ThreadPoolExecutor):
    """A writer whose lookup reads (``kv_tablet._read_database``) wait for :attr:`release`, either before
    they read or after, so that a test can interleave other work with a read in flight; writes pass."""

    def __init__(self, *, hold_after_read: bool) -> None:
        super().__init__(4, thread_name_prefix="test-held-reads")
        self.hold_after_read = hold_after_read
        self.release = threading.Event()
        self.holding = threading.Event()
        """Set once a read waits for the release."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if fn is not kv_tablet._read_database:
            return super().submit(fn, *args, **kwargs)

        def held() -> Any:
            if not self.hold_after_read:
                self.holding.set()
                self.release.wait(HOLD_S)
            try:
                return fn(*args, **kwargs)
            finally:
                if self.hold_after_read:
                    self.holding.set()
                    self.release.wait(HOLD_S)

        return super().submit(held)


HOLD_S = 30.0
"""The longest a held read waits (a failing test must not hang)."""


async def write_and_reopen(bucket: CachedWriterBucket, count: int) -> None:
    """``count`` rows ``(id, "v1", id)`` applied, then the tablet reopened: RocksDB holds them and the row
    cache (a new instance's) none, so lookups of them miss it."""
    await bucket.put_acknowledged(*((id_, ("v1", id_)) for id_ in range(count)))
    bucket.reopen()


async def test_a_lookup_that_misses_the_row_cache_reads_rocksdb_off_the_loop(
        tmp_path: Path, writer: ThreadPoolExecutor, rocksdb_binding: str) -> None:
    """With the native binding a lookup whose cache misses are many answers with a future, its values those
    the loop would read; what it read fills the cache, so the same lookup again is answered at once. With
    rocksdict (whose close does not wait for a read in another thread) it reads on the loop as before."""
    bucket = CachedWriterBucket(tmp_path, writer)
    try:
        await write_and_reopen(bucket, 200)
        keys = bucket.keys([*range(150, 200), *range(1_000, 1_000 + kv_tablet.OFF_LOOP_READ_MIN_KEYS - 1)])
        answer = bucket.kv.lookup_soon(keys)
        if rocksdb_binding == "native":
            assert isinstance(answer, asyncio.Future)
            values = await answer
        else:
            assert isinstance(answer, list)
            values = answer
        expected = [(id_, "v1", id_) for id_ in range(150, 200)] + [None] * (kv_tablet.OFF_LOOP_READ_MIN_KEYS - 1)
        assert bucket.decoded(values) == expected
        # the 50 rows are cached now; the absent keys, fewer than the threshold, are read on the loop
        again = bucket.kv.lookup_soon(keys)
        assert isinstance(again, list)
        assert bucket.decoded(again) == expected
        # a few misses are read on the loop too, and the cache bypass (no cache entry read) as well
        assert bucket.decoded(bucket.kv.lookup_soon(bucket.keys([3, 4]))) == [(3, "v1", 3), (4, "v1", 4)]  # type: ignore[arg-type]
    finally:
        bucket.close()


@contextlib.asynccontextmanager
async def lookup_of_held_reads(tmp_path: Path, *, hold_after_read: bool) -> AsyncIterator[
        tuple[HeldReads, CachedWriterBucket, list[bytes | None] | asyncio.Future[list[bytes | None]]]]:
    """A bucket of 100 rows none of which its cache holds, its writer holding lookup reads, and the answer
    of a lookup of all 100 (a future with the native binding, whose read then waits for the release)."""
    held = HeldReads(hold_after_read=hold_after_read)
    bucket = CachedWriterBucket(tmp_path, held)
    try:
        await write_and_reopen(bucket, 100)
        yield held, bucket, bucket.kv.lookup_soon(bucket.keys(range(100)))
    finally:
        held.release.set()
        bucket.close()
        held.shutdown(wait=True)


async def test_a_read_off_the_loop_leaves_the_cache_to_a_write_that_passed_it(tmp_path: Path,
                                                                              rocksdb_binding: str) -> None:
    """A lookup reads key 5 from RocksDB; before its answer reaches the loop, a put of key 5 is applied and
    written through the cache. The lookup may answer the value it read, but it must not put that older
    value into the cache: every later read of the key, lookups and the next put's changelog alike, would
    see it."""
    async with lookup_of_held_reads(tmp_path, hold_after_read=True) as (held, bucket, answer):
        if rocksdb_binding == "native":
            assert isinstance(answer, asyncio.Future)
            assert await asyncio.to_thread(held.holding.wait, HOLD_S)  # read, its answer not yet on the loop
            await bucket.put_acknowledged((5, ("v2", -5)))  # applied and written through meanwhile
            held.release.set()
            values = await answer
            assert bucket.decoded(values)[5] in ((5, "v1", 5), (5, "v2", -5))
        else:
            assert isinstance(answer, list)
            await bucket.put_acknowledged((5, ("v2", -5)))
        assert bucket.lookup(5) == (5, "v2", -5)
        assert bucket.lookup(6) == (6, "v1", 6)
        await bucket.put_acknowledged((5, ("v3", 0)))
        assert [row for _offset, _change, row in bucket.changelog()][-2:] == [(5, "v2", -5), (5, "v3", 0)]


async def test_a_lookup_whose_tablet_closes_before_its_read_fails_with_a_storage_error(
        tmp_path: Path, rocksdb_binding: str) -> None:
    """The bucket closes (leadership moved, the table dropped) while its read waits for a thread: the read
    then finds the database closed, and the lookup fails with KvStorageError instead of crashing or
    answering from a closed database."""
    async with lookup_of_held_reads(tmp_path, hold_after_read=False) as (held, bucket, answer):
        if rocksdb_binding == "native":
            assert isinstance(answer, asyncio.Future)
            assert await asyncio.to_thread(held.holding.wait, HOLD_S)
            bucket.close()
            held.release.set()
            with pytest.raises(KvStorageError, match="closed"):
                await answer
        else:
            assert bucket.decoded(answer)[7] == (7, "v1", 7)  # type: ignore[arg-type]
            bucket.close()
        with pytest.raises(KvStorageError, match="closed"):
            bucket.kv.lookup_soon(bucket.keys(range(100)))
