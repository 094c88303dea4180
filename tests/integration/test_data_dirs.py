"""A real ``strom server`` with three data directories (``data.dirs``): a primary-key table's and a log
table's buckets spread over them, everything reads back after a restart, and after one directory is removed
while the server is down, the server starts without it — logged OFFLINE, not created anew — serves the
buckets of the other two, and answers a clear storage error for the buckets that were lost with it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import EARLIEST_OFFSET, Connection, Lookuper, Schema, TableDescriptor, TablePath
from strom.client.table import Table
from strom.errors import StorageError
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

BUCKETS = 3
KEYS = range(30)
USERS, EVENTS = TablePath("fluss", "users"), TablePath("fluss", "events")


async def _events_by_bucket(table: Table, buckets: list[int], count: int) -> dict[int, list[int]]:
    """The ids in each of ``buckets`` of the events log, read from its start until ``count`` came (bounded)."""
    scanner = table.new_scan().create_log_scanner()
    for bucket in buckets:
        scanner.subscribe(bucket, EARLIEST_OFFSET)
    found: dict[int, list[int]] = {bucket: [] for bucket in buckets}
    for _ in range(50):
        if sum(map(len, found.values())) >= count:
            break
        for batch in await scanner.poll(200):
            found[batch.bucket.bucket] += batch.batch.column("id").to_pylist()
    return found


async def _lookups(table: Table) -> dict[int, object]:
    """Each key's row name, or the error its lookup met."""
    lookuper = table.new_lookup().create_lookuper()
    assert isinstance(lookuper, Lookuper)
    found: dict[int, object] = {}
    for key in KEYS:
        try:
            row = await lookuper.lookup({"id": key})
            found[key] = None if row is None else row["name"]
        except StorageError as exc:
            found[key] = exc
    return found


async def test_buckets_spread_over_the_data_directories_and_one_lost_directory_fails_only_its_own(
    tmp_path: Path,
) -> None:
    disks = [tmp_path / f"disk{n}" for n in range(BUCKETS)]
    server = ServerProcess(tmp_path / "node", {"data.dirs": ",".join(map(str, disks))})
    server.start()
    try:
        async with await Connection.create(server.address) as connection:
            admin = connection.get_admin()
            users_schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("name", pa.string())]), primary_key=["id"])
            await admin.create_table(USERS, TableDescriptor(users_schema, bucket_count=BUCKETS))
            events_schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("name", pa.string())]))
            await admin.create_table(EVENTS, TableDescriptor(events_schema, bucket_keys=("id",), bucket_count=BUCKETS))
            users, events = await connection.get_table(USERS), await connection.get_table(EVENTS)
            rows = pa.table({"id": list(KEYS), "name": [f"user {key}" for key in KEYS]})
            await users.new_upsert().create_writer().upsert_batch(rows)
            await events.new_append().create_writer().write_arrow_batch(rows)
            users_id, events_id = users.table_info.table_id, events.table_info.table_id

        # bucket n of each table in directory n: the first table's buckets fill the directories by KV count,
        # the second's by log count, ties to the first configured
        for n, disk in enumerate(disks):
            assert (disk / "disk.properties").is_file()
            assert (disk / "tablets" / "fluss" / f"users-{users_id}" / str(n) / "kv").is_dir()
            assert (disk / "tablets" / "fluss" / f"events-{events_id}" / str(n) / "log").is_dir()

        assert server.stop() == 0
        server.start()
        async with await Connection.create(server.address) as connection:
            users, events = await connection.get_table(USERS), await connection.get_table(EVENTS)
            assert await _lookups(users) == {key: f"user {key}" for key in KEYS}
            by_bucket = await _events_by_bucket(events, list(range(BUCKETS)), len(KEYS))
            assert sorted(key for keys in by_bucket.values() for key in keys) == list(KEYS)
            assert all(by_bucket.values()), "every bucket holds some of the keys"
        assert server.stop() == 0

        shutil.rmtree(disks[1])  # lost while the server was down
        server.start()
        assert f"data directory {disks[1]} is OFFLINE" in server.log_text()
        assert not disks[1].exists(), "a directory that held a disk is not created anew, empty"
        lost_keys = set(by_bucket[1])  # both tables bucket by id: the same keys lie in bucket 1 of each
        async with await Connection.create(server.address) as connection:
            users, events = await connection.get_table(USERS), await connection.get_table(EVENTS)
            found = await _lookups(users)
            assert {key: value for key, value in found.items() if key not in lost_keys} == {
                key: f"user {key}" for key in KEYS if key not in lost_keys}
            for key in lost_keys:
                assert isinstance(found[key], StorageError) and "not online" in str(found[key]), found[key]
            kept_count = len(by_bucket[0]) + len(by_bucket[2])
            assert await _events_by_bucket(events, [0, 2], kept_count) == {0: by_bucket[0], 2: by_bucket[2]}
            with pytest.raises(StorageError, match="not online"):
                await _events_by_bucket(events, [1], 1)
            kept = min(by_bucket[0])  # a bucket of a directory that is still there takes writes
            await users.new_upsert().create_writer().upsert_batch(pa.table({"id": [kept], "name": ["renamed"]}))
            assert (await _lookups(users))[kept] == "renamed"
        assert server.stop() == 0
        assert not server.internal_errors()
    finally:
        server.kill()
