"""Rebalance plans: which replicas and leaderships move where, computed from the cluster's current layout.

Fluss's model (0.9): servers may carry a tag (PERMANENT_OFFLINE: about to be decommissioned, every replica
moves off it; TEMPORARY_OFFLINE: about to restart, its leaderships move off, its replicas stay), and a
rebalance optimises goals in priority order: REPLICA_DISTRIBUTION (every eligible server holds within one
replica of the others), LEADER_DISTRIBUTION (the same for leaderships) and RACK_AWARE (each bucket spans as
many racks as it can). A plan names, per bucket that changes, the original and new replicas and leader; the
new replicas list the new leader first (it is the bucket's preferred leader from then on).

Pure functions over plain values: the coordinator (:mod:`strom.coordinator.rebalance`) reads the layout
and executes the plan one bucket at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

from strom.ids import TableBucket


class ServerTag(IntEnum):
    PERMANENT_OFFLINE = 0
    TEMPORARY_OFFLINE = 1


class GoalType(IntEnum):
    REPLICA_DISTRIBUTION = 0
    LEADER_DISTRIBUTION = 1
    RACK_AWARE = 2


class RebalanceStatus(IntEnum):
    NOT_STARTED = 0
    REBALANCING = 1
    FAILED = 2
    COMPLETED = 3
    CANCELED = 4
    TIMEOUT = 5

    @property
    def is_final(self) -> bool:
        return self not in (RebalanceStatus.NOT_STARTED, RebalanceStatus.REBALANCING)


DEFAULT_GOALS = (GoalType.RACK_AWARE, GoalType.REPLICA_DISTRIBUTION, GoalType.LEADER_DISTRIBUTION)
"""What a Rebalance request without goals optimises (racks only where every server names one)."""


@dataclass(frozen=True, slots=True)
class BucketLayout:
    """Where one bucket is now."""

    leader: int | None
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BucketMove:
    """One bucket's part of a plan, and how far it got."""

    bucket: TableBucket
    original_leader: int | None
    new_leader: int
    original_replicas: tuple[int, ...]
    new_replicas: tuple[int, ...]
    status: RebalanceStatus = RebalanceStatus.NOT_STARTED

    def with_status(self, status: RebalanceStatus) -> BucketMove:
        return replace(self, status=status)


class PlanningError(ValueError):
    """No plan satisfies the tags (every server that could take a replica is tagged or gone)."""


def plan_rebalance(
    layout: Mapping[TableBucket, BucketLayout],
    servers: Mapping[int, str | None],
    tags: Mapping[int, ServerTag],
    goals: Sequence[GoalType] = DEFAULT_GOALS,
) -> list[BucketMove]:
    """The moves that reach ``goals`` from ``layout`` over the live ``servers`` (id -> rack).

    Replicas on PERMANENT_OFFLINE servers always move, leaderships on either tag always move; the goals
    then even out what remains. Servers that are neither live nor tagged keep their replicas (they may come
    back); they take no new ones.

    Raises:
        PlanningError: a replica must move and no eligible server can take it.
    """
    eligible = sorted(s for s in servers if s not in tags)
    goals = list(dict.fromkeys(goals)) or list(DEFAULT_GOALS)
    rack_aware = GoalType.RACK_AWARE in goals and bool(servers) and all(servers[s] is not None for s in servers)
    racks = {s: servers.get(s) for s in servers}
    replicas = {bucket: list(state.replicas) for bucket, state in layout.items()}
    load = {s: 0 for s in eligible}
    for members in replicas.values():
        for server in members:
            if server in load:
                load[server] += 1

    def rack_count(members: Sequence[int]) -> int:
        return len({racks.get(s) for s in members})

    def pick(members: list[int], leaving: int) -> int | None:
        """The eligible server to take ``leaving``'s replica: not in the bucket, keeping its rack spread,
        least loaded."""
        others = [s for s in members if s != leaving]
        candidates = [s for s in eligible if s not in members]
        if rack_aware:
            used = {racks[s] for s in others if s in racks}
            fresh = [s for s in candidates if racks[s] not in used]
            candidates = fresh or candidates
        return min(candidates, key=lambda s: (load[s], s), default=None)

    def swap(bucket: TableBucket, leaving: int, taking: int) -> None:
        members = replicas[bucket]
        members[members.index(leaving)] = taking
        if leaving in load:
            load[leaving] -= 1
        load[taking] += 1

    for bucket in sorted(replicas):  # drain the decommissioned servers first, whatever the goals
        for server in list(replicas[bucket]):
            if tags.get(server) is ServerTag.PERMANENT_OFFLINE:
                target = pick(replicas[bucket], server)
                if target is None:
                    raise PlanningError(f"no eligible tablet server can take {bucket}'s replica on server {server}")
                swap(bucket, server, target)

    if rack_aware:  # buckets that span fewer racks than they could
        rack_total = len(set(racks.values()))
        for bucket in sorted(replicas):
            members = replicas[bucket]
            while rack_count(members) < min(len(members), rack_total):
                doubled = _sharing_a_rack(members, racks)
                movable = [s for s in doubled if s in load] or doubled
                target = pick(members, movable[-1])
                if target is None or racks[target] in {racks.get(s) for s in members}:
                    break
                swap(bucket, movable[-1], target)

    if GoalType.REPLICA_DISTRIBUTION in goals or GoalType.RACK_AWARE in goals:
        _even_replicas(replicas, load, layout, racks if rack_aware else None, swap)

    leaders = _choose_leaders(replicas, layout, tags, GoalType.LEADER_DISTRIBUTION in goals, eligible)
    moves = []
    for bucket in sorted(replicas):
        state = layout[bucket]
        leader = leaders[bucket]
        new_replicas = (leader, *[s for s in replicas[bucket] if s != leader])
        if set(new_replicas) == set(state.replicas) and leader == state.leader:
            continue
        moves.append(BucketMove(bucket, state.leader, leader, state.replicas, new_replicas))
    return moves


def _sharing_a_rack(members: Sequence[int], racks: Mapping[int, str | None]) -> list[int]:
    """The replicas after the first on each rack."""
    seen: set[str | None] = set()
    later = []
    for server in members:
        if racks.get(server) in seen:
            later.append(server)
        seen.add(racks.get(server))
    return later


def _spread_kept(members: Sequence[int], leaving: int, taking: int, racks: Mapping[int, str | None]) -> bool:
    after = [taking if server == leaving else server for server in members]
    return len({racks.get(s) for s in after}) >= len({racks.get(s) for s in members})


def _even_replicas(replicas: dict[TableBucket, list[int]], load: dict[int, int],
                   layout: Mapping[TableBucket, BucketLayout], racks: Mapping[int, str | None] | None,
                   swap: Callable[[TableBucket, int, int], None]) -> None:
    """Move single replicas from a server to one holding at least two fewer (the widest gap first) until
    no such move exists: each move lowers the sum of squared loads, so this ends. Followers move before
    leaders, and a move never narrows a bucket's rack spread."""
    while True:
        pairs = sorted(((high, low) for high in load for low in load if load[high] - load[low] >= 2),
                       key=lambda pair: (load[pair[1]] - load[pair[0]], pair))
        for high, low in pairs:
            candidates = [b for b in sorted(replicas) if high in replicas[b] and low not in replicas[b]
                          and (racks is None or _spread_kept(replicas[b], high, low, racks))]
            if candidates:
                bucket = min(candidates, key=lambda b: layout[b].leader == high)  # a follower: no leader move
                swap(bucket, high, low)
                break
        else:
            return


def _choose_leaders(replicas: Mapping[TableBucket, list[int]], layout: Mapping[TableBucket, BucketLayout],
                    tags: Mapping[int, ServerTag], balance: bool, eligible: Sequence[int]) -> dict[TableBucket, int]:
    """Each bucket's leader: the current one while it stays a replica and carries no tag (else the first
    untagged replica); with ``balance``, then evened out along chains of leadership moves (the busiest
    server hands a bucket to another of its replicas, which may hand one on, until a server with at least
    two fewer leaderships takes one), which finds a chain wherever one exists."""
    leaders: dict[TableBucket, int] = {}
    for bucket, members in replicas.items():
        current = layout[bucket].leader
        untagged = [s for s in members if s not in tags]
        if current in members and current not in tags:
            leaders[bucket] = current  # type: ignore[assignment]
        else:
            leaders[bucket] = untagged[0] if untagged else members[0]
    if not balance or not eligible:
        return leaders
    count = dict.fromkeys(eligible, 0)
    for leader in leaders.values():
        if leader in count:
            count[leader] += 1
    while _shift_one_leadership(leaders, replicas, count):
        pass
    return leaders


def _shift_one_leadership(leaders: dict[TableBucket, int], replicas: Mapping[TableBucket, list[int]],
                          count: dict[int, int]) -> bool:
    """Move one leadership along the shortest chain from a busiest server to one leading two fewer."""
    for source in sorted(count, key=lambda s: (-count[s], s)):
        came_from: dict[int, tuple[int, TableBucket] | None] = {source: None}
        frontier = [source]
        while frontier:
            following = []
            for server in frontier:
                for bucket in sorted(b for b, leader in leaders.items() if leader == server):
                    for other in replicas[bucket]:
                        if other in count and other not in came_from:
                            came_from[other] = (server, bucket)
                            if count[other] <= count[source] - 2:
                                target = other
                                while came_from[target] is not None:
                                    giver, handed = came_from[target]  # type: ignore[misc]
                                    leaders[handed] = target
                                    target = giver
                                count[source] -= 1
                                count[other] += 1
                                return True
                            following.append(other)
            frontier = following
    return False


# ---- the stored form (one JSON document, like Fluss's /cluster/rebalance node) ----
def encode_task(rebalance_id: str, status: RebalanceStatus, moves: Sequence[BucketMove]) -> bytes:
    return json.dumps({
        "version": 1, "rebalance_id": rebalance_id, "status": int(status),
        "buckets": [{
            "table_id": m.bucket.table_id, "partition_id": m.bucket.partition_id, "bucket": m.bucket.bucket,
            "original_leader": m.original_leader, "new_leader": m.new_leader,
            "original_replicas": list(m.original_replicas), "new_replicas": list(m.new_replicas),
            "status": int(m.status),
        } for m in moves],
    }, sort_keys=True).encode()


def decode_task(raw: bytes) -> tuple[str, RebalanceStatus, list[BucketMove]]:
    document = json.loads(raw)
    moves = [
        BucketMove(
            TableBucket(entry["table_id"], entry["bucket"], entry["partition_id"]),
            entry["original_leader"], entry["new_leader"], tuple(entry["original_replicas"]),
            tuple(entry["new_replicas"]), RebalanceStatus(entry["status"]),
        )
        for entry in document["buckets"]
    ]
    return document["rebalance_id"], RebalanceStatus(document["status"]), moves


def encode_tags(tags: Mapping[int, ServerTag]) -> bytes:
    return json.dumps({"version": 1, "server_tags": {str(s): int(t) for s, t in sorted(tags.items())}}).encode()


def decode_tags(raw: bytes | None) -> dict[int, ServerTag]:
    if raw is None:
        return {}
    return {int(s): ServerTag(t) for s, t in json.loads(raw)["server_tags"].items()}


__all__ = [
    "DEFAULT_GOALS", "BucketLayout", "BucketMove", "GoalType", "PlanningError", "RebalanceStatus", "ServerTag",
    "decode_tags", "decode_task", "encode_tags", "encode_task", "plan_rebalance",
]
