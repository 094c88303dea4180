"""KvTablet on real RocksDB and real log files: changelogs, the pre-write buffer, and crash recovery."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from strom.errors import (
    DeletionDisabledError,
    DuplicateSequenceError,
    InvalidTargetColumnError,
    RequestTimeoutError,
)
from strom.ids import TablePath
from strom.kv.kv_tablet import KvConfig, KvTablet
from strom.kv.rocksdb import RocksDbOptions, open_rocksdb
from strom.kv.row_format import TableRowFormat
from strom.log.log_tablet import LogConfig, LogTablet
from strom.metadata.table_info import TableInfo
from strom.records import log_batch
from strom.records.arrow_compression import ArrowCompression, compressed_message
from strom.records.compacted import CompactedRowEncoder
from strom.records.kv_batch import SCHEMA_ID
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import BigIntType, IntType, StringType

LOG_CONFIG = LogConfig(segment_size_bytes_max=1 << 30, flush_interval_messages=1, writer_expiration_ms=60_000)
T0_MS = 1_700_000_000_000
NO_WRITER = -1


def table_info(properties: dict[str, str] | None = None, *, name_nullable: bool = True) -> TableInfo:
    columns = [("id", IntType()), ("name", StringType(nullable=name_nullable)), ("score", BigIntType())]
    schema = Schema.of(columns, primary_key=["id"])
    descriptor = TableDescriptor(schema, bucket_count=1, properties=properties or {})
    return TableInfo(7, TablePath("db", "scores"), 1, descriptor.to_json(), T0_MS, T0_MS)


class Bucket:
    """A KvTablet over its LogTablet in one directory, reopenable like a restarted server does it."""

    def __init__(self, directory: Path, properties: dict[str, str] | None = None, *, name_nullable: bool = True) -> None:
        self.directory = directory
        self.table = table_info(properties, name_nullable=name_nullable)
        self.format = TableRowFormat(self.table)
        self.encoder = CompactedRowEncoder(self.format.row_type)
        properties = self.table.properties
        self.config = KvConfig(
            rocksdb=RocksDbOptions(block_cache_size_bytes=1 << 20),
            delete_behavior=properties.get("table.delete.behavior", "ALLOW"),
            changelog_image=properties.get("table.changelog.image", "FULL"),
        )
        self.kv = self._open()

    def _open(self) -> KvTablet:
        log = LogTablet.open(self.directory / "log", LOG_CONFIG)
        return KvTablet(self.directory / "kv", log, self.format, self.config)

    def close(self) -> None:
        self.kv.close()
        self.kv.log.close()

    def reopen(self) -> KvTablet:
        self.close()
        self.kv = self._open()
        return self.kv

    def key(self, id_: int) -> bytes:
        return self.format.encode_key([id_, None, None])

    def row(self, id_: int, name: str | None, score: int | None) -> bytes:
        """A row as a client sends it in PutKv (no schema id)."""
        return self.encoder.encode([id_, name, score])

    def stored(self, id_: int, name: str | None, score: int | None) -> bytes:
        return SCHEMA_ID.pack(1) + self.row(id_, name, score)

    def prepare(
        self,
        *records: tuple[int, tuple[str | None, int | None] | None],
        target_columns: list[int] | None = None,
        writer_id: int = NO_WRITER,
        sequence: int = -1,
    ) -> int:
        """Prepare a put of ``(id, (name, score))`` upserts and ``(id, None)`` deletes; returns its end offset."""
        keys = [self.key(id_) for id_, _value in records]
        values = [None if value is None else self.row(id_, *value) for id_, value in records]
        result = self.kv.prepare_put(keys, values, 1, target_columns, writer_id, sequence, T0_MS)
        return result.next_offset

    async def put_acknowledged(self, *records: tuple[int, tuple[str | None, int | None] | None]) -> int:
        """Prepare a put and wait until it would be answered (committed and in RocksDB, whether the tablet
        writes on the event loop or on a writer thread); returns its end offset."""
        keys = [self.key(id_) for id_, _value in records]
        values = [None if value is None else self.row(id_, *value) for id_, value in records]
        result = self.kv.prepare_put(keys, values, 1, None, NO_WRITER, -1, T0_MS)
        await self.kv.acknowledgement(result)
        return result.next_offset

    async def put(self, *records: tuple[int, tuple[str | None, int | None] | None], **options: Any) -> int:
        """The whole write path as the tablet server runs it: prepare, wait for the fsync, apply."""
        next_offset = self.prepare(*records, **options)
        await self.kv.log.wait_durable(next_offset)
        self.kv.apply_durable()
        return next_offset

    def lookup(self, id_: int) -> tuple[Any, ...] | None:
        (value,) = self.kv.lookup([self.key(id_)])
        return None if value is None else self.format.decode_stored(value)

    def changelog(self, start_offset: int = 0) -> list[tuple[int, str, tuple[Any, ...]]]:
        """``(offset, change type, row)`` of every durable changelog record from ``start_offset``."""
        log = self.kv.log
        data = log.read_range(start_offset, log.high_watermark, 1 << 30)
        entries = []
        for position, header in log_batch.iter_batches(data):
            change_types, batch = log_batch.read_arrow(data, position, header, self.format.arrow_schema)
            assert not header.is_append_only
            for index, row in enumerate(batch.to_pylist()):
                change = log_batch.ChangeType(change_types[index]).name  # type: ignore[index]
                entries.append((header.base_offset + index, change, (row["id"], row["name"], row["score"])))
        return entries

    def batch_record_counts(self) -> list[tuple[int, int]]:
        data = self.kv.log.read_range(0, self.kv.log.high_watermark, 1 << 30)
        return [(h.base_offset, h.record_count) for _p, h in log_batch.iter_batches(data)]


@pytest.fixture
def bucket(tmp_path: Path) -> Any:
    opened = Bucket(tmp_path / "bucket")
    yield opened
    opened.close()


# ---- changelog of each kind of write ----


@pytest.mark.parametrize(("properties", "compression"), [
    ({}, ArrowCompression("zstd", 3)),
    ({"table.log.arrow.compression.zstd.level": "19"}, ArrowCompression("zstd", 19)),
    ({"table.log.arrow.compression.type": "LZ4_FRAME"}, ArrowCompression("lz4")),
])
@pytest.mark.asyncio
async def test_the_changelog_is_compressed_as_the_table_says(
    tmp_path: Path, properties: dict[str, str], compression: ArrowCompression
) -> None:
    """``table.log.arrow.compression.type`` and ``...zstd.level`` (Fluss's default: ZSTD at 3) decide the
    changelog's Arrow body: its message is the one that codec and level make of the rows it holds."""
    bucket = Bucket(tmp_path / "bucket", properties)
    try:
        await bucket.put(*((i, (f"name-{i % 17}" * 3, i // 3)) for i in range(600)))
        data = bucket.kv.log.read_range(0, bucket.kv.log.high_watermark, 1 << 30)
        ((position, header),) = list(log_batch.iter_batches(data))
        _, batch = log_batch.read_arrow(data, position, header, bucket.format.arrow_schema)
        start = position + header.records_offset + header.record_count
        message = bytes(data[start : position + header.size_bytes])
        assert message == compressed_message(batch, compression)
        if compression.codec == "zstd":  # the level shows in the frames
            assert message != compressed_message(batch, ArrowCompression("zstd", 22 - compression.level))
    finally:
        bucket.close()



@pytest.mark.asyncio
async def test_an_insert_then_update_then_delete_produce_plus_i_then_update_pair_then_minus_d(bucket: Bucket) -> None:
    await bucket.put((1, ("a", 10)), (2, ("b", 20)))
    await bucket.put((1, ("a2", 11)))
    await bucket.put((2, None))
    assert bucket.changelog() == [
        (0, "INSERT", (1, "a", 10)),
        (1, "INSERT", (2, "b", 20)),
        (2, "UPDATE_BEFORE", (1, "a", 10)),
        (3, "UPDATE_AFTER", (1, "a2", 11)),
        (4, "DELETE", (2, "b", 20)),
    ]
    assert bucket.lookup(1) == (1, "a2", 11)
    assert bucket.lookup(2) is None
    assert bucket.kv.applied_offset == 5


@pytest.mark.asyncio
async def test_deleting_a_missing_key_appends_an_empty_batch_that_takes_one_offset(bucket: Bucket) -> None:
    assert await bucket.put((9, None)) == 1
    assert bucket.changelog() == []
    assert bucket.batch_record_counts() == [(0, 0)]
    assert await bucket.put((1, ("a", 1))) == 2
    assert bucket.changelog() == [(1, "INSERT", (1, "a", 1))]


@pytest.mark.asyncio
async def test_the_same_key_twice_in_one_batch_compares_against_the_first(bucket: Bucket) -> None:
    await bucket.put((1, ("a", 1)), (1, ("b", 2)), (1, None), (1, ("c", 3)))
    assert [(change, row) for _o, change, row in bucket.changelog()] == [
        ("INSERT", (1, "a", 1)),
        ("UPDATE_BEFORE", (1, "a", 1)),
        ("UPDATE_AFTER", (1, "b", 2)),
        ("DELETE", (1, "b", 2)),
        ("INSERT", (1, "c", 3)),
    ]
    assert bucket.lookup(1) == (1, "c", 3)


@pytest.mark.asyncio
async def test_a_partial_update_merges_the_target_columns_into_the_stored_row(bucket: Bucket) -> None:
    await bucket.put((1, ("a", 10)))
    await bucket.put((1, (None, 99)), target_columns=[0, 2])  # id and score only
    assert bucket.lookup(1) == (1, "a", 99)
    assert bucket.changelog(1) == [(1, "UPDATE_BEFORE", (1, "a", 10)), (2, "UPDATE_AFTER", (1, "a", 99))]

    await bucket.put((2, (None, 5)), target_columns=[0, 2])  # no stored row: inserted as sent
    assert bucket.lookup(2) == (2, None, 5)
    assert bucket.changelog(3) == [(3, "INSERT", (2, None, 5))]


@pytest.mark.asyncio
async def test_a_partial_delete_nulls_the_targets_and_deletes_the_row_when_nothing_is_left(bucket: Bucket) -> None:
    await bucket.put((1, ("a", 10)))
    await bucket.put((1, None), target_columns=[0, 1])
    assert bucket.lookup(1) == (1, None, 10)
    assert bucket.changelog(1) == [(1, "UPDATE_BEFORE", (1, "a", 10)), (2, "UPDATE_AFTER", (1, None, 10))]

    await bucket.put((1, None), target_columns=[0, 2])
    assert bucket.lookup(1) is None
    assert bucket.changelog(3) == [(3, "DELETE", (1, None, 10))]


@pytest.fixture
def wal_bucket(tmp_path: Path) -> Any:
    opened = Bucket(tmp_path / "wal", {"table.changelog.image": "WAL"})
    yield opened
    opened.close()


@pytest.mark.asyncio
async def test_wal_image_writes_upserts_as_plus_u_without_reading_old_values(
    wal_bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    current_values = wal_bucket.kv._current_values

    def counting(keys: Any, ahead: Any = None) -> Any:
        reads.append(len(keys))
        return current_values(keys, ahead)

    monkeypatch.setattr(wal_bucket.kv, "_current_values", counting)
    await wal_bucket.put((1, ("a", 10)), (2, ("b", 20)))
    await wal_bucket.put((1, ("a2", 11)))
    assert reads == [], "a full-row upsert with a WAL image reads no old value"
    await wal_bucket.put((2, None), (3, None))  # -D carries the old row: deletes read it, in one read
    assert reads == [2]
    assert wal_bucket.changelog() == [
        (0, "UPDATE_AFTER", (1, "a", 10)),
        (1, "UPDATE_AFTER", (2, "b", 20)),
        (2, "UPDATE_AFTER", (1, "a2", 11)),
        (3, "DELETE", (2, "b", 20)),
    ]
    assert wal_bucket.lookup(1) == (1, "a2", 11) and wal_bucket.lookup(2) is None
    assert wal_bucket.kv.row_count == -1  # +U does not say whether the key existed
    reopened = wal_bucket.reopen()
    assert wal_bucket.lookup(1) == (1, "a2", 11) and wal_bucket.lookup(2) is None
    assert reopened.applied_offset == 4


@pytest.mark.asyncio
async def test_wal_image_in_one_batch_and_with_partial_updates(wal_bucket: Bucket) -> None:
    await wal_bucket.put((1, ("a", 1)), (1, ("b", 2)), (1, None), (1, ("c", 3)))
    assert [(change, row) for _o, change, row in wal_bucket.changelog()] == [
        ("UPDATE_AFTER", (1, "a", 1)),
        ("UPDATE_AFTER", (1, "b", 2)),
        ("DELETE", (1, "b", 2)),
        ("UPDATE_AFTER", (1, "c", 3)),
    ]
    await wal_bucket.put((1, (None, 99)), target_columns=[0, 2])  # a partial update merges: no -U either
    await wal_bucket.put((2, (None, 5)), target_columns=[0, 2])  # a partial insert is +I, as in Fluss
    assert [(change, row) for _o, change, row in wal_bucket.changelog(4)] == [
        ("UPDATE_AFTER", (1, "c", 99)),
        ("INSERT", (2, None, 5)),
    ]
    assert wal_bucket.lookup(1) == (1, "c", 99)


@pytest.mark.asyncio
async def test_a_partial_delete_of_a_not_null_column_is_rejected_and_writes_nothing(tmp_path: Path) -> None:
    bucket = Bucket(tmp_path / "bucket", name_nullable=False)
    try:
        await bucket.put((1, ("a", 10)))
        with pytest.raises(InvalidTargetColumnError, match="name"):
            bucket.prepare((1, None), target_columns=[0, 1])
        assert bucket.kv.log.log_end_offset == 1
    finally:
        bucket.close()


@pytest.mark.asyncio
async def test_table_delete_behavior_disable_rejects_and_ignore_skips_deletes(tmp_path: Path) -> None:
    disabled = Bucket(tmp_path / "disabled", {"table.delete.behavior": "DISABLE"})
    try:
        await disabled.put((1, ("a", 1)))
        with pytest.raises(DeletionDisabledError):
            disabled.prepare((1, None))
        assert disabled.kv.log.log_end_offset == 1
    finally:
        disabled.close()
    ignored = Bucket(tmp_path / "ignored", {"table.delete.behavior": "IGNORE"})
    try:
        await ignored.put((1, ("a", 1)))
        await ignored.put((1, None), (2, ("b", 2)))
        assert ignored.lookup(1) == (1, "a", 1)
        assert [change for _o, change, _r in ignored.changelog()] == ["INSERT", "INSERT"]
    finally:
        ignored.close()


# ---- the pre-write buffer ----


@pytest.mark.asyncio
async def test_values_stay_invisible_to_lookup_until_applied_after_the_log_is_durable(bucket: Bucket) -> None:
    next_offset = bucket.prepare((1, ("a", 1)))
    assert bucket.lookup(1) is None
    await bucket.kv.log.wait_durable(next_offset)
    bucket.kv.apply_durable()
    assert bucket.lookup(1) == (1, "a", 1)
    assert bucket.kv.applied_offset == next_offset


@pytest.mark.asyncio
async def test_a_second_put_before_durability_sees_the_first_value_as_old(bucket: Bucket) -> None:
    bucket.prepare((1, ("a", 1)))
    bucket.prepare((1, ("b", 2)))
    second = bucket.prepare((1, None))
    assert bucket.lookup(1) is None
    await bucket.kv.log.wait_durable(second)
    bucket.kv.apply_durable()
    assert [(change, row) for _o, change, row in bucket.changelog()] == [
        ("INSERT", (1, "a", 1)),
        ("UPDATE_BEFORE", (1, "a", 1)),
        ("UPDATE_AFTER", (1, "b", 2)),
        ("DELETE", (1, "b", 2)),
    ]
    assert bucket.lookup(1) is None
    assert bucket.kv.applied_offset == 4


@pytest.mark.asyncio
async def test_one_apply_of_many_batches_keeps_each_keys_last_write_in_rocksdb(bucket: Bucket) -> None:
    """apply_durable writes the batches of a group commit sorted by key: a key written in several of them
    must still end with its last value (the sort keeps a key's writes in log order), as RocksDB holds it
    after a reopen (no row cache in front)."""
    ids = list(range(300, 0, -7))
    bucket.prepare(*[(id_, ("first", id_)) for id_ in ids])
    bucket.prepare(*[(id_, None) for id_ in ids[::3]])
    last = bucket.prepare(*[(id_, ("second", id_)) for id_ in ids[::2]])
    await bucket.kv.log.wait_durable(last)
    bucket.kv.apply_durable()
    bucket.reopen()
    expected = {id_: (id_, "first", id_) for id_ in ids}
    expected.update({id_: None for id_ in ids[::3]})
    expected.update({id_: (id_, "second", id_) for id_ in ids[::2]})
    assert {id_: bucket.lookup(id_) for id_ in ids} == expected


@pytest.mark.asyncio
async def test_apply_durable_applies_only_batches_below_the_high_watermark(bucket: Bucket) -> None:
    first = bucket.prepare((1, ("a", 1)))
    await bucket.kv.log.wait_durable(first)
    bucket.prepare((2, ("b", 2)))  # appended after the fsync: not durable yet
    bucket.kv.apply_durable()
    assert bucket.lookup(1) == (1, "a", 1)
    assert bucket.lookup(2) is None
    assert bucket.kv.applied_offset == first


@pytest.mark.asyncio
async def test_a_durable_put_its_handler_never_applied_shows_at_the_next_lookup(bucket: Bucket) -> None:
    next_offset = bucket.prepare((1, ("a", 1)))
    await bucket.kv.log.wait_durable(next_offset)  # e.g. the handler failed on a later batch of the request
    assert bucket.lookup(1) == (1, "a", 1)
    assert bucket.kv.applied_offset == next_offset


@pytest.mark.asyncio
async def test_a_durable_put_its_handler_never_applied_shows_in_the_next_scan(bucket: Bucket) -> None:
    """Also a new leader's held batches, once its followers have them: no write need come first."""
    next_offset = bucket.prepare((1, ("a", 1)), (2, ("b", 2)))
    await bucket.kv.log.wait_durable(next_offset)
    values, log_offset, empty = bucket.kv.open_scan()
    assert not empty and log_offset == next_offset
    assert sorted(bucket.format.decode_stored(v)[0] for v in values) == [1, 2]


@pytest.mark.asyncio
async def test_a_retried_writer_batch_is_a_duplicate_and_writes_nothing(bucket: Bucket) -> None:
    await bucket.put((1, ("a", 1)), writer_id=5, sequence=0)
    with pytest.raises(DuplicateSequenceError):
        bucket.prepare((1, ("a", 1)), writer_id=5, sequence=0)
    assert bucket.kv.log.log_end_offset == 1
    await bucket.put((1, ("b", 2)), writer_id=5, sequence=1)
    assert bucket.lookup(1) == (1, "b", 2)


@pytest.mark.asyncio
async def test_a_retry_is_acknowledged_as_duplicate_only_once_the_original_is_applied(bucket: Bucket) -> None:
    original = bucket.prepare((1, ("a", 1)), writer_id=5, sequence=0)
    with pytest.raises(RequestTimeoutError):  # retriable: the original is not even durable
        bucket.prepare((1, ("a", 1)), writer_id=5, sequence=0)
    await bucket.kv.log.wait_durable(original)
    # durable (acknowledged): applied to RocksDB as the high watermark passed it; the retry is a duplicate
    with pytest.raises(DuplicateSequenceError):
        bucket.prepare((1, ("a", 1)), writer_id=5, sequence=0)
    assert bucket.kv.applied_offset == bucket.kv.log.log_end_offset == 1
    assert bucket.lookup(1) == (1, "a", 1)


# ---- recovery ----


@pytest.mark.asyncio
async def test_applying_some_pending_batches_keeps_the_later_writes_visible_to_puts(bucket: Bucket) -> None:
    """The pre-write buffer's index outlives an apply that leaves batches pending: a key's latest write,
    applied or not, is what the next put compares against; it is rebuilt once applied writes fill it."""
    bucket.kv.log.remove_high_watermark_listener(bucket.kv._apply_committed)  # applies happen when this test says
    bucket.prepare((1, ("a", 1)), (2, ("b", 2)), (3, ("c", 3)))
    bucket.prepare((1, ("a2", 1)), (2, None))  # builds the index over both batches
    durable = bucket.prepare(*[(id_, ("bulk", id_)) for id_ in range(100, 140)])
    await bucket.kv.log.wait_durable(durable)
    bucket.prepare((1, ("a3", 1)), (3, None))  # the tail, pending beyond the high watermark
    bucket.kv.apply_durable()  # the first three batches reach RocksDB; the tail stays pending
    assert bucket.kv.applied_offset == durable and bucket.lookup(1) == (1, "a2", 1)
    index = bucket.kv._pending_index
    assert index is None or len(index) <= 4 * 2, "mostly applied writes: the index is rebuilt"
    last = bucket.prepare((1, ("a4", 1)), (2, ("b2", 2)), (3, ("c2", 3)), (100, None))
    await bucket.kv.log.wait_durable(last)
    bucket.kv.apply_durable()
    assert [(change, row) for _offset, change, row in bucket.changelog(durable)] == [
        ("UPDATE_BEFORE", (1, "a2", 1)), ("UPDATE_AFTER", (1, "a3", 1)),  # the tail
        ("DELETE", (3, "c", 3)),
        ("UPDATE_BEFORE", (1, "a3", 1)), ("UPDATE_AFTER", (1, "a4", 1)),  # the tail's write, still pending then
        ("INSERT", (2, "b2", 2)),  # deleted by an applied batch
        ("INSERT", (3, "c2", 3)),  # deleted by the pending tail
        ("DELETE", (100, "bulk", 100)),  # written by an applied batch
    ]
    assert [bucket.lookup(i) for i in (1, 2, 3, 100, 101)] == [
        (1, "a4", 1), (2, "b2", 2), (3, "c2", 3), None, (101, "bulk", 101)]


@pytest.mark.asyncio
async def test_a_crash_after_the_log_fsync_and_before_apply_is_recovered_by_replay(bucket: Bucket) -> None:
    await bucket.put((1, ("a", 1)), (2, ("b", 2)))
    applied = bucket.kv.applied_offset
    # the process dies right after the fsync, before the tablet applies what it made durable: here, the
    # tablet stops hearing of the high watermark
    bucket.kv.log.remove_high_watermark_listener(bucket.kv._apply_committed)
    last = bucket.prepare((1, ("a2", 10)), (3, ("c", 3)))
    last = bucket.prepare((2, None), (4, ("d", 4)))
    await bucket.kv.log.wait_durable(last)  # durable in the log, never applied to RocksDB
    assert bucket.kv.applied_offset == applied == 2

    kv = bucket.reopen()
    assert kv.applied_offset == kv.log.log_end_offset == last
    assert [bucket.lookup(i) for i in (1, 2, 3, 4)] == [(1, "a2", 10), None, (3, "c", 3), (4, "d", 4)]
    # the writer continues on top of the recovered state
    await bucket.put((3, ("c2", 30)))
    assert bucket.changelog(last) == [
        (last, "UPDATE_BEFORE", (3, "c", 3)),
        (last + 1, "UPDATE_AFTER", (3, "c2", 30)),
    ]


@pytest.mark.asyncio
async def test_the_applied_offset_is_persisted_with_the_values(bucket: Bucket) -> None:
    for index in range(5):
        await bucket.put((index, (f"n{index}", index)))
    assert bucket.kv.applied_offset == 5
    kv = bucket.reopen()
    assert kv.applied_offset == 5
    assert [bucket.lookup(i) for i in range(5)] == [(i, f"n{i}", i) for i in range(5)]


@pytest.mark.asyncio
async def test_a_put_that_was_never_fsynced_is_replayed_if_its_bytes_reached_the_file(bucket: Bucket) -> None:
    # A killed process leaves its written bytes in the page cache: the log keeps them and so must RocksDB.
    await bucket.put((1, ("a", 1)))
    bucket.prepare((2, ("b", 2)))
    bucket.reopen()
    assert bucket.lookup(2) == (2, "b", 2)
    assert bucket.kv.applied_offset == 2


@pytest.mark.asyncio
async def test_rocksdb_ahead_of_a_truncated_log_is_rebuilt_from_the_log(bucket: Bucket) -> None:
    await bucket.put((1, ("a", 1)))
    await bucket.put((2, ("b", 2)))
    bucket.close()
    # lose the last changelog batch (a torn tail): RocksDB now holds a change the log does not
    (segment,) = sorted((bucket.directory / "log").glob("*.log"))
    os.truncate(segment, segment.stat().st_size - 10)

    kv = bucket.reopen()
    assert kv.log.log_end_offset == 1
    assert kv.applied_offset == 1
    assert bucket.lookup(1) == (1, "a", 1)
    assert bucket.lookup(2) is None


@pytest.mark.asyncio
async def test_replay_of_updates_and_deletes_reaches_the_same_state_as_the_live_path(tmp_path: Path) -> None:
    import random

    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    live = Bucket(tmp_path / "live")
    try:
        expected: dict[int, tuple[str, int] | None] = {}
        offsets = []
        for _ in range(40):
            records = []
            for _ in range(rng.randint(1, 5)):
                id_ = rng.randrange(10)
                value = None if rng.random() < 0.3 else (f"v{rng.randrange(1000)}", rng.randrange(1000))
                records.append((id_, value))
                expected[id_] = value
            offsets.append(live.prepare(*records))
        await live.kv.log.wait_durable(offsets[-1])
        live.kv.apply_durable()
        live_values = {i: live.lookup(i) for i in range(10)}
        assert live_values == {i: None if v is None else (i, *v) for i, v in expected.items()} | {
            i: None for i in range(10) if i not in expected
        }, f"seed={seed}"

        # the same log, replayed from offset 0 into a fresh RocksDB
        live.close()
        for path in sorted((live.directory / "kv").rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        live.kv = live._open()
        assert live.kv.applied_offset == offsets[-1], f"seed={seed}"
        assert {i: live.lookup(i) for i in range(10)} == live_values, f"seed={seed}"
    finally:
        live.close()


# ---- large batches (old values read in key order) ----


@pytest.mark.asyncio
async def test_a_large_batch_pairs_each_update_with_its_own_old_row(bucket: Bucket) -> None:
    """Batches of many keys read old values with one multi-get in key order: every -U must still carry its
    own key's old row, in the batch's order, with missing keys and repeated keys in the same batch."""
    ids = list(range(0, 400, 2))
    await bucket.put(*[(id_, (f"v{id_}", id_)) for id_ in ids])
    # descending ids (another key order than RocksDB's), new odd keys between existing ones, a key twice
    records = [(id_, (f"w{id_}", -id_)) for id_ in range(399, 99, -1)] + [(150, ("again", 0))]
    start = bucket.kv.log.high_watermark
    await bucket.put(*records)
    expected = []
    current = {id_: (id_, f"v{id_}", id_) for id_ in ids}
    for id_, (name, score) in records:
        new = (id_, name, score)
        if id_ in current:
            expected += [("UPDATE_BEFORE", current[id_]), ("UPDATE_AFTER", new)]
        else:
            expected.append(("INSERT", new))
        current[id_] = new
    assert [(change, row) for _o, change, row in bucket.changelog(start)] == expected
    lookups = bucket.kv.lookup([bucket.key(id_) for id_ in (*range(500, 380, -1), 150, 2)])
    found = [None if value is None else bucket.format.decode_stored(value) for value in lookups]
    assert found == [current.get(id_) for id_ in (*range(500, 380, -1), 150, 2)]


def test_rocksdb_options_reach_the_bucket_database(tmp_path: Path) -> None:
    """The kv.rocksdb.* options are RocksDB's own settings of each bucket (as its OPTIONS file records them),
    with a whole-key bloom filter over the memtable while bloom filters are on."""
    options = RocksDbOptions(
        block_cache_size_bytes=2 << 20, write_buffer_size_bytes=3 << 20, write_buffer_count=3, block_size_bytes=16 << 10
    )
    db = open_rocksdb(tmp_path / "on", options)
    db.close()
    settings = rocksdb_settings(tmp_path / "on")
    assert settings["write_buffer_size"] == str(3 << 20)
    assert settings["max_write_buffer_number"] == "3"
    assert settings["block_size"] == str(16 << 10)
    assert settings["memtable_whole_key_filtering"] == "true"
    assert settings["memtable_prefix_bloom_size_ratio"] == "0.100000"
    assert "bloomfilter" in settings["filter_policy"]
    db = open_rocksdb(tmp_path / "off", RocksDbOptions(use_bloom_filter=False))
    db.close()
    settings = rocksdb_settings(tmp_path / "off")
    assert settings["memtable_whole_key_filtering"] == "false"
    assert settings["filter_policy"] == "nullptr"


def rocksdb_settings(path: Path) -> dict[str, str]:
    """The default column family's options from the newest OPTIONS file RocksDB wrote."""
    newest = max(path.glob("OPTIONS-*"), key=lambda file: int(file.name.split("-")[1]))
    settings: dict[str, str] = {}
    section = ""
    for line in newest.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif "=" in line and section in ('[CFOptions "default"]', '[TableOptions/BlockBasedTable "default"]'):
            key, _, value = line.partition("=")
            settings[key] = value
    return settings

