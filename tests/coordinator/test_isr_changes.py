"""AdjustIsr on the coordinator (strom/coordinator/isr_changes.py), over the embedded store's bucket states:
a leader's ISR change is written against the state it names; a deposed leader, a stale view, a follower
that is not live, or an ISR without its leader is refused with Fluss's code and changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strom.coordinator.isr_changes import IsrChanges
from strom.errors import (
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidCoordinatorError,
    InvalidUpdateVersionError,
)
from strom.ids import TableBucket
from strom.membership.contract import LeaderAndIsr
from strom.membership.local_membership import LocalBucketStates
from strom.rpc.messages import pb

BUCKET = TableBucket(3, 1, partition_id=9)
EPOCH = 4


@pytest.fixture
def states(tmp_path: Path) -> LocalBucketStates:
    states = LocalBucketStates(str(tmp_path / "membership.db"))
    states.create(BUCKET, LeaderAndIsr(1, 2, (1, 2, 3), (1, 2, 3)))
    return states


def _request(server: int, isr: list[int], *, leader_epoch: int = 2, bucket_epoch: int = 0,
             coordinator_epoch: int = EPOCH) -> Any:
    request = pb.AdjustIsrRequest(serverId=server)
    entry = request.tables_req.add(table_id=BUCKET.table_id).buckets_req.add(
        bucket_id=BUCKET.bucket, partition_id=BUCKET.partition_id, leader_epoch=leader_epoch,
        coordinator_epoch=coordinator_epoch, bucket_epoch=bucket_epoch)
    entry.new_isr.extend(isr)
    return request


async def _answer(changes: IsrChanges, request: Any) -> Any:
    response = await changes.adjust_isr(request, None)
    (table,) = response.tables_resp
    (answer,) = table.buckets_resp
    assert (table.table_id, answer.bucket_id, answer.partition_id) == (3, 1, 9)
    return answer


@pytest.mark.asyncio
async def test_the_leader_shrinks_and_expands_its_isr(states: LocalBucketStates) -> None:
    changes = IsrChanges(states, lambda: {1, 2, 3}, EPOCH)
    shrunk = await _answer(changes, _request(1, [1, 3]))
    assert not shrunk.HasField("error_code")
    assert (shrunk.leader_id, shrunk.leader_epoch, list(shrunk.isr), shrunk.bucket_epoch) == (1, 2, [1, 3], 1)
    assert states.get(BUCKET) == (LeaderAndIsr(1, 2, (1, 2, 3), (1, 3)), 1)
    grown = await _answer(changes, _request(1, [3, 2, 1], bucket_epoch=1))
    assert list(grown.isr) == [1, 2, 3] and grown.bucket_epoch == 2


@pytest.mark.asyncio
@pytest.mark.parametrize(("request_args", "live", "error"), [
    ({"server": 2, "isr": [2]}, {1, 2, 3}, FencedLeaderEpochError),  # not the leader
    ({"server": 1, "isr": [1], "leader_epoch": 1}, {1, 2, 3}, FencedLeaderEpochError),  # a deposed epoch
    ({"server": 1, "isr": [1], "leader_epoch": 3}, {1, 2, 3}, InvalidCoordinatorError),  # an epoch not seen here
    ({"server": 1, "isr": [1], "coordinator_epoch": EPOCH + 1}, {1, 2, 3}, InvalidCoordinatorError),
    ({"server": 1, "isr": [2, 3]}, {1, 2, 3}, IneligibleReplicaError),  # the leader left out
    ({"server": 1, "isr": [1, 4]}, {1, 2, 3, 4}, FencedLeaderEpochError),  # not a replica of the bucket
], ids=["not-the-leader", "deposed", "unseen-epoch", "unseen-coordinator", "leader-left-out", "not-a-replica"])
async def test_proposals_that_do_not_fit_the_state_are_refused(
    states: LocalBucketStates, request_args: dict[str, Any], live: set[int], error: type[Exception]
) -> None:
    answer = await _answer(IsrChanges(states, lambda: live, EPOCH), _request(**request_args))
    assert answer.error_code == error.code  # type: ignore[attr-defined]
    assert states.get(BUCKET) == (LeaderAndIsr(1, 2, (1, 2, 3), (1, 2, 3)), 0)


@pytest.mark.asyncio
async def test_a_stale_version_and_a_dead_joiner_are_refused(states: LocalBucketStates) -> None:
    live = {1, 2, 3}
    changes = IsrChanges(states, lambda: live, EPOCH)
    assert not (await _answer(changes, _request(1, [1]))).HasField("error_code")
    stale = await _answer(changes, _request(1, [1, 2]))  # made against version 0, now 1
    assert stale.error_code == InvalidUpdateVersionError.code
    live.discard(2)
    dead = await _answer(changes, _request(1, [1, 2], bucket_epoch=1))
    assert dead.error_code == IneligibleReplicaError.code and "not live" in dead.error_message
    assert states.get(BUCKET) == (LeaderAndIsr(1, 2, (1, 2, 3), (1,)), 1)
