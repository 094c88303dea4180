"""V1 and V2 log batches through a real server: ProduceLog stores them as written (statistics kept), FetchLog
serves them byte for byte but for the offsets and time the server stamps, strom's client and pyfluss 1.0
read their rows, and a restart recovers a log whose segments mix versions."""

from __future__ import annotations

import time
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, Predicate, ScanBatch, Schema, TableDescriptor, TablePath, col
from strom.records import batch_statistics, log_batch
from strom.records.types import DataField, IntType, RowType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.pyfluss_support import poll_arrow
from tests.records.test_log_batch_versions import STATISTICS, spec_batch

pytestmark = pytest.mark.asyncio

SCHEMA = pa.schema([("id", pa.int32()), ("name", pa.string())])
ROW_TYPE = RowType([DataField("id", IntType()), DataField("name", StringType())])


def _batch(magic: int, ids: list[int]) -> bytes:
    records = log_batch.arrow_message(pa.RecordBatch.from_pydict({"id": ids, "name": [f"n{i}" for i in ids]},
                                                                  schema=SCHEMA))
    statistics = STATISTICS if magic != log_batch.MAGIC_V0 else b""
    if magic == log_batch.MAGIC_V0:
        return log_batch.build_batch(schema_id=1, record_count=len(ids), records=records, append_only=True)
    return spec_batch(magic, records, len(ids), statistics, writer_id=-1, batch_sequence=-1)


async def _produce(rpc: RpcConnection, table_id: int, data: bytes) -> Any:
    request = pb.ProduceLogRequest(acks=-1, table_id=table_id, timeout_ms=30_000)
    request.buckets_req.add(bucket_id=0, records=data)
    (bucket,) = (await rpc.request(ApiKey.PRODUCE_LOG, request)).buckets_resp
    assert not bucket.error_code, bucket
    return bucket.base_offset


async def _fetched(rpc: RpcConnection, table_id: int) -> bytes:
    request = pb.FetchLogRequest(follower_server_id=-1, max_bytes=1 << 20)
    table = request.tables_req.add(table_id=table_id, projection_pushdown_enabled=False)
    table.buckets_req.add(bucket_id=0, fetch_offset=0, max_fetch_bytes=1 << 20)
    (bucket,) = (await rpc.request(ApiKey.FETCH_LOG, request)).tables_resp[0].buckets_resp
    return bytes(bucket.records)


async def _rows(connection: Connection, path: TablePath, count: int) -> list[int]:
    table = await connection.get_table(path)
    scanner = table.new_scan().create_log_scanner()
    scanner.subscribe(0, 0)
    ids: list[int] = []
    deadline = time.monotonic() + 30
    while len(ids) < count:
        assert time.monotonic() < deadline, f"read {ids}"
        for scanned in await scanner.poll(500):
            ids += scanned.batch.column(0).to_pylist()
    return ids


async def test_v1_and_v2_batches_are_stored_served_and_recovered_as_written(server_factory: Any) -> None:
    server = server_factory()
    path = TablePath("fluss", unique_name("versions"))
    schema = Schema.from_arrow(SCHEMA)
    written = {
        log_batch.MAGIC_V0: _batch(log_batch.MAGIC_V0, [1, 2]),
        log_batch.MAGIC_V1: _batch(log_batch.MAGIC_V1, [3, 4, 5]),
        log_batch.MAGIC_V2: _batch(log_batch.MAGIC_V2, [6]),
    }
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table_id = (await connection.get_admin().get_table_info(path)).table_id
        host, _, port = server.address.rpartition(":")
        rpc = await RpcConnection.connect(host, int(port))
        try:
            assert [await _produce(rpc, table_id, data) for data in written.values()] == [0, 2, 5]
            served = await _fetched(rpc, table_id)
        finally:
            await rpc.close()
        assert await _rows(connection, path, 6) == [1, 2, 3, 4, 5, 6]

    found = list(log_batch.iter_batches(served))
    assert [header.magic for _, header in found] == [0, 1, 2]
    for (position, header), original in zip(found, written.values(), strict=True):
        stored = served[position : position + header.size_bytes]
        # the server stamps the base offset and the commit time (and for V2 leaves the epoch as sent)
        assert stored[log_batch.LENGTH_OFFSET : log_batch.COMMIT_TIMESTAMP_OFFSET] == original[
            log_batch.LENGTH_OFFSET : log_batch.COMMIT_TIMESTAMP_OFFSET]
        assert stored[log_batch.COMMIT_TIMESTAMP_OFFSET + 8 :] == original[log_batch.COMMIT_TIMESTAMP_OFFSET + 8 :]

    server.kill()  # recovery rescans the last segment, whose batches mix the three versions
    restarted = server_factory(data_dir=server.data_dir, port=server.port)
    async with await Connection.create(restarted.address) as connection:
        assert await _rows(connection, path, 6) == [1, 2, 3, 4, 5, 6]


async def test_pyfluss_reads_a_log_whose_batches_mix_versions(server: Any, fluss: Any) -> None:
    path = TablePath("fluss", unique_name("pyfluss_versions"))
    await fluss.get_admin().create_table(pyfluss.TablePath(path.database_name, path.table_name),
                                         pyfluss.TableDescriptor(pyfluss.Schema(SCHEMA)), False)
    table = await fluss.get_table(pyfluss.TablePath(path.database_name, path.table_name))
    table_id = table.get_table_info().table_id
    host, _, port = server.address.rpartition(":")
    rpc = await RpcConnection.connect(host, int(port))
    try:
        for magic, ids in ((log_batch.MAGIC_V0, [1]), (log_batch.MAGIC_V1, [2, 3]), (log_batch.MAGIC_V2, [4])):
            await _produce(rpc, table_id, _batch(magic, ids))
    finally:
        await rpc.close()
    scanner = await table.new_scan().create_record_batch_log_scanner()
    scanner.subscribe(0, 0)
    rows = await poll_arrow(scanner, 4)
    assert sorted(rows.column("id").to_pylist()) == [1, 2, 3, 4]


async def test_strom_client_writes_statistics_for_the_columns_the_table_names(server: Any, fluss: Any) -> None:
    path = TablePath("fluss", unique_name("statistics"))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        descriptor = TableDescriptor(Schema.from_arrow(SCHEMA), bucket_count=1,
                                     properties={"table.statistics.columns": "id"})
        await admin.create_table(path, descriptor)
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        writer.append_arrow_batch(pa.RecordBatch.from_pydict({"id": [7, 3, None], "name": ["a", "b", "c"]},
                                                             schema=SCHEMA))
        await writer.flush()
        table_id = (await admin.get_table_info(path)).table_id
        host, _, port = server.address.rpartition(":")
        rpc = await RpcConnection.connect(host, int(port))
        try:
            served = await _fetched(rpc, table_id)
        finally:
            await rpc.close()
    [(_position, header)] = list(log_batch.iter_batches(served))
    assert header.magic == log_batch.MAGIC_V1
    statistics = batch_statistics.parse(served[header.header_size : header.records_offset], ROW_TYPE)
    assert statistics == batch_statistics.BatchStatistics((0,), (1,), (3,), (7,))
    pyfluss_table = await fluss.get_table(pyfluss.TablePath(path.database_name, path.table_name))
    scanner = await pyfluss_table.new_scan().create_record_batch_log_scanner()
    scanner.subscribe(0, 0)
    assert (await poll_arrow(scanner, 3)).column("name").to_pylist() == ["a", "b", "c"]  # pyfluss 1.0 reads V1


async def test_a_filtered_scan_skips_the_batches_that_cannot_match(server: Any) -> None:
    path = TablePath("fluss", unique_name("filtered"))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        await admin.create_table(path, TableDescriptor(Schema.from_arrow(SCHEMA), bucket_count=1,
                                                       properties={"table.statistics.columns": "*"}))
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        for first in range(0, 2000, 100):  # 20 batches of 100 ids each
            await writer.write_arrow_batch(pa.RecordBatch.from_pydict(
                {"id": list(range(first, first + 100)), "name": [f"n{i}" for i in range(first, first + 100)]},
                schema=SCHEMA))
        await writer.flush()

        async def scan(predicate: Predicate | None) -> tuple[list[ScanBatch], int]:
            builder = table.new_scan()
            scanner = (builder.filter(predicate) if predicate is not None else builder).create_log_scanner()
            scanner.subscribe(0, 0)
            found: list[ScanBatch] = []
            deadline = time.monotonic() + 30
            while scanner.position(table.bucket(0)) < 2000:
                assert time.monotonic() < deadline, scanner.position(table.bucket(0))
                found += await scanner.poll(200)
            return found, scanner.position(table.bucket(0))

        wanted = (col("id") >= 1234) & (col("id") < 1240) | (col("name") == "n77")
        everything, _ = await scan(None)
        filtered, end = await scan(wanted)
        assert end == 2000  # the scanner went past the skipped batches to the log's end
        assert sum(b.batch.num_rows for b in everything) == 2000
        # only the batches that may match come back: n77 also sorts inside [n700, n799]
        assert [b.base_offset for b in filtered] == [0, 700, 1200]
        matching = [row for b in filtered for row in wanted.filter(b.batch).column("id").to_pylist()]
        assert matching == [77, 1234, 1235, 1236, 1237, 1238, 1239]
        expected = [row for b in everything for row in wanted.filter(b.batch).column("id").to_pylist()]
        assert matching == expected  # the same rows as filtering the whole log here
        nothing, end = await scan(col("id") > 5000)
        assert nothing == [] and end == 2000
