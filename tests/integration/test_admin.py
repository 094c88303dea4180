"""The catalog through the official client's admin API: databases, tables, their metadata, server nodes, and
the Fluss error code each failure carries."""

from __future__ import annotations

import time
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from tests.conftest import unique_name
from tests.integration.pyfluss_support import create_table
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

DATABASE_NOT_EXIST = 4
DATABASE_NOT_EMPTY = 5
DATABASE_ALREADY_EXIST = 6
TABLE_NOT_EXIST = 7
TABLE_ALREADY_EXIST = 8
INVALID_TABLE = 15
INVALID_DATABASE = 16
TABLE_NOT_PARTITIONED = 37

USER_FIELDS = [
    pa.field("id", pa.int32()),
    pa.field("name", pa.string()),
    pa.field("age", pa.int64()),
]


async def raises_code(code: int, call: Any) -> pyfluss.FlussError:
    """Await ``call`` and check that it fails with Fluss error ``code``."""
    with pytest.raises(pyfluss.FlussError) as failure:
        await call
    assert failure.value.error_code == code, str(failure.value)
    return failure.value


@pytest.mark.asyncio
async def test_create_database_stores_its_descriptor_and_times(fluss: Any) -> None:
    admin = fluss.get_admin()
    name = unique_name("db")
    before_ms = int(time.time() * 1000)
    assert not await admin.database_exists(name)

    descriptor = pyfluss.DatabaseDescriptor(comment="for tests", custom_properties={"owner": "qa", "tier": "1"})
    await admin.create_database(name, descriptor, ignore_if_exists=False)

    assert await admin.database_exists(name)
    assert name in await admin.list_databases()
    info = await admin.get_database_info(name)
    assert info.database_name == name
    assert info.get_database_descriptor().comment == "for tests"
    assert info.get_database_descriptor().get_custom_properties() == {"owner": "qa", "tier": "1"}
    assert before_ms <= info.created_time <= int(time.time() * 1000)
    assert info.modified_time == info.created_time


@pytest.mark.asyncio
async def test_a_database_created_without_descriptor_has_no_comment_and_no_properties(fluss: Any) -> None:
    admin = fluss.get_admin()
    name = unique_name("db")
    await admin.create_database(name)

    descriptor = (await admin.get_database_info(name)).get_database_descriptor()
    assert descriptor.comment is None
    assert descriptor.get_custom_properties() == {}


@pytest.mark.asyncio
async def test_the_default_database_exists_from_startup(fluss: Any) -> None:
    admin = fluss.get_admin()
    assert await admin.database_exists("fluss")
    assert "fluss" in await admin.list_databases()


@pytest.mark.asyncio
async def test_creating_an_existing_database_fails_with_code_6_unless_ignored(fluss: Any) -> None:
    admin = fluss.get_admin()
    name = unique_name("db")
    await admin.create_database(name, pyfluss.DatabaseDescriptor(comment="first"))

    await raises_code(DATABASE_ALREADY_EXIST, admin.create_database(name, ignore_if_exists=False))
    await admin.create_database(name, pyfluss.DatabaseDescriptor(comment="second"), ignore_if_exists=True)

    assert (await admin.get_database_info(name)).get_database_descriptor().comment == "first"


@pytest.mark.asyncio
async def test_operations_on_a_missing_database_fail_with_code_4(fluss: Any) -> None:
    admin = fluss.get_admin()
    name = unique_name("missing_db")

    await raises_code(DATABASE_NOT_EXIST, admin.get_database_info(name))
    await raises_code(DATABASE_NOT_EXIST, admin.list_tables(name))
    await raises_code(DATABASE_NOT_EXIST, admin.drop_database(name, ignore_if_not_exists=False))
    await admin.drop_database(name, ignore_if_not_exists=True)
    schema = pyfluss.Schema(pa.schema(USER_FIELDS))
    await raises_code(
        DATABASE_NOT_EXIST, admin.create_table(pyfluss.TablePath(name, "t"), pyfluss.TableDescriptor(schema))
    )
    assert not await admin.database_exists(name)


@pytest.mark.asyncio
async def test_dropping_a_non_empty_database_without_cascade_fails_with_code_5_and_keeps_it(fluss: Any) -> None:
    admin = fluss.get_admin()
    name = unique_name("db")
    await admin.create_database(name)
    path, _ = await create_table(fluss, USER_FIELDS, database=name)

    await raises_code(DATABASE_NOT_EMPTY, admin.drop_database(name, ignore_if_not_exists=False, cascade=False))

    assert await admin.database_exists(name)
    assert await admin.table_exists(path)


@pytest.mark.asyncio
async def test_dropping_a_database_with_cascade_drops_its_tables(fluss: Any) -> None:
    admin = fluss.get_admin()
    name = unique_name("db")
    await admin.create_database(name)
    log_path, _ = await create_table(fluss, USER_FIELDS, database=name)
    kv_path, kv_table = await create_table(fluss, USER_FIELDS, database=name, primary_keys=["id"])
    partitioned_path, _ = await create_table(fluss, USER_FIELDS, database=name, partition_keys=["name"])
    await admin.create_partition(partitioned_path, {"name": "p1"})
    await kv_table.new_upsert().create_writer().upsert({"id": 1, "name": "x", "age": 1}).wait()

    await admin.drop_database(name, ignore_if_not_exists=False, cascade=True)

    assert not await admin.database_exists(name)
    assert name not in await admin.list_databases()
    for path in (log_path, kv_path, partitioned_path):
        assert not await admin.table_exists(path)
    # A database of the same name starts out empty, and so do tables of the same names.
    await admin.create_database(name)
    assert await admin.list_tables(name) == []
    schema = pyfluss.Schema(pa.schema(USER_FIELDS), primary_keys=["id"])
    await admin.create_table(kv_path, pyfluss.TableDescriptor(schema))
    assert await admin.list_offsets(kv_path, [0], pyfluss.OffsetSpec.latest()) == {0: 0}
    await admin.create_table(partitioned_path, pyfluss.TableDescriptor(
        pyfluss.Schema(pa.schema(USER_FIELDS)), partition_keys=["name"]
    ))
    assert await admin.list_partition_infos(partitioned_path) == []


@pytest.mark.asyncio
async def test_an_empty_database_can_be_dropped_without_cascade(fluss: Any) -> None:
    admin = fluss.get_admin()
    name = unique_name("db")
    await admin.create_database(name)

    await admin.drop_database(name, ignore_if_not_exists=False, cascade=False)

    assert not await admin.database_exists(name)


@pytest.mark.asyncio
async def test_list_tables_names_exactly_the_tables_of_the_database(fluss: Any) -> None:
    admin = fluss.get_admin()
    name = unique_name("db")
    await admin.create_database(name)
    assert await admin.list_tables(name) == []

    first, _ = await create_table(fluss, USER_FIELDS, database=name)
    second, _ = await create_table(fluss, USER_FIELDS, database=name, primary_keys=["id"])
    assert sorted(await admin.list_tables(name)) == sorted([first.table_name, second.table_name])

    await admin.drop_table(first)
    assert await admin.list_tables(name) == [second.table_name]


@pytest.mark.asyncio
async def test_get_table_info_describes_a_primary_key_table(fluss: Any) -> None:
    admin = fluss.get_admin()
    path = pyfluss.TablePath("fluss", unique_name("users"))
    schema = pyfluss.Schema(pa.schema([*USER_FIELDS, pa.field("email", pa.string())]), primary_keys=["id"])
    descriptor = pyfluss.TableDescriptor(
        schema,
        bucket_count=3,
        bucket_keys=["id"],
        comment="users by id",
        log_format="arrow",
        kv_format="indexed",
        properties={"table.replication.factor": "1"},
        custom_properties={"team": "storage"},
    )
    before_ms = int(time.time() * 1000)
    await admin.create_table(path, descriptor, ignore_if_exists=False)

    assert await admin.table_exists(path)
    info = await admin.get_table_info(path)
    assert info.table_path == path
    assert info.table_id >= 0
    assert info.schema_id == 1
    assert before_ms <= info.created_time <= int(time.time() * 1000)
    assert info.modified_time == info.created_time
    assert info.comment == "users by id"
    assert info.has_primary_key()
    assert info.get_primary_keys() == ["id"]
    assert info.get_bucket_keys() == ["id"]
    assert info.num_buckets == 3
    assert not info.is_partitioned()
    assert info.get_partition_keys() == []
    assert info.get_column_names() == ["id", "name", "age", "email"]
    assert info.get_column_count() == 4
    assert info.get_schema().get_column_types() == ["int NOT NULL", "string", "bigint", "string"]
    assert info.get_properties().items() >= {
        "table.replication.factor": "1",
        "table.log.format": "ARROW",
        "table.kv.format": "INDEXED",
    }.items()
    assert info.get_custom_properties() == {"team": "storage"}
    # The connection's table handle sees the same metadata.
    table = await fluss.get_table(path)
    assert table.get_table_info().table_id == info.table_id
    assert table.has_primary_key()


@pytest.mark.asyncio
async def test_a_table_without_bucket_count_gets_the_default_and_pk_tables_bucket_by_their_key(
    fluss: Any,
) -> None:
    admin = fluss.get_admin()
    log_path, _ = await create_table(fluss, USER_FIELDS)
    kv_path, _ = await create_table(fluss, USER_FIELDS, primary_keys=["id", "name"])

    log_info = await admin.get_table_info(log_path)
    kv_info = await admin.get_table_info(kv_path)

    assert log_info.num_buckets == 1
    assert not log_info.has_primary_key()
    assert log_info.get_primary_keys() == []
    assert kv_info.num_buckets == 1
    assert kv_info.get_primary_keys() == ["id", "name"]
    assert kv_info.get_bucket_keys() == ["id", "name"]


@pytest.mark.asyncio
async def test_creating_an_existing_table_fails_with_code_8_and_ignoring_keeps_the_original(fluss: Any) -> None:
    admin = fluss.get_admin()
    path, _ = await create_table(fluss, USER_FIELDS, primary_keys=["id"], comment="original")
    original = await admin.get_table_info(path)
    other = pyfluss.TableDescriptor(pyfluss.Schema(pa.schema([pa.field("x", pa.int8())])), comment="other")

    await raises_code(TABLE_ALREADY_EXIST, admin.create_table(path, other, ignore_if_exists=False))
    await admin.create_table(path, other, ignore_if_exists=True)

    after = await admin.get_table_info(path)
    assert after.table_id == original.table_id
    assert after.comment == "original"
    assert after.get_column_names() == ["id", "name", "age"]


@pytest.mark.asyncio
async def test_operations_on_a_missing_table_fail_with_code_7(fluss: Any) -> None:
    admin = fluss.get_admin()
    path = pyfluss.TablePath("fluss", unique_name("missing"))

    await raises_code(TABLE_NOT_EXIST, admin.get_table_info(path))
    await raises_code(TABLE_NOT_EXIST, admin.drop_table(path, ignore_if_not_exists=False))
    await admin.drop_table(path, ignore_if_not_exists=True)
    assert not await admin.table_exists(path)
    with pytest.raises(pyfluss.FlussError) as failure:
        await fluss.get_table(path)
    assert failure.value.error_code == TABLE_NOT_EXIST


@pytest.mark.asyncio
async def test_a_dropped_table_is_gone_and_its_name_can_be_reused_for_an_empty_table(fluss: Any) -> None:
    admin = fluss.get_admin()
    path, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"])
    await table.new_upsert().create_writer().upsert({"id": 1, "name": "old", "age": 1}).wait()
    old_id = table.get_table_info().table_id

    await admin.drop_table(path, ignore_if_not_exists=False)
    assert not await admin.table_exists(path)
    await raises_code(TABLE_NOT_EXIST, admin.get_table_info(path))

    schema = pyfluss.Schema(pa.schema(USER_FIELDS), primary_keys=["id"])
    await admin.create_table(path, pyfluss.TableDescriptor(schema))
    recreated = await fluss.get_table(path)
    assert recreated.get_table_info().table_id != old_id
    assert await recreated.new_lookup().create_lookuper().lookup({"id": 1}) is None
    latest = await admin.list_offsets(path, [0], pyfluss.OffsetSpec.latest())
    assert latest == {0: 0}


@pytest.mark.asyncio
async def test_partition_operations_on_a_non_partitioned_table_fail_with_code_37(fluss: Any) -> None:
    admin = fluss.get_admin()
    path, _ = await create_table(fluss, USER_FIELDS)

    await raises_code(TABLE_NOT_PARTITIONED, admin.list_partition_infos(path))
    await raises_code(TABLE_NOT_PARTITIONED, admin.create_partition(path, {"name": "x"}))
    await raises_code(TABLE_NOT_PARTITIONED, admin.drop_partition(path, {"name": "x"}))


@pytest.mark.asyncio
async def test_get_server_nodes_lists_the_coordinator_and_a_tablet_server_at_the_server_address(
    server: ServerProcess, fluss: Any
) -> None:
    nodes = await fluss.get_admin().get_server_nodes()

    assert sorted(node.server_type for node in nodes) == ["CoordinatorServer", "TabletServer"]
    for node in nodes:
        assert f"{node.host}:{node.port}" == server.address
        assert node.uid
        assert repr(node).startswith("ServerNode(")


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["has space", "ünicode", "x" * 201, "__reserved"])
async def test_invalid_names_are_rejected_with_codes_15_and_16(fluss: Any, name: str) -> None:
    admin = fluss.get_admin()
    schema = pyfluss.Schema(pa.schema(USER_FIELDS))

    await raises_code(INVALID_TABLE, admin.create_table(pyfluss.TablePath("fluss", name), pyfluss.TableDescriptor(schema)))
    await raises_code(INVALID_DATABASE, admin.create_database(name))
    assert not await admin.database_exists(name)


@pytest.mark.asyncio
async def test_an_invalid_table_descriptor_is_rejected_with_code_15(fluss: Any) -> None:
    admin = fluss.get_admin()
    schema = pyfluss.Schema(pa.schema(USER_FIELDS), primary_keys=["id"])
    for descriptor in (
        pyfluss.TableDescriptor(schema, bucket_count=0),
        pyfluss.TableDescriptor(schema, partition_keys=["name"]),
        pyfluss.TableDescriptor(pyfluss.Schema(pa.schema(USER_FIELDS)), bucket_keys=["missing"]),
    ):
        path = pyfluss.TablePath("fluss", unique_name("bad"))
        await raises_code(INVALID_TABLE, admin.create_table(path, descriptor))
        assert not await admin.table_exists(path)
