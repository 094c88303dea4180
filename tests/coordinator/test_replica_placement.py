"""Where a new table's replicas go: spread over the tablet servers, and over their racks when every server
has one (``tablet-server.rack``)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from strom.coordinator.placement import replica_assignment

servers_st = st.dictionaries(st.integers(0, 30), st.sampled_from(["r1", "r2", "r3", "r4"]), min_size=1, max_size=9)


@settings(max_examples=300, deadline=None)
@given(servers=servers_st, factor_seed=st.integers(1, 9), buckets=st.integers(1, 40), start=st.integers(0, 50))
def test_each_bucket_spans_as_many_racks_as_it_can(servers: dict[int, str], factor_seed: int, buckets: int,
                                                  start: int) -> None:
    factor = 1 + factor_seed % len(servers)
    racks = len(set(servers.values()))
    placed = replica_assignment(buckets, factor, servers, start)
    assert len(placed) == buckets
    for replicas in placed:
        assert len(replicas) == factor == len(set(replicas)) and set(replicas) <= set(servers)
        assert len({servers[r] for r in replicas}) == min(factor, racks), (replicas, servers)
    leaders = Counter(replicas[0] for replicas in placed)
    if buckets % len(servers) == 0:
        assert set(leaders.values()) == {buckets // len(servers)}, "first replicas round robin over the servers"


@settings(max_examples=200, deadline=None)
@given(ids=st.sets(st.integers(0, 30), min_size=1, max_size=9), factor_seed=st.integers(1, 9),
       buckets=st.integers(1, 40), start=st.integers(0, 50))
def test_without_racks_the_servers_follow_each_other_from_the_start(ids: set[int], factor_seed: int, buckets: int,
                                                                   start: int) -> None:
    """The placement strom always had (and has when one server lacks a rack)."""
    ordered = sorted(ids)
    factor = 1 + factor_seed % len(ordered)
    servers: dict[int, str | None] = dict.fromkeys(ordered)
    expected = [tuple(ordered[(start + b + i) % len(ordered)] for i in range(factor)) for b in range(buckets)]
    assert replica_assignment(buckets, factor, servers, start) == expected
    if len(ordered) > 1:
        servers[ordered[0]] = "r1"  # racks only on some servers: ignored
        assert replica_assignment(buckets, factor, servers, start) == expected


def test_two_racks_of_two_servers_put_every_bucket_on_both() -> None:
    servers = {1: "a", 2: "a", 3: "b", 4: "b"}
    placed = replica_assignment(8, 2, servers, 0)
    assert all({servers[x] for x in replicas} == {"a", "b"} for replicas in placed)
    assert Counter(r for replicas in placed for r in replicas) == {1: 4, 2: 4, 3: 4, 4: 4}
