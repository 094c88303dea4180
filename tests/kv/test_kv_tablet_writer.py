"""KvTablet with a RocksDB writer: committed batches are written off the event loop, puts are answered
once their write is done, the pre-write buffer covers the write in flight, and a checkpoint holds exactly
the offset it records."""

from __future__ import annotations

import asyncio
import random
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from strom.errors import KvStorageError
from strom.kv.kv_tablet import APPLIED_OFFSET_KEY, ROW_COUNT_KEY, KvTablet
from strom.kv.rocksdb import open_rocksdb
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
        model: dict[int, tuple[int, str, int] | None] = {}
        expected: list[tuple[str, tuple[Any, ...]]] = []
        puts = []
        for round_ in range(150):
            records: list[tuple[int, tuple[str | None, int | None] | None]] = []
            for _ in range(rng.choice((1, 2, 40))):  # small batches beside large ones
                id_ = rng.randrange(keys)
                value = None if rng.random() < 0.3 else (f"r{round_}", rng.randrange(100))
                records.append((id_, value))
                old = model.get(id_)
                if value is None:
                    if old is not None:
                        expected.append(("DELETE", old))
                    model[id_] = None
                    continue
                new_row = (id_, *value)
                expected += [("INSERT", new_row)] if old is None else [("UPDATE_BEFORE", old), ("UPDATE_AFTER", new_row)]
                model[id_] = new_row  # type: ignore[assignment]
            puts.append(asyncio.ensure_future(bucket.put_acknowledged(*records)))
            if rng.random() < 0.3:
                await asyncio.sleep(0)  # let a group commit and a write happen between some of them
        await asyncio.gather(*puts)
        assert [(change, row) for _offset, change, row in bucket.changelog()] == expected
        assert {id_: bucket.lookup(id_) for id_ in range(keys)} == {id_: model.get(id_) for id_ in range(keys)}
    finally:
        bucket.close()


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
