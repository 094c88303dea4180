"""AdjustIsr (1020): a bucket's leader proposes a new in-sync replica set, and the active coordinator checks
it against the bucket's current state and writes it, as in Fluss.

The proposal names the state it was made against — the leader epoch and the bucket epoch (the state's
version) — so a leader replaced while it was paused, or one whose view is stale, is refused and writes
nothing; the write itself is a compare-and-set on that version, so a change the coordinator makes meanwhile
(an election) wins. Followers added must be live, and the leader must stay in its ISR. The coordinator then
knows every ISR change as it happens (its remembered states stay current for metadata and health).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from strom.errors import (
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidCoordinatorError,
    InvalidUpdateVersionError,
    StromError,
    UnknownTableOrBucketError,
)
from strom.ids import TableBucket
from strom.membership.contract import BucketStates, LeaderAndIsr
from strom.metadata.off_loop import off_loop
from strom.rpc.messages import pb

log = logging.getLogger(__name__)


class IsrChanges:
    """Serves AdjustIsr on the active coordinator (event loop; the state reads and writes run off it)."""

    def __init__(self, states: BucketStates, live_servers: Callable[[], set[int]], coordinator_epoch: int) -> None:
        self._states = states
        self._live = live_servers
        self._epoch = coordinator_epoch

    async def adjust_isr(self, request: Any, _context: object) -> Any:
        response = pb.AdjustIsrResponse()
        for table in request.tables_req:
            table_response = response.tables_resp.add(table_id=table.table_id)
            for entry in table.buckets_req:
                partition_id = entry.partition_id if entry.HasField("partition_id") else None
                answer = table_response.buckets_resp.add(bucket_id=entry.bucket_id)
                if partition_id is not None:
                    answer.partition_id = partition_id
                bucket = TableBucket(table.table_id, entry.bucket_id, partition_id)
                try:
                    state, version = await self._change(bucket, request.serverId, entry)
                except StromError as exc:
                    answer.error_code, answer.error_message = exc.code, str(exc)
                    continue
                answer.leader_id, answer.leader_epoch = state.leader, state.leader_epoch
                answer.isr.extend(state.isr)
                answer.bucket_epoch, answer.coordinator_epoch = version, self._epoch
        return response

    async def _change(self, bucket: TableBucket, leader: int, entry: Any) -> tuple[LeaderAndIsr, int]:
        """Check the proposal against the bucket's state and write it; returns the new state and version."""
        found = await off_loop(self._states.get, bucket)
        if found is None:
            raise UnknownTableOrBucketError(f"{bucket} has no replicated state")
        state, version = found
        if entry.coordinator_epoch > self._epoch or entry.leader_epoch > state.leader_epoch or entry.bucket_epoch > version:
            raise InvalidCoordinatorError(
                f"{bucket}: the proposal was made against a state this coordinator has not seen (coordinator epoch "
                f"{entry.coordinator_epoch}, leader epoch {entry.leader_epoch}, bucket epoch {entry.bucket_epoch})"
            )
        if entry.leader_epoch < state.leader_epoch or leader != state.leader:
            raise FencedLeaderEpochError(
                f"{bucket}: server {leader} at leader epoch {entry.leader_epoch} no longer leads it "
                f"(leader {state.leader} at epoch {state.leader_epoch})"
            )
        if entry.bucket_epoch < version:
            raise InvalidUpdateVersionError(f"{bucket}: its state changed since bucket epoch {entry.bucket_epoch}")
        isr = tuple(sorted(set(entry.new_isr)))
        if state.leader not in isr:
            raise IneligibleReplicaError(f"{bucket}: the leader {state.leader} must stay in the ISR {list(isr)}")
        outside = [r for r in isr if r not in state.replicas]
        if outside:
            raise FencedLeaderEpochError(f"{bucket}: {outside} are not replicas of the bucket ({list(state.replicas)})")
        gone = [r for r in isr if r not in state.isr and r not in self._live()]
        if gone:
            raise IneligibleReplicaError(f"{bucket}: tablet servers {gone} are not live and cannot join the ISR")
        new = state.with_isr(isr)
        if not await off_loop(self._states.compare_and_set, bucket, new, version):
            raise InvalidUpdateVersionError(f"{bucket}: its state changed while the ISR change was written")
        log.info("%s: ISR %s -> %s (asked by leader %d)", bucket, list(state.isr), list(isr), leader)
        return new, version + 1


__all__ = ["IsrChanges"]
