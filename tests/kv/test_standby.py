"""A follower's standby KV state (``table.kv.standby-replica.enabled``): it applies the changelog its log
replicates as the high watermark passes it — never what lies above — and, promoted, serves the bucket as
a leader's state would, holding the uncommitted rest as its pre-write buffer; a standby that lost its log
refuses promotion so its replica reopens it from a snapshot."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from strom.kv.kv_tablet import KvRestoreNeededError, KvTablet
from strom.log.log_tablet import LogTablet
from tests.kv.test_kv_tablet import LOG_CONFIG, T0_MS, Bucket


class Follower:
    """A follower's log beside a leader :class:`Bucket`, and a standby KvTablet over it."""

    def __init__(self, directory: Path, leader: Bucket) -> None:
        self.leader = leader
        self.log = LogTablet.open(directory / "log", LOG_CONFIG)
        self.log.set_replication_limit(0)
        self.kv = KvTablet(directory / "kv", self.log, leader.format, leader.config, standby=True)

    async def fetch(self, committed: int | None = None) -> None:
        """Copy what the leader's log holds past ours, durably, then take ``committed`` (default: the
        leader's high watermark) as ours, as a follower's fetch does."""
        source = self.leader.kv.log
        data = source.read_range(self.log.log_end_offset, source.log_end_offset, 1 << 30, unacknowledged=True)
        if data:
            await self.log.append_from_leader(data, T0_MS)
            await self.log.flushed(self.log.log_end_offset)
        self.log.set_replication_limit(source.high_watermark if committed is None else committed)
        await asyncio.sleep(0)  # the standby applies on the next turn of the loop
        await asyncio.sleep(0)

    def lookup(self, id_: int) -> tuple[object, ...] | None:
        (value,) = self.kv.lookup([self.leader.key(id_)])
        return None if value is None else self.leader.format.decode_stored(value)

    def close(self) -> None:
        self.kv.close()
        self.log.close()


@pytest.mark.asyncio
async def test_a_standby_applies_what_becomes_committed_and_nothing_above(tmp_path: Path) -> None:
    leader = Bucket(tmp_path / "leader")
    follower = Follower(tmp_path / "follower", leader)
    try:
        await leader.put((1, ("a", 1)), (2, ("b", 2)))
        await follower.fetch()
        assert follower.lookup(1) == (1, "a", 1) and follower.kv.applied_offset == leader.kv.log.high_watermark
        await leader.put((1, ("a2", 10)), (3, ("c", 3)))
        await leader.put((2, None))
        committed = follower.log.high_watermark
        await follower.fetch(committed=committed)  # fetched, not committed yet
        assert follower.lookup(1) == (1, "a", 1) and follower.lookup(3) is None
        await follower.fetch()
        assert follower.lookup(1) == (1, "a2", 10)
        assert follower.lookup(2) is None and follower.lookup(3) == (3, "c", 3)
        assert follower.kv.row_count == 2
    finally:
        follower.close()
        leader.close()


@pytest.mark.asyncio
async def test_a_promoted_standby_holds_what_is_uncommitted_and_takes_writes(tmp_path: Path) -> None:
    leader = Bucket(tmp_path / "leader")
    follower = Follower(tmp_path / "follower", leader)
    try:
        await leader.put((1, ("a", 1)))
        await follower.fetch()
        await leader.put((1, ("b", 2)))  # the old leader's last write: on the follower, not known committed
        await follower.fetch(committed=follower.log.high_watermark)
        follower.kv.promote()
        assert not follower.kv.standby
        # what it holds above the high watermark is its pre-write buffer: a put reads it as the old value
        assert follower.kv.buffered_bytes > 0
        result = follower.kv.prepare_put([leader.key(1)], [leader.row(1, "c", 3)], 1, None, -1, -1, T0_MS)
        follower.log.set_replication_limit(None)  # alone in the ISR now
        await follower.kv.acknowledgement(result)
        assert follower.lookup(1) == (1, "c", 3)
        changes = [t for t, _ in _change_types(follower)]
        assert changes[-2:] == ["UPDATE_BEFORE", "UPDATE_AFTER"]  # an update of the held row, not an insert
    finally:
        follower.close()
        leader.close()


def _change_types(follower: Follower) -> list[tuple[str, int]]:
    from strom.records import log_batch

    data = follower.log.read_range(0, follower.log.high_watermark, 1 << 30)
    found = []
    for position, header in log_batch.iter_batches(data):
        change_types, _batch = log_batch.read_arrow(data, position, header, follower.leader.format.arrow_schema)
        found += [(log_batch.ChangeType(c).name, header.base_offset) for c in change_types or b""]
    return found


@pytest.mark.asyncio
async def test_a_standby_whose_log_skipped_ahead_stops_and_refuses_promotion(tmp_path: Path) -> None:
    leader = Bucket(tmp_path / "leader")
    follower = Follower(tmp_path / "follower", leader)
    try:
        await leader.put((1, ("a", 1)))
        await follower.fetch()
        applied = follower.kv.applied_offset
        await leader.put((2, ("b", 2)))
        await leader.put((3, ("c", 3)))
        # the leader's older segments went to remote storage: this log starts where the leader's does now
        await follower.log.start_at(leader.kv.log.log_end_offset - 1)
        await follower.fetch()
        assert follower.kv.standby_lost is not None and follower.kv.applied_offset == applied
        with pytest.raises(KvRestoreNeededError, match="behind its log"):
            follower.kv.promote()
    finally:
        follower.close()
        leader.close()
