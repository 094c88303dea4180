"""``table.datalake.historical-partition.enabled`` through a real ``strom server`` of a Paimon cluster: the
coordinator's system partition ``__historical__`` exists while the option is on (GetMetadata resolves it,
ListPartitionInfos hides it), users can neither drop nor create it, AlterTable drops and re-creates it, a
restart keeps it, and a table missing Fluss's requirements is refused with every unmet one listed."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import InvalidConfigError, PartitionNotExistError, PartitionSpecInvalidError
from strom.table_properties import HISTORICAL_PARTITION_VALUE
from tests.conftest import unique_name

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio]

PAIMON = {"datalake.format": "paimon"}
HISTORICAL = "table.datalake.historical-partition.enabled"
OPTIONS = {
    "table.auto-partition.enabled": "true",
    "table.auto-partition.time-unit": "DAY",
    "table.auto-partition.time-zone": "UTC",
    "table.datalake.enabled": "true",
    HISTORICAL: "true",
}
FIELDS = [pa.field("id", pa.int64(), nullable=False), pa.field("dt", pa.string(), nullable=False),
          pa.field("v", pa.string())]


async def _historical_id(address: str, path: TablePath) -> int:
    """The partition's id as GetMetadata resolves it (a fresh connection: nothing cached)."""
    async with await Connection.create(address) as connection:
        table = await connection.metadata.refresh_table(path)
        return await connection.metadata.partition_id(table, HISTORICAL_PARTITION_VALUE)


async def _listed(address: str, path: TablePath) -> set[str]:
    async with await Connection.create(address) as connection:
        return {info.partition_name for info in await connection.get_admin().list_partition_infos(path)}


async def test_the_historical_partition_of_a_paimon_table(server_factory: Any) -> None:
    server = server_factory(PAIMON)
    path = TablePath("fluss", unique_name("historical"))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        await admin.create_table(path, TableDescriptor(Schema.from_arrow(pa.schema(FIELDS), ["id", "dt"]),
                                                       partition_keys=("dt",), bucket_count=2, properties=OPTIONS))
        assert (await admin.get_table_info(path)).properties["table.datalake.format"] == "paimon"
        partition_id = await _historical_id(server.address, path)
        listed = await _listed(server.address, path)
        assert listed and HISTORICAL_PARTITION_VALUE not in listed, listed

        with pytest.raises(PartitionSpecInvalidError, match="cannot be dropped manually"):
            await admin.drop_partition(path, {"dt": HISTORICAL_PARTITION_VALUE})
        with pytest.raises(PartitionSpecInvalidError, match="cannot be created manually"):
            await admin.create_partition(path, {"dt": HISTORICAL_PARTITION_VALUE})

        await admin.alter_table(path, {HISTORICAL: "false"})
        with pytest.raises(PartitionNotExistError):
            await _historical_id(server.address, path)
        await admin.alter_table(path, {HISTORICAL: "true"})
        partition_id = await _historical_id(server.address, path)
        assert await _listed(server.address, path) == listed

    server.kill()
    restarted = server_factory(PAIMON, data_dir=server.data_dir, port=server.port)
    assert await _historical_id(restarted.address, path) == partition_id, "kept across a restart"
    assert await _listed(restarted.address, path) == listed


async def test_a_table_missing_the_requirements_is_refused_with_each_listed(server_factory: Any) -> None:
    server = server_factory(PAIMON)
    fields = [*FIELDS, pa.field("region", pa.string(), nullable=False)]
    descriptor = TableDescriptor(Schema.from_arrow(pa.schema(fields)), partition_keys=("dt", "region"),
                                 properties={HISTORICAL: "true"})
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = TablePath("fluss", unique_name("historical_unmet"))
        with pytest.raises(InvalidConfigError) as refused:
            await admin.create_table(path, descriptor)
        assert str(refused.value) == (
            f"'{HISTORICAL}' has unmet requirements: 'table.auto-partition.enabled' must be set to true; "
            "'table.datalake.enabled' must be set to true; the table must define a primary key; "
            "the table must define exactly one partition key (found 2)."
        )
        assert not await admin.table_exists(path)
