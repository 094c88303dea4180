"""A put's old values read ahead on a writer thread (strom/kv/read_ahead.py): the put plans from them
exactly the changelog it would plan reading on the loop, whatever was applied, buffered or dropped while
the read was in flight.

The writer holds the reads where a test needs an order of events (``HeldReads``), so nothing is timed.
The tests run on the native binding, the suite's; with rocksdict (whose close does not wait for a read on
another thread) nothing is read ahead, and the put reads on the loop as before (the last test).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest

from strom.kv import kv_tablet, read_ahead, rocksdb
from strom.kv.read_ahead import ReadAhead
from tests.kv.test_kv_tablet import NO_WRITER, T0_MS
from tests.kv.test_kv_tablet_writer import (
    HOLD_S,
    CachedWriterBucket,
    HeldReads,
    Record,
    random_put,
    write_and_reopen,
)

pytestmark = pytest.mark.asyncio

@contextlib.asynccontextmanager
async def held_bucket(tmp_path: Path, *, hold: bool = False, hold_after_read: bool = False,
                      wal: bool = False) -> AsyncIterator[tuple[HeldReads, CachedWriterBucket]]:
    """A bucket of 100 rows ``(id, "v1", id)`` in RocksDB and none in its cache (``wal``: a WAL changelog
    image), whose writer holds each read (before or ``hold_after_read``) until the test releases it
    (``hold``)."""
    held = HeldReads(hold_after_read=hold_after_read)
    if not hold:
        held.release.set()
    bucket = CachedWriterBucket(tmp_path, held)
    try:
        if wal:
            bucket.config = dataclasses.replace(bucket.config, changelog_image="WAL")
            bucket.reopen()
        await write_and_reopen(bucket, 100)
        yield held, bucket
    finally:
        held.release.set()
        bucket.close()
        held.shutdown(wait=True)


@pytest.fixture(autouse=True)
def native_binding() -> None:
    assert rocksdb.binding() == "native", "reads ahead need the native binding, which the suite builds"


def _put_args(bucket: CachedWriterBucket, records: list[Record]) -> tuple[list[bytes], list[bytes | None]]:
    keys = [bucket.key(id_) for id_, _value in records]
    return keys, [None if value is None else bucket.row(id_, *value) for id_, value in records]


async def _planned(bucket: CachedWriterBucket, keys: list[bytes], values: list[bytes | None],
                   ahead: ReadAhead | None, *, on_loop: bool = True) -> int:
    """The put planned from ``ahead`` once its read is done (``on_loop=False``: reading RocksDB on the loop
    fails the test), released, and acknowledged; its end offset."""
    try:
        if ahead is not None and ahead.reading is not None:
            await ahead.reading
        if on_loop:
            result = bucket.kv.prepare_put(keys, values, 1, None, NO_WRITER, -1, T0_MS, ahead=ahead)
        else:
            with patch.object(kv_tablet, "_read_database", side_effect=AssertionError("RocksDB read on the loop")):
                result = bucket.kv.prepare_put(keys, values, 1, None, NO_WRITER, -1, T0_MS, ahead=ahead)
    finally:
        if ahead is not None:
            ahead.release()
    await bucket.kv.acknowledgement(result)
    return result.next_offset


async def test_a_put_whose_cache_lacks_its_keys_reads_them_on_a_writer_thread(tmp_path: Path) -> None:
    """The read waits on the writer while the loop acknowledges another put; the put then plans from it
    without touching RocksDB on the loop, and its changelog holds each key's stored row as -U."""
    async with held_bucket(tmp_path, hold=True) as (held, bucket):
        keys, values = _put_args(bucket, [(id_, ("v2", -id_)) for id_ in range(100)])
        ahead = bucket.kv.read_ahead(keys, values, None)
        assert ahead is not None and ahead.reading is not None
        assert await asyncio.to_thread(held.holding.wait, HOLD_S)
        await bucket.put_acknowledged((500, ("other", 1)))  # the loop goes on meanwhile
        assert not ahead.reading.done()
        held.release.set()
        end = await _planned(bucket, keys, values, ahead, on_loop=False)
        assert bucket.kv.reads_ahead.read == 1
        assert [(change, row) for _offset, change, row in bucket.changelog(end - 200)] == [
            entry for id_ in range(100)
            for entry in (("UPDATE_BEFORE", (id_, "v1", id_)), ("UPDATE_AFTER", (id_, "v2", -id_)))
        ]
        assert bucket.kv.row_count == 101


async def test_writes_applied_while_the_read_is_in_flight_are_laid_over_what_it_read(
        tmp_path: Path) -> None:
    """The read has RocksDB's rows, then (before its result reaches the loop) a put updates key 5 and deletes
    key 6, and is applied: it left the pre-write buffer. The read-ahead put must still compare against them:
    -U of key 5's new row, and +I for key 6."""
    async with held_bucket(tmp_path, hold=True, hold_after_read=True) as (held, bucket):
        keys, values = _put_args(bucket, [(id_, ("v3", 3)) for id_ in range(100)])
        ahead = bucket.kv.read_ahead(keys, values, None)
        assert ahead is not None and ahead.reading is not None
        assert await asyncio.to_thread(held.holding.wait, HOLD_S)  # read: key 5 and key 6 as "v1"
        await bucket.put_acknowledged((5, ("v2", -5)), (6, None))
        assert bucket.kv.buffered_bytes == 0
        held.release.set()
        end = await _planned(bucket, keys, values, ahead, on_loop=False)
        changes = {row[0]: (change, row) for _offset, change, row in bucket.changelog(end - 199)
                   if change != "UPDATE_AFTER"}
        assert changes[5] == ("UPDATE_BEFORE", (5, "v2", -5))
        assert changes[6] == ("INSERT", (6, "v3", 3))
        assert changes[7] == ("UPDATE_BEFORE", (7, "v1", 7))
        assert bucket.kv.row_count == 100
        assert bucket.kv.reads_ahead.stale == 0


async def test_a_read_that_would_keep_too_many_applied_writes_is_dropped_and_the_put_reads_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_ahead, "RETAINED_KEYS_MAX", 1)
    async with held_bucket(tmp_path, hold=True, hold_after_read=True) as (held, bucket):
        keys, values = _put_args(bucket, [(id_, ("v3", 3)) for id_ in range(100)])
        ahead = bucket.kv.read_ahead(keys, values, None)
        assert ahead is not None
        assert await asyncio.to_thread(held.holding.wait, HOLD_S)
        await bucket.put_acknowledged((5, ("v2", -5)), (6, None))  # two keys kept: past the bound
        assert bucket.kv.reads_ahead.stale == 1
        held.release.set()
        end = await _planned(bucket, keys, values, ahead)  # planned from a read on the loop
        changes = {row[0]: change for _offset, change, row in bucket.changelog(end - 199) if change != "UPDATE_AFTER"}
        assert changes[5] == "UPDATE_BEFORE" and changes[6] == "INSERT"
        assert bucket.kv.row_count == 100


@dataclasses.dataclass
class Applied:
    next_offset: int
    keys: list[bytes]
    values: list[bytes | None]


async def test_the_bound_on_kept_writes_first_forgets_what_no_read_in_flight_needs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads overlap without end under a steady load, so the writes kept for them are pruned to those above
    the lowest floor in flight before any read is dropped; a key's latest write since a read's floor is laid
    over what it read, and one from before its floor is not needed."""
    monkeypatch.setattr(read_ahead, "RETAINED_KEYS_MAX", 4)
    loop = asyncio.get_running_loop()
    reads = read_ahead.ReadAheads()
    first = reads.begin([b"a"], 0, loop.create_future())
    reads.applied([Applied(10, [b"a", b"b", b"c"], [b"a1", b"b1", None])])
    second = reads.begin([b"a", b"c", b"d", b"e"], 10, loop.create_future())
    first.release()
    reads.applied([Applied(20, [b"d", b"e"], [b"d2", None])])  # 5 keys kept: those below floor 10 go
    assert reads.stale == 0
    second.values = [b"a1", None, b"d0", b"e0"]  # what the read found: the batch ending at 10 included
    assert reads.take(second, second.keys) == [b"a1", None, b"d2", None]
    reads.applied([Applied(30, [b"f", b"g", b"h", b"i", b"j"], [b"x"] * 5)])  # all above the floor: dropped
    assert reads.stale == 1


async def test_a_read_of_another_batch_or_of_a_tablet_since_reopened_is_not_used(
        tmp_path: Path) -> None:
    async with held_bucket(tmp_path) as (_held, bucket):
        keys, values = _put_args(bucket, [(id_, ("v2", 2)) for id_ in range(100)])
        ahead = bucket.kv.read_ahead(keys[:50], values[:50], None)  # a read of other keys than the put's
        stale = bucket.kv.read_ahead(keys, values, None)  # used below, after the tablet reopened
        assert ahead is not None and stale is not None
        await asyncio.gather(ahead.reading, stale.reading)
        with patch.object(kv_tablet, "_read_database", wraps=kv_tablet._read_database) as read:
            await _planned(bucket, keys, values, ahead)
        assert read.call_count == 1  # the put read for itself
        assert stale.values is not None
        bucket.reopen()  # a new tablet (the replica reopened its state): the read was another's
        _keys, values3 = _put_args(bucket, [(id_, ("v3", 3)) for id_ in range(100)])
        with patch.object(kv_tablet, "_read_database", wraps=kv_tablet._read_database) as read:
            end = await _planned(bucket, keys, values3, stale)
        assert read.call_count == 1
        assert [row for _offset, change, row in bucket.changelog(end - 200) if change == "UPDATE_BEFORE"] == [
            (id_, "v2", 2) for id_ in range(100)]


async def test_a_put_whose_keys_the_cache_holds_reads_nothing_ahead(tmp_path: Path) -> None:
    """Where the row cache holds all but a few of a put's keys, nothing is read ahead: the put reads the
    cache at its turn, and no batch applied meanwhile is kept for it to lay over its values (an overlay
    that grew with the requests in flight and cost a loaded loop 43 %)."""
    async with held_bucket(tmp_path) as (_held, bucket):
        keys, values = _put_args(bucket, [(id_, ("v2", 2)) for id_ in range(100)])
        ahead = bucket.kv.read_ahead(keys, values, None)  # cold: read on the writer
        assert ahead is not None
        await ahead.reading
        await _planned(bucket, keys, values, ahead, on_loop=False)  # the cache holds the keys now
        few_missing = [*range(100), *range(1_000, 1_000 + kv_tablet.OFF_LOOP_READ_MIN_KEYS - 1)]
        keys3, values3 = _put_args(bucket, [(id_, ("v3", 3)) for id_ in few_missing])
        assert bucket.kv.read_ahead(keys3, values3, None) is None
        await bucket.put_acknowledged((5, ("v4", 4)))  # applied before the put's turn
        assert bucket.kv.reads_ahead.read == 1
        end = await _planned(bucket, keys3, values3, None)
        before = {row[0]: row for _offset, change, row in bucket.changelog(end - 200) if change == "UPDATE_BEFORE"}
        assert before[5] == (5, "v4", 4) and before[6] == (6, "v2", 2)


async def test_a_wal_table_reads_no_old_values_ahead_unless_its_put_needs_them(tmp_path: Path) -> None:
    async with held_bucket(tmp_path, wal=True) as (_held, bucket):
        keys, values = _put_args(bucket, [(id_, ("v2", 2)) for id_ in range(100)])
        assert bucket.kv.read_ahead(keys, values, None) is None  # +U without reading
        partial = bucket.kv.read_ahead(keys, values, [0, 2])  # a partial update merges with the stored row
        assert partial is not None and partial.reading is not None
        await partial.reading
        rows = [bucket.row(id_, None, -id_) for id_ in range(100)]
        result = bucket.kv.prepare_put(keys, rows, 1, [0, 2], NO_WRITER, -1, T0_MS, ahead=partial)
        partial.release()
        await bucket.kv.acknowledgement(result)
        assert bucket.lookup(42) == (42, "v1", -42)


async def test_a_wal_table_reads_its_deletes_old_values_ahead_all_at_once(tmp_path: Path) -> None:
    """A WAL image's deletes are -D of the stored row: a batch of them reads their old values on the writer,
    in one read of each key once, and upserts beside them read nothing. With deletes ignored nothing is
    read at all."""
    async with held_bucket(tmp_path, wal=True) as (_held, bucket):
        records: list[Record] = [*((id_, None) for id_ in range(0, 120, 2)), *((id_, ("new", id_)) for id_ in range(1, 80, 2)),
                                 (4, None), (1, None)]  # 4 deleted twice; 1 deleted after its upsert
        keys, values = _put_args(bucket, records)
        with patch.object(kv_tablet, "_read_database", wraps=kv_tablet._read_database) as read:
            ahead = bucket.kv.read_ahead(keys, values, None)
            assert ahead is not None and ahead.reading is not None
            await ahead.reading
        (_database, read_keys), _ = read.call_args
        assert read_keys == [bucket.key(id_) for id_ in range(0, 120, 2)]  # the deleted keys, once each
        end = await _planned(bucket, keys, values, ahead, on_loop=False)
        changes = [(change, row) for _offset, change, row in bucket.changelog(end - 91)]
        assert changes == [*(("DELETE", (id_, "v1", id_)) for id_ in range(0, 100, 2)),
                           *(("UPDATE_AFTER", (id_, "new", id_)) for id_ in range(1, 80, 2)),
                           ("DELETE", (1, "new", 1))]
        bucket.config = dataclasses.replace(bucket.config, delete_behavior="IGNORE")
        bucket.reopen()
        assert bucket.kv.read_ahead(keys, values, None) is None


class SlowReads(ThreadPoolExecutor):
    """A writer whose reads ahead each take up to 3 ms longer, at random, while writes pass: more puts
    are applied while a read is in flight, and reads end out of the order they began."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(4, thread_name_prefix="test-slow-reads")
        self.rng = rng

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if fn is not kv_tablet._read_database:
            return super().submit(fn, *args, **kwargs)
        delay = self.rng.choice((0.0, 0.0, 0.001, 0.003))

        def slow() -> Any:
            found = fn(*args, **kwargs)
            time.sleep(delay)
            return found

        return super().submit(slow)


async def test_pipelined_puts_read_ahead_in_arrival_order_follow_the_sequential_changelog(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Puts of overlapping keys and deletes, each reading ahead as it arrives and planned in arrival order
    once its read is done (as the tablet service runs them), beside group commits and applies, with a row
    cache of a few rows: the changelog is exactly the one of the same writes done one at a time."""
    monkeypatch.setattr(kv_tablet, "OFF_LOOP_READ_MIN_KEYS", 1)  # every miss is read on a thread
    rng = random.Random(11)
    key_count = 60
    writer = SlowReads(random.Random(12))
    bucket = CachedWriterBucket(tmp_path, writer, cache_bytes=2_000)
    try:
        model: dict[int, tuple[Any, ...] | None] = {}
        expected: list[tuple[str, tuple[Any, ...]]] = []
        turn: asyncio.Future[None] | None = None
        puts = []
        for round_ in range(150):
            records = random_put(rng, round_, key_count, model, expected, sizes=(1, 3, 40), deletes=0.25)
            keys, values = _put_args(bucket, records)
            ahead = bucket.kv.read_ahead(keys, values, None)
            mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def put(keys: list[bytes], values: list[bytes | None], ahead: ReadAhead | None,
                          before: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> int:
                if before is not None:
                    await before
                try:
                    if ahead is not None and ahead.reading is not None:
                        await ahead.reading
                    result = bucket.kv.prepare_put(keys, values, 1, None, NO_WRITER, -1, T0_MS, ahead=ahead)
                finally:
                    if ahead is not None:
                        ahead.release()
                    mine.set_result(None)
                await bucket.kv.acknowledgement(result)
                return result.next_offset

            puts.append(asyncio.ensure_future(put(keys, values, ahead, turn, mine)))
            turn = mine
            if rng.random() < 0.3:
                await asyncio.sleep(rng.choice((0, 0, 0.002)))  # fsyncs, group commits and writes go on
            if rng.random() < 0.05:
                await asyncio.gather(*puts)  # let every write reach RocksDB now and then
        await asyncio.gather(*puts)
        assert [(change, row) for _offset, change, row in bucket.changelog()] == expected
        assert {id_: bucket.lookup(id_) for id_ in range(key_count)} == {id_: model.get(id_) for id_ in range(key_count)}
        assert bucket.kv.reads_ahead.read > 50
    finally:
        bucket.close()
        writer.shutdown(wait=True)


async def test_with_rocksdict_nothing_is_read_ahead(tmp_path: Path) -> None:
    before = rocksdb.binding()
    rocksdb.use_binding("rocksdict")
    try:
        async with held_bucket(tmp_path) as (_held, bucket):
            keys, values = _put_args(bucket, [(id_, ("v2", 2)) for id_ in range(100)])
            assert bucket.kv.read_ahead(keys, values, None) is None
            end = await _planned(bucket, keys, values, None)
            assert [change for _offset, change, _row in bucket.changelog(end - 200)] == [
                "UPDATE_BEFORE", "UPDATE_AFTER"] * 100
    finally:
        rocksdb.use_binding(before)
