"""Auto-increment columns through a real server with the official client (pyfluss): the server fills the column
of each newly inserted key with a table-wide unique id, keeps it on updates, gives a re-inserted key a new
one, refuses writes that would set it, and never hands out an id twice, across buckets and a kill -9."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.errors import InvalidTargetColumnError, StromError
from strom.records import kv_batch
from strom.records.compacted import CompactedKeyEncoder, CompactedRowEncoder
from strom.records.types import BigIntType, DataField, RowType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.pyfluss_support import DATABASE, change_types, changelog
from tests.integration.snapshot_support import SNAPSHOT_CONFIG, wait_for_snapshot_ids, wait_until
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(90)

FIELDS = [pa.field("user_id", pa.string()), pa.field("uid", pa.int64()), pa.field("name", pa.string())]
WRITTEN = ["user_id", "name"]
ROW_TYPE = RowType((DataField("user_id", StringType(nullable=False)), DataField("uid", BigIntType()),
                    DataField("name", StringType())))


async def create(connection: Any, *, column: str = "uid", fields: list[pa.Field] = FIELDS,
                 primary_keys: list[str] | None = None, **descriptor: Any) -> tuple[Any, Any]:
    path = pyfluss.TablePath(DATABASE, unique_name("autoinc"))
    schema = pyfluss.Schema(pa.schema(fields), primary_keys=primary_keys or ["user_id"], auto_increment_column=column)
    await connection.get_admin().create_table(path, pyfluss.TableDescriptor(schema, **descriptor))
    return path, await connection.get_table(path)


async def insert(table: Any, rows: list[dict[str, Any]]) -> None:
    writer = table.new_upsert().partial_update_by_name(WRITTEN).create_writer()
    for row in rows:
        writer.upsert(row)
    await writer.flush()


async def uids(table: Any, users: list[str]) -> dict[str, int | None]:
    lookuper = table.new_lookup().create_lookuper()
    found = {}
    for user in users:
        row = await lookuper.lookup({"user_id": user})
        found[user] = None if row is None else row["uid"]
    return found


@pytest.mark.asyncio
async def test_new_keys_get_unique_ids_that_updates_keep_and_reinserts_renew(fluss: Any) -> None:
    _path, table = await create(fluss, bucket_count=2, properties={"table.auto-increment.cache-size": "4"})
    users = [f"user{i}" for i in range(10)]
    await insert(table, [{"user_id": u, "name": f"n-{u}"} for u in users])

    first = await uids(table, users)
    assert all(isinstance(value, int) and value > 0 for value in first.values()), first
    assert len(set(first.values())) == len(users), f"ids repeat: {first}"

    await insert(table, [{"user_id": "user1", "name": "renamed"}])
    assert (await uids(table, ["user1"]))["user1"] == first["user1"], "an update keeps the key's id"
    deleter = table.new_upsert().partial_update_by_name(WRITTEN).create_writer()  # pyfluss has no other writer here
    deleter.delete({"user_id": "user2"})
    await deleter.flush()
    assert await uids(table, ["user2"]) == {"user2": None}, "the delete removed the row, its id with it"
    await insert(table, [{"user_id": "user2", "name": "back"}])
    again = (await uids(table, ["user2"]))["user2"]
    assert again is not None and again not in first.values(), "a re-inserted key gets a new id"


@pytest.mark.asyncio
async def test_the_changelog_carries_the_assigned_ids(fluss: Any) -> None:
    _path, table = await create(fluss, bucket_count=1)
    await insert(table, [{"user_id": "a", "name": "x"}, {"user_id": "b", "name": "y"}])
    await insert(table, [{"user_id": "a", "name": "z"}])

    records = await changelog(table, 4)

    assert change_types(records) == ["+I", "+I", "-U", "+U"]
    ids = [record.row["uid"] for record in records]
    assert ids[0] != ids[1] and ids[2] == ids[3] == ids[0], ids


@pytest.mark.asyncio
async def test_writes_that_would_set_the_column_are_refused_by_the_server(fluss: Any, server: ServerProcess) -> None:
    path, table = await create(fluss, bucket_count=1)
    table_id = table.get_table_info().table_id
    with pytest.raises(Exception, match="auto increment column uid"):  # pyfluss refuses before sending
        table.new_upsert().create_writer()
    key = CompactedKeyEncoder(ROW_TYPE, [0]).encode(("a", 5, "x"))
    value = CompactedRowEncoder(ROW_TYPE).encode(("a", 5, "x"))
    records = kv_batch.build_kv_batch(1, [key], [value])
    host, _, port = server.address.rpartition(":")
    rpc = await RpcConnection.connect(host, int(port))
    try:
        for targets, message in [
            ([], "auto-increment column \\[uid\\], but update target columns are not explicitly specified"),
            ([0, 1], "Auto-increment column \\[uid\\] at index 1 must not be included in target columns"),
        ]:
            request = pb.PutKvRequest(acks=-1, table_id=table_id, timeout_ms=30_000, target_columns=targets)
            request.buckets_req.add(bucket_id=0, records=records)
            response = await rpc.request(ApiKey.PUT_KV, request)
            (bucket,) = response.buckets_resp
            assert bucket.error_code == InvalidTargetColumnError.code, bucket
            assert re.search(message, bucket.error_message), bucket.error_message
    finally:
        await rpc.close()
    assert await uids(table, ["a"]) == {"a": None}, "a refused write stores nothing"
    async with await Connection.create(server.address) as strom:  # strom's client writes around the column
        writer = (await strom.get_table(TablePath.parse(str(path)))).new_upsert().create_writer()
        await writer.upsert_arrow_batch(pa.table({"user_id": ["a"], "name": ["x"]})).wait()
    assert (await uids(table, ["a"]))["a"] == 1


@pytest.mark.parametrize(
    ("auto_increment", "properties", "message"),
    [
        (["user_id"], {}, "auto-increment column 'user_id' must be a non-key column of a PK table"),
        (["name"], {}, "auto-increment column 'name' must be INT or BIGINT"),
        (["uid", "seq"], {}, "multiple auto-increment columns"),
        (["uid"], {"table.auto-increment.cache-size": "0"}, "'table.auto-increment.cache-size' must be a positive"),
    ],
)
@pytest.mark.asyncio
async def test_invalid_auto_increment_definitions_are_refused_by_the_server(
    server: ServerProcess, auto_increment: list[str], properties: dict[str, str], message: str
) -> None:
    """pyfluss and strom's client check most of this before sending; the server checks it for any client."""
    columns = [*FIELDS, pa.field("seq", pa.int64())]
    document = json.loads(TableDescriptor(Schema.from_arrow(pa.schema(columns), ["user_id"]), bucket_count=1).to_json())
    document["schema"]["auto_increment_column"] = auto_increment
    document["properties"] = properties
    host, _, port = server.address.rpartition(":")
    rpc = await RpcConnection.connect(host, int(port))
    try:
        path = pb.PbTablePath(database_name=DATABASE, table_name=unique_name("autoinc"))
        request = pb.CreateTableRequest(table_path=path, table_json=json.dumps(document).encode(), ignore_if_exists=False)
        with pytest.raises(StromError, match=message):
            await rpc.request(ApiKey.CREATE_TABLE, request)
    finally:
        await rpc.close()


@pytest.mark.asyncio
async def test_ids_stay_unique_across_a_crash_and_restart(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_factory(data_dir=data_dir)
    connection = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": first.address}))
    before = [f"old{i}" for i in range(6)]
    try:
        path, table = await create(connection, bucket_count=2, properties={"table.auto-increment.cache-size": "100"})
        await insert(table, [{"user_id": u, "name": u} for u in before])
        assigned = await uids(table, before)
    finally:
        await connection.close()
    first.kill()

    second = server_factory(data_dir=data_dir, port=first.port)
    connection = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": second.address}))
    try:
        table = await connection.get_table(path)
        assert await uids(table, before) == assigned, "replay restores the ids the changelog carries"
        after = [f"new{i}" for i in range(6)]
        await insert(table, [{"user_id": u, "name": u} for u in after])
        fresh = await uids(table, after)
    finally:
        await connection.close()
    every = list(assigned.values()) + list(fresh.values())
    assert len(set(every)) == len(every), f"an id was handed out twice: {assigned} then {fresh}"
    assert min(fresh.values()) > max(assigned.values()), "the restarted buckets reserved new segments"  # type: ignore[type-var]


@pytest.mark.asyncio
async def test_a_lookup_inserts_missing_keys_and_answers_their_new_ids(server: ServerProcess) -> None:
    """Fluss's dictionary table: the first lookup of a key inserts it and returns its id; later and
    concurrent lookups of the same key return the same row."""
    async with await Connection.create(server.address) as connection:
        path = TablePath(DATABASE, unique_name("dictionary"))
        schema = Schema.from_arrow(pa.schema(FIELDS), ["user_id"])
        schema = Schema(schema.columns, schema.primary_key, auto_increment_columns=("uid",))
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        writer.upsert({"user_id": "known", "name": "k"})
        await writer.flush()
        inserting = table.new_lookup().insert_if_not_exists().create_lookuper()

        first = await inserting.lookup_many([{"user_id": "known"}, {"user_id": "new1"}, {"user_id": "new2"}])
        racing = await asyncio.gather(*(inserting.lookup({"user_id": "new3"}) for _ in range(4)))
        again = await table.new_lookup().create_lookuper().lookup_many([{"user_id": u} for u in ("new1", "new3")])

    assert [row["user_id"] for row in first] == ["known", "new1", "new2"]  # type: ignore[index]
    assert first[0]["name"] == "k" and first[1]["name"] is None  # type: ignore[index]
    assert len({row["uid"] for row in first}) == 3  # type: ignore[index]
    assert len({row["uid"] for row in racing}) == 1, f"concurrent lookups of one key saw different ids: {racing}"  # type: ignore[index]
    assert again == [first[1], racing[0]]


@pytest.mark.asyncio
async def test_a_lookup_cannot_insert_rows_that_keys_alone_cannot_make(server: ServerProcess) -> None:
    fields = [pa.field("user_id", pa.string()), pa.field("label", pa.string(), nullable=False)]
    async with await Connection.create(server.address) as connection:
        path = TablePath(DATABASE, unique_name("dictionary"))
        schema = Schema.from_arrow(pa.schema(fields), ["user_id"])
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        with pytest.raises(StromError, match="\\['label'\\] are NOT NULL"):
            await table.new_lookup().insert_if_not_exists().create_lookuper().lookup({"user_id": "x"})
        assert await table.new_lookup().create_lookuper().lookup({"user_id": "x"}) is None


@pytest.mark.asyncio
async def test_a_bucket_restored_from_a_kv_snapshot_keeps_its_ids_and_hands_out_new_ones(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory({**SNAPSHOT_CONFIG, "log.segment.file-size": "4kb", "log.retention.check-interval": "200ms"})
    path = TablePath(DATABASE, unique_name("autoinc_restore"))
    schema = Schema.from_arrow(pa.schema(FIELDS), ["user_id"])
    schema = Schema(schema.columns, schema.primary_key, auto_increment_columns=("uid",))
    descriptor = TableDescriptor(schema, bucket_count=1, properties={"table.log.ttl": "1ms"})
    users = [f"u{i}" for i in range(300)]
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        await admin.create_table(path, descriptor)
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        for round_ in range(4):  # inserts, then updates that keep the ids: enough log to roll segments
            await writer.upsert_batch(pa.table({"user_id": users, "name": [f"r{round_}"] * len(users)}))
        await wait_for_snapshot_ids(admin, path, 0)

        async def log_trimmed() -> bool:
            return (await admin.list_offsets(path, [0], OffsetSpec.earliest()))[0] > 0

        await wait_until(log_trimmed, "retention to trim the changelog below the snapshot")
        before = await (await table.new_scan().create_batch_scanner()).to_arrow()
    assert server.stop() == 0
    [kv_dir] = server.data_dir.glob(f"tablets/fluss/{path.table_name}-*/0/kv")
    shutil.rmtree(kv_dir)
    server.start()
    async with await Connection.create(server.address) as connection:
        table = await connection.get_table(path)
        restored = await (await table.new_scan().create_batch_scanner()).to_arrow()
        writer = table.new_upsert().create_writer()
        await writer.upsert_batch(pa.table({"user_id": ["late1", "late2"], "name": ["x", "y"]}))
        late = await table.new_lookup().create_lookuper().lookup_many([{"user_id": "late1"}, {"user_id": "late2"}])
    ids = dict(zip(before.column("user_id").to_pylist(), before.column("uid").to_pylist(), strict=True))
    assert dict(zip(restored.column("user_id").to_pylist(), restored.column("uid").to_pylist(), strict=True)) == ids
    assert "restoring RocksDB from snapshot" in server.log_text()
    new_ids = [row["uid"] for row in late]  # type: ignore[index]
    assert len(set(new_ids)) == 2 and not set(new_ids) & set(ids.values()), (new_ids, sorted(ids.values())[-3:])
