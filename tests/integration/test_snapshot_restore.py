"""A bucket whose local RocksDB is gone, and whose changelog was trimmed, is rebuilt from its latest KV
snapshot plus the changelog after it."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from tests.conftest import unique_name
from tests.integration.snapshot_support import SNAPSHOT_CONFIG, wait_for_snapshot_ids, wait_until

pytestmark = pytest.mark.asyncio

RESTORE_CONFIG = {
    **SNAPSHOT_CONFIG,
    "log.segment.file-size": "4kb",
    "log.retention.check-interval": "200ms",
}


async def test_a_lost_rocksdb_is_restored_from_the_latest_snapshot_and_the_changelog_after_it(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(RESTORE_CONFIG)
    path = TablePath("fluss", unique_name("restore"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    descriptor = TableDescriptor(schema, bucket_count=1, properties={"table.log.ttl": "1ms"})
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        await admin.create_table(path, descriptor)
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        for round_ in range(6):
            await writer.upsert_batch(pa.table({"id": list(range(200)), "v": [f"r{round_}-{i}" for i in range(200)]}))
        await wait_for_snapshot_ids(admin, path, 0)

        async def log_trimmed() -> bool:
            offsets = await admin.list_offsets(path, [0], OffsetSpec.earliest())
            return offsets[0] > 0

        await wait_until(log_trimmed, "retention to trim the changelog below the snapshot")
        # changes after the snapshot that only the changelog holds
        await writer.upsert_batch(pa.table({"id": [0, 1, 500], "v": ["after-0", "after-1", "after-500"]}))
        writer.delete({"id": 2})
        await writer.flush()
    assert server.stop() == 0
    kv_dirs = list(server.data_dir.glob(f"tablets/fluss/{path.table_name}-*/0/kv"))
    assert len(kv_dirs) == 1
    shutil.rmtree(kv_dirs[0])
    server.start()
    async with await Connection.create(server.address) as connection:
        table = await connection.get_table(path)
        rows = await (await table.new_scan().create_batch_scanner()).to_arrow()
    state = dict(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))
    expected = {i: f"r5-{i}" for i in range(200)} | {0: "after-0", 1: "after-1", 500: "after-500"}
    del expected[2]
    assert state == expected
    assert "restoring RocksDB from snapshot" in server.log_text()
