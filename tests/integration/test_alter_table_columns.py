"""ALTER TABLE ... ADD COLUMN through a real server: the table gets a new schema id, rows written before read
with nulls in the new columns (lookups, scans, the changelog, KV snapshots), writers that still hold the old
schema keep working, and all of it survives a restart; strom's client and pyfluss both read it."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Column, Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.client.admin import read_snapshot
from strom.errors import InvalidAlterTableError, SchemaNotExistError
from strom.records.log_batch import ChangeType
from strom.records.types import IntType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.pyfluss_support import changelog as pyfluss_changelog
from tests.integration.snapshot_support import SNAPSHOT_CONFIG, wait_for_snapshot_ids, wait_until
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.timeout(90)]

BASE = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


async def create(connection: Connection, *, primary_key: bool = True, **properties: str) -> TablePath:
    path = TablePath("fluss", unique_name("alter"))
    schema = Schema.from_arrow(BASE, primary_key=["id"] if primary_key else None)
    await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2, properties=properties))
    return path


async def upsert(connection: Connection, path: TablePath, rows: dict[str, list[Any]]) -> None:
    table = await connection.get_table(path)
    writer = table.new_upsert().create_writer()
    writer.upsert_arrow_batch(pa.table(rows))
    await writer.flush()


async def scan_sorted(connection: Connection, path: TablePath) -> list[dict[str, Any]]:
    table = await connection.get_table(path)
    rows = await (await table.new_scan().create_batch_scanner()).to_arrow()
    return sorted(rows.to_pylist(), key=lambda row: row["id"])


async def changelog(connection: Connection, path: TablePath) -> list[tuple[int, dict[str, Any]]]:
    table = await connection.get_table(path)
    buckets = range(table.layout.bucket_count)
    ends = await connection.get_admin().list_offsets(path, list(buckets), OffsetSpec.latest())
    changes: list[tuple[int, dict[str, Any]]] = []
    scanner = table.new_scan().create_log_scanner()
    for bucket in buckets:
        async for change in scanner.read_range(table.bucket(bucket), 0, ends[bucket]):
            types = change.change_types or bytes(change.batch.num_rows)
            changes += zip(types, change.batch.to_pylist(), strict=True)
    return changes


@pytest.mark.asyncio
async def test_added_columns_read_as_null_in_earlier_rows_and_take_new_writes(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        path = await create(connection)
        await upsert(connection, path, {"id": [1, 2, 3], "name": ["a", "b", "c"]})
        before = await connection.get_admin().get_table_info(path)

        await connection.get_admin().alter_table(
            path, add_columns=[Column("email", StringType(), "contact"), Column("age", IntType())]
        )
        after = await connection.get_admin().get_table_info(path)
        assert (before.schema_id, after.schema_id) == (1, 2)
        assert after.schema.column_names == ["id", "name", "email", "age"]
        assert [c.column_id for c in after.schema.columns] == [0, 1, 2, 3]
        assert after.schema.columns[2].comment == "contact"

        assert await scan_sorted(connection, path) == [
            {"id": i, "name": n, "email": None, "age": None} for i, n in [(1, "a"), (2, "b"), (3, "c")]
        ]
        await upsert(connection, path, {"id": [2, 4], "name": ["b2", "d"], "email": ["b@x", None], "age": [20, 40]})
        table = await connection.get_table(path)
        found = await table.new_lookup().create_lookuper().lookup_arrow(pa.table({"id": [1, 2, 4, 5]}))  # found rows only
        assert found.to_pylist() == [
            {"id": 1, "name": "a", "email": None, "age": None},
            {"id": 2, "name": "b2", "email": "b@x", "age": 20},
            {"id": 4, "name": "d", "email": None, "age": 40},
        ]
        # the update of key 2 carries its old row, written under schema 1, in the new schema
        changes = await changelog(connection, path)
        assert [(t, r) for t, r in changes if r["id"] == 2] == [
            (ChangeType.INSERT, {"id": 2, "name": "b", "email": None, "age": None}),
            (ChangeType.UPDATE_BEFORE, {"id": 2, "name": "b", "email": None, "age": None}),
            (ChangeType.UPDATE_AFTER, {"id": 2, "name": "b2", "email": "b@x", "age": 20}),
        ]


@pytest.mark.asyncio
async def test_a_writer_with_the_earlier_schema_keeps_writing_and_the_server_fills_the_new_columns(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        path = await create(connection)
        stale = await connection.get_table(path)  # opened before the change: encodes rows of schema 1
        await connection.get_admin().alter_table(path, add_columns=[Column("email", StringType())])
        await upsert(connection, path, {"id": [1], "name": ["new"], "email": ["n@x"]})

        writer = stale.new_upsert().create_writer()
        writer.upsert_arrow_batch(pa.table({"id": [2], "name": ["old"]}))
        await writer.flush()
        partial = stale.new_upsert().partial_update_by_name(["id", "name"]).create_writer()
        partial.upsert_arrow_batch(pa.table({"id": [1], "name": ["renamed"]}))
        await partial.flush()
        assert await scan_sorted(connection, path) == [
            {"id": 1, "name": "renamed", "email": "n@x"},  # a partial update of schema 1 keeps the new column
            {"id": 2, "name": "old", "email": None},
        ]


@pytest.mark.asyncio
async def test_log_tables_serve_earlier_batches_in_the_current_schema(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        path = await create(connection, primary_key=False)
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        writer.append_arrow_batch(pa.table({"id": [1, 2], "name": ["a", "b"]}))
        await writer.flush()
        await connection.get_admin().alter_table(path, add_columns=[Column("score", IntType())])
        writer.append_arrow_batch(pa.table({"id": [3], "name": ["c"]}))  # the stale writer's schema-1 batch
        await writer.flush()
        fresh = (await connection.get_table(path)).new_append().create_writer()
        fresh.append_arrow_batch(pa.table({"id": [4], "name": ["d"], "score": [7]}))
        await fresh.flush()

        rows = sorted((row for _, row in await changelog(connection, path)), key=lambda row: row["id"])
        assert rows == [
            {"id": 1, "name": "a", "score": None},
            {"id": 2, "name": "b", "score": None},
            {"id": 3, "name": "c", "score": None},
            {"id": 4, "name": "d", "score": 7},
        ]


@pytest.mark.asyncio
async def test_pyfluss_reads_and_writes_the_altered_table(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        path = await create(connection)
        await upsert(connection, path, {"id": [1], "name": ["a"]})
        await connection.get_admin().alter_table(path, add_columns=[Column("email", StringType())])

    client = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": server.address}))
    try:
        table = await client.get_table(pyfluss.TablePath(path.database_name, path.table_name))
        writer = table.new_upsert().create_writer()
        writer.upsert({"id": 2, "name": "b", "email": "b@x"})
        await writer.flush()
        lookuper = table.new_lookup().create_lookuper()
        assert await lookuper.lookup({"id": 1}) == {"id": 1, "name": "a", "email": None}
        assert await lookuper.lookup({"id": 2}) == {"id": 2, "name": "b", "email": "b@x"}
        records = await pyfluss_changelog(table, 2, buckets=2)  # the first written under schema 1
        assert sorted((dict(record.row) for record in records), key=lambda row: row["id"]) == [
            {"id": 1, "name": "a", "email": None},
            {"id": 2, "name": "b", "email": "b@x"},
        ]
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_column_changes_fluss_refuses_are_refused_with_its_messages(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        path = await create(connection)
        admin = connection.get_admin()
        with pytest.raises(InvalidAlterTableError, match="Column name already exists"):
            await admin.alter_table(path, add_columns=[Column("name", StringType())])
        with pytest.raises(InvalidAlterTableError, match="Column late must be nullable"):
            await admin.alter_table(path, add_columns=[Column("late", StringType(nullable=False))])
        rpc = await RpcConnection.connect(*server.address.split(":"))
        try:
            for change in ("drop_columns", "rename_columns"):
                request = pb.AlterTableRequest(ignore_if_not_exists=False)
                request.table_path.database_name, request.table_path.table_name = path.database_name, path.table_name
                if change == "drop_columns":
                    request.drop_columns.add(column_name="name")
                else:
                    request.rename_columns.add(old_column_name="name", new_column_name="n")
                with pytest.raises(InvalidAlterTableError, match="Not support"):
                    await rpc.request(ApiKey.ALTER_TABLE, request)
            first = pb.AlterTableRequest(ignore_if_not_exists=False)
            first.table_path.database_name, first.table_path.table_name = path.database_name, path.table_name
            first.add_columns.add(column_name="x", data_type_json=json.dumps({"type": "INTEGER"}).encode(),
                                  column_position_type=1)
            with pytest.raises(InvalidAlterTableError, match="at last"):
                await rpc.request(ApiKey.ALTER_TABLE, first)
            bad = pb.AlterTableRequest(ignore_if_not_exists=False)
            bad.table_path.database_name, bad.table_path.table_name = path.database_name, path.table_name
            bad.add_columns.add(column_name="x", data_type_json=b"{not json", column_position_type=0)
            with pytest.raises(InvalidAlterTableError, match="invalid data type"):
                await rpc.request(ApiKey.ALTER_TABLE, bad)

            schema_request = pb.GetTableSchemaRequest(schema_id=2)
            schema_request.table_path.database_name = path.database_name
            schema_request.table_path.table_name = path.table_name
            with pytest.raises(SchemaNotExistError):
                await rpc.request(ApiKey.GET_TABLE_SCHEMA, schema_request)
        finally:
            await rpc.close()
        info = await admin.get_table_info(path)
        assert (info.schema_id, info.schema.column_names) == (1, ["id", "name"]), "a refused change changes nothing"


@pytest.mark.asyncio
async def test_rows_of_both_schemas_survive_a_kill_and_replay(server_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kill -9 before RocksDB flushed anything: the restart replays changelog batches of schema 1 and 2."""
    first = server_factory(data_dir=tmp_path / "data")
    async with await Connection.create(first.address) as connection:
        path = await create(connection)
        await upsert(connection, path, {"id": [1, 2], "name": ["a", "b"]})
        await connection.get_admin().alter_table(path, add_columns=[Column("email", StringType())])
        await upsert(connection, path, {"id": [2, 3], "name": ["b2", "c"], "email": ["b@x", "c@x"]})
        expected = await scan_sorted(connection, path)
    first.kill()
    second = server_factory(data_dir=tmp_path / "data", port=first.port)
    async with await Connection.create(second.address) as connection:
        assert await scan_sorted(connection, path) == expected == [
            {"id": 1, "name": "a", "email": None},
            {"id": 2, "name": "b2", "email": "b@x"},
            {"id": 3, "name": "c", "email": "c@x"},
        ]
        info = await connection.get_admin().get_table_info(path)
        assert (info.schema_id, info.schema.column_names) == (2, ["id", "name", "email"])


@pytest.mark.asyncio
async def test_kv_snapshots_with_rows_of_both_schemas_read_in_the_current_one(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SNAPSHOT_CONFIG)
    async with await Connection.create(server.address) as connection:
        path = await create(connection)
        admin = connection.get_admin()
        await upsert(connection, path, {"id": [1, 2], "name": ["a", "b"]})
        await admin.alter_table(path, add_columns=[Column("email", StringType())])
        await upsert(connection, path, {"id": [3], "name": ["c"], "email": ["c@x"]})
        table = await connection.get_table(path)
        ids = await wait_for_snapshot_ids(admin, path, 0)
        latest = {bucket: info for bucket, info in ids.snapshots.items() if info is not None}

        async def covered() -> bool:
            snapshots = await admin.get_latest_kv_snapshots(path)
            return sum(s.log_offset for s in snapshots.snapshots.values() if s is not None) >= 3  # three inserts

        await wait_until(covered, "a snapshot of every write")
        snapshots = await admin.get_latest_kv_snapshots(path)
        rows: list[dict[str, Any]] = []
        for bucket, info in snapshots.snapshots.items():
            if info is not None:
                rows += (await read_snapshot(connection, table.layout, table.bucket(bucket), info.snapshot_id)).to_pylist()
        assert latest
        assert sorted(rows, key=lambda row: row["id"]) == [
            {"id": 1, "name": "a", "email": None},
            {"id": 2, "name": "b", "email": None},
            {"id": 3, "name": "c", "email": "c@x"},
        ]


@pytest.mark.asyncio
async def test_a_table_opened_before_the_change_refuses_rows_it_cannot_decode(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        path = await create(connection)
        stale = await connection.get_table(path)
        await connection.get_admin().alter_table(path, add_columns=[Column("email", StringType())])
        await upsert(connection, path, {"id": [1], "name": ["a"], "email": ["a@x"]})
        with pytest.raises(SchemaNotExistError, match="open the table again"):
            await stale.new_lookup().create_lookuper().lookup({"id": 1})
        with pytest.raises(SchemaNotExistError, match="open the table again"):  # a batch: one C pass finds it
            await stale.new_lookup().create_lookuper().lookup_arrow(pa.table({"id": [2, 1]}))
        with stale.new_lookup().create_blocking_lookuper() as blocking, \
                pytest.raises(SchemaNotExistError, match="open the table again"):
            await asyncio.to_thread(blocking.lookup, {"id": 1})
        with pytest.raises(SchemaNotExistError, match="open the table again"):
            await (await stale.new_scan().create_batch_scanner()).to_arrow()
        fresh = await connection.get_table(path)
        assert await fresh.new_lookup().create_lookuper().lookup({"id": 1}) == {"id": 1, "name": "a", "email": "a@x"}


@pytest.mark.asyncio
async def test_an_aggregation_table_gets_a_column_with_its_aggregate(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        path = await create(connection, **{"table.merge-engine": "aggregation"})
        await upsert(connection, path, {"id": [1], "name": ["a"]})
        await connection.get_admin().alter_table(
            path, add_columns=[Column("total", IntType(), agg_function={"type": "sum"})]
        )
        info = await connection.get_admin().get_table_info(path)
        assert info.schema.columns[2].agg_function == {"type": "sum"}
        for amount in (5, 7):
            await upsert(connection, path, {"id": [1], "name": ["a"], "total": pa.array([amount], pa.int32())})
        assert await scan_sorted(connection, path) == [{"id": 1, "name": "a", "total": 12}]


@pytest.mark.asyncio
async def test_a_lake_enabled_table_takes_new_columns_where_its_lake_format_evolves(server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Delta (this server's format), Iceberg and Paimon lake tables gain the column at the next round
    (tests/lake/test_lake_schema_evolution.py, tests/spark/test_tiering.py); Lance refuses it."""
    async with await Connection.create(server.address) as connection:
        path = await create(connection, **{"table.datalake.enabled": "true"})
        await connection.get_admin().alter_table(path, add_columns=[Column("email", StringType())])
        info = await connection.get_admin().get_table_info(path)
        assert [c.name for c in info.schema.columns][-1] == "email"
    lance = ServerProcess(tmp_path / "lance", {"datalake.format": "lance"}).start()
    try:
        async with await Connection.create(lance.address) as connection:
            path = TablePath("fluss", "events")
            await connection.get_admin().create_table(path, TableDescriptor(
                Schema.from_arrow(pa.schema([("id", pa.int64())])), properties={"table.datalake.enabled": "true"}))
            with pytest.raises(InvalidAlterTableError, match="strom evolves Delta, Iceberg and Paimon lake tables only"):
                await connection.get_admin().alter_table(path, add_columns=[Column("email", StringType())])
    finally:
        lance.stop()


def test_the_alter_table_doc_example_runs(server) -> None:  # type: ignore[no-untyped-def]
    """docs/alter-table.md's example, a script as written, against a fresh table and database of this test
    (tests/docs runs it on the README's own tables)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "alter-table.md").read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match
    table, database = unique_name("users"), unique_name("db")
    code = match.group(1).replace("127.0.0.1:9123", server.address).replace('"users"', f'"{table}"')
    code = code.replace('alter_database("fluss"', f'alter_database("{database}"')

    async def prepare() -> None:
        async with await Connection.create(server.address) as connection:
            await connection.get_admin().create_database(database)
            await connection.get_admin().create_table(TablePath("fluss", table),
                                                      TableDescriptor(Schema.from_arrow(BASE, ["id"])))

    async def inspect() -> dict[str, Any]:
        async with await Connection.create(server.address) as connection:
            admin = connection.get_admin()
            info = await admin.get_table_info(TablePath("fluss", table))
            return {
                "columns": info.schema.column_names,
                "ttl": info.properties.get("table.log.ttl"),
                "database": await admin.get_database_info(database),
            }

    asyncio.run(prepare())
    exec(compile(code, "docs/alter-table.md", "exec"), {"__name__": "__main__"})  # it runs its own event loop
    found = asyncio.run(inspect())
    assert found["columns"] == ["id", "name", "email", "visits"]
    assert found["ttl"] == "3d"
    assert "data-team" in str(found["database"]) and "shared tables" in str(found["database"])
