"""Many small writers through a real server: PutKv requests from independent client connections, on two
buckets, share the changelog's fsyncs (counted on the real log files, never timed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.ids import TableBucket
from strom.server.node import StromServer
from tests.log.test_group_commit import FsyncGate, until

pytestmark = pytest.mark.asyncio

WRITERS = 20
ROWS_PER_WRITE = 10
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


async def test_small_writes_from_many_connections_share_fsyncs_across_both_buckets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration({"kv.snapshot.interval": "0s"}))
    await server.start()
    address = f"127.0.0.1:{server.port}"
    connections = [await Connection.create(address) for _ in range(WRITERS)]
    try:
        path = TablePath("fluss", "small_writers")
        schema = Schema.from_arrow(SCHEMA, primary_key=["id"])
        await connections[0].get_admin().create_table(path, TableDescriptor(schema, bucket_count=2))
        tables = [await connection.get_table(path) for connection in connections]
        writers = [table.new_upsert().create_writer() for table in tables]
        warm = pa.table({"id": list(range(-20, 0)), "v": ["w"] * 20}, schema=SCHEMA)
        await writers[0].upsert_batch(warm)  # opens both buckets (their recovery fsyncs are not counted)
        assert server.replicas is not None
        table_id = tables[0].table_info.table_id
        logs = [server.replicas.get(TableBucket(table_id, bucket)).log for bucket in (0, 1)]
        assert all(log.log_end_offset > 0 for log in logs)  # the warm-up rows reached both buckets
        appended_before = sum(log.log_end_offset for log in logs)

        gate = FsyncGate(monkeypatch)
        writes = [
            asyncio.ensure_future(writer.upsert_batch(pa.table(
                {"id": [index * ROWS_PER_WRITE + row for row in range(ROWS_PER_WRITE)],
                 "v": [f"v{index}"] * ROWS_PER_WRITE}, schema=SCHEMA)))
            for index, writer in enumerate(writers)
        ]
        # every request is appended (one +I per new key) while the first fsyncs are held
        await until(lambda: sum(log.log_end_offset for log in logs) == appended_before + WRITERS * ROWS_PER_WRITE)
        assert not any(write.done() for write in writes)  # nothing is acknowledged before its fsync
        gate.open()
        await asyncio.gather(*writes)
        # at most the held fsync and the one after it, per bucket: not one per request and bucket (40)
        assert gate.count <= 4, f"{gate.count} fsyncs for {WRITERS} PutKv requests on 2 buckets"
        lookuper = tables[1].new_lookup().create_lookuper()
        assert await lookuper.lookup({"id": WRITERS * ROWS_PER_WRITE - 1}) is not None
    finally:
        for connection in connections:
            await connection.close()
        await server.stop()
