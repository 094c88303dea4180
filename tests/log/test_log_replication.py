"""What a replicated log needs from LogTablet: a high watermark held back by the followers, batches appended
with the leader's offsets, truncation of what a follower must give up, and a recorded high watermark."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.errors import DuplicateSequenceError, LogStorageError, NotLeaderOrFollowerError
from strom.log.log_tablet import HIGH_WATERMARK_FILE, DivergedLogError, LogTablet
from tests.log.test_log_tablet import DURABLE_EACH_APPEND, T0_MS, append, batch_bytes, ids_in

pytestmark = pytest.mark.asyncio


async def test_an_acknowledgement_waits_for_the_followers_but_a_flush_does_not(tmp_path: Path) -> None:
    leader = LogTablet.open(tmp_path / "leader", DURABLE_EACH_APPEND)
    try:
        leader.set_replication_limit(0)
        result = append(leader, batch_bytes([1, 2]), batch_bytes([3]))
        acknowledged = leader.durable(result.next_offset)
        await leader.flushed(result.next_offset)
        assert leader.durable_end == 3 and leader.high_watermark == 0 and not acknowledged.done()
        assert ids_in(leader.read(0, 1 << 20, for_follower=True).records) == [1, 2, 3]
        assert leader.read(0, 1 << 20).records == b"", "clients see nothing the followers lack"

        leader.set_replication_limit(2)  # a follower has the first batch
        await asyncio.sleep(0)
        assert leader.high_watermark == 2 and not acknowledged.done()
        leader.set_replication_limit(5)  # beyond what is durable here: capped
        await acknowledged
        assert leader.high_watermark == 3
        leader.set_replication_limit(1)
        assert leader.high_watermark == 3, "the high watermark never moves back"
    finally:
        leader.close()


async def test_a_follower_appends_the_leaders_batches_with_their_offsets_and_writer_state(tmp_path: Path) -> None:
    leader = LogTablet.open(tmp_path / "leader", DURABLE_EACH_APPEND)
    follower = LogTablet.open(tmp_path / "follower", DURABLE_EACH_APPEND)
    try:
        result = append(leader, batch_bytes([1, 2], writer_id=7, sequence=0), batch_bytes([3], writer_id=7, sequence=1))
        await leader.durable(result.next_offset)
        fetched = leader.read(0, 1 << 20, for_follower=True).records
        appended = follower.append_replicated(fetched, T0_MS)
        await follower.flushed(appended.next_offset)
        assert (appended.base_offset, appended.next_offset, follower.durable_end) == (0, 3, 3)
        assert follower.read(0, 1 << 20).records == fetched, "the same bytes: offsets and timestamps kept"
        with pytest.raises(DuplicateSequenceError):  # a retry of writer 7's last batch is known here too
            follower.check_writers([(7, 1)], follower.high_watermark)
        with pytest.raises(LogStorageError, match="start at 0, the log ends at 3"):
            follower.append_replicated(fetched, T0_MS)
    finally:
        leader.close()
        follower.close()


async def test_truncation_drops_whole_batches_and_what_they_taught_the_writer_state(tmp_path: Path) -> None:
    tablet = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        for sequence, ids in enumerate([[1, 2], [3, 4, 5], [6]]):
            result = append(tablet, batch_bytes(ids, writer_id=9, sequence=sequence))
            await tablet.durable(result.next_offset)
        await tablet.truncate_to(3)  # inside the second batch: the whole batch goes
        assert (tablet.log_end_offset, tablet.durable_end, tablet.high_watermark) == (2, 2, 2)
        assert ids_in(tablet.read(0, 1 << 20).records) == [1, 2]
        tablet.check_writers([(9, 1)], tablet.high_watermark)  # sequence 1 is new again: no duplicate
        result = append(tablet, batch_bytes([30], writer_id=9, sequence=1))
        await tablet.durable(result.next_offset)
        assert ids_in(tablet.read(0, 1 << 20).records) == [1, 2, 30]
    finally:
        tablet.close()
    reopened = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        assert ids_in(reopened.read(0, 1 << 20).records) == [1, 2, 30], "the truncation is on disk"
    finally:
        reopened.close()


async def test_the_high_watermark_is_recorded_only_when_it_moved(tmp_path: Path) -> None:
    """The replication manager checkpoints every bucket each second on the event loop: an idle bucket
    writes nothing, and the first checkpoint of a freshly opened log writes its record even unchanged."""
    record = tmp_path / "log" / HIGH_WATERMARK_FILE
    tablet = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        first = append(tablet, batch_bytes([1, 2]))
        await tablet.durable(first.next_offset)
        tablet.checkpoint_high_watermark()
        written = record.stat().st_ino  # every record is a new file renamed over the old one
        tablet.checkpoint_high_watermark()
        assert record.stat().st_ino == written, "an unchanged high watermark was written again"
        second = append(tablet, batch_bytes([3]))
        await tablet.durable(second.next_offset)
        tablet.checkpoint_high_watermark()
        assert record.read_text() == "3" and record.stat().st_ino != written
    finally:
        tablet.close()
    record.unlink()
    reopened = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        reopened.checkpoint_high_watermark()
        assert record.read_text() == "3"
    finally:
        reopened.close()


async def test_a_reopened_replica_starts_from_its_recorded_high_watermark(tmp_path: Path) -> None:
    tablet = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        tablet.set_replication_limit(0)
        first = append(tablet, batch_bytes([1, 2]))
        tablet.set_replication_limit(first.next_offset)
        await tablet.durable(first.next_offset)
        tablet.checkpoint_high_watermark()
        second = append(tablet, batch_bytes([3]))  # on disk, never acknowledged
        await tablet.flushed(second.next_offset)
    finally:
        tablet.close()
    assert (tmp_path / "log" / HIGH_WATERMARK_FILE).read_text() == "2"
    reopened = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        assert (reopened.high_watermark, reopened.log_end_offset) == (2, 3)
    finally:
        reopened.close()


async def test_a_follower_holding_a_batch_its_leader_never_had_learns_where_they_diverge(tmp_path: Path) -> None:
    """A leader killed before its first high-watermark record restarts with no record, so it cannot tell
    its unacknowledged tail from the rest; as a follower it meets its new leader's different batches and
    truncates to where they start (the follower used to retry the same failing append for ever)."""
    leader = LogTablet.open(tmp_path / "leader", DURABLE_EACH_APPEND)
    follower = LogTablet.open(tmp_path / "follower", DURABLE_EACH_APPEND)
    try:
        for tablet in (leader, follower):  # both hold offsets 0-1
            await tablet.durable(append(tablet, batch_bytes([1, 2], writer_id=7, sequence=0)).next_offset)
        await follower.durable(append(follower, batch_bytes([3, 4], writer_id=7, sequence=1)).next_offset)  # never sent
        await leader.durable(append(leader, batch_bytes([5], writer_id=8, sequence=0)).next_offset)
        await leader.durable(append(leader, batch_bytes([6, 7], writer_id=8, sequence=1)).next_offset)
        fetched = leader.read(3, 1 << 20, for_follower=True).records  # what a fetch at the follower's end gets
        with pytest.raises(DivergedLogError) as diverged:
            follower.append_replicated(fetched, T0_MS)
        assert diverged.value.base_offset == 3
        await follower.truncate_to(diverged.value.base_offset)  # as the follower does: its batch [2, 3] goes whole
        assert follower.log_end_offset == 2
        appended = follower.append_replicated(leader.read(2, 1 << 20, for_follower=True).records, T0_MS)
        await follower.flushed(appended.next_offset)
        assert ids_in(follower.read(0, 1 << 20).records) == [1, 2, 5, 6, 7]
    finally:
        leader.close()
        follower.close()



@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[LogTablet, LogTablet]]:
    """A leader's and a follower's log (the follower's reopened by a test is closed by it)."""
    leader = LogTablet.open(tmp_path / "leader", DURABLE_EACH_APPEND)
    follower = LogTablet.open(tmp_path / "follower", DURABLE_EACH_APPEND)
    try:
        yield leader, follower
    finally:
        leader.close()
        follower.close()


async def _replicated(leader: LogTablet, follower: LogTablet, *batches: bytearray) -> int:
    """Append ``batches`` on the leader and copy them to the follower as a fetch would."""
    start = leader.log_end_offset
    result = append(leader, *batches)
    await leader.durable(result.next_offset)
    appended = follower.append_replicated(leader.read(start, 1 << 20, for_follower=True).records, T0_MS)
    await follower.flushed(appended.next_offset)
    return appended.next_offset


async def test_a_follower_keeps_what_it_holds_above_its_recorded_high_watermark_when_the_leader_holds_it_too(
    tmp_path: Path,
) -> None:
    """The recorded high watermark lags (it is written once a second): what lies above it may have been
    acknowledged. A follower compares it with its leader's log instead of dropping it."""
    leader = LogTablet.open(tmp_path / "leader", DURABLE_EACH_APPEND)
    follower = LogTablet.open(tmp_path / "follower", DURABLE_EACH_APPEND)
    try:
        recorded = await _replicated(leader, follower, batch_bytes([1, 2], writer_id=7, sequence=0))
        follower.set_replication_limit(recorded)
        follower.checkpoint_high_watermark()
        end = await _replicated(leader, follower, batch_bytes([3], writer_id=7, sequence=1),
                                batch_bytes([4, 5], writer_id=7, sequence=2))
        await leader.durable(append(leader, batch_bytes([6], writer_id=7, sequence=3)).next_offset)
        follower.close()
        follower = LogTablet.open(tmp_path / "follower", DURABLE_EACH_APPEND)
        assert (follower.high_watermark, follower.log_end_offset) == (recorded, end)

        matched = await follower.append_from_leader(leader.read(recorded, 1 << 20, for_follower=True).records, T0_MS)
        assert matched == leader.log_end_offset == follower.log_end_offset == 6
        assert follower.read_range(0, 6, 1 << 20, unacknowledged=True) == leader.read(0, 1 << 20).records
        with pytest.raises(DuplicateSequenceError):  # the kept batches still teach the writer state
            follower.check_writers([(7, 2)], 6)
    finally:
        leader.close()
        follower.close()


async def test_a_follower_gives_up_its_batches_from_the_first_that_differs_from_the_leaders(
    pair: tuple[LogTablet, LogTablet],
) -> None:
    leader, follower = pair
    await _replicated(leader, follower, batch_bytes([1, 2]), batch_bytes([3]))  # offsets 0-2 on both
    await follower.durable(append(follower, batch_bytes([40])).next_offset)  # never sent: offset 3
    await follower.durable(append(follower, batch_bytes([50, 51])).next_offset)
    await leader.durable(append(leader, batch_bytes([4, 5])).next_offset)  # the leader's offsets 3-4
    matched = await follower.append_from_leader(leader.read(2, 1 << 20, for_follower=True).records, T0_MS)
    assert matched == follower.log_end_offset == 5
    assert ids_in(follower.read_range(0, 5, 1 << 20, unacknowledged=True)) == [1, 2, 3, 4, 5]


async def test_a_follower_whose_batches_straddle_the_leaders_truncates_to_its_own_batch_start(
    pair: tuple[LogTablet, LogTablet],
) -> None:
    leader, follower = pair
    await _replicated(leader, follower, batch_bytes([1, 2]))
    await follower.durable(append(follower, batch_bytes([30, 31, 32])).next_offset)  # offsets 2-4
    await leader.durable(append(leader, batch_bytes([3])).next_offset)
    await leader.durable(append(leader, batch_bytes([4, 5])).next_offset)  # the leader's batch starts at 3
    matched = await follower.append_from_leader(leader.read(3, 1 << 20, for_follower=True).records, T0_MS)
    assert matched == follower.log_end_offset == 2, "its batch at 2-4 went whole; fetch again from 2"
    matched = await follower.append_from_leader(leader.read(2, 1 << 20, for_follower=True).records, T0_MS)
    assert matched == 5 and ids_in(follower.read_range(0, 5, 1 << 20, unacknowledged=True)) == [1, 2, 3, 4, 5]


async def test_a_log_started_at_a_later_offset_keeps_the_batches_from_there(tmp_path: Path) -> None:
    tablet = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        for ids in ([1, 2], [3], [4, 5]):
            await tablet.durable(append(tablet, batch_bytes(ids)).next_offset)
        await tablet.start_at(2)  # a batch starts there: the batches from 2 on stay
        assert (tablet.log_start_offset, tablet.log_end_offset) == (2, 5)
        assert ids_in(tablet.read_range(2, 5, 1 << 20, unacknowledged=True)) == [3, 4, 5]
        await tablet.start_at(4)  # inside the batch 3-4: nothing can be kept
        assert (tablet.log_start_offset, tablet.log_end_offset) == (4, 4)
    finally:
        tablet.close()
    reopened = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        assert (reopened.log_start_offset, reopened.log_end_offset) == (4, 4)
    finally:
        reopened.close()


async def test_a_replica_that_stops_leading_fails_the_waits_whose_fsync_is_still_running(tmp_path: Path) -> None:
    """A write whose fsync ran while its replica stopped leading is never acknowledged by the high watermark
    that follows: as a follower that watermark tracks another leader's log, which may hold other batches at
    those offsets (found by the nemesis: such a wait outlived the role change)."""
    tablet = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    try:
        tablet.set_replication_limit(0)  # followers must acknowledge
        result = append(tablet, batch_bytes([1, 2]))
        acknowledged = tablet.durable(result.next_offset)  # its fsync is requested, not yet done
        assert tablet.flush_in_flight
        tablet.fail_unacknowledged(NotLeaderOrFollowerError("now led by another server"))
        await tablet.flushed(result.next_offset)
        tablet.set_replication_limit(None)  # the high watermark passes the offset, as a follower's may
        with pytest.raises(NotLeaderOrFollowerError):
            await asyncio.wait_for(acknowledged, 1)
    finally:
        tablet.close()
