"""A bucket whose RocksDB refuses writes (what RocksDB does after ENOSPC in a flush), in a StromServer in this
process so the failure can be injected into the live tablet: reads go on, writes fail fast without growing
the changelog, and the bucket reopens itself — replaying the changelog — once storage works again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.client import writer as writer_module
from strom.config import Configuration
from strom.errors import KvStorageError
from strom.ids import TableBucket
from strom.server.node import StromServer
from strom.tablet import replica as replica_module

pytestmark = pytest.mark.asyncio


class _RefusingWrites:
    """Stands in for a RocksDB in its background-error state: reads and closing work, writes raise."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def write(self, *_args: Any, **_kwargs: Any) -> None:
        raise Exception("IO error: No space left on device: While appending to file: 000012.sst")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def test_a_failed_rocksdb_keeps_serving_reads_and_reopens_once_storage_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration({"kv.snapshot.interval": "0s"}))
    await server.start()
    try:
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
            path = TablePath("fluss", "refusing")
            await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
            table = await connection.get_table(path)
            await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [1, 2], "v": ["a", "b"]}))
            assert server.replicas is not None
            bucket = TableBucket(table.table_info.table_id, 0)
            kv = server.replicas.get(bucket).kv
            monkeypatch.setattr(replica_module, "RECOVERY_FREE_BYTES_MIN", 1 << 62)  # "the disk is still full"
            # the refusals below are what is tested, not the client's ~35 s of retries before it gives up
            retries_max = writer_module.RETRIES_MAX
            monkeypatch.setattr(writer_module, "RETRIES_MAX", 2)
            kv._db = _RefusingWrites(kv._db)  # type: ignore[assignment]

            with pytest.raises(KvStorageError, match="No space left"):
                await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [3], "v": ["c"]}))
            log_end = kv.log.log_end_offset
            with pytest.raises(KvStorageError, match="writes resume once storage works again"):
                await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [4], "v": ["d"]}))
            assert kv.log.log_end_offset == log_end, "a write RocksDB cannot take must not grow the changelog"
            lookuper = table.new_lookup().create_lookuper()
            assert (await lookuper.lookup({"id": 1}))["v"] == "a"  # reads go on
            assert await lookuper.lookup({"id": 3}) is None  # never acknowledged, so never visible

            monkeypatch.setattr(replica_module, "RECOVERY_FREE_BYTES_MIN", 0)  # space is back
            monkeypatch.setattr(writer_module, "RETRIES_MAX", retries_max)  # the bucket reopens after a pause
            await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [4], "v": ["d"]}))
            reopened = server.replicas.get(bucket).kv
            assert reopened is not kv and reopened.failed is None
            # the failed write reached the changelog before RocksDB refused it: replay applied it
            assert [(await lookuper.lookup({"id": i}) or {}).get("v") for i in (1, 2, 3, 4)] == ["a", "b", "c", "d"]
    finally:
        await server.stop()
