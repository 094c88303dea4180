"""``log.replica.min-in-sync-replicas-number`` on a replicated cluster: with a replication factor of 3 and
a minimum of 2, a write with acks = all is acknowledged while one follower is gone, refused with
NotEnoughReplicas (29) while both are (nothing of it is appended), and a client that keeps retrying gets
it through once a follower is back in the ISR: every row once, on at least two servers."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.client import Connection, TableBucket
from strom.records import kv_batch
from strom.records.compacted import CompactedKeyEncoder, CompactedRowEncoder
from strom.records.types import BigIntType, DataField, RowType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import _cluster, rows, upsert
from tests.cluster.test_replication import PK_FIELDS, States, create

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

NOT_ENOUGH_REPLICAS = 29
ROW_TYPE = RowType((DataField("id", BigIntType(nullable=False)), DataField("v", StringType())))
WAIT_S = 30.0


@pytest.fixture
def min_two(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path / "cluster", 3, {"kv.snapshot.interval": "0s", "log.replica.max-silence-time": "2s",
                                                 "log.replica.min-in-sync-replicas-number": "2"})


def _wait_isr(states: States, bucket: TableBucket, size: int) -> tuple[int, ...]:
    deadline = time.monotonic() + WAIT_S
    while len(isr := states.get(bucket).isr) != size:
        assert time.monotonic() < deadline, f"the ISR of {bucket} stayed {isr}, not {size} replicas"
        time.sleep(0.2)
    return isr


def test_acks_all_needs_the_minimum_of_in_sync_replicas(min_two: LocalCluster) -> None:
    async def setup() -> tuple[object, TableBucket]:
        async with await Connection.create(min_two.bootstrap) as connection:
            path = await create(connection, PK_FIELDS, ["id"])
            await upsert(connection, path, range(10), "before")
            return path, TableBucket((await connection.get_admin().get_table_info(path)).table_id, 0)

    path, bucket = asyncio.run(setup())
    states = States(min_two)
    stopped: list[int] = []
    try:
        state = states.wait_full_isr(bucket)
        followers = [r for r in state.replicas if r != state.leader]

        def stop(server_id: int) -> None:
            min_two.signal_member(min_two.member("tablet-server", server_id), signal.SIGSTOP)
            stopped.append(server_id)

        def resume(server_id: int) -> None:
            min_two.signal_member(min_two.member("tablet-server", server_id), signal.SIGCONT)
            stopped.remove(server_id)

        stop(followers[0])
        _wait_isr(states, bucket, 2)

        async def one_follower_gone() -> None:
            async with await Connection.create(min_two.bootstrap) as connection:
                await asyncio.wait_for(upsert(connection, path, range(10, 20), "two"), WAIT_S)  # type: ignore[arg-type]

        asyncio.run(one_follower_gone())  # two in sync: the minimum is met

        stop(followers[1])
        _wait_isr(states, bucket, 1)

        async def both_gone() -> None:
            async with await Connection.create(min_two.bootstrap) as connection:
                await connection.get_table(path)  # type: ignore[arg-type]  # its metadata names the leader
                # the leader's answer itself: refused before the append
                request = pb.PutKvRequest(acks=-1, table_id=bucket.table_id, timeout_ms=10_000)
                row = (99, "refused")
                request.buckets_req.add(bucket_id=0, records=kv_batch.build_kv_batch(
                    1, [CompactedKeyEncoder(ROW_TYPE, [0]).encode(row)], [CompactedRowEncoder(ROW_TYPE).encode(row)]))
                answer = (await connection.leader_request(bucket, ApiKey.PUT_KV, request)).buckets_resp[0]
                assert answer.error_code == NOT_ENOUGH_REPLICAS, answer
                # strom's writer retries a NotEnoughReplicas; a follower back in the ISR lets the write through
                pending = asyncio.ensure_future(upsert(connection, path, range(20, 30), "one"))  # type: ignore[arg-type]
                await asyncio.sleep(3)
                assert not pending.done(), "a write must wait while one replica is in sync"
                resume(followers[0])
                await asyncio.wait_for(pending, WAIT_S)

        asyncio.run(both_gone())
        _wait_isr(states, bucket, 2)
    finally:
        for server_id in list(stopped):
            min_two.signal_member(min_two.member("tablet-server", server_id), signal.SIGCONT)
        states.close()

    async def stored() -> dict[int, str]:
        async with await Connection.create(min_two.bootstrap) as connection:
            return await rows(connection, path)  # type: ignore[arg-type]

    found = asyncio.run(stored())
    assert found == {**{i: f"before{i}" for i in range(10)}, **{i: f"two{i}" for i in range(10, 20)},
                     **{i: f"one{i}" for i in range(20, 30)}}
