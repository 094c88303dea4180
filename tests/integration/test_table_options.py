"""Table options at creation through a real server, with the official client (pyfluss) and strom's: values of
each type round-trip through GetTableInfo with the defaults Fluss's coordinator fills in, and bad values,
unknown ``table.*`` keys and keys outside ``table.`` are refused with Fluss's error code and message."""

from __future__ import annotations

from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import InvalidConfigError, InvalidReplicationFactorError
from tests.conftest import unique_name
from tests.integration.pyfluss_support import create_table

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]

INVALID_CONFIG = 39
INVALID_REPLICATION_FACTOR = 17
FIELDS = [pa.field("id", pa.int32()), pa.field("ver", pa.int64()), pa.field("name", pa.string())]

ACCEPTED = {
    "table.log.ttl": "2 h",  # Duration
    "table.log.local-ttl": "30 min",  # Duration, no effect (no remote log tiering)
    "table.datalake.freshness": "45s",  # Duration
    "table.log.tiered.local-segments": "4",  # Integer, no effect
    "table.log.arrow.compression.zstd.level": "9",  # Integer
    "table.auto-increment.cache-size": "5000000000",  # Long
    "table.kv.standby-replica.enabled": "True",  # Boolean, no effect
    "table.datalake.auto-compaction": "false",  # Boolean, no effect
    "table.kv.format": "indexed",  # Enum, any case
    "table.log.arrow.compression.type": "LZ4_FRAME",  # Enum
    "table.changelog.image": "wal",  # Enum
    "table.merge-engine": "versioned",  # Enum
    "table.merge-engine.versioned.ver-column": "ver",  # String
    "table.auto-partition.time-unit": "HOUR",  # Enum, no effect (auto-partitioning is off)
}

REFUSED = [
    # (properties, start of Fluss's message)
    ({"table.log.ttl": "7"}, "Invalid value for config 'table.log.ttl'. Reason: Could not parse value '7' for key 'table.log.ttl'."),
    (
        {"table.datalake.enabled": "yes"},
        "Invalid value for config 'table.datalake.enabled'. Reason: Could not parse value 'yes' for key",
    ),
    (
        {"table.replication.factor": "one"},
        "Invalid value for config 'table.replication.factor'. Reason: Could not parse value 'one' for key",
    ),
    ({"table.kv.format": "ROWS"}, "Invalid value for config 'table.kv.format'. Reason: Could not parse value 'ROWS'"),
    ({"table.no-such-option": "x"}, "'table.no-such-option' is not a recognized Fluss table property"),
    ({"owner": "qa"}, "'owner' is not a Fluss table property. Please use '.customProperty(..)'"),
    ({"table.replication.factor": "0"}, "'table.replication.factor' must be greater than 0."),
    ({"table.log.arrow.compression.zstd.level": "0"}, "Invalid ZSTD compression level: 0."),
    ({"table.log.ttl": "1 h", "table.log.local-ttl": "1 d"}, "'table.log.local-ttl' must be less than or equal to"),
    ({"table.statistics.columns": "*"}, "Statistics columns are not supported for primary key tables."),
    ({"table.kv.format-version": "3"}, "Unsupported kv format version 3."),
    ({"table.auto-partition.enabled": "true"}, "Currently, auto partition is only supported for partitioned table"),
]


async def test_accepted_options_round_trip_with_the_defaults_fluss_fills_in(fluss: Any) -> None:
    path, _ = await create_table(
        fluss, FIELDS, primary_keys=["id"], properties=ACCEPTED, custom_properties={"owner": "qa"}
    )
    info = await fluss.get_admin().get_table_info(path)
    properties = info.get_properties()
    assert properties.items() >= ACCEPTED.items()
    assert properties["table.replication.factor"] == "1"
    assert properties["table.kv.format-version"] == "2"
    assert properties["table.delete.behavior"] == "IGNORE"  # Fluss's default with a merge engine
    assert info.get_custom_properties() == {"owner": "qa"}


async def test_a_log_table_gets_only_the_replication_factor_filled_in(fluss: Any) -> None:
    path, _ = await create_table(fluss, FIELDS, properties={"table.statistics.columns": "id,name"})
    properties = (await fluss.get_admin().get_table_info(path)).get_properties()
    assert properties["table.replication.factor"] == "1"
    assert properties["table.statistics.columns"] == "id,name"
    assert "table.kv.format-version" not in properties


@pytest.mark.parametrize(("properties", "message"), REFUSED)
async def test_pyfluss_gets_flusss_error_for_a_refused_option(
    fluss: Any, properties: dict[str, str], message: str
) -> None:
    with pytest.raises(pyfluss.FlussError) as failure:
        await create_table(fluss, FIELDS, primary_keys=["id"], properties=properties)
    assert failure.value.error_code == INVALID_CONFIG, str(failure.value)
    assert message in str(failure.value)


async def test_strom_client_gets_the_same_errors(server: Any) -> None:
    schema = Schema.from_arrow(pa.schema(FIELDS), ["id"])
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        for properties, message in REFUSED:
            with pytest.raises(InvalidConfigError) as failure:
                await admin.create_table(
                    TablePath("fluss", unique_name("opts")), TableDescriptor(schema, properties=properties)
                )
            assert str(failure.value).startswith(message), (properties, str(failure.value))
        path = TablePath("fluss", unique_name("opts"))
        await admin.create_table(path, TableDescriptor(schema, properties=ACCEPTED))
        info = await admin.get_table_info(path)
        assert info.properties.items() >= {**ACCEPTED, "table.replication.factor": "1"}.items()


async def test_more_replicas_than_tablet_servers_is_refused(fluss: Any, server: Any) -> None:
    with pytest.raises(pyfluss.FlussError) as failure:
        await create_table(fluss, FIELDS, primary_keys=["id"], properties={"table.replication.factor": "2"})
    assert failure.value.error_code == INVALID_REPLICATION_FACTOR
    assert "Replication factor: 2 larger than available tablet servers: 1." in str(failure.value)

    schema = Schema.from_arrow(pa.schema([("id", pa.int32()), ("day", pa.string())]))
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = TablePath("fluss", unique_name("opts"))
        # a partitioned table places replicas per partition, so the partition is refused (as in Fluss)
        await admin.create_table(
            path, TableDescriptor(schema, partition_keys=["day"], properties={"table.replication.factor": "3"})
        )
        with pytest.raises(InvalidReplicationFactorError, match="Replication factor: 3 larger than"):
            await admin.create_partition(path, {"day": "2024-01-01"})
