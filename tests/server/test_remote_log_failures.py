"""Remote log uploads that fail: a refused or failed manifest commit leaves no remote file behind and
deletes nothing local; the next round copies the same segments again. A StromServer in this process, so the
coordinator's commit can be made to fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.errors import StorageError
from strom.rpc.messages import pb
from strom.server.node import StromServer

pytestmark = pytest.mark.asyncio


async def _server_with_segments(tmp_path: Path) -> tuple[StromServer, int]:
    config = {"kv.snapshot.interval": "0s", "log.segment.file-size": "4kb",
              "remote.log.task-interval-duration": "1h",  # rounds run by the test only (and once at start)
              "remote.data.dir": str(tmp_path / "remote")}
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration(config))
    await server.start()
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        path = TablePath("fluss", "failing")
        schema = Schema.from_arrow(pa.schema([("seq", pa.int64()), ("pad", pa.string())]))
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        for first in range(0, 1000, 50):
            ids = list(range(first, first + 50))
            writer.append_arrow_batch(pa.table({"seq": ids, "pad": [f"row-{i:08d}" for i in ids]}))
        await writer.flush()
        return server, table.layout.info.table_id


def _remote_files(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "remote").rglob("*") if p.is_file() and "/log/" in str(p))


@pytest.mark.parametrize("failure", ["refused", "raises"])
async def test_a_failed_commit_leaves_no_remote_files_and_keeps_the_local_log(tmp_path: Path, failure: str) -> None:
    server, table_id = await _server_with_segments(tmp_path)
    try:
        assert server.role is not None and server.role.remote_logs is not None and server.tablets is not None
        remote_logs, manager = server.role.remote_logs, server.tablets.remote_logs
        assert manager is not None
        replica = server.replicas.hosted(table_id)[0]  # type: ignore[union-attr]
        segments_before = len(list(replica.log.directory.glob("*.log")))
        real_commit = remote_logs.commit_remote_log_manifest

        def failing(request: Any, context: object) -> Any:
            if failure == "refused":
                return pb.CommitRemoteLogManifestResponse(commitSuccess=False)
            raise StorageError("the metadata store is unavailable")

        remote_logs.commit_remote_log_manifest = failing  # type: ignore[method-assign]
        await manager.run_once()
        assert _remote_files(tmp_path) == [], "an uncommitted upload left files"
        assert len(list(replica.log.directory.glob("*.log"))) == segments_before
        assert replica.log.log_start_offset == 0

        remote_logs.commit_remote_log_manifest = real_commit  # type: ignore[method-assign]
        await manager.run_once()
        end = manager.remote_end_offset(replica.bucket)
        assert end is not None and end >= replica.log.log_start_offset > 0, "copied segments leave the local disk"
        assert any(p.suffix == ".manifest" for p in _remote_files(tmp_path))
    finally:
        await server.stop()
