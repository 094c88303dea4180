"""The KV leader replica capacity (``kv.leader-replica.memory-reserved``): Fluss's formula over the live tablet
servers' memory, the check before KV leaders are created, and the memory a registration carries."""

from __future__ import annotations

import json

import pytest

from strom.coordinator.kv_leader_capacity import UNLIMITED, KvLeaderCapacity, kv_leader_replica_capacity
from strom.errors import InsufficientKvLeaderReplicaCapacityError, RetriableError, error_for_code
from strom.membership.contract import RegisteredServer, decode_registration, encode_registration
from strom.rpc.endpoints import Endpoint

MB = 1 << 20


def test_the_capacity_is_the_known_memory_over_the_reserve() -> None:
    assert kv_leader_replica_capacity(8 * MB, [64 * MB]) == 8
    assert kv_leader_replica_capacity(8 * MB, [64 * MB, 32 * MB, 100 * MB]) == 196 // 8
    assert kv_leader_replica_capacity(16 * MB, [63 * MB]) == 3, "rounded down"


def test_a_server_without_memory_counts_as_the_average_of_the_others() -> None:
    # known 40 + 80 = 120 MB, average 60 MB, one unknown: 180 MB in all
    assert kv_leader_replica_capacity(10 * MB, [40 * MB, None, 80 * MB]) == 18
    assert kv_leader_replica_capacity(10 * MB, [40 * MB, 0, 80 * MB]) == 18, "0 is unknown too"


def test_half_or_fewer_servers_with_memory_turn_the_check_off() -> None:
    assert kv_leader_replica_capacity(8 * MB, [64 * MB, None]) == UNLIMITED
    assert kv_leader_replica_capacity(8 * MB, [64 * MB, None, None, 64 * MB]) == UNLIMITED
    assert kv_leader_replica_capacity(8 * MB, [None]) == UNLIMITED
    assert kv_leader_replica_capacity(8 * MB, [64 * MB, None, 64 * MB]) == 24, "two of three is more than half"


def test_no_reserve_or_no_server_is_unlimited() -> None:
    assert kv_leader_replica_capacity(0, [64 * MB]) == UNLIMITED
    assert kv_leader_replica_capacity(8 * MB, []) == UNLIMITED


def test_the_check_refuses_what_does_not_fit() -> None:
    observed = [3]
    memories: list[int | None] = [32 * MB]
    capacity = KvLeaderCapacity(8 * MB, lambda: memories, lambda: observed[0])
    assert (capacity.capacity(), capacity.count()) == (4, 3)
    capacity.check(1, "table 'fluss.t'")
    capacity.check(0, "a log table")
    with pytest.raises(InsufficientKvLeaderReplicaCapacityError) as refused:
        capacity.check(2, "table 'fluss.big'")
    assert refused.value.code == 71
    message = str(refused.value)
    assert "table 'fluss.big'" in message and "needs 2" in message and "has 3 of its capacity of 4" in message

    observed[0] = 5  # over the capacity already (a server left): nothing more fits
    with pytest.raises(InsufficientKvLeaderReplicaCapacityError):
        capacity.check(1, "table 'fluss.t'")

    memories.append(64 * MB)  # a server joined: 96 MB hold 12
    capacity.check(7, "table 'fluss.t'")
    with pytest.raises(InsufficientKvLeaderReplicaCapacityError):
        capacity.check(8, "table 'fluss.t'")


def test_a_reserve_of_zero_turns_the_check_off_at_run_time() -> None:
    capacity = KvLeaderCapacity(8 * MB, lambda: [8 * MB], lambda: 1)
    with pytest.raises(InsufficientKvLeaderReplicaCapacityError):
        capacity.check(1, "table 'fluss.t'")
    capacity.reserved_bytes = 0
    assert not capacity.enabled and capacity.capacity() == UNLIMITED
    capacity.check(1_000_000, "table 'fluss.t'")


def test_the_error_is_flusss_code_71_and_not_retriable() -> None:
    error = error_for_code(71, "no room")
    assert isinstance(error, InsufficientKvLeaderReplicaCapacityError) and not isinstance(error, RetriableError)
    assert str(error) == "no room"


ENDPOINTS = (Endpoint("FLUSS", "127.0.0.1", 9123),)


def test_a_registration_carries_the_memory_as_flusss_version_4() -> None:
    document = json.loads(encode_registration(RegisteredServer(1, ENDPOINTS, memory_bytes=64 * MB)))
    assert document["version"] == 4 and document["memory_bytes"] == 64 * MB
    decoded = decode_registration(1, encode_registration(RegisteredServer(1, ENDPOINTS, "r1", memory_bytes=64 * MB)))
    assert (decoded.memory_bytes, decoded.rack) == (64 * MB, "r1")
    node = decoded.node("FLUSS")
    assert node is not None and node.memory_bytes == 64 * MB


def test_a_registration_without_memory_reads_as_unknown() -> None:
    plain = json.loads(encode_registration(RegisteredServer(2, ENDPOINTS)))
    assert plain["version"] == 3 and "memory_bytes" not in plain, "no memory: the version 3 document as before"
    older = {"version": 3, "listeners": "FLUSS://127.0.0.1:9123", "register_timestamp": 1}
    assert decode_registration(2, json.dumps(older).encode()).memory_bytes is None
    for memory in (0, -5, "lots", None):
        document = {"version": 4, "listeners": "FLUSS://127.0.0.1:9123", "register_timestamp": 1, "memory_bytes": memory}
        assert decode_registration(2, json.dumps(document).encode()).memory_bytes is None, memory
