"""A crashed primary-key bucket's changelog replayed into RocksDB where its files were opened, before the
event loop takes them (``changelog_replay.catch_up_opened``): the tablet then finds nothing left to replay and
holds exactly what a replay on the loop gives; the cases it leaves to the tablet are left untouched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from strom.kv import changelog_replay
from strom.kv.changelog_replay import APPLIED_OFFSET_KEY, ROW_COUNT_KEY, read_meta_int
from strom.kv.kv_tablet import BucketDatabase, KvTablet, open_bucket_database, replayed_database
from strom.kv.row_cache import RowCache
from strom.log.log_tablet import LogTablet
from tests.kv.test_kv_tablet import LOG_CONFIG, Bucket

pytestmark = pytest.mark.asyncio


async def _crashed(directory: Path) -> Bucket:
    """A bucket as a crash leaves it: RocksDB (WAL off) at its last flush, after the inserts, and the
    changelog with every acknowledged write since, updates and deletes."""
    bucket = Bucket(directory)
    await bucket.put(*((i, (f"name-{i}", i)) for i in range(300)))
    bucket.close()  # flushed here
    shutil.copytree(directory / "kv", directory.parent / f"{directory.name}-flushed")
    bucket = Bucket(directory)
    await bucket.put(*((i, (f"renamed-{i}", -i)) for i in range(0, 300, 3)))
    await bucket.put(*((i, None) for i in range(1, 300, 7)))
    bucket.close()
    shutil.rmtree(directory / "kv")
    shutil.copytree(directory.parent / f"{directory.name}-flushed", directory / "kv")
    return bucket


def _opened(directory: Path, bucket: Bucket, cache: RowCache | None = None) -> tuple[LogTablet, BucketDatabase]:
    log = LogTablet.open(directory / "log", LOG_CONFIG)
    return log, open_bucket_database(directory / "kv", bucket.config, cache)


def _state(kv: KvTablet, bucket: Bucket) -> tuple[int, int, list[object]]:
    found = kv.lookup([bucket.key(i) for i in range(300)])
    return kv.applied_offset, kv.row_count, [None if v is None else bucket.format.decode_stored(v) for v in found]


async def test_a_crashed_buckets_changelog_replays_where_it_opened(tmp_path: Path) -> None:
    on_loop_dir, ahead_dir = tmp_path / "on_loop", tmp_path / "ahead"
    bucket = await _crashed(on_loop_dir)  # its encoders and options serve both
    await _crashed(ahead_dir)

    log, database = _opened(on_loop_dir, bucket)
    behind = read_meta_int(database.db, APPLIED_OFFSET_KEY)
    assert behind < log.high_watermark  # the crash lost what RocksDB had not flushed
    on_loop = KvTablet(on_loop_dir / "kv", log, bucket.format, bucket.config, database=database)  # replays itself
    expected = _state(on_loop, bucket)
    on_loop.close()
    log.close()

    log, database = _opened(ahead_dir, bucket)
    updates, deletes = len(range(0, 300, 3)), len(range(1, 300, 7))
    assert log.high_watermark - behind == 2 * updates + deletes  # -U/+U pairs, then -D
    assert changelog_replay.catch_up_opened(database, log, bucket.format) == updates + deletes  # -U written by +U
    assert read_meta_int(database.db, APPLIED_OFFSET_KEY) == log.high_watermark
    assert read_meta_int(database.db, ROW_COUNT_KEY) == expected[1]
    ahead = KvTablet(ahead_dir / "kv", log, bucket.format, bucket.config, database=database)
    try:
        assert _state(ahead, bucket) == expected
        assert expected[2][0] == (0, "renamed-0", 0) and expected[2][1] is None  # updates and deletes replayed
        assert changelog_replay.catch_up_opened(database, log, bucket.format) == 0  # nothing left
    finally:
        ahead.close()
        log.close()


async def test_what_the_tablet_replays_itself_is_left_to_it(tmp_path: Path) -> None:
    """RocksDB that is not behind the log's high watermark (a clean close flushed it) is not touched."""
    clean = Bucket(tmp_path / "clean")
    await clean.put(*((i, (f"n{i}", i)) for i in range(50)))
    clean.close()
    log, database = _opened(tmp_path / "clean", clean)
    try:
        assert read_meta_int(database.db, APPLIED_OFFSET_KEY) == log.high_watermark > 0
        assert changelog_replay.catch_up_opened(database, log, clean.format) == 0
    finally:
        database.db.close()
        log.close()


async def _replayed_into_a_new_rocksdb(directory: Path, cache: RowCache) -> tuple[Bucket, LogTablet, BucketDatabase]:
    """A replica without RocksDB (a follower that now leads, no snapshot), its changelog replayed where it
    opened as ``replica._open_ahead`` does it."""
    bucket = await _crashed(directory)
    shutil.rmtree(directory / "kv")
    log, database = _opened(directory, bucket, cache)
    assert database.vector_memtable
    rows = cache.replayed_rows()
    assert changelog_replay.catch_up_opened(database, log, bucket.format, rows.add) > 0
    return bucket, log, replayed_database(directory / "kv", bucket.config, database, rows)


def _check_rows(kv: KvTablet, bucket: Bucket, log: LogTablet) -> None:
    _offset, rows, found = _state(kv, bucket)
    assert kv.applied_offset == log.high_watermark
    assert rows == sum(value is not None for value in found) == 300 - len(range(1, 300, 7))
    assert found[0] == (0, "renamed-0", 0) and found[1] is None and found[2] == (2, "name-2", 2)


async def test_a_new_rocksdb_takes_the_changelog_as_a_bulk_load_and_the_row_cache_adopts_its_rows(
        tmp_path: Path) -> None:
    """The replay fills the vector memtable and collects the rows it writes; the row cache takes them whole
    as the tablet opens, so the bucket is complete (no read reaches the vector memtable) as after a replay
    on the loop, and the tablet finds nothing left to replay."""
    cache = RowCache(64 << 20)
    bucket, log, database = await _replayed_into_a_new_rocksdb(tmp_path / "bucket", cache)
    assert database.vector_memtable and database.replayed_rows is not None
    kv = KvTablet(tmp_path / "bucket" / "kv", log, bucket.format, bucket.config, row_cache=cache, database=database)
    try:
        assert cache.is_complete(kv._cache_token) and cache.entries == 300 - len(range(1, 300, 7))
        _check_rows(kv, bucket, log)
        assert kv._vector_memtable, "every read was answered by the cache"
    finally:
        kv.close()
        log.close()


async def test_a_bulk_load_larger_than_the_row_cache_is_flushed_and_read_through_the_skip_list(
        tmp_path: Path) -> None:
    """Rows more than a cache generation holds cannot keep the bucket complete: the database is flushed and
    reopened with the skip list where it opened, and its reads reach RocksDB."""
    cache = RowCache(8 << 10)
    bucket, log, database = await _replayed_into_a_new_rocksdb(tmp_path / "bucket", cache)
    assert not database.vector_memtable and database.replayed_rows is None
    kv = KvTablet(tmp_path / "bucket" / "kv", log, bucket.format, bucket.config, row_cache=cache, database=database)
    try:
        assert not cache.is_complete(kv._cache_token)
        _check_rows(kv, bucket, log)
    finally:
        kv.close()
        log.close()


async def test_a_crashed_buckets_replayed_rows_are_in_its_row_cache(tmp_path: Path) -> None:
    """The rows the replay wrote where the bucket opened are in the row cache as the tablet opens, as a replay
    on the loop leaves them; RocksDB holds others too, so the bucket is not complete."""
    bucket = await _crashed(tmp_path / "bucket")
    cache = RowCache(64 << 20)
    log, database = _opened(tmp_path / "bucket", bucket, cache)
    assert not database.vector_memtable
    rows = cache.replayed_rows()
    updates, deletes = len(range(0, 300, 3)), len(range(1, 300, 7))
    assert changelog_replay.catch_up_opened(database, log, bucket.format, rows.add) == updates + deletes
    kv = KvTablet(tmp_path / "bucket" / "kv", log, bucket.format, bucket.config, row_cache=cache,
                  database=replayed_database(tmp_path / "bucket" / "kv", bucket.config, database, rows))
    try:
        assert not cache.is_complete(kv._cache_token)
        assert cache.entries == len({i for i in range(0, 300, 3)} - set(range(1, 300, 7)))
        found = cache.get_many(kv._cache_token, [bucket.key(0), bucket.key(2)])
        assert found is not None and found[1] == [1]  # key 0 was replayed (renamed), key 2 was not
        assert bucket.format.decode_stored(found[0][0]) == (0, "renamed-0", 0)
        _check_rows(kv, bucket, log)
    finally:
        kv.close()
        log.close()
