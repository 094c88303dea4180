"""A cluster whose lake format is Iceberg, end to end through a real server: every table carries
``table.datalake.format=iceberg`` from its creation, its rows land in the bucket Iceberg's ``bucket[N]``
transform computes (pyiceberg's, checked independently), lookups find them — after a restart too, when the
server rebuilds RocksDB from the changelog with the same key bytes — and a key Iceberg cannot bucket by is
refused at creation."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg import types as iceberg
from pyiceberg.transforms import BucketTransform

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import InvalidConfigError, InvalidTableError
from strom.records.log_batch import ChangeType
from tests.integration.pyfluss_support import POLL_DEADLINE_S
from tests.server_process import ServerProcess

pytestmark = pytest.mark.asyncio

ICEBERG = {"datalake.format": "iceberg", "kv.snapshot.interval": "0s"}
BUCKETS = 4


async def _changes_by_bucket(table: object, buckets: int, expected_rows: int) -> dict[int, list[int]]:
    """Every id the changelog holds, by bucket."""
    import time

    scanner = table.new_scan().create_log_scanner()  # type: ignore[attr-defined]
    scanner.subscribe_buckets({b: 0 for b in range(buckets)})
    seen: dict[int, list[int]] = {}
    deadline = time.monotonic() + POLL_DEADLINE_S
    count = 0
    while count < expected_rows and time.monotonic() < deadline:
        for batch in await scanner.poll(500):
            inserts = [
                i for i, change in zip(batch.batch.column("id").to_pylist(), batch.change_types or b"", strict=True)
                if change == ChangeType.INSERT
            ]
            seen.setdefault(batch.bucket.bucket, []).extend(inserts)
            count += len(inserts)
    return seen


async def test_an_iceberg_cluster_buckets_keys_as_iceberg_and_finds_them_after_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = ServerProcess(tmp_path / "data", ICEBERG).start()
    path = TablePath("fluss", "iceberg_keyed")
    ids = list(range(-500, 1_500, 7))
    try:
        async with await Connection.create(server.address) as connection:
            schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
            await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=BUCKETS))
            table = await connection.get_table(path)
            assert table.table_info.properties["table.datalake.format"] == "iceberg"
            await table.new_upsert().create_writer().upsert_batch(pa.table({"id": ids, "v": [f"v{i}" for i in ids]}))

            by_bucket = await _changes_by_bucket(table, BUCKETS, len(ids))
            assert sorted(i for bucket_ids in by_bucket.values() for i in bucket_ids) == sorted(ids)
            bucket_of = BucketTransform(BUCKETS).transform(iceberg.LongType())
            for bucket, bucket_ids in by_bucket.items():
                assert {bucket_of(i) for i in bucket_ids} == {bucket}
        server.stop()

        server = ServerProcess(tmp_path / "data", ICEBERG, server.port).start()
        async with await Connection.create(server.address) as connection:
            table = await connection.get_table(path)
            lookuper = table.new_lookup().create_lookuper()
            for key in ids[::10]:
                row = await lookuper.lookup({"id": key})
                assert row is not None and row["v"] == f"v{key}", key
            await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [ids[0]], "v": ["updated"]}))
            assert (await lookuper.lookup({"id": ids[0]}))["v"] == "updated"
            assert [r["v"] for r in await lookuper.lookup_many([{"id": i} for i in ids[:5]])][1:] == [
                f"v{i}" for i in ids[1:5]
            ]
    finally:
        server.stop()


async def test_a_key_iceberg_cannot_bucket_by_is_refused_at_creation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = ServerProcess(tmp_path / "data", ICEBERG).start()
    try:
        async with await Connection.create(server.address) as connection:
            admin = connection.get_admin()
            two_keys = Schema.from_arrow(
                pa.schema([("a", pa.int32()), ("b", pa.string()), ("v", pa.string())]), primary_key=["a", "b"]
            )
            with pytest.raises(InvalidTableError, match="exactly one key column"):
                await admin.create_table(TablePath("fluss", "two_keys"), TableDescriptor(two_keys))
            flag_key = Schema.from_arrow(pa.schema([("flag", pa.bool_()), ("v", pa.string())]), primary_key=["flag"])
            with pytest.raises(InvalidTableError, match="cannot be the key"):
                await admin.create_table(TablePath("fluss", "flag_key"), TableDescriptor(flag_key))
            # a log table without a bucket key needs no key encoding at all
            log_schema = Schema.from_arrow(pa.schema([("a", pa.int32()), ("b", pa.string())]))
            await admin.create_table(TablePath("fluss", "plain_log"), TableDescriptor(log_schema, bucket_count=2))
            log_table = await connection.get_table(TablePath("fluss", "plain_log"))
            await log_table.new_append().create_writer().write_arrow_batch(pa.table({"a": [1, 2], "b": ["x", "y"]}))
    finally:
        server.stop()


async def test_only_tables_created_under_iceberg_can_tier_into_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    older, newer = TablePath("fluss", "created_before"), TablePath("fluss", "created_after")
    server = ServerProcess(tmp_path / "data", {"kv.snapshot.interval": "0s"}).start()  # Delta, Fluss's keys
    try:
        async with await Connection.create(server.address) as connection:
            await connection.get_admin().create_table(older, TableDescriptor(schema))
    finally:
        server.stop()
    server = ServerProcess(tmp_path / "data", ICEBERG, server.port).start()
    try:
        async with await Connection.create(server.address) as connection:
            admin = connection.get_admin()
            with pytest.raises(InvalidConfigError, match="created before the cluster's lake format was iceberg"):
                await admin.alter_table(older, set_properties={"table.datalake.enabled": "true"})
            await admin.create_table(newer, TableDescriptor(schema))
            await admin.alter_table(newer, set_properties={"table.datalake.enabled": "true"})
            await admin.alter_table(newer, set_properties={"table.datalake.enabled": "false"})
            properties = (await connection.get_table(newer)).table_info.properties
            assert properties["table.datalake.format"] == "iceberg"  # its keys stay encoded for Iceberg
            assert "table.datalake.format" not in (await connection.get_table(older)).table_info.properties
    finally:
        server.stop()
