"""Server tags and rebalance from the client: Fluss's AddServerTag (1047), RemoveServerTag (1048), Rebalance
(1049), ListRebalanceProgress (1050) and CancelRebalance (1051); see ``strom/coordinator/rebalance.py``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from strom.client.rpc_client import ClusterRpc
from strom.ids import TableBucket
from strom.metadata.rebalance_plan import BucketMove, GoalType, RebalanceStatus, ServerTag
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb


@dataclass(frozen=True, slots=True)
class RebalanceProgress:
    rebalance_id: str
    status: RebalanceStatus
    moves: list[BucketMove]
    """Every bucket of the plan with its own status."""

    @property
    def progress(self) -> float:
        """The share of the plan's buckets that finished (1.0 for an empty plan)."""
        return sum(m.status.is_final for m in self.moves) / len(self.moves) if self.moves else 1.0


class RebalanceAdmin:
    """The rebalance part of :class:`~strom.client.admin.Admin`."""

    _connection: ClusterRpc

    async def add_server_tag(self, server_ids: Iterable[int], tag: ServerTag) -> None:
        """Tag tablet servers (PERMANENT_OFFLINE: the next rebalance moves every replica off them;
        TEMPORARY_OFFLINE: it moves their leaderships). Raises ServerNotExistError, ServerTagAlreadyExistError."""
        request = pb.AddServerTagRequest(server_ids=list(server_ids), server_tag=int(tag))
        await self._connection.coordinator_request(ApiKey.ADD_SERVER_TAG, request)

    async def remove_server_tag(self, server_ids: Iterable[int], tag: ServerTag) -> None:
        request = pb.RemoveServerTagRequest(server_ids=list(server_ids), server_tag=int(tag))
        await self._connection.coordinator_request(ApiKey.REMOVE_SERVER_TAG, request)

    async def rebalance(self, goals: Iterable[GoalType] = ()) -> str:
        """Plan and start a rebalance toward ``goals`` (by priority; none: racks, replicas, then leaders);
        returns its id. Raises RebalanceFailureError while another is in progress or when no plan exists."""
        response = await self._connection.coordinator_request(
            ApiKey.REBALANCE, pb.RebalanceRequest(goals=[int(goal) for goal in goals])
        )
        return str(response.rebalance_id)

    async def list_rebalance_progress(self, rebalance_id: str | None = None) -> RebalanceProgress | None:
        """The current (or last) rebalance, None if there never was one."""
        request = pb.ListRebalanceProgressRequest()
        if rebalance_id is not None:
            request.rebalance_id = rebalance_id
        response = await self._connection.coordinator_request(ApiKey.LIST_REBALANCE_PROGRESS, request)
        if not response.HasField("rebalance_id"):
            return None
        moves = []
        for table in response.table_progress:
            for entry in table.buckets_progress:
                plan = entry.rebalance_plan
                bucket = TableBucket(table.table_id, plan.bucket_id,
                                     plan.partition_id if plan.HasField("partition_id") else None)
                moves.append(BucketMove(
                    bucket, plan.original_leader if plan.HasField("original_leader") else None, plan.new_leader,
                    tuple(plan.original_replicas), tuple(plan.new_replicas), RebalanceStatus(entry.rebalance_status),
                ))
        return RebalanceProgress(response.rebalance_id, RebalanceStatus(response.rebalance_status), moves)

    async def cancel_rebalance(self, rebalance_id: str | None = None) -> None:
        """Stop the rebalance after the bucket in flight; raises NoRebalanceInProgressError for another id."""
        request = pb.CancelRebalanceRequest()
        if rebalance_id is not None:
            request.rebalance_id = rebalance_id
        await self._connection.coordinator_request(ApiKey.CANCEL_REBALANCE, request)


__all__ = ["RebalanceAdmin", "RebalanceProgress"]
