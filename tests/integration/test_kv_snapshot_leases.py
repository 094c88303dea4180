"""KV snapshots and leases (FIP-22) end to end: real server, real RocksDB, real remote files."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableBucket, TableDescriptor, TablePath
from strom.client.snapshots import KvSnapshotReader
from strom.errors import KvSnapshotNotExistError, NonPrimaryKeyTableError, UnknownTableOrBucketError
from tests.conftest import unique_name
from tests.integration.snapshot_support import (
    SNAPSHOT_CONFIG,
    create_pk_table,
    shared_files,
    snapshot_dirs,
    wait_for_snapshot_ids,
    wait_until,
    write_round,
)

pytestmark = pytest.mark.asyncio


async def test_leased_snapshots_outlive_retention_and_are_freed_when_released(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SNAPSHOT_CONFIG)
    path = TablePath("fluss", unique_name("leases"))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        table = await create_pk_table(connection, path, buckets=3)
        table_id = table.table_info.table_id
        buckets = [table.bucket(b) for b in range(3)]

        await write_round(table, range(300), "r0")
        first = await wait_for_snapshot_ids(admin, path, 0)
        lease_a = admin.create_kv_snapshot_lease(unique_name("a"), 60_000)
        result = await lease_a.acquire_snapshots({first.table_bucket(b): s.snapshot_id for b, s in first.snapshots.items()})
        assert result.unavailable_snapshots == {}
        a_ids = {b: s.snapshot_id for b, s in first.snapshots.items()}

        await write_round(table, range(300), "r1")
        second = await wait_for_snapshot_ids(admin, path, max(a_ids.values()) + 1)
        lease_b = admin.create_kv_snapshot_lease(unique_name("b"), 60_000)
        b_ids = {b: s.snapshot_id for b, s in second.snapshots.items()}
        assert (await lease_b.acquire_snapshots({second.table_bucket(b): i for b, i in b_ids.items()})).unavailable_snapshots == {}

        # roll newer snapshots well past kv.snapshot.num-retained (2)
        for round_ in range(2, 5):
            await write_round(table, range(300), f"r{round_}")
            latest = await wait_for_snapshot_ids(admin, path, max(b_ids.values()) + round_ - 1)
        active = await admin.list_kv_snapshots(table_id)
        for bucket in range(3):
            ids = {s for b, s, _offset in active if b == bucket}
            assert a_ids[bucket] in ids and b_ids[bucket] in ids, (bucket, ids)
            assert latest.snapshots[bucket].snapshot_id in ids
            assert f"snap-{a_ids[bucket]}" in snapshot_dirs(server.data_dir, path, table_id, bucket)

        # a leased snapshot outside the retention window is readable end to end: metadata + files -> rows
        metadata = await admin.get_kv_snapshot_metadata(buckets[0], a_ids[0])
        assert metadata.log_offset == first.snapshots[0].log_offset
        with KvSnapshotReader(table.layout, metadata) as reader:
            rows = pa.Table.from_batches(list(reader.iter_batches()), schema=table.arrow_schema)
        assert rows.num_rows > 0
        assert set(rows.column("v").to_pylist()) == {f"r0-{i}" for i in rows.column("id").to_pylist()}

        # partial release: bucket 0 unpinned, buckets 1 and 2 stay pinned
        await lease_b.release_snapshots([buckets[0]])
        [info] = await admin.list_kv_snapshot_leases(lease_b.lease_id)
        assert set(info.snapshots) == {buckets[1], buckets[2]}
        await wait_until(
            lambda: f"snap-{b_ids[0]}" not in snapshot_dirs(server.data_dir, path, table_id, 0),
            "the released snapshot's files to be deleted",
        )
        assert f"snap-{b_ids[1]}" in snapshot_dirs(server.data_dir, path, table_id, 1)
        with pytest.raises(KvSnapshotNotExistError):
            await admin.get_kv_snapshot_metadata(buckets[0], b_ids[0])

        # full release deletes the lease
        await lease_b.release_snapshots([buckets[1], buckets[2]])
        assert await admin.list_kv_snapshot_leases(lease_b.lease_id) == []

        # dropping lease A frees snapshot 0 everywhere; only the retained snapshots' files remain
        await lease_a.drop()
        for bucket in range(3):
            await wait_until(
                lambda bucket=bucket: len(snapshot_dirs(server.data_dir, path, table_id, bucket)) == 2,
                f"bucket {bucket} to keep only its two retained snapshots",
            )
        remaining = await admin.list_kv_snapshots(table_id)
        for bucket in range(3):
            newest = latest.snapshots[bucket].snapshot_id
            assert sorted(s for b, s, _o in remaining if b == bucket) == [newest - 1, newest]
            referenced = set()
            for snapshot_id in (newest - 1, newest):
                files = (await admin.get_kv_snapshot_metadata(buckets[bucket], snapshot_id)).files
                referenced |= {remote.rsplit("/", 1)[1] for remote, _local in files if "/shared/" in remote}
            assert shared_files(server.data_dir, path, table_id, bucket) == referenced

        await admin.create_kv_snapshot_lease("never-existed", 1000).drop()  # dropping an unknown lease succeeds


async def test_acquiring_a_deleted_snapshot_reports_it_unavailable(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory({**SNAPSHOT_CONFIG, "kv.snapshot.num-retained": "1"})
    path = TablePath("fluss", unique_name("gone"))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        table = await create_pk_table(connection, path, buckets=1)
        await write_round(table, range(50), "r0")
        first = await wait_for_snapshot_ids(admin, path, 0)
        old_id = first.snapshots[0].snapshot_id
        await write_round(table, range(50), "r1")
        await wait_for_snapshot_ids(admin, path, old_id + 1)
        lease = admin.create_kv_snapshot_lease(unique_name("late"), 60_000)
        result = await lease.acquire_snapshots({table.bucket(0): old_id})
        assert result.unavailable_snapshots == {table.bucket(0): old_id}
        [info] = await admin.list_kv_snapshot_leases(lease.lease_id)
        assert info.snapshots == {}  # nothing pinned: the snapshot was already gone


async def test_an_unrenewed_lease_expires_and_its_snapshot_is_cleaned_but_a_renewed_one_is_kept(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory({**SNAPSHOT_CONFIG, "kv.snapshot.num-retained": "1"})
    path = TablePath("fluss", unique_name("expiry"))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        table = await create_pk_table(connection, path, buckets=2)
        table_id = table.table_info.table_id
        await write_round(table, range(100), "r0")
        first = await wait_for_snapshot_ids(admin, path, 0)
        ids = {b: s.snapshot_id for b, s in first.snapshots.items()}
        expiring = admin.create_kv_snapshot_lease(unique_name("expiring"), 2000)
        renewed = admin.create_kv_snapshot_lease(unique_name("renewed"), 2000)
        await expiring.acquire_snapshots({table.bucket(0): ids[0]})
        await renewed.acquire_snapshots({table.bucket(1): ids[1]})
        await write_round(table, range(100), "r1")
        await wait_for_snapshot_ids(admin, path, max(ids.values()) + 1)

        async def renew_for(seconds: float) -> None:
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            while loop.time() < end:
                await renewed.renew()
                await asyncio.sleep(0.3)

        await renew_for(3.5)
        leases = {lease.lease_id for lease in await admin.list_kv_snapshot_leases()}
        assert expiring.lease_id not in leases
        assert renewed.lease_id in leases
        await wait_until(
            lambda: f"snap-{ids[0]}" not in snapshot_dirs(server.data_dir, path, table_id, 0),
            "the expired lease's snapshot to be cleaned",
        )
        assert f"snap-{ids[1]}" in snapshot_dirs(server.data_dir, path, table_id, 1)
        metadata = await admin.get_kv_snapshot_metadata(table.bucket(1), ids[1])
        assert metadata.files


async def test_leases_survive_a_server_restart(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SNAPSHOT_CONFIG)
    path = TablePath("fluss", unique_name("restart"))
    lease_id = unique_name("durable")
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        table = await create_pk_table(connection, path, buckets=2)
        await write_round(table, range(100), "r0")
        latest = await wait_for_snapshot_ids(admin, path, 0)
        lease = admin.create_kv_snapshot_lease(lease_id, 600_000)
        await lease.acquire_snapshots({latest.table_bucket(b): s.snapshot_id for b, s in latest.snapshots.items()})
        [before] = await admin.list_kv_snapshot_leases(lease_id)
    assert server.stop() == 0
    server.start()
    async with await Connection.create(server.address) as connection:
        [after] = await connection.get_admin().list_kv_snapshot_leases(lease_id)
    assert after == before


async def test_concurrent_clients_acquiring_renewing_and_dropping_leave_no_lease_and_intact_data(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SNAPSHOT_CONFIG)
    path = TablePath("fluss", unique_name("concurrent"))
    async with await Connection.create(server.address) as setup:
        admin = setup.get_admin()
        table = await create_pk_table(setup, path, buckets=4)
        await write_round(table, range(400), "r0")
        latest = await wait_for_snapshot_ids(admin, path, 0)
    pins = {latest.table_bucket(b): s.snapshot_id for b, s in latest.snapshots.items()}

    async def client(index: int) -> None:
        async with await Connection.create(server.address) as connection:
            lease = connection.get_admin().create_kv_snapshot_lease(f"{path.table_name}-{index}", 60_000)
            assert (await lease.acquire_snapshots(pins)).unavailable_snapshots == {}
            for _ in range(3):
                await lease.renew()
            await lease.drop()

    await asyncio.gather(*(client(i) for i in range(5)))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        assert [lease for lease in await admin.list_kv_snapshot_leases() if lease.lease_id.startswith(path.table_name)] == []
        table = await connection.get_table(path)
        rows = await (await table.new_scan().create_batch_scanner()).to_arrow()
        assert sorted(rows.column("id").to_pylist()) == list(range(400))
        for bucket, snapshot_id in pins.items():
            assert (await admin.get_kv_snapshot_metadata(bucket, snapshot_id)).files


async def test_acquiring_or_releasing_on_a_log_table_fails_with_non_primary_key_table(server) -> None:  # type: ignore[no-untyped-def]
    path = TablePath("fluss", unique_name("logtable"))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        schema = Schema.from_arrow(pa.schema([("id", pa.int64())]))
        await admin.create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        lease = admin.create_kv_snapshot_lease(unique_name("log"), 1000)
        with pytest.raises(NonPrimaryKeyTableError):
            await lease.acquire_snapshots({table.bucket(0): 0})
        with pytest.raises(NonPrimaryKeyTableError):
            await lease.release_snapshots([table.bucket(0)])
        with pytest.raises(UnknownTableOrBucketError):
            await lease.acquire_snapshots({TableBucket(987654, 0): 0})
        with pytest.raises(NonPrimaryKeyTableError):
            await admin.get_latest_kv_snapshots(path)


async def test_dropping_a_table_removes_its_pins_from_every_lease(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SNAPSHOT_CONFIG)
    dropped = TablePath("fluss", unique_name("dropped"))
    kept = TablePath("fluss", unique_name("kept"))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        tables = [await create_pk_table(connection, path, buckets=1) for path in (dropped, kept)]
        for table in tables:
            await write_round(table, range(20), "r0")
        snapshots = [await wait_for_snapshot_ids(admin, path, 0) for path in (dropped, kept)]
        lease = admin.create_kv_snapshot_lease(unique_name("two-tables"), 60_000)
        await lease.acquire_snapshots({s.table_bucket(0): s.snapshots[0].snapshot_id for s in snapshots})
        await admin.drop_table(dropped)
        [info] = await admin.list_kv_snapshot_leases(lease.lease_id)
        assert set(info.snapshots) == {snapshots[1].table_bucket(0)}
        await lease.release_snapshots([snapshots[0].table_bucket(0)])  # releasing a dropped table's bucket is a no-op
        [info] = await admin.list_kv_snapshot_leases(lease.lease_id)
        assert set(info.snapshots) == {snapshots[1].table_bucket(0)}


async def test_lease_and_snapshot_cli_show_what_the_server_holds(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SNAPSHOT_CONFIG)
    path = TablePath("fluss", unique_name("cli"))
    lease_id = unique_name("cli-lease")
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        table = await create_pk_table(connection, path, buckets=2)
        await write_round(table, range(40), "r0")
        latest = await wait_for_snapshot_ids(admin, path, 0)
        await admin.create_kv_snapshot_lease(lease_id, 60_000).acquire_snapshots(
            {latest.table_bucket(b): s.snapshot_id for b, s in latest.snapshots.items()}
        )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "strom.cli.main", *args, "-b", server.address],
            capture_output=True, text=True, timeout=60,
        )

    listed = json.loads(cli("lease", "list", "--json").stdout)
    assert [lease["lease_id"] for lease in listed] == [lease_id]
    shown = json.loads(cli("lease", "show", lease_id, "--json").stdout)
    assert sorted(s["bucket"] for s in shown["snapshots"]) == [0, 1]
    human = cli("lease", "list")
    assert lease_id in human.stdout and human.returncode == 0
    snapshots = json.loads(cli("snapshot", "list", str(path), "--json").stdout)
    assert {(s["bucket"], s["snapshot_id"]) for s in snapshots["snapshots"]} >= {
        (b, s.snapshot_id) for b, s in latest.snapshots.items()
    }
    assert cli("lease", "drop", lease_id).returncode == 0
    assert json.loads(cli("lease", "list", "--json").stdout) == []
    missing = cli("snapshot", "list", "fluss.no_such_table")
    assert missing.returncode == 1 and "TableNotExistError" in missing.stderr and "Traceback" not in missing.stderr
