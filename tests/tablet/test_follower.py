"""A follower (ReplicationManager) against a fake leader: its fetch task ends when its replica changes role,
even when a cancellation is lost on the way; a role change whose notice never came is taken up from
ZooKeeper; a log that went offline (a full disk) is reopened once there is room, and fetching goes on.

A lost cancellation:
Before Python 3.12, ``asyncio.wait_for`` returns its result instead of raising when it is cancelled just as
the awaited call completes (strom's peer connections used it to connect). A follower's fetch loop that
swallowed its cancellation that way kept running; the replica's role change waited for it for ever, holding
the bucket's lock, so the server never took up a leadership it was elected to (found by the nemesis: a
bucket stayed on a leader that did not know it led). The fake peer connection here swallows the first
cancellation exactly so.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from strom.config import Configuration
from strom.log.log_tablet import LogTablet
from strom.membership.contract import LeaderAndIsr
from strom.rpc.messages import pb
from strom.rpc.peers import ServerNode
from strom.tablet.replica import Replica, ReplicaManager
from strom.tablet.replication import ReplicationManager
from tests.log.test_log_tablet import DURABLE_EACH_APPEND, append, batch_bytes
from tests.tablet.test_leader_high_watermark import BUCKET, ME, SECOND, TABLE, GatedStates

pytestmark = pytest.mark.asyncio


class SwallowingPeers:
    """A leader that never answers a fetch, and a connection that swallows the first cancellation."""

    def __init__(self) -> None:
        self.swallowed = False
        self.fetches = 0

    async def request(self, _host: str, _port: int, _key: object, _message: object, *, server_name: str) -> Any:
        self.fetches += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed = True  # as wait_for did: the call completed, the cancellation is gone
        response = pb.FetchLogResponse()
        response.tables_resp.add(table_id=TABLE.table_id).buckets_resp.add(bucket_id=0, high_watermark=0)
        return response


class Registry:
    def live(self) -> dict[int, ServerNode]:
        return {SECOND: ServerNode(SECOND, "127.0.0.1", 1)}


async def test_a_follower_elected_leader_leads_although_its_fetch_swallowed_the_cancellation(tmp_path: Path) -> None:
    replicas = ReplicaManager(tmp_path, Configuration())
    states = GatedStates(LeaderAndIsr(SECOND, 1, (ME, SECOND), (ME, SECOND)))
    peers = SwallowingPeers()
    manager = ReplicationManager(
        ME, replicas, states, registry=Registry(), peers=peers,  # type: ignore[arg-type]
        table_of=lambda _table_id: TABLE, lag_max_ms=60_000, silence_max_ms=60_000,
    )
    await manager.apply(TABLE, BUCKET)  # following SECOND
    try:
        for _ in range(100):
            if peers.fetches:
                break
            await asyncio.sleep(0.01)
        states.state, states.version = LeaderAndIsr(ME, 2, (ME, SECOND), (ME,)), states.version + 1
        await asyncio.wait_for(manager.apply(TABLE, BUCKET), 10)  # elected: it must take up the leadership
        replica = replicas.replica(BUCKET)
        assert peers.swallowed and replica.is_leader and replica.leader_epoch == 2
        await asyncio.sleep(0.1)
        assert peers.fetches == 1, "the fetch loop ended: it fetched nothing after its replica began to lead"
    finally:
        await manager.stop()
        await replicas.stop_bucket(BUCKET)


async def test_a_role_change_whose_notice_never_came_is_taken_up_from_zookeeper(tmp_path: Path) -> None:
    """The coordinator may be killed between writing a new leader to ZooKeeper and telling it: the replica
    finds the change itself within a few seconds."""
    replicas = ReplicaManager(tmp_path, Configuration())
    states = GatedStates(LeaderAndIsr(SECOND, 1, (ME, SECOND), (ME, SECOND)))
    manager = ReplicationManager(
        ME, replicas, states, registry=Registry(), peers=SwallowingPeers(),  # type: ignore[arg-type]
        table_of=lambda _table_id: TABLE, lag_max_ms=60_000, silence_max_ms=60_000,
    )
    await manager.apply(TABLE, BUCKET)
    manager.start()
    try:
        states.state, states.version = LeaderAndIsr(ME, 2, (ME, SECOND), (ME,)), states.version + 1  # no notice
        for _ in range(100):
            if replicas.replica(BUCKET).is_leader:
                break
            await asyncio.sleep(0.1)
        assert replicas.replica(BUCKET).is_leader and replicas.replica(BUCKET).leader_epoch == 2
    finally:
        await manager.stop()
        await replicas.stop_bucket(BUCKET)


async def fetched_up_to(replica: Replica, end: int) -> bool:
    """Whether a follower's log reaches ``end`` within two seconds."""
    for _ in range(100):
        if replica.log.log_end_offset == end:
            return True
        await asyncio.sleep(0.02)
    return False


class LeaderLog:
    """A leader answering follower fetches from a real log."""

    def __init__(self, log_tablet: LogTablet) -> None:
        self.log = log_tablet

    async def request(self, _host: str, _port: int, _key: object, message: Any, *, server_name: str) -> Any:
        offset = message.tables_req[0].buckets_req[0].fetch_offset
        read = self.log.read(offset, 1 << 20, for_follower=True)
        if not read.records:
            await asyncio.sleep(0.05)  # a long poll, shortened
        response = pb.FetchLogResponse()
        response.tables_resp.add(table_id=TABLE.table_id).buckets_resp.add(
            bucket_id=0, high_watermark=read.high_watermark, records=read.records)
        return response


async def test_a_follower_whose_disk_filled_up_fetches_on_once_there_is_room(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    leader_log = LogTablet.open(tmp_path / "leader", DURABLE_EACH_APPEND)
    replicas = ReplicaManager(tmp_path / "follower", Configuration())
    states = GatedStates(LeaderAndIsr(SECOND, 1, (ME, SECOND), (ME, SECOND)))
    manager = ReplicationManager(
        ME, replicas, states, registry=Registry(), peers=LeaderLog(leader_log),  # type: ignore[arg-type]
        table_of=lambda _table_id: TABLE, lag_max_ms=60_000, silence_max_ms=60_000,
    )
    await manager.apply(TABLE, BUCKET)
    try:
        await leader_log.durable(append(leader_log, batch_bytes([1, 2])).next_offset)
        replica = replicas.replica(BUCKET)
        assert await fetched_up_to(replica, 2)
        disk = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(shutil, "disk_usage", lambda _path: disk._replace(free=0))  # full: no reopening yet
        replica.log._fail(OSError(28, "No space left on device"))  # as a failed append leaves it
        await leader_log.durable(append(leader_log, batch_bytes([3])).next_offset)
        await asyncio.sleep(1.5)
        assert replica.log.failed is not None and replica.log.log_end_offset == 2
        monkeypatch.undo()  # room again
        for _ in range(150):
            if replica.storage_failure is None and replica.log.log_end_offset == 3:
                break
            await asyncio.sleep(0.02)
        assert replica.storage_failure is None and replica.log.log_end_offset == 3, "reopened and fetching on"
    finally:
        await manager.stop()
        await replicas.stop_bucket(BUCKET)
        leader_log.close()


async def test_a_leader_told_to_follow_while_its_disk_is_full_follows_all_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the nemesis (seed 422): the high watermark's record could not be written (no space left on
    the device) as the replica started to follow, and the role change stopped there: neither leading nor
    following, it fetched nothing until another notice came. The record is written by the once-a-second
    checkpoint when there is room; the replica follows at once."""
    leader_log = LogTablet.open(tmp_path / "leader", DURABLE_EACH_APPEND)
    replicas = ReplicaManager(tmp_path / "follower", Configuration())
    states = GatedStates(LeaderAndIsr(ME, 1, (ME, SECOND), (ME,)))
    manager = ReplicationManager(
        ME, replicas, states, registry=Registry(), peers=LeaderLog(leader_log),  # type: ignore[arg-type]
        table_of=lambda _table_id: TABLE, lag_max_ms=60_000, silence_max_ms=60_000,
    )
    await manager.apply(TABLE, BUCKET)  # leading
    try:
        def disk_full(_log: LogTablet) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(LogTablet, "checkpoint_high_watermark", disk_full)
        states.state, states.version = LeaderAndIsr(SECOND, 2, (ME, SECOND), (ME, SECOND)), states.version + 1
        await manager.apply(TABLE, BUCKET)
        replica = replicas.replica(BUCKET)
        assert not replica.is_leader and BUCKET in manager._following
        await leader_log.durable(append(leader_log, batch_bytes([1, 2])).next_offset)
        assert await fetched_up_to(replica, 2), "it fetches from the leader"
    finally:
        monkeypatch.undo()
        await manager.stop()
        await replicas.stop_bucket(BUCKET)
        leader_log.close()
