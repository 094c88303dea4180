"""Writes are applied exactly once: concurrent pyfluss writers, and a batch retried with the same writer id
and sequence.

pyfluss cannot be made to retry on demand, so the retry tests replay a batch with strom's own RPC client
(the wire format pyfluss uses, from the same writer id and sequence) and read the result back with pyfluss.
A replay must not be applied again: Fluss answers it as a success carrying the original offsets, or with
DUPLICATE_SEQUENCE (32), which the client also counts as success.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest
import pytest_asyncio

from strom.records import kv_batch, log_batch
from strom.records.compacted import CompactedKeyEncoder, CompactedRowEncoder
from strom.records.types import DataField, IntType, RowType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.integration.pyfluss_support import change_types, changelog, create_table, lookup_many, poll_records
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

DUPLICATE_SEQUENCE = 32
OUT_OF_ORDER_SEQUENCE = 31
SCHEMA_ID = 1
FIELDS = [pa.field("id", pa.int32()), pa.field("name", pa.string())]
ROW_TYPE = RowType((DataField("id", IntType(nullable=False)), DataField("name", StringType())))
KEY_ENCODER = CompactedKeyEncoder(ROW_TYPE, [0])
VALUE_ENCODER = CompactedRowEncoder(ROW_TYPE)


@pytest_asyncio.fixture
async def rpc(server: ServerProcess) -> AsyncIterator[RpcConnection]:
    """strom's own RPC client, connected to the shared server."""
    host, _, port = server.address.rpartition(":")
    connection = await RpcConnection.connect(host, int(port))
    try:
        yield connection
    finally:
        await connection.close()


async def new_writer_id(rpc: RpcConnection) -> int:
    response = await rpc.request(ApiKey.INIT_WRITER, pb.InitWriterRequest())
    return int(response.writer_id)


async def put_kv(rpc: RpcConnection, table_id: int, records: bytes) -> Any:
    request = pb.PutKvRequest(acks=-1, table_id=table_id, timeout_ms=30_000)
    request.buckets_req.add(bucket_id=0, records=records)
    response = await rpc.request(ApiKey.PUT_KV, request)
    assert [b.bucket_id for b in response.buckets_resp] == [0]
    return response.buckets_resp[0]


async def produce_log(rpc: RpcConnection, table_id: int, records: bytes) -> Any:
    request = pb.ProduceLogRequest(acks=-1, table_id=table_id, timeout_ms=30_000)
    request.buckets_req.add(bucket_id=0, records=records)
    response = await rpc.request(ApiKey.PRODUCE_LOG, request)
    assert [b.bucket_id for b in response.buckets_resp] == [0]
    return response.buckets_resp[0]


def upsert_batch(writer_id: int, sequence: int, rows: list[tuple[int, str]]) -> bytes:
    return kv_batch.build_kv_batch(
        SCHEMA_ID,
        [KEY_ENCODER.encode(row) for row in rows],
        [VALUE_ENCODER.encode(row) for row in rows],
        writer_id=writer_id,
        batch_sequence=sequence,
    )


def append_batch(writer_id: int, sequence: int, rows: list[tuple[int, str]]) -> bytes:
    batch = pa.RecordBatch.from_pylist([{"id": i, "name": n} for i, n in rows], schema=pa.schema(FIELDS))
    return log_batch.build_arrow_batch(batch, schema_id=SCHEMA_ID, writer_id=writer_id, batch_sequence=sequence)


def assert_replay_acknowledged_without_effect(response: Any, original_offset: int, offset_field: str) -> None:
    if response.HasField("error_code") and response.error_code != 0:
        assert response.error_code == DUPLICATE_SEQUENCE, response.error_message
    else:
        assert getattr(response, offset_field) == original_offset


@pytest.mark.asyncio
async def test_a_replayed_put_kv_batch_is_not_applied_twice(fluss: Any, rpc: RpcConnection) -> None:
    path, table = await create_table(fluss, FIELDS, primary_keys=["id"], bucket_count=1)
    table_id = table.get_table_info().table_id
    writer_id = await new_writer_id(rpc)
    first = upsert_batch(writer_id, 0, [(1, "one"), (2, "two")])
    second = upsert_batch(writer_id, 1, [(1, "one again")])

    assert (await put_kv(rpc, table_id, first)).log_end_offset == 2
    assert (await put_kv(rpc, table_id, second)).log_end_offset == 4
    assert_replay_acknowledged_without_effect(await put_kv(rpc, table_id, second), 4, "log_end_offset")
    assert_replay_acknowledged_without_effect(await put_kv(rpc, table_id, first), 2, "log_end_offset")

    records = await changelog(table, 4)
    assert change_types(records) == ["+I", "+I", "-U", "+U"]
    assert [r.row["name"] for r in records] == ["one", "two", "one", "one again"]
    assert await fluss.get_admin().list_offsets(path, [0], pyfluss.OffsetSpec.latest()) == {0: 4}
    assert await lookup_many(table, [{"id": 1}, {"id": 2}]) == [
        {"id": 1, "name": "one again"},
        {"id": 2, "name": "two"},
    ]


@pytest.mark.asyncio
async def test_a_put_kv_batch_that_skips_a_sequence_is_rejected_with_code_31(fluss: Any, rpc: RpcConnection) -> None:
    path, table = await create_table(fluss, FIELDS, primary_keys=["id"], bucket_count=1)
    table_id = table.get_table_info().table_id
    writer_id = await new_writer_id(rpc)
    await put_kv(rpc, table_id, upsert_batch(writer_id, 0, [(1, "one")]))

    response = await put_kv(rpc, table_id, upsert_batch(writer_id, 2, [(2, "two")]))

    assert response.error_code == OUT_OF_ORDER_SEQUENCE
    assert await table.new_lookup().create_lookuper().lookup({"id": 2}) is None
    assert await fluss.get_admin().list_offsets(path, [0], pyfluss.OffsetSpec.latest()) == {0: 1}


@pytest.mark.asyncio
async def test_a_replayed_produce_log_batch_is_not_appended_twice(fluss: Any, rpc: RpcConnection) -> None:
    path, table = await create_table(fluss, FIELDS, bucket_count=1)
    table_id = table.get_table_info().table_id
    writer_id = await new_writer_id(rpc)
    first = append_batch(writer_id, 0, [(1, "a"), (2, "b")])
    second = append_batch(writer_id, 1, [(3, "c")])

    assert (await produce_log(rpc, table_id, first)).base_offset == 0
    assert (await produce_log(rpc, table_id, second)).base_offset == 2
    assert_replay_acknowledged_without_effect(await produce_log(rpc, table_id, first), 0, "base_offset")
    assert_replay_acknowledged_without_effect(await produce_log(rpc, table_id, second), 2, "base_offset")

    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    records = await poll_records(scanner, 3)
    assert [(r.offset, r.row["id"]) for r in records] == [(0, 1), (1, 2), (2, 3)]
    assert await fluss.get_admin().list_offsets(path, [0], pyfluss.OffsetSpec.latest()) == {0: 3}


@pytest.mark.asyncio
async def test_concurrent_upsert_writers_produce_exactly_the_rows_written(server: ServerProcess, fluss: Any) -> None:
    """Many writers, each with its own connection (so its own writer id) and keys, write at once: every row
    is there once, and the changelog holds exactly one +I per key and nothing else."""
    writer_count, keys_per_writer, bucket_count = 8, 50, 3
    path, table = await create_table(fluss, FIELDS, primary_keys=["id"], bucket_count=bucket_count)
    config = pyfluss.Config({"bootstrap.servers": server.address})
    connections = [await pyfluss.FlussConnection.create(config) for _ in range(writer_count)]

    async def write(index: int) -> None:
        writer = (await connections[index].get_table(path)).new_upsert().create_writer()
        for key in range(index * keys_per_writer, (index + 1) * keys_per_writer):
            writer.upsert({"id": key, "name": f"w{index}"})
            if key % 10 == 9:
                await writer.flush()  # several batches per writer and bucket, in flight with the others

    try:
        await asyncio.gather(*(write(i) for i in range(writer_count)))
    finally:
        for connection in connections:
            await connection.close()

    expected_count = writer_count * keys_per_writer
    records = await changelog(table, expected_count, buckets=bucket_count)
    assert len(records) == expected_count
    assert set(change_types(records)) == {"+I"}
    assert sorted(r.row["id"] for r in records) == list(range(expected_count))
    offsets = await fluss.get_admin().list_offsets(path, list(range(bucket_count)), pyfluss.OffsetSpec.latest())
    assert sum(offsets.values()) == expected_count
    sample = list(range(0, expected_count, 9))
    assert await lookup_many(table, [{"id": key} for key in sample]) == [
        {"id": key, "name": f"w{key // keys_per_writer}"} for key in sample
    ]


@pytest.mark.asyncio
async def test_concurrent_append_writers_produce_exactly_the_rows_written(server: ServerProcess, fluss: Any) -> None:
    writer_count, rows_per_writer, bucket_count = 8, 60, 3
    path, table = await create_table(fluss, FIELDS, bucket_count=bucket_count, bucket_keys=["id"])
    config = pyfluss.Config({"bootstrap.servers": server.address})
    connections = [await pyfluss.FlussConnection.create(config) for _ in range(writer_count)]

    async def write(index: int) -> None:
        writer = (await connections[index].get_table(path)).new_append().create_writer()
        for row_id in range(index * rows_per_writer, (index + 1) * rows_per_writer):
            writer.append({"id": row_id, "name": f"w{index}"})
            if row_id % 20 == 19:
                await writer.flush()

    try:
        await asyncio.gather(*(write(i) for i in range(writer_count)))
    finally:
        for connection in connections:
            await connection.close()

    expected_count = writer_count * rows_per_writer
    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe_buckets(dict.fromkeys(range(bucket_count), pyfluss.EARLIEST_OFFSET))
    records = await poll_records(scanner, expected_count)
    assert sorted(r.row["id"] for r in records) == list(range(expected_count))
    assert all(r.row["name"] == f"w{r.row['id'] // rows_per_writer}" for r in records)
    offsets = await fluss.get_admin().list_offsets(path, list(range(bucket_count)), pyfluss.OffsetSpec.latest())
    assert sum(offsets.values()) == expected_count
