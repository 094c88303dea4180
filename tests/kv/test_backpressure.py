"""A bucket's write debt as Fluss's cooperative back-pressure reads it: the level-0 ramp, the admission
budget over level-0 files, memtables and the pre-write buffer, on real RocksDB through each binding."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from strom.errors import StorageBackpressureError
from strom.kv.backpressure import (
    L0_FILES,
    PRESSURE_MAX,
    BackpressureConfig,
    BucketBackpressure,
    l0_pressure,
    ramp,
)
from strom.kv.kv_tablet import KvConfig
from strom.kv.rocksdb import RocksDbOptions, open_rocksdb
from tests.kv.test_kv_tablet import T0_MS, Bucket

SMALL_MEMTABLE = 64 << 10


def test_the_level0_ramp_is_flusss() -> None:
    """T = 8, RocksDB's slowdown trigger 20: twelve steps of 1/12 from the 9th file, at most 11/12."""
    assert [l0_pressure(files, 8) for files in (0, 7, 8)] == [0.0, 0.0, 0.0]
    assert l0_pressure(9, 8) == pytest.approx(1 / 12)
    assert l0_pressure(19, 8) == pytest.approx(11 / 12)
    assert l0_pressure(50, 8) == pytest.approx(11 / 12)  # never a refusal's 1.0
    assert l0_pressure(30, 20) == 0.0 and l0_pressure(30, 25) == 0.0  # no room below RocksDB's trigger: off
    assert l0_pressure(2, 1) == pytest.approx(1 / 19)


def test_ramps_start_at_zero_and_stay_below_one() -> None:
    assert ramp(5, 10, 20) == 0.0
    assert ramp(15, 10, 20) == pytest.approx(0.5)
    assert ramp(25, 10, 20) == PRESSURE_MAX
    assert ramp(25, 20, 10) == 0.0  # an empty window is no signal


class Counters:
    """RocksDB's properties as a test sets them, and a clock it moves."""

    def __init__(self) -> None:
        self.values = {L0_FILES: "0"}
        self.reads = 0
        self.now = 0.0

    def read(self, name: str) -> str | None:
        self.reads += 1
        return self.values.get(name)


def test_counters_are_sampled_at_most_every_tenth_of_a_second() -> None:
    counters = Counters()
    debt = BucketBackpressure(counters.read, BackpressureConfig(l0_slowdown_trigger=8), clock=lambda: counters.now)
    assert debt.pressure(0) == 0.0
    reads = counters.reads
    counters.values[L0_FILES] = "14"
    assert debt.pressure(0) == 0.0 and counters.reads == reads  # within the interval: the old sample
    counters.now = 0.2
    assert debt.pressure(0) == pytest.approx(6 / 12)
    assert debt.last_pressure == pytest.approx(6 / 12)


def test_the_budget_counts_level0_files_memtables_and_the_buffer() -> None:
    """Fluss's rule: refuse once L0 + ceil(buffered / memtable size) + memtable count reaches 20."""
    counters = Counters()
    config = BackpressureConfig(8, write_buffer_size_bytes=SMALL_MEMTABLE, write_buffer_count=2)
    debt = BucketBackpressure(counters.read, config, clock=lambda: counters.now)
    assert debt.budget_bytes() == 17 * SMALL_MEMTABLE
    assert not debt.over_budget(17 * SMALL_MEMTABLE)
    assert debt.over_budget(17 * SMALL_MEMTABLE + 1)
    counters.values[L0_FILES] = "10"
    counters.now = 1.0
    assert debt.over_budget(7 * SMALL_MEMTABLE + 1) and not debt.over_budget(7 * SMALL_MEMTABLE)
    # a buffer past what the memtables take ramps the signal up towards the budget
    assert debt.pressure(2 * SMALL_MEMTABLE) == pytest.approx(l0_pressure(10, 8))
    counters.values[L0_FILES] = "0"
    counters.now = 2.0
    assert debt.pressure(2 * SMALL_MEMTABLE) == 0.0
    assert 0.0 < debt.pressure(10 * SMALL_MEMTABLE) < debt.pressure(16 * SMALL_MEMTABLE) < 1.0


def test_a_failing_database_reads_as_no_debt() -> None:
    def broken(_name: str) -> str | None:
        raise OSError("closed")

    assert BucketBackpressure(broken, BackpressureConfig(0)).pressure(0) == 0.0


def test_level0_files_of_a_real_rocksdb(tmp_path: Path) -> None:
    """Each flush of a memtable with rows makes one level-0 file, which the counter reads (below RocksDB's
    compaction trigger of four files nothing compacts them away)."""
    db = open_rocksdb(tmp_path / "db", RocksDbOptions(block_cache_size_bytes=1 << 20))
    now = [0.0]
    try:
        debt = BucketBackpressure(db.property, BackpressureConfig(l0_slowdown_trigger=1), clock=lambda: now[0])
        assert debt.pressure(0) == 0.0 and debt.l0_files == 0
        for round_ in range(2):
            db.write([b"key-%d" % round_], [b"value"], [], [])
            db.flush()
        now[0] = 1.0
        assert debt.pressure(0) == pytest.approx(1 / 19)
        assert debt.l0_files == 2
    finally:
        db.close()


def small_bucket(directory: Path, l0_slowdown_trigger: int = 8) -> Bucket:
    opened = Bucket(directory)
    opened.config = KvConfig(rocksdb=RocksDbOptions(block_cache_size_bytes=1 << 20,
                                                    write_buffer_size_bytes=SMALL_MEMTABLE),
                             l0_slowdown_trigger=l0_slowdown_trigger)
    opened.reopen()
    return opened


@pytest.mark.asyncio
async def test_a_bucket_whose_buffer_is_not_applied_refuses_past_its_budget(tmp_path: Path) -> None:
    """Batches wait in the pre-write buffer until the high watermark passes them (a follower that lags
    holds it): the buffer's weight counts against the budget, a write over it is refused before anything is
    appended, and once the buffer drains writes are taken again."""
    bucket = small_bucket(tmp_path / "bucket")
    try:
        kv = bucket.kv
        weight = 4 * SMALL_MEMTABLE
        taken = 0
        with pytest.raises(StorageBackpressureError, match="write budget"):
            for id_ in range(100):
                kv.check_write_budget(weight)
                last = kv.prepare_put([bucket.key(id_)], [bucket.row(id_, "x", id_)], 1, None, -1, -1, T0_MS, weight)
                taken += 1
        assert taken == 4  # 4 x 4 memtables buffered + 2 memtables reach 18; a fifth would reach 22 >= 20
        assert kv.buffered_bytes == taken * weight
        assert kv.backpressure.rejections == 1
        assert 0.0 < kv.pressure() < 1.0  # a buffer far past the memtables: slow down
        await kv.acknowledgement(last)  # durable, and applied by the high watermark's listener
        assert kv.buffered_bytes == 0
        kv.check_write_budget(weight)
        assert bucket.lookup(3) == (3, "x", 3)
    finally:
        bucket.close()


@pytest.mark.asyncio
async def test_a_bucket_reports_pressure_from_its_level0_files(tmp_path: Path) -> None:
    bucket = small_bucket(tmp_path / "bucket", l0_slowdown_trigger=1)
    try:
        assert bucket.kv.pressure() == 0.0
        for id_ in range(3):
            await bucket.put((id_, ("x", id_)))
            bucket.kv.create_checkpoint(tmp_path / f"checkpoint-{id_}")  # flushes: one level-0 file each
        await asyncio.sleep(0.15)  # past the sampling interval
        assert bucket.kv.pressure() == pytest.approx(2 / 19)
    finally:
        bucket.close()
