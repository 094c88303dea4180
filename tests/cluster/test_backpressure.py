"""The hard edge of KV back-pressure on a replicated cluster: while a paused follower holds the high
watermark, a bucket's acknowledged-to-be writes pile up in its pre-write buffer; once the buffer would
bring its memtables to RocksDB's slowdown trigger, writes are refused with StorageBackpressure (72; a
client of PutKv version 0 gets KvStorage, 11) and nothing of them is appended. strom's writer pauses the
bucket and retries; when the follower resumes, every write taken is acknowledged and the refused one is
nowhere, and the writer's rows get through."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, TableBucket
from strom.ids import TablePath
from strom.records import kv_batch
from strom.records.compacted import CompactedKeyEncoder, CompactedRowEncoder
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import BigIntType, DataField, RowType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import FIELDS, _cluster, rows, upsert
from tests.cluster.test_replication import States
from tests.conftest import unique_name

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

STORAGE_BACKPRESSURE = 72
KV_STORAGE = 11
ROW_TYPE = RowType((DataField("id", BigIntType(nullable=False)), DataField("v", StringType())))
ROWS_PER_REQUEST = 128
VALUE = "x" * 2000
"""A request of ~256 KiB: four of the 64 KiB memtables configured below."""
WAIT_S = 60.0


@pytest.fixture
def small_memtables(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path / "cluster", 2, {
        "kv.snapshot.interval": "0s",
        "kv.rocksdb.writebuffer.size": "64kb",
        # the paused follower stays in the ISR (it would leave it after these), so the high watermark waits
        "log.replica.max-lag-time": "120s",
        "log.replica.max-silence-time": "120s",
        "zookeeper.client.session-timeout": "40s",  # nor does its registration lapse while it is paused
    })


def put_request(table_id: int, ids: range) -> pb.PutKvRequest:
    keys = [CompactedKeyEncoder(ROW_TYPE, [0]).encode((i, VALUE)) for i in ids]
    values = [CompactedRowEncoder(ROW_TYPE).encode((i, VALUE)) for i in ids]
    request = pb.PutKvRequest(acks=-1, table_id=table_id, timeout_ms=60_000)
    request.buckets_req.add(bucket_id=0, records=kv_batch.build_kv_batch(1, keys, values))
    return request


def test_a_full_prewrite_buffer_refuses_writes_until_the_follower_catches_up(small_memtables: LocalCluster) -> None:
    local = small_memtables
    states = States(local)
    stopped: list[int] = []

    async def run() -> tuple[TablePath, set[int], int]:
        async with await Connection.create(local.bootstrap) as connection:
            path = TablePath("fluss", unique_name("buffered"))
            await connection.get_admin().create_table(path, TableDescriptor(
                Schema.from_arrow(FIELDS, ["id"]), bucket_count=1, properties={"table.replication.factor": "2"}))
            await upsert(connection, path, range(10), "before")
            table = await connection.get_table(path)
            bucket = TableBucket(table.layout.info.table_id, 0)
            state = await asyncio.to_thread(states.wait_full_isr, bucket)
            follower = next(r for r in state.replicas if r != state.leader)
            host, port = (await connection.metadata.leader_address(bucket)).rsplit(":", 1)
            raw = await RpcConnection.connect(host, int(port))
            local.signal_member(local.member("tablet-server", follower), signal.SIGSTOP)
            stopped.append(follower)
            try:
                held: list[asyncio.Future[object]] = []
                taken: set[int] = set()
                refused_id = -1
                for index in range(20):
                    ids = range(1000 + index * ROWS_PER_REQUEST, 1000 + (index + 1) * ROWS_PER_REQUEST)
                    answer = asyncio.ensure_future(raw.request(ApiKey.PUT_KV, put_request(bucket.table_id, ids)))
                    done, _ = await asyncio.wait({answer}, timeout=1.0)
                    if not done:  # taken: waits for the follower
                        held.append(answer)
                        taken.update(ids)
                        continue
                    entry = answer.result().buckets_resp[0]
                    assert entry.error_code == STORAGE_BACKPRESSURE, entry
                    assert "write budget" in entry.error_message
                    refused_id = ids[0]
                    break
                assert refused_id >= 0, "twenty requests of four memtables each were all taken"
                assert 3 <= len(held) <= 5, f"{len(held)} requests taken before the budget was spent"
                old = (await raw.request(ApiKey.PUT_KV, put_request(bucket.table_id, range(-200, -200 + ROWS_PER_REQUEST)),
                                         version=0)).buckets_resp[0]
                assert old.error_code == KV_STORAGE, old  # a client that does not know 72
                # strom's writer is refused, pauses the bucket and retries
                writer = table.new_upsert().create_writer()
                late_ids = list(range(2000, 2000 + ROWS_PER_REQUEST))  # over the budget left, as the raw ones
                late = asyncio.ensure_future(writer.upsert_batch(pa.table({"id": late_ids, "v": [VALUE] * len(late_ids)})))
                await asyncio.sleep(2.0)
                assert not late.done()
                assert connection.write_throttle.latest.get(bucket) == 1.0
            finally:
                local.signal_member(local.member("tablet-server", follower), signal.SIGCONT)
                stopped.remove(follower)
            answers = await asyncio.wait_for(asyncio.gather(*held), WAIT_S)
            assert all(not a.buckets_resp[0].error_code for a in answers), answers  # type: ignore[attr-defined]
            await asyncio.wait_for(late, WAIT_S)
            await raw.close()
            return path, taken, refused_id

    try:
        path, taken, refused_id = asyncio.run(run())
    finally:
        for server_id in stopped:
            local.signal_member(local.member("tablet-server", server_id), signal.SIGCONT)
        states.close()

    async def stored() -> dict[int, str]:
        async with await Connection.create(local.bootstrap) as connection:
            return await rows(connection, path)

    found = asyncio.run(stored())
    assert set(found) == set(range(10)) | taken | set(range(2000, 2000 + ROWS_PER_REQUEST))
    assert refused_id not in found and -200 not in found
    assert all(found[i] == VALUE for i in taken | set(range(2000, 2000 + ROWS_PER_REQUEST)))

