"""Rebalance planning (strom.metadata.rebalance_plan): what moves for each goal and tag, over layouts a
cluster reaches (grown, shrunk, racks), and the stored form of a plan."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from strom.ids import TableBucket
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


def layout_over(servers: list[int], buckets: int, factor: int, table_id: int = 1) -> dict[TableBucket, BucketLayout]:
    """Round robin, as a table created on ``servers`` gets it."""
    found = {}
    for b in range(buckets):
        replicas = tuple(servers[(b + i) % len(servers)] for i in range(factor))
        found[TableBucket(table_id, b)] = BucketLayout(replicas[0], replicas)
    return found


def applied(layout: dict[TableBucket, BucketLayout], moves: list[BucketMove]) -> dict[TableBucket, BucketLayout]:
    after = dict(layout)
    for move in moves:
        assert layout[move.bucket].replicas == move.original_replicas
        assert move.new_replicas[0] == move.new_leader, "the new leader is the preferred (first) replica"
        assert len(set(move.new_replicas)) == len(move.new_replicas) == len(move.original_replicas)
        after[move.bucket] = BucketLayout(move.new_leader, move.new_replicas)
    return after


def spread(layout: dict[TableBucket, BucketLayout], servers: set[int]) -> tuple[Counter[int], Counter[int]]:
    replicas = Counter(dict.fromkeys(servers, 0))
    leaders = Counter(dict.fromkeys(servers, 0))
    for state in layout.values():
        replicas.update(state.replicas)
        leaders[state.leader] += 1  # type: ignore[index]
    return replicas, leaders


def even(counts: Counter[int]) -> bool:
    return max(counts.values()) - min(counts.values()) <= 1


def test_a_balanced_cluster_needs_no_move() -> None:
    layout = layout_over([1, 2, 3], 12, 2)
    assert plan_rebalance(layout, {1: None, 2: None, 3: None}, {}) == []


def test_a_new_server_takes_its_share_of_replicas_and_leaderships() -> None:
    layout = layout_over([1, 2, 3], 12, 2)
    moves = plan_rebalance(layout, dict.fromkeys([1, 2, 3, 4]), {})
    replicas, leaders = spread(applied(layout, moves), {1, 2, 3, 4})
    assert replicas == Counter({1: 6, 2: 6, 3: 6, 4: 6})
    assert even(leaders) and leaders[4] == 3
    assert len(moves) <= 8, "only what the new server takes moves"


def test_a_permanently_offline_server_is_drained_and_a_temporarily_offline_one_loses_only_its_leaderships() -> None:
    layout = layout_over([1, 2, 3, 4], 16, 3)
    servers = dict.fromkeys([1, 2, 3, 4])
    drained = applied(layout, plan_rebalance(layout, servers, {4: ServerTag.PERMANENT_OFFLINE}))
    replicas, leaders = spread(drained, {1, 2, 3})
    assert all(4 not in state.replicas for state in drained.values())
    assert replicas == Counter({1: 16, 2: 16, 3: 16}) and even(leaders)

    paused = applied(layout, plan_rebalance(layout, servers, {2: ServerTag.TEMPORARY_OFFLINE}))
    assert all(paused[b].replicas and set(paused[b].replicas) == set(layout[b].replicas) for b in layout)
    assert all(state.leader != 2 for state in paused.values())


def test_leader_distribution_alone_moves_no_replica() -> None:
    layout = {TableBucket(1, b): BucketLayout(1, (1, 2, 3)) for b in range(9)}  # server 1 leads everything
    moves = plan_rebalance(layout, dict.fromkeys([1, 2, 3]), {}, [GoalType.LEADER_DISTRIBUTION])
    after = applied(layout, moves)
    assert all(set(after[b].replicas) == {1, 2, 3} for b in layout)
    assert spread(after, {1, 2, 3})[1] == Counter({1: 3, 2: 3, 3: 3})


def test_replica_distribution_without_leader_distribution_keeps_leaders_where_they_can_stay() -> None:
    layout = layout_over([1, 2, 3], 12, 2)
    moves = plan_rebalance(layout, dict.fromkeys([1, 2, 3, 4]), {}, [GoalType.REPLICA_DISTRIBUTION])
    assert all(m.new_leader == m.original_leader for m in moves if m.original_leader in m.new_replicas)


def test_racks_keep_every_bucket_on_both_racks_when_a_server_is_drained() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    layout = {TableBucket(1, b): BucketLayout(r[0], r) for b, r in enumerate([(1, 3), (3, 1), (1, 4), (4, 2), (2, 3)])}
    after = applied(layout, plan_rebalance(layout, racks, {1: ServerTag.PERMANENT_OFFLINE}))
    assert all(1 not in s.replicas and {racks[r] for r in s.replicas} == {"a", "b"} for s in after.values())


def test_rack_awareness_fixes_a_bucket_on_one_rack() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    layout = {TableBucket(1, 0): BucketLayout(1, (1, 2)), TableBucket(1, 1): BucketLayout(3, (3, 4))}
    after = applied(layout, plan_rebalance(layout, racks, {}, [GoalType.RACK_AWARE]))
    assert all({racks[r] for r in s.replicas} == {"a", "b"} for s in after.values()), after


def test_without_a_server_to_take_a_replica_planning_fails() -> None:
    layout = layout_over([1, 2], 4, 2)
    with pytest.raises(PlanningError, match="no eligible tablet server"):
        plan_rebalance(layout, {1: None, 2: None}, {2: ServerTag.PERMANENT_OFFLINE})


def test_a_server_that_is_gone_keeps_its_replicas_unless_it_is_tagged() -> None:
    layout = layout_over([1, 2, 3], 6, 2)
    untouched = plan_rebalance(layout, {1: None, 2: None}, {})  # server 3 is down, maybe coming back
    assert all(3 in m.new_replicas for m in untouched if 3 in m.original_replicas)
    drained = applied(layout, plan_rebalance(layout, {1: None, 2: None, 4: None}, {3: ServerTag.PERMANENT_OFFLINE}))
    assert all(3 not in s.replicas for s in drained.values())


@pytest.mark.parametrize("seed", range(20))
def test_random_layouts_end_even_and_each_bucket_keeps_its_replica_count(seed: int) -> None:
    rng = random.Random(seed)
    servers = list(range(1, rng.randint(3, 7) + 1))
    factor = rng.randint(1, 3)
    layout = {}
    for b in range(rng.randint(5, 40)):
        replicas = tuple(rng.sample(servers[: max(factor, len(servers) - 2)], factor))  # skewed to the first
        layout[TableBucket(rng.randint(1, 3), b)] = BucketLayout(replicas[0], replicas)
    after = applied(layout, plan_rebalance(layout, dict.fromkeys(servers), {}))
    replicas, leaders = spread(after, set(servers))
    assert even(replicas), replicas
    assert even(leaders), leaders


def test_a_plan_and_tags_round_trip_through_their_stored_form() -> None:
    moves = [BucketMove(TableBucket(3, 1, 7), None, 2, (1, 3), (2, 3), RebalanceStatus.COMPLETED),
             BucketMove(TableBucket(3, 2), 1, 1, (1, 2), (1, 4))]
    assert decode_task(encode_task("r1", RebalanceStatus.REBALANCING, moves)) == ("r1", RebalanceStatus.REBALANCING, moves)
    tags = {4: ServerTag.PERMANENT_OFFLINE, 2: ServerTag.TEMPORARY_OFFLINE}
    assert decode_tags(encode_tags(tags)) == tags
    assert decode_tags(None) == {}
