"""kill -9 while KV snapshots are being taken and uploaded, several times over: after the next start and a
clean stop, nothing the crashes left behind remains — no local checkpoint in ``snapshot-staging/``, no
partial ``snap-<id>/`` without its ``_METADATA``, no remote file that no snapshot record references."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import StromError
from strom.kv.snapshot import CompletedKvSnapshot
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

KILLS = 4
CONFIG = {"kv.snapshot.interval": "50ms", "kv.snapshot.num-retained": "1"}


async def _write_until_cancelled(address: str, path: TablePath) -> None:
    """Keep the buckets changing so every snapshot interval has something to upload."""
    rng = random.Random(7)
    async with await Connection.create(address) as connection:
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        while True:
            ids = rng.sample(range(200_000), 5_000)
            with contextlib.suppress(StromError):  # the server is being killed under it
                await writer.upsert_batch(pa.table({"id": ids, "v": [f"{i}-{rng.random()}" * 4 for i in ids]}))


def _referenced(data_dir: Path) -> set[Path]:
    with sqlite3.connect(data_dir / "metadata.sqlite") as db:
        rows = db.execute("SELECT snapshot_json FROM kv_snapshots").fetchall()
    files: set[Path] = set()
    for (document,) in rows:
        snapshot = CompletedKvSnapshot.from_json(document)
        files.add(Path(snapshot.metadata_path))
        files.update(Path(f.remote_path) for f in snapshot.files)
    return files


async def test_kill_9_during_snapshot_uploads_leaves_nothing_behind_after_the_next_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir, CONFIG).start()
    path = TablePath("fluss", "crashy")
    async with await Connection.create(server.address) as connection:
        schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2))
    rng = random.Random(11)
    for _ in range(KILLS):
        writing = asyncio.ensure_future(_write_until_cancelled(server.address, path))
        await asyncio.sleep(rng.uniform(1.0, 2.0))
        server.kill()
        writing.cancel()
        await asyncio.gather(writing, return_exceptions=True)
        server = ServerProcess(data_dir, CONFIG, server.port).start()
    await asyncio.sleep(1.0)  # the restarted server takes snapshots of its own
    assert server.stop() == 0, server.log_text()[-3000:]

    staging = data_dir / "snapshot-staging"
    assert not staging.exists() or list(staging.iterdir()) == []
    remote_kv = data_dir / "remote" / "kv"
    for snap_dir in remote_kv.rglob("snap-*"):
        assert (snap_dir / "_METADATA").exists(), f"partial snapshot directory {snap_dir}"
    present = {p for p in remote_kv.rglob("*") if p.is_file()}
    referenced = _referenced(data_dir)
    assert referenced, "the restarted server took no snapshot"
    assert present == referenced, sorted(str(p) for p in present ^ referenced)[:10]
