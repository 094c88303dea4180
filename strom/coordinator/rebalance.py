"""Server tags and rebalance on the active coordinator: Fluss's AddServerTag (1047), RemoveServerTag (1048),
Rebalance (1049), ListRebalanceProgress (1050) and CancelRebalance (1051).

A rebalance plans every move at once (:func:`~strom.metadata.rebalance_plan.plan_rebalance`), stores the
plan (Fluss's ``/cluster/rebalance`` node), and carries it out one bucket at a time: that is the
throttle, as in Fluss: at most one bucket's new replicas catch up at any moment, so the fetch traffic of a
move is one follower's on one bucket, and client writes never wait for a replica that is still copying.
Each bucket's status is stored as it finishes, so a coordinator that takes over resumes the plan where it
stopped. Cancel lets the bucket in flight finish (a half-done move would leave an extra replica) and starts
no other.

Tags are stored too (``/tabletservers/server_tags``); new tables and partitions avoid tagged servers
while enough others are live (:class:`~strom.coordinator.cluster_placement.ClusterPlacement`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from strom.coordinator.placement import BucketPlacement, placed_tables
from strom.errors import (
    NoRebalanceInProgressError,
    RebalanceFailureError,
    ServerNotExistError,
    ServerTagAlreadyExistError,
    ServerTagNotExistError,
)
from strom.ids import TableBucket
from strom.metadata.off_loop import off_loop
from strom.metadata.rebalance_plan import (
    BucketLayout,
    BucketMove,
    GoalType,
    PlanningError,
    RebalanceStatus,
    ServerTag,
    decode_tags,
    decode_task,
    encode_tags,
    encode_task,
    plan_rebalance,
)
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.rpc.messages import pb

log = logging.getLogger(__name__)


class BucketMover(Protocol):
    """Carries out one bucket's move (a cluster's :class:`~strom.coordinator.replica_mover.ReplicaMover`)."""

    async def move(self, table: TableInfo, move: BucketMove) -> RebalanceStatus: ...


class RebalanceManager:
    """Owned by the coordinator's event loop: :meth:`start` once (resumes a stored plan), :meth:`stop` once."""

    def __init__(
        self,
        store: MetadataStore,
        placement: BucketPlacement,
        table_of: Callable[[int], TableInfo | None],
        mover: BucketMover | None,
    ) -> None:
        """``mover``: None where no bucket can move (one process hosts them all); a plan that needs a move
        is then refused."""
        self._store = store
        self._placement = placement
        self._table_of = table_of
        self._mover = mover
        self.tags = decode_tags(store.get_server_tags())
        self._rebalance_id: str | None = None
        self._status: RebalanceStatus | None = None
        self._moves: list[BucketMove] = []
        self._cancelled = False
        self._task: asyncio.Task[None] | None = None
        self._changing = asyncio.Lock()
        """One change at a time (tags, a new plan, a cancel): each decides on what the one before it stored."""
        stored = store.get_rebalance_task()
        if stored is not None:
            self._rebalance_id, self._status, self._moves = decode_task(stored)

    def start(self) -> None:
        if self._status is not None and not self._status.is_final:
            log.info("resuming rebalance %s: %d of %d buckets left", self._rebalance_id,
                     sum(not m.status.is_final for m in self._moves), len(self._moves))
            self._task = asyncio.create_task(self._execute())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def in_progress(self) -> bool:
        return self._status is not None and not self._status.is_final

    # ---- server tags ----
    async def add_server_tag(self, request: Any, _context: object) -> Any:
        async with self._changing:
            return await self._add_server_tag(request)

    async def _add_server_tag(self, request: Any) -> Any:
        tag = _tag(request.server_tag)
        known = await self._known_servers(request.server_ids)
        for server in request.server_ids:
            if server not in known:
                raise ServerNotExistError(f"Server {server} does not exist; it cannot be tagged {tag.name}.")
            existing = self.tags.get(server)
            if existing is not None and existing != tag:
                raise ServerTagAlreadyExistError(
                    f"Server {server} is tagged {existing.name}; remove that tag before tagging it {tag.name}."
                )
        tags = {**self.tags, **dict.fromkeys(request.server_ids, tag)}
        await off_loop(self._store.put_server_tags, encode_tags(tags))
        self.tags = tags
        log.info("servers %s tagged %s", list(request.server_ids), tag.name)
        return pb.AddServerTagResponse()

    async def remove_server_tag(self, request: Any, _context: object) -> Any:
        tag = _tag(request.server_tag)
        async with self._changing:
            for server in request.server_ids:
                existing = self.tags.get(server)
                if existing is not None and existing != tag:
                    raise ServerTagNotExistError(f"Server {server} is tagged {existing.name}, not {tag.name}.")
            tags = {server: t for server, t in self.tags.items() if server not in set(request.server_ids)}
            await off_loop(self._store.put_server_tags, encode_tags(tags))
            self.tags = tags
        log.info("tag %s removed from servers %s", tag.name, list(request.server_ids))
        return pb.RemoveServerTagResponse()

    async def _known_servers(self, asked: Iterable[int]) -> set[int]:
        """The live tablet servers and, so that a server lost for good can be drained, those holding
        replicas (the buckets are read only when ``asked`` names a server that is not live)."""
        known = {node.node_id for node in self._placement.tablet_servers()}
        if not known.issuperset(asked):
            for layout in (await off_loop(self._layout)).values():
                known.update(layout.replicas)
        return known

    # ---- rebalance ----
    async def rebalance(self, request: Any, _context: object) -> Any:
        async with self._changing:
            return await self._rebalance(request)

    async def _rebalance(self, request: Any) -> Any:
        if self.in_progress:
            raise RebalanceFailureError(
                f"Rebalance {self._rebalance_id} is in progress: wait for it to finish or cancel it first."
            )
        try:
            goals = [GoalType(goal) for goal in request.goals]
        except ValueError as exc:
            raise RebalanceFailureError(f"unknown rebalance goal: {exc}") from None
        servers = {node.node_id: node.rack for node in self._placement.tablet_servers()}
        try:
            moves = plan_rebalance(await off_loop(self._layout), servers, self.tags, goals)
        except PlanningError as exc:
            raise RebalanceFailureError(f"Cannot plan the rebalance: {exc}") from None
        if moves and self._mover is None:
            raise RebalanceFailureError("This server hosts every bucket itself; there is nowhere to move one.")
        rebalance_id = uuid.uuid4().hex
        status = RebalanceStatus.REBALANCING if moves else RebalanceStatus.COMPLETED
        await off_loop(self._store.put_rebalance_task, encode_task(rebalance_id, status, moves))
        self._rebalance_id, self._status, self._moves, self._cancelled = rebalance_id, status, moves, False
        log.info("rebalance %s: %d buckets to move (goals %s)", rebalance_id, len(moves),
                 [g.name for g in goals] or "default")
        if moves:
            self._task = asyncio.create_task(self._execute())
        return pb.RebalanceResponse(rebalance_id=rebalance_id)

    def list_rebalance_progress(self, request: Any, _context: object) -> Any:
        self._check_id(request)
        response = pb.ListRebalanceProgressResponse()
        if self._rebalance_id is None or self._status is None:
            return response
        response.rebalance_id, response.rebalance_status = self._rebalance_id, int(self._status)
        by_table: dict[int, Any] = {}
        for move in self._moves:
            table = by_table.get(move.bucket.table_id)
            if table is None:
                table = by_table[move.bucket.table_id] = response.table_progress.add(table_id=move.bucket.table_id)
            entry = table.buckets_progress.add(rebalance_status=int(move.status))
            plan = entry.rebalance_plan
            plan.bucket_id = move.bucket.bucket
            if move.bucket.partition_id is not None:
                plan.partition_id = move.bucket.partition_id
            if move.original_leader is not None:
                plan.original_leader = move.original_leader
            plan.new_leader = move.new_leader
            plan.original_replicas.extend(move.original_replicas)
            plan.new_replicas.extend(move.new_replicas)
        return response

    async def cancel_rebalance(self, request: Any, _context: object) -> Any:
        self._check_id(request)
        if self._rebalance_id is None:
            raise NoRebalanceInProgressError("No rebalance was ever started.")
        if self.in_progress:
            self._cancelled = True
            self._moves = [m if m.status.is_final else m.with_status(RebalanceStatus.CANCELED) for m in self._moves]
            await self._finish(RebalanceStatus.CANCELED)
        return pb.CancelRebalanceResponse()

    def _check_id(self, request: Any) -> None:
        if request.HasField("rebalance_id") and self._rebalance_id is not None \
                and request.rebalance_id != self._rebalance_id:
            raise NoRebalanceInProgressError(
                f"Rebalance {request.rebalance_id} is not the current one ({self._rebalance_id})."
            )

    async def _execute(self) -> None:
        assert self._mover is not None
        for index, move in enumerate(self._moves):
            if self._cancelled:
                return
            if move.status.is_final:
                continue
            self._moves[index] = move.with_status(RebalanceStatus.REBALANCING)
            await self._save()
            table = self._table_of(move.bucket.table_id)
            try:
                status = RebalanceStatus.FAILED if table is None else await self._mover.move(table, move)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: moving replicas failed", move.bucket)
                status = RebalanceStatus.FAILED
            self._moves[index] = move.with_status(status)  # after a cancel too: the bucket finished its move
            await self._save()
            if self._cancelled:
                return
        failed = any(m.status is not RebalanceStatus.COMPLETED for m in self._moves)
        await self._finish(RebalanceStatus.FAILED if failed else RebalanceStatus.COMPLETED)

    async def _finish(self, status: RebalanceStatus) -> None:
        self._status = status
        await self._save()
        log.info("rebalance %s: %s", self._rebalance_id, status.name)

    async def _save(self) -> None:
        assert self._rebalance_id is not None and self._status is not None
        await off_loop(self._store.put_rebalance_task, encode_task(self._rebalance_id, self._status, list(self._moves)))

    def _layout(self) -> dict[TableBucket, BucketLayout]:
        """Where every bucket's replicas are (blocks: store reads; run it with :func:`off_loop`)."""
        layout = {}
        for table, partition_id in placed_tables(self._store, self._table_of):
            for bucket_id, leadership in self._placement.describe(table, partition_id).items():
                bucket = TableBucket(table.table_id, bucket_id, partition_id)
                layout[bucket] = BucketLayout(leadership.leader, tuple(leadership.replicas))
        return layout


def _tag(value: int) -> ServerTag:
    try:
        return ServerTag(value)
    except ValueError:
        raise ServerTagNotExistError(f"unknown server tag {value}") from None


__all__ = ["BucketMover", "RebalanceManager"]
