"""Test helpers for the Spark connector: tables and rows on a real strom server, through strom's client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from strom.client import Connection, OffsetSpec
from strom.client.changelog import CHANGE_TYPE_NAMES
from strom.client.snapshots import KvSnapshotInfo, KvSnapshotLeaseInfo
from strom.client.table import TableLayout
from strom.ids import TablePath
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import DataType
from tests.conftest import unique_name

T = TypeVar("T")


@dataclass(frozen=True)
class LogRecord:
    bucket: int
    offset: int
    commit_timestamp: int
    change_type: str
    row: dict[str, Any]

WAIT_S_MAX = 30.0
DATABASE = "fluss"


def run(address: str, action: Callable[[Connection], Awaitable[T]]) -> T:
    """Connect to ``address``, run ``action``, close."""

    async def main() -> T:
        async with await Connection.create(address) as connection:
            return await action(connection)

    return asyncio.run(main())


class Fluss:
    """A strom server as the tests drive it: create tables, write rows, look at snapshots and leases."""

    def __init__(self, address: str) -> None:
        self.address = address

    def options(self, table: str, **extra: str) -> dict[str, str]:
        return {"bootstrap.servers": self.address, "table": table, **extra}

    def create_table(
        self,
        columns: Sequence[tuple[str, DataType]],
        *,
        primary_key: Sequence[str] | None = None,
        partition_keys: Sequence[str] = (),
        partitions: Iterable[Mapping[str, str]] = (),
        bucket_count: int = 2,
        prefix: str = "spark",
        properties: Mapping[str, str] | None = None,
        bucket_keys: Sequence[str] = (),
    ) -> str:
        path = TablePath(DATABASE, unique_name(prefix))
        descriptor = TableDescriptor(
            Schema.of(columns, primary_key), partition_keys=tuple(partition_keys), bucket_count=bucket_count,
            properties=dict(properties or {}), bucket_keys=tuple(bucket_keys),
        )

        async def create(connection: Connection) -> None:
            admin = connection.get_admin()
            await admin.create_table(path, descriptor)
            for spec in partitions:
                await admin.create_partition(path, spec)

        run(self.address, create)
        return str(path)

    def upsert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        async def write(connection: Connection) -> None:
            handle = await connection.get_table(TablePath.parse(table))
            writer = handle.new_upsert().create_writer()
            for row in rows:
                writer.upsert(row)
            await writer.flush()

        run(self.address, write)

    def delete(self, table: str, keys: Sequence[Mapping[str, Any]]) -> None:
        async def write(connection: Connection) -> None:
            handle = await connection.get_table(TablePath.parse(table))
            writer = handle.new_upsert().create_writer()
            for key in keys:
                writer.delete(key)
            await writer.flush()

        run(self.address, write)

    def append(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        async def write(connection: Connection) -> None:
            handle = await connection.get_table(TablePath.parse(table))
            writer = handle.new_append().create_writer()
            for row in rows:
                writer.append(row)
            await writer.flush()

        run(self.address, write)

    def rows(self, table: str) -> list[dict[str, Any]]:
        """The table's current rows through a server-side scan (ScanKv), sorted by their values."""

        async def scan(connection: Connection) -> pa.Table:
            handle = await connection.get_table(TablePath.parse(table))
            scanner = await handle.new_scan().create_batch_scanner()
            batches = [batch async for batch in scanner]
            return pa.Table.from_batches(batches, schema=handle.layout.arrow_schema)

        return sorted(run(self.address, scan).to_pylist(), key=lambda row: [(v is None, v) for v in row.values()])

    def log_batch_sizes(self, table: str, bucket: int = 0) -> list[int]:
        """Rows per record batch of a bucket's log (a log table's appends, a primary-key table's changelog):
        one batch per write request that reached the bucket."""

        async def sizes(connection: Connection) -> list[int]:
            handle = await connection.get_table(TablePath.parse(table))
            path = TablePath.parse(table)
            end = (await connection.get_admin().list_offsets(path, [bucket], OffsetSpec.latest()))[bucket]
            scanner = handle.new_scan().create_log_scanner()
            table_bucket = handle.layout.info.buckets()[bucket]
            return [scan.batch.num_rows async for scan in scanner.read_range(table_bucket, 0, end)]

        return run(self.address, sizes)

    def describe(self, table: str) -> TableLayout:
        async def layout(connection: Connection) -> TableLayout:
            return (await connection.get_table(TablePath.parse(table))).layout

        return run(self.address, layout)

    def log_records(self, table: str, bucket: int = 0) -> list[LogRecord]:
        """Every record of a bucket's log as strom's LogScanner reports it: offset, commit time, change type, row."""

        async def records(connection: Connection) -> list[LogRecord]:
            handle = await connection.get_table(TablePath.parse(table))
            path = TablePath.parse(table)
            end = (await connection.get_admin().list_offsets(path, [bucket], OffsetSpec.latest()))[bucket]
            scanner = handle.new_scan().create_log_scanner()
            table_bucket = handle.layout.info.buckets()[bucket]
            found = []
            async for scan in scanner.read_range(table_bucket, 0, end):
                types = scan.change_types or bytes(scan.batch.num_rows)
                for index, row in enumerate(scan.batch.to_pylist()):
                    change = CHANGE_TYPE_NAMES[types[index]]
                    found.append(LogRecord(bucket, scan.base_offset + index, scan.commit_timestamp, change, row))
            return found

        return run(self.address, records)

    def latest_snapshots(self, table: str, partition_name: str | None = None) -> dict[int, KvSnapshotInfo | None]:
        async def latest(connection: Connection) -> dict[int, KvSnapshotInfo | None]:
            listed = await connection.get_admin().get_latest_kv_snapshots(TablePath.parse(table), partition_name)
            return listed.snapshots

        return run(self.address, latest)

    def high_watermarks(self, table: str, bucket_count: int) -> dict[int, int]:
        async def offsets(connection: Connection) -> dict[int, int]:
            admin = connection.get_admin()
            return await admin.list_offsets(TablePath.parse(table), list(range(bucket_count)), OffsetSpec.latest())

        return run(self.address, offsets)

    def wait_for_snapshots_at_high_watermark(self, table: str, bucket_count: int) -> dict[int, KvSnapshotInfo]:
        """Wait until every bucket with data has a snapshot covering all of it."""
        high = self.high_watermarks(table, bucket_count)
        deadline = time.monotonic() + WAIT_S_MAX
        while True:
            latest = self.latest_snapshots(table)
            covered = {
                b: s for b, s in latest.items() if s is not None and s.log_offset >= high[b]
            }
            if all(b in covered or high[b] == 0 for b in high):
                return covered
            assert time.monotonic() < deadline, f"no snapshots at {high} within {WAIT_S_MAX} s: {latest}"
            time.sleep(0.1)

    def leases(self) -> list[KvSnapshotLeaseInfo]:
        return run(self.address, lambda connection: connection.get_admin().list_kv_snapshot_leases())

    def retained_snapshot_ids(self, table: str) -> set[tuple[int, int]]:
        """``(bucket, snapshot id)`` of every snapshot the coordinator still keeps."""

        async def listed(connection: Connection) -> set[tuple[int, int]]:
            handle = await connection.get_table(TablePath.parse(table))
            snapshots = await connection.get_admin().list_kv_snapshots(handle.layout.info.table_id)
            return {(bucket, snapshot_id) for bucket, snapshot_id, _offset in snapshots}

        return run(self.address, listed)


def run_available_now(stream_writer: Any, checkpoint: Path) -> None:
    """Start a streaming query (a ``DataStreamWriter`` with its sink set) with trigger(availableNow=True)
    and wait until it has drained its source."""
    query = stream_writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    try:
        query.awaitTermination(120)
    finally:
        query.stop()


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = WAIT_S_MAX) -> T:
    """Poll ``condition`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.05)
