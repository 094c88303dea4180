"""LogTablet and LogSegment on real files: offsets, reads, segment rolls, crash repair, retention, group commit."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pyarrow as pa
import pytest

from strom.errors import (
    DuplicateSequenceError,
    LogOffsetOutOfRangeError,
    LogStorageError,
    OutOfOrderSequenceError,
    RequestTimeoutError,
)
from strom.log.log_tablet import EARLIEST_OFFSET, AppendResult, LogConfig, LogTablet
from strom.log.segment import LogSegment, segment_file_name
from strom.records import log_batch

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
DURABLE_EACH_APPEND = LogConfig(segment_size_bytes_max=1 << 30, flush_interval_messages=1, writer_expiration_ms=60_000)
T0_MS = 1_700_000_000_000


def batch_bytes(ids: list[int], *, writer_id: int = -1, sequence: int = -1, name_size: int = 4) -> bytes:
    """One append-only v0 batch holding rows ``id`` with a name of ``name_size`` characters."""
    rows = pa.RecordBatch.from_pydict({"id": ids, "name": [f"{i:0{name_size}d}" for i in ids]}, schema=SCHEMA)
    return log_batch.build_arrow_batch(rows, schema_id=1, writer_id=writer_id, batch_sequence=sequence)


def append(tablet: LogTablet, *batches: bytes, now_ms: int = T0_MS) -> AppendResult:
    data = bytearray(b"".join(batches))
    return tablet.append(data, list(log_batch.iter_batches(data)), now_ms)


async def append_durable(tablet: LogTablet, *batches: bytes, now_ms: int = T0_MS) -> AppendResult:
    result = append(tablet, *batches, now_ms=now_ms)
    await tablet.wait_durable(result.next_offset)
    return result


def ids_in(records: bytes) -> list[int]:
    """The ``id`` column of every batch in ``records``, which must be whole batches with valid CRCs."""
    ids: list[int] = []
    for position, header in log_batch.iter_batches(records, verify_crc=True):
        _change_types, rows = log_batch.read_arrow(records, position, header, SCHEMA)
        ids.extend(rows.column("id").to_pylist())
    return ids


def base_offsets(records: bytes) -> list[int]:
    return [header.base_offset for _position, header in log_batch.iter_batches(records)]


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


# ---- appending and reading ----


@pytest.mark.asyncio
async def test_appends_get_consecutive_offsets_and_read_back_whole(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    first = await append_durable(tablet, batch_bytes([1, 2, 3]))
    second = await append_durable(tablet, batch_bytes([4]), batch_bytes([5, 6]))
    assert (first.base_offset, first.next_offset) == (0, 3)
    assert (second.base_offset, second.next_offset) == (3, 6)
    assert (tablet.log_start_offset, tablet.log_end_offset, tablet.high_watermark) == (0, 6, 6)
    read = tablet.read(0, 1 << 20)
    assert ids_in(read.records) == [1, 2, 3, 4, 5, 6]
    assert base_offsets(read.records) == [0, 3, 4]
    assert (read.high_watermark, read.log_start_offset) == (6, 0)
    tablet.close()


@pytest.mark.asyncio
async def test_reading_from_the_middle_of_a_batch_returns_that_whole_batch(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    await append_durable(tablet, batch_bytes([1, 2, 3]))
    await append_durable(tablet, batch_bytes([4, 5]))
    assert base_offsets(tablet.read(1, 1 << 20).records) == [0, 3]
    assert base_offsets(tablet.read(4, 1 << 20).records) == [3]
    assert tablet.read(EARLIEST_OFFSET, 1 << 20).records == tablet.read(0, 1 << 20).records
    tablet.close()


@pytest.mark.asyncio
async def test_read_at_the_high_watermark_is_empty_and_beyond_it_is_out_of_range(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    await append_durable(tablet, batch_bytes([1]))
    assert tablet.read(1, 1 << 20).records == b""
    with pytest.raises(LogOffsetOutOfRangeError):
        tablet.read(2, 1 << 20)
    tablet.close()


def test_appended_batches_stay_invisible_until_durable(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    result = append(tablet, batch_bytes([1, 2]))
    assert tablet.log_end_offset == result.next_offset == 2
    assert tablet.high_watermark == 0
    assert tablet.read(0, 1 << 20).records == b""

    asyncio.run(tablet.wait_durable(result.next_offset))
    assert tablet.high_watermark == 2
    assert ids_in(tablet.read(0, 1 << 20).records) == [1, 2]
    tablet.close()


@pytest.mark.asyncio
async def test_read_with_max_bytes_returns_whole_batches_and_at_least_one(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    sizes = []
    for index in range(6):
        batch = batch_bytes([index], name_size=10 + 50 * index)  # batches of growing size
        sizes.append(len(batch))
        await append_durable(tablet, batch)
    # below the first batch's size: still the first batch, whole
    assert base_offsets(tablet.read(0, 1).records) == [0]
    # exactly two batches fit, a byte less fits one, a byte more still two
    assert base_offsets(tablet.read(0, sizes[0] + sizes[1]).records) == [0, 1]
    assert base_offsets(tablet.read(0, sizes[0] + sizes[1] - 1).records) == [0]
    assert base_offsets(tablet.read(0, sizes[0] + sizes[1] + 1).records) == [0, 1]
    # from the middle of the log
    assert base_offsets(tablet.read(3, sizes[3]).records) == [3]
    assert base_offsets(tablet.read(3, 1 << 20).records) == [3, 4, 5]
    for max_bytes in range(1, sum(sizes) + 2, 37):
        records = tablet.read(0, max_bytes).records
        assert len(records) <= max(max_bytes, sizes[0]), max_bytes
        assert ids_in(records) == list(range(len(base_offsets(records))))
    tablet.close()


@pytest.mark.asyncio
async def test_commit_timestamps_never_go_backwards(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    await append_durable(tablet, batch_bytes([1]), now_ms=T0_MS + 500)
    await append_durable(tablet, batch_bytes([2]), now_ms=T0_MS)  # the clock stepped back
    timestamps = [h.commit_timestamp for _p, h in log_batch.iter_batches(tablet.read(0, 1 << 20).records)]
    assert timestamps == [T0_MS + 500, T0_MS + 500]
    tablet.close()


# ---- segments ----


@pytest.mark.asyncio
async def test_segments_roll_at_the_size_limit_and_reads_cross_them(log_dir: Path) -> None:
    batch_size = len(batch_bytes([0]))
    config = LogConfig(segment_size_bytes_max=batch_size * 3, flush_interval_messages=1, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    for index in range(10):
        await append_durable(tablet, batch_bytes([index]))
    files = segment_files(log_dir)
    assert [f.name for f in files] == [segment_file_name(base) for base in (0, 3, 6, 9)]
    assert all(f.stat().st_size <= batch_size * 3 for f in files)
    assert ids_in(tablet.read_range(0, 10, 1 << 20)) == list(range(10))
    assert ids_in(tablet.read(4, 1 << 20).records) == [4, 5]  # a read stops at its segment's end
    tablet.close()


@pytest.mark.asyncio
async def test_an_append_larger_than_a_segment_gets_a_segment_of_its_own(log_dir: Path) -> None:
    config = LogConfig(segment_size_bytes_max=200, flush_interval_messages=1, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    await append_durable(tablet, batch_bytes([1], name_size=300))
    await append_durable(tablet, batch_bytes([2], name_size=300))
    assert [f.name for f in segment_files(log_dir)] == [segment_file_name(0), segment_file_name(1)]
    assert ids_in(tablet.read_range(0, 2, 1 << 20)) == [1, 2]
    tablet.close()


@pytest.mark.asyncio
async def test_reopen_rebuilds_offsets_index_and_timestamps(log_dir: Path) -> None:
    batch_size = len(batch_bytes([0]))
    config = LogConfig(segment_size_bytes_max=batch_size * 2, flush_interval_messages=1, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    for index in range(5):
        await append_durable(tablet, batch_bytes([index, index + 100]), now_ms=T0_MS + 1000 * index)
    before = tablet.read_range(0, 10, 1 << 20)
    tablet.close()

    reopened = LogTablet.open(log_dir, config)
    assert (reopened.log_start_offset, reopened.log_end_offset, reopened.high_watermark) == (0, 10, 10)
    assert reopened.read_range(0, 10, 1 << 20) == before
    assert base_offsets(reopened.read(7, 1 << 20).records) == [6]
    assert reopened.offset_for_timestamp(T0_MS + 2500) == 6
    result = await append_durable(reopened, batch_bytes([5]), now_ms=T0_MS)
    assert result.base_offset == 10
    assert [h.commit_timestamp for _p, h in log_batch.iter_batches(reopened.read(10, 1 << 20).records)] == [
        T0_MS + 4000
    ]
    reopened.close()


@pytest.mark.asyncio
async def test_reopen_rebuilds_writer_state_from_batch_headers(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    for sequence in range(3):
        await append_durable(tablet, batch_bytes([sequence], writer_id=7, sequence=sequence))
    tablet.close()

    reopened = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    with pytest.raises(DuplicateSequenceError):
        append(reopened, batch_bytes([2], writer_id=7, sequence=2))
    with pytest.raises(OutOfOrderSequenceError):
        append(reopened, batch_bytes([9], writer_id=7, sequence=5))
    assert reopened.log_end_offset == 3  # rejected batches were not written
    result = await append_durable(reopened, batch_bytes([3], writer_id=7, sequence=3))
    assert result.base_offset == 3
    reopened.close()


@pytest.mark.parametrize("deletion", ["tiered", "retention"])
@pytest.mark.asyncio
async def test_a_writer_whose_batches_were_all_in_deleted_segments_is_known_after_a_reopen(
    log_dir: Path, deletion: str
) -> None:
    """Writer 7's batches go into segments that are then deleted (copied to remote storage, or expired);
    writer 8 writes after them. After a reopen, 7's next sequence is accepted and its last one is still a
    duplicate: the state was saved before the deletion."""
    size = len(batch_bytes([0], writer_id=7, sequence=0))
    tablet = LogTablet.open(log_dir, LogConfig(segment_size_bytes_max=size * 2, flush_interval_messages=1,
                                                writer_expiration_ms=60_000))
    for sequence in range(4):
        await append_durable(tablet, batch_bytes([sequence], writer_id=7, sequence=sequence))
    for sequence in range(3):
        await append_durable(tablet, batch_bytes([10 + sequence], writer_id=8, sequence=sequence), now_ms=T0_MS + 10)
    if deletion == "tiered":
        assert tablet.delete_tiered_segments(below_offset=4, keep=1) > 0
    else:
        assert tablet.delete_segments(older_than_ms=T0_MS + 5, below_offset=None) > 0
    assert tablet.log_start_offset == 4
    tablet.close()

    reopened = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    assert reopened.log_start_offset == 4
    with pytest.raises(DuplicateSequenceError):
        append(reopened, batch_bytes([3], writer_id=7, sequence=3))
    with pytest.raises(DuplicateSequenceError):
        append(reopened, batch_bytes([12], writer_id=8, sequence=2))
    assert (await append_durable(reopened, batch_bytes([4], writer_id=7, sequence=4))).base_offset == 7
    assert (await append_durable(reopened, batch_bytes([13], writer_id=8, sequence=3))).base_offset == 8
    reopened.close()


@pytest.mark.asyncio
async def test_several_batches_of_one_writer_in_one_append_are_accepted_in_sequence(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    result = await append_durable(
        tablet, batch_bytes([1], writer_id=3, sequence=0), batch_bytes([2], writer_id=3, sequence=1)
    )
    assert result.next_offset == 2
    with pytest.raises(OutOfOrderSequenceError):
        append(tablet, batch_bytes([3], writer_id=3, sequence=2), batch_bytes([4], writer_id=3, sequence=4))
    with pytest.raises(OutOfOrderSequenceError):
        append(tablet, batch_bytes([3], writer_id=3, sequence=2), batch_bytes([4], writer_id=3, sequence=2))
    assert tablet.log_end_offset == 2
    tablet.close()


@pytest.mark.asyncio
async def test_a_retried_batch_is_a_duplicate_only_when_sent_alone(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    await append_durable(tablet, batch_bytes([1], writer_id=3, sequence=0))
    with pytest.raises(DuplicateSequenceError):
        append(tablet, batch_bytes([1], writer_id=3, sequence=0))
    # the client takes DUPLICATE_SEQUENCE as success: answering it here would silently drop batch 1
    with pytest.raises(OutOfOrderSequenceError, match="retry it alone"):
        append(tablet, batch_bytes([1], writer_id=3, sequence=0), batch_bytes([2], writer_id=3, sequence=1))
    # nor when another writer's batch rides along
    with pytest.raises(OutOfOrderSequenceError, match="retry it alone"):
        append(tablet, batch_bytes([1], writer_id=3, sequence=0), batch_bytes([9], writer_id=4, sequence=0))
    assert tablet.log_end_offset == 1
    tablet.close()


@pytest.mark.asyncio
async def test_a_retry_of_a_batch_not_yet_durable_is_told_to_retry_not_acknowledged(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    original = append(tablet, batch_bytes([1], writer_id=3, sequence=0))
    # DUPLICATE_SEQUENCE would count as the client's acknowledgement while the original is not on disk
    with pytest.raises(RequestTimeoutError, match="retry"):
        append(tablet, batch_bytes([1], writer_id=3, sequence=0))
    await tablet.wait_durable(original.next_offset)
    with pytest.raises(DuplicateSequenceError):
        append(tablet, batch_bytes([1], writer_id=3, sequence=0))
    assert tablet.log_end_offset == 1
    tablet.close()


@pytest.mark.asyncio
async def test_appends_forget_writers_idle_longer_than_the_expiration(log_dir: Path) -> None:
    config = LogConfig(segment_size_bytes_max=1 << 30, flush_interval_messages=1, writer_expiration_ms=80_000)
    tablet = LogTablet.open(log_dir, config)
    await append_durable(tablet, batch_bytes([1], writer_id=1, sequence=0), now_ms=T0_MS)
    await append_durable(tablet, batch_bytes([2], writer_id=2, sequence=0), now_ms=T0_MS + 50_000)
    assert tablet.writer_state.writer_count == 2
    await append_durable(tablet, batch_bytes([3], writer_id=2, sequence=1), now_ms=T0_MS + 90_000)
    assert tablet.writer_state.writer_count == 1  # writer 1 was idle for 90 s
    # writer 1's state is gone: it may start again at sequence 0
    await append_durable(tablet, batch_bytes([4], writer_id=1, sequence=0), now_ms=T0_MS + 95_000)
    tablet.close()

    # writer state rebuilt from the log carries the commit times, so idle writers expire after a restart too
    reopened = LogTablet.open(log_dir, config)
    await append_durable(reopened, batch_bytes([5]), now_ms=T0_MS + 200_000)
    assert reopened.writer_state.writer_count == 0
    reopened.close()


# ---- crash repair ----


async def three_batches(log_dir: Path) -> tuple[list[int], int]:
    """Write batches [1,2], [3], [4,5,6]; returns the file positions where each batch ends, and the file size."""
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    ends = []
    size = 0
    for ids in ([1, 2], [3], [4, 5, 6]):
        batch = batch_bytes(ids)
        await append_durable(tablet, batch)
        size += len(batch)
        ends.append(size)
    tablet.close()
    return ends, size


@pytest.mark.asyncio
@pytest.mark.parametrize("chopped_bytes", [1, 30, 47, 48, 60])
async def test_a_torn_last_batch_is_cut_off_and_appends_continue_after_the_last_good_one(
    log_dir: Path, chopped_bytes: int
) -> None:
    ends, size = await three_batches(log_dir)
    (path,) = segment_files(log_dir)
    os.truncate(path, size - chopped_bytes)

    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    assert path.stat().st_size == ends[1]
    assert (tablet.log_end_offset, tablet.high_watermark) == (3, 3)
    result = await append_durable(tablet, batch_bytes([7]))
    assert result.base_offset == 3
    tablet.close()

    reopened = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    assert ids_in(reopened.read_range(0, 100, 1 << 20)) == [1, 2, 3, 7]
    reopened.close()


@pytest.mark.asyncio
async def test_a_last_batch_failing_its_crc_is_cut_off(log_dir: Path) -> None:
    ends, size = await three_batches(log_dir)
    (path,) = segment_files(log_dir)
    flip_byte(path, size - 3)

    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    assert path.stat().st_size == ends[1]
    assert tablet.log_end_offset == 3
    assert ids_in(tablet.read(0, 1 << 20).records) == [1, 2, 3]
    assert (await append_durable(tablet, batch_bytes([7]))).base_offset == 3
    tablet.close()


@pytest.mark.asyncio
async def test_garbage_after_the_last_batch_is_cut_off(log_dir: Path) -> None:
    _ends, size = await three_batches(log_dir)
    (path,) = segment_files(log_dir)
    path.write_bytes(path.read_bytes() + b"\x00" * 100)

    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    assert path.stat().st_size == size
    assert tablet.log_end_offset == 6
    tablet.close()


@pytest.mark.asyncio
async def test_a_torn_batch_in_a_closed_segment_refuses_to_open(log_dir: Path) -> None:
    batch_size = len(batch_bytes([0]))
    config = LogConfig(segment_size_bytes_max=batch_size * 2, flush_interval_messages=1, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    for index in range(5):
        await append_durable(tablet, batch_bytes([index]))
    tablet.close()
    first = segment_files(log_dir)[0]
    os.truncate(first, first.stat().st_size - 5)

    with pytest.raises(LogStorageError, match="corrupt"):
        LogTablet.open(log_dir, config)


@pytest.mark.asyncio
async def test_a_missing_segment_in_the_middle_refuses_to_open(log_dir: Path) -> None:
    batch_size = len(batch_bytes([0]))
    config = LogConfig(segment_size_bytes_max=batch_size * 2, flush_interval_messages=1, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    for index in range(6):
        await append_durable(tablet, batch_bytes([index]))
    tablet.close()
    segment_files(log_dir)[1].unlink()

    with pytest.raises(LogStorageError, match="gap"):
        LogTablet.open(log_dir, config)


@pytest.mark.asyncio
async def test_an_empty_log_directory_opens_at_offset_zero_and_an_empty_last_segment_is_kept(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    assert (tablet.log_start_offset, tablet.log_end_offset) == (0, 0)
    tablet.close()
    reopened = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    assert (await append_durable(reopened, batch_bytes([1]))).base_offset == 0
    reopened.close()


# ---- timestamps and retention ----


@pytest.mark.asyncio
async def test_offset_for_timestamp_finds_the_first_batch_committed_at_or_after_it(log_dir: Path) -> None:
    batch_size = len(batch_bytes([0, 1]))
    config = LogConfig(segment_size_bytes_max=batch_size * 2, flush_interval_messages=1, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    for index in range(5):  # batches at offsets 0, 2, 4, 6, 8 committed at T0 + 0, 1000, ... 4000
        await append_durable(tablet, batch_bytes([index, index]), now_ms=T0_MS + 1000 * index)
    assert len(segment_files(log_dir)) == 3
    assert tablet.offset_for_timestamp(0) == 0
    assert tablet.offset_for_timestamp(T0_MS) == 0
    assert tablet.offset_for_timestamp(T0_MS + 1) == 2
    assert tablet.offset_for_timestamp(T0_MS + 2000) == 4
    assert tablet.offset_for_timestamp(T0_MS + 3999) == 8
    assert tablet.offset_for_timestamp(T0_MS + 4001) == 10  # none: the high watermark
    tablet.close()


@pytest.mark.asyncio
async def test_retention_deletes_old_closed_segments_but_never_the_active_one(log_dir: Path) -> None:
    batch_size = len(batch_bytes([0]))
    config = LogConfig(segment_size_bytes_max=batch_size * 2, flush_interval_messages=1, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    for index in range(5):  # segments [0,1] [2,3] [4]
        await append_durable(tablet, batch_bytes([index]), now_ms=T0_MS + 1000 * index)

    assert tablet.delete_segments(older_than_ms=T0_MS + 1000, below_offset=None) == 0  # [0,1] ends at T0+1000
    freed = tablet.delete_segments(older_than_ms=T0_MS + 1001, below_offset=None)
    assert freed == 2 * batch_size
    assert tablet.log_start_offset == 2
    assert [f.name for f in segment_files(log_dir)] == [segment_file_name(2), segment_file_name(4)]
    with pytest.raises(LogOffsetOutOfRangeError):
        tablet.read(0, 1 << 20)

    assert tablet.delete_segments(older_than_ms=None, below_offset=3) == 0  # [2,3] still holds offset 3
    assert tablet.delete_segments(older_than_ms=T0_MS + 10_000, below_offset=None) == 2 * batch_size
    assert tablet.delete_segments(older_than_ms=T0_MS + 10_000, below_offset=100) == 0  # the active one stays
    assert [f.name for f in segment_files(log_dir)] == [segment_file_name(4)]
    assert ids_in(tablet.read(EARLIEST_OFFSET, 1 << 20).records) == [4]
    tablet.close()

    reopened = LogTablet.open(log_dir, config)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (4, 5)
    reopened.close()


@pytest.mark.asyncio
async def test_no_segment_is_deleted_while_a_thread_reads_the_log(log_dir: Path) -> None:
    """A new leader's changelog replays on a thread while the loop keeps the log: retention deletes nothing
    until every hold is released (a deleted segment's file would close under the reader), then catches up."""
    batch_size = len(batch_bytes([0]))
    config = LogConfig(segment_size_bytes_max=batch_size * 2, flush_interval_messages=1, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    for index in range(5):  # segments [0,1] [2,3] [4]
        await append_durable(tablet, batch_bytes([index]), now_ms=T0_MS + 1000 * index)
    first, second = tablet.hold_segments(), tablet.hold_segments()
    assert tablet.delete_segments(older_than_ms=None, below_offset=4) == 0
    assert tablet.delete_tiered_segments(4, keep=1) == 0
    first()
    first()  # a release counts once
    assert tablet.delete_segments(older_than_ms=None, below_offset=4) == 0
    await asyncio.to_thread(second)  # released from the reading thread
    assert tablet.delete_segments(older_than_ms=None, below_offset=4) == 4 * batch_size
    assert tablet.log_start_offset == 4
    tablet.close()


# ---- durability and group commit ----


@pytest.mark.asyncio
async def test_concurrent_writers_share_fsyncs_and_all_become_durable(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsync_count = 0
    real_fsync = LogSegment.fsync

    def counting_fsync(segment: LogSegment) -> None:
        nonlocal fsync_count
        fsync_count += 1
        real_fsync(segment)  # the real fdatasync still runs: this only counts

    monkeypatch.setattr(LogSegment, "fsync", counting_fsync)
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)

    async def writer(index: int) -> AppendResult:
        result = append(tablet, batch_bytes([index]))
        await tablet.wait_durable(result.next_offset)
        assert tablet.high_watermark >= result.next_offset
        return result

    results = await asyncio.gather(*(writer(index) for index in range(200)))
    assert sorted(r.base_offset for r in results) == list(range(200))
    assert tablet.high_watermark == 200
    assert fsync_count <= 2, f"{fsync_count} fsyncs for 200 concurrent appends"

    # appends arriving while a flush runs are covered by the next flush, not one fsync each
    fsync_count = 0
    first = asyncio.ensure_future(writer(1000))
    await asyncio.sleep(0)
    late = [asyncio.ensure_future(writer(1001 + index)) for index in range(50)]
    await asyncio.gather(first, *late)
    assert tablet.high_watermark == 251
    assert fsync_count <= 3, f"{fsync_count} fsyncs for 51 appends in two waves"
    tablet.close()


@pytest.mark.asyncio
async def test_wait_durable_on_a_closed_log_raises_instead_of_hanging(log_dir: Path) -> None:
    tablet = LogTablet.open(log_dir, DURABLE_EACH_APPEND)
    result = append(tablet, batch_bytes([1]))
    tablet.close()
    with pytest.raises(LogStorageError):
        await asyncio.wait_for(tablet.wait_durable(result.next_offset), 5)


@pytest.mark.asyncio
async def test_with_a_flush_interval_the_high_watermark_moves_before_fsync(log_dir: Path) -> None:
    config = LogConfig(segment_size_bytes_max=1 << 30, flush_interval_messages=3, writer_expiration_ms=60_000)
    tablet = LogTablet.open(log_dir, config)
    append(tablet, batch_bytes([1]))
    append(tablet, batch_bytes([2]))
    assert tablet.high_watermark == 2
    third = append(tablet, batch_bytes([3]))
    assert tablet.high_watermark == 2  # every third append waits for an fsync
    await tablet.wait_durable(third.next_offset)
    assert tablet.high_watermark == 3
    append(tablet, batch_bytes([4]))
    assert tablet.high_watermark == 4  # and the count starts again
    tablet.close()
