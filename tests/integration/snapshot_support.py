"""Helpers for tests that need KV snapshots to happen on a real server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow as pa

from strom.client import Admin, Connection, Schema, Table, TableDescriptor, TablePath
from strom.client.snapshots import KvSnapshots

SNAPSHOT_CONFIG = {
    "kv.snapshot.interval": "200ms",
    "kv.snapshot.lease.expiration-check-interval": "200ms",
}
WAIT_S = 30.0


async def create_pk_table(connection: Connection, path: TablePath, buckets: int) -> Table:
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=buckets))
    return await connection.get_table(path)


async def write_round(table: Table, ids: range, tag: str) -> None:
    writer = table.new_upsert().create_writer()
    await writer.upsert_batch(pa.table({"id": list(ids), "v": [f"{tag}-{i}" for i in ids]}))


async def wait_for_snapshot_ids(admin: Admin, path: TablePath, snapshot_id: int) -> KvSnapshots:
    """Wait until every bucket's latest snapshot id is at least ``snapshot_id``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        latest = await admin.get_latest_kv_snapshots(path)
        if all(info is not None and info.snapshot_id >= snapshot_id for info in latest.snapshots.values()):
            return latest
        if time.monotonic() > deadline:
            raise AssertionError(f"snapshots of {path} did not reach id {snapshot_id}: {latest}")
        await asyncio.sleep(0.05)


async def wait_until(predicate, what: str, timeout_s: float = WAIT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def snapshot_dirs(data_dir: Path, path: TablePath, table_id: int, bucket: int) -> set[str]:
    """The ``snap-<id>`` directories that exist in the server's default remote storage for a bucket."""
    bucket_dir = data_dir / "remote" / "kv" / path.database_name / f"{path.table_name}-{table_id}" / str(bucket)
    if not bucket_dir.exists():
        return set()
    return {p.name for p in bucket_dir.iterdir() if p.name.startswith("snap-")}


def shared_files(data_dir: Path, path: TablePath, table_id: int, bucket: int) -> set[str]:
    shared = data_dir / "remote" / "kv" / path.database_name / f"{path.table_name}-{table_id}" / str(bucket) / "shared"
    return {p.name for p in shared.iterdir()} if shared.exists() else set()
