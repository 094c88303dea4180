"""AlterTable and the table options Fluss lets users alter: each can be set and reset and GetTableInfo shows
it, a bad value is refused with the error CreateTable gives for it and changes nothing, other ``table.*``
options are refused (InvalidAlterTableError), and a ``table.log.ttl`` set by AlterTable deletes old log
segments from the next retention check on."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.client.admin import Admin
from strom.errors import InvalidAlterTableError, InvalidConfigError
from strom.records.schema import Column
from strom.records.types import StringType
from tests.conftest import unique_name
from tests.integration.snapshot_support import wait_until

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]

LOG_FIELDS = [pa.field("id", pa.int32()), pa.field("name", pa.string()), pa.field("tags", pa.list_(pa.string()))]
PK_FIELDS = [pa.field("id", pa.int32(), nullable=False), pa.field("name", pa.string())]

SET_ON_A_LOG_TABLE = {
    "table.datalake.enabled": "false",
    "table.datalake.historical-partition.enabled": "false",
    "table.datalake.freshness": "90s",
    "table.datalake.auto-compaction": "true",
    "table.log.ttl": "2 h",
    "table.log.tiered.local-segments": "5",
    "table.log.local-ttl": "30 min",
    "table.auto-partition.enabled": "false",
    "table.auto-partition.num-retention": "3",
    "table.auto-partition.num-precreate": "1",
    "table.statistics.columns": "id,name",
}
SET_ON_A_PK_TABLE = {"table.kv.standby-replica.enabled": "true"}

REFUSED_ON_A_LOG_TABLE = [
    {"table.log.ttl": "7"},
    {"table.log.local-ttl": "soon"},
    {"table.log.tiered.local-segments": "0"},
    {"table.log.ttl": "1 h", "table.log.local-ttl": "1 d"},
    {"table.datalake.enabled": "yes"},
    {"table.datalake.freshness": "-1s"},
    {"table.datalake.auto-compaction": "sometimes"},
    {"table.datalake.historical-partition.enabled": "true"},
    {"table.auto-partition.enabled": "true"},
    {"table.auto-partition.num-retention": "many"},
    {"table.auto-partition.num-precreate": "99999999999"},
    {"table.statistics.columns": "id,missing"},
    {"table.statistics.columns": "tags"},
    {"table.statistics.columns": " , "},
]
REFUSED_ON_A_PK_TABLE = [
    {"table.kv.standby-replica.enabled": "maybe"},
    {"table.statistics.columns": "*"},
]


def log_schema() -> Schema:
    return Schema.from_arrow(pa.schema(LOG_FIELDS))


def pk_schema() -> Schema:
    return Schema.from_arrow(pa.schema(PK_FIELDS), ["id"])


async def new_table(admin: Admin, schema: Schema, **descriptor: Any) -> TablePath:
    path = TablePath("fluss", unique_name("alter_opts"))
    await admin.create_table(path, TableDescriptor(schema, **descriptor))
    return path


@pytest.mark.parametrize(
    ("key", "value", "primary_key"),
    [(key, value, False) for key, value in SET_ON_A_LOG_TABLE.items()]
    + [(key, value, True) for key, value in SET_ON_A_PK_TABLE.items()],
)
async def test_each_alterable_option_is_set_and_reset(server: Any, key: str, value: str, primary_key: bool) -> None:
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await new_table(admin, pk_schema() if primary_key else log_schema())
        created = await admin.get_table_info(path)
        assert key not in created.properties

        await admin.alter_table(path, set_properties={key: value})
        altered = await admin.get_table_info(path)
        assert altered.properties == {**created.properties, key: value}
        assert altered.descriptor.custom_properties == created.descriptor.custom_properties
        assert altered.modified_ms >= created.modified_ms

        await admin.alter_table(path, reset_properties=[key])
        assert (await admin.get_table_info(path)).properties == created.properties


async def test_every_alterable_option_at_once_and_a_table_created_with_them(server: Any) -> None:
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await new_table(admin, log_schema())
        await admin.alter_table(path, set_properties=SET_ON_A_LOG_TABLE)
        altered = (await admin.get_table_info(path)).properties
        assert altered.items() >= SET_ON_A_LOG_TABLE.items()
        # the same values change again, and are what a table may be created with
        await admin.alter_table(path, set_properties={"table.log.ttl": "1 d", "table.statistics.columns": "*"})
        properties = (await admin.get_table_info(path)).properties
        assert properties == {**altered, "table.log.ttl": "1 d", "table.statistics.columns": "*"}
        twin = await new_table(admin, log_schema(), properties=properties)
        assert (await admin.get_table_info(twin)).properties == properties

        await admin.alter_table(path, reset_properties=list(SET_ON_A_LOG_TABLE))
        assert (await admin.get_table_info(path)).properties == {"table.replication.factor": "1"}


async def test_statistics_columns_are_checked_against_the_current_columns(server: Any) -> None:
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await new_table(admin, log_schema())
        with pytest.raises(InvalidConfigError, match="Column 'email' specified in statistics collection does not exist"):
            await admin.alter_table(path, set_properties={"table.statistics.columns": "email"})
        await admin.alter_table(path, add_columns=[Column("email", StringType())])
        await admin.alter_table(path, set_properties={"table.statistics.columns": "name,email"})
        assert (await admin.get_table_info(path)).properties["table.statistics.columns"] == "name,email"


async def creation_error(admin: Admin, schema: Schema, properties: dict[str, str], **descriptor: Any) -> str:
    with pytest.raises(InvalidConfigError) as failure:
        await new_table(admin, schema, properties=properties, **descriptor)
    return str(failure.value)


async def assert_refused_as_at_creation(
    admin: Admin, path: TablePath, schema: Schema, properties: dict[str, str], **descriptor: Any
) -> None:
    before = await admin.get_table_info(path)
    expected = await creation_error(admin, schema, properties, **descriptor)
    # with a valid option and a custom property in the same change: it is refused whole
    valid = "table.datalake.freshness" if "table.datalake.freshness" not in properties else "table.log.tiered.local-segments"
    with pytest.raises(InvalidConfigError) as failure:
        await admin.alter_table(path, set_properties={**properties, valid: SET_ON_A_LOG_TABLE[valid], "owner": "ops"})
    assert str(failure.value) == expected, properties
    after = await admin.get_table_info(path)
    assert (after.table_json, after.modified_ms) == (before.table_json, before.modified_ms), properties


async def test_bad_values_are_refused_with_the_creation_error_and_change_nothing(server: Any) -> None:
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        log_path = await new_table(admin, log_schema())
        for properties in REFUSED_ON_A_LOG_TABLE:
            await assert_refused_as_at_creation(admin, log_path, log_schema(), properties)
        pk_path = await new_table(admin, pk_schema())
        for properties in REFUSED_ON_A_PK_TABLE:
            await assert_refused_as_at_creation(admin, pk_path, pk_schema(), properties)
        partitioned = await new_table(admin, log_schema(), partition_keys=["name"])
        await assert_refused_as_at_creation(
            admin, partitioned, log_schema(),
            {"table.auto-partition.enabled": "true", "table.auto-partition.num-retention": "many"},
            partition_keys=["name"],
        )


async def test_altered_options_are_checked_with_the_stored_ones(server: Any) -> None:
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await new_table(admin, log_schema(), properties={"table.log.ttl": "1 h"})
        with pytest.raises(InvalidConfigError, match=r"'table\.log\.local-ttl' must be less than or equal to 'table\.log\.ttl'"):
            await admin.alter_table(path, set_properties={"table.log.local-ttl": "1 d"})
        await admin.alter_table(path, set_properties={"table.log.local-ttl": "30 min"})
        with pytest.raises(InvalidConfigError, match=r"'table\.log\.local-ttl' must be less than or equal to 'table\.log\.ttl'"):
            await admin.alter_table(path, set_properties={"table.log.ttl": "10 min"})
        await admin.alter_table(path, reset_properties=["table.log.ttl"])  # back to the 7 d default
        assert (await admin.get_table_info(path)).properties == {
            "table.replication.factor": "1", "table.log.local-ttl": "30 min",
        }


@pytest.mark.parametrize(
    ("set_properties", "reset_properties", "key"),
    [
        ({"table.kv.format": "INDEXED"}, [], "table.kv.format"),
        ({"table.log.format": "INDEXED"}, [], "table.log.format"),
        ({"table.replication.factor": "1"}, [], "table.replication.factor"),
        ({"table.auto-partition.time-unit": "HOUR"}, [], "table.auto-partition.time-unit"),
        ({"table.log.arrow.compression.zstd.level": "9"}, [], "table.log.arrow.compression.zstd.level"),
        ({"table.no-such-option": "x"}, [], "table.no-such-option"),
        ({}, ["table.replication.factor"], "table.replication.factor"),
        ({"table.log.ttl": "1 h"}, ["table.changelog.image"], "table.changelog.image"),
    ],
)
async def test_other_table_options_are_refused(
    server: Any, set_properties: dict[str, str], reset_properties: list[str], key: str
) -> None:
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await new_table(admin, log_schema())
        before = await admin.get_table_info(path)
        with pytest.raises(InvalidAlterTableError, match=f"The following options are not supported to alter yet: '{re.escape(key)}'"):
            await admin.alter_table(path, set_properties=set_properties, reset_properties=reset_properties)
        after = await admin.get_table_info(path)
        assert (after.table_json, after.modified_ms) == (before.table_json, before.modified_ms)


RETENTION_CONFIG = {"log.segment.file-size": "4kb", "log.retention.check-interval": "100ms"}


async def test_a_log_ttl_set_by_alter_table_deletes_old_segments(server_factory: Any) -> None:
    server = server_factory(RETENTION_CONFIG)
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        paths = [await new_table(admin, schema, bucket_count=1) for _ in range(2)]
        for path in paths:  # the same rows into both: several 4 kb segments each
            writer = (await connection.get_table(path)).new_append().create_writer()
            for round_ in range(8):
                ids = range(round_ * 100, (round_ + 1) * 100)
                await writer.write_arrow_batch(pa.table({"id": list(ids), "v": [f"row-{i:08d}" * 4 for i in ids]}))
        altered_path, kept_path = paths

        async def earliest(path: TablePath) -> int:
            return (await admin.list_offsets(path, [0], OffsetSpec.earliest()))[0]

        assert await earliest(altered_path) == 0 and await earliest(kept_path) == 0
        await admin.alter_table(altered_path, set_properties={"table.log.ttl": "1 ms"})

        async def trimmed() -> bool:
            return await earliest(altered_path) > 0

        await wait_until(trimmed, "retention to delete the altered table's old segments", timeout_s=20)
        # the other table, as old and as large, keeps its log under the server's 7 d default
        assert await earliest(kept_path) == 0
        assert (await admin.list_offsets(altered_path, [0], OffsetSpec.latest()))[0] == 800, "the active segment stays"


@pytest.mark.asyncio
async def test_every_unsupported_key_is_named_and_standby_replicas_need_a_primary_key(server: Any) -> None:
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await new_table(admin, log_schema())
        with pytest.raises(InvalidAlterTableError, match=r"yet: 'table\.kv\.format', 'table\.log\.format'\.$"):
            await admin.alter_table(path, set_properties={"table.kv.format": "INDEXED", "table.log.ttl": "1d"},
                                    reset_properties=["table.log.format"])
        with pytest.raises(InvalidAlterTableError, match="can only be altered on primary key tables"):
            await admin.alter_table(path, set_properties={"table.kv.standby-replica.enabled": "true"})
        assert "table.log.ttl" not in (await admin.get_table_info(path)).properties
