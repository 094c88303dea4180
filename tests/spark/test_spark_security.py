"""The connector on a secured server: Fluss's client.security.* options reach strom's client in every task."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from strom.client import Connection, TablePath
from strom.security.acl import AclBinding, OperationType, Principal, Resource
from tests.conftest import unique_name
from tests.integration.security_support import SECURE_CONFIG, strom_config
from tests.integration.snapshot_support import create_pk_table, write_round
from tests.server_process import ServerProcess
from tests.tls_support import make_certificates

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("spark-secure") / "data", SECURE_CONFIG).start()
    yield process
    assert process.stop() == 0, process.log_text()[-3000:]


def test_batch_read_with_sasl_credentials_of_a_reader(spark: Any, secure_server: ServerProcess) -> None:
    path = TablePath("fluss", unique_name("spark_sasl"))

    async def prepare() -> None:
        async with await Connection.create(strom_config(secure_server, "admin")) as admin:
            table = await create_pk_table(admin, path, buckets=2)
            await write_round(table, range(20), "r")
            await admin.get_admin().create_acls([
                AclBinding(Resource.table(path.database_name, path.table_name), Principal("User", "bob"), "*",
                           OperationType.READ),
            ])

    asyncio.run(prepare())
    reader = spark.read.format("fluss").option("table", str(path))
    for key, value in strom_config(secure_server, "bob").items():
        reader = reader.option(key, value)
    rows = reader.load().collect()
    assert sorted(row.id for row in rows) == list(range(20))
    assert {row.v for row in rows} == {f"r-{i}" for i in range(20)}


def test_batch_read_over_sasl_ssl(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The client.security.ssl.* options reach every task: Spark reads over SASL_SSL."""
    certificates = make_certificates(tmp_path_factory.mktemp("spark-certs"))
    config = {**SECURE_CONFIG, "security.protocol.map": "CLIENT:SASL_SSL", **certificates.server_config()}
    server = ServerProcess(tmp_path_factory.mktemp("spark-tls") / "data", config).start()
    try:
        login = {**strom_config(server, "admin"), "client.security.protocol": "SASL_SSL",
                 "client.security.ssl.truststore": str(certificates.ca)}
        path = TablePath("fluss", unique_name("spark_tls"))

        async def prepare(login: dict[str, str]) -> None:
            async with await Connection.create(login) as admin:
                await write_round(await create_pk_table(admin, path, buckets=2), range(10), "t")

        asyncio.run(prepare(login))
        reader = spark.read.format("fluss").option("table", str(path))
        for key, value in login.items():
            reader = reader.option(key, value)
        assert sorted(row.id for row in reader.load().collect()) == list(range(10))
    finally:
        assert server.stop() == 0, server.log_text()[-3000:]
