"""TLS listeners (Kafka's SSL and SASL_SSL in ``security.protocol.map``; Fluss has none yet): strom's client
and the CLI speak them with a trust store, nothing unencrypted or untrusted gets through, a listener can
require client certificates, and pyfluss (which has no TLS) keeps a SASL listener of its own."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from pathlib import Path

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import ConnectionFailedError, NetworkError
from strom.rpc.client import RpcConnection
from tests.conftest import unique_name
from tests.integration.security_support import JAAS, USERS
from tests.server_process import ServerProcess, free_port
from tests.tls_support import Certificates, make_certificates

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("security")]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def _tls_login(server: ServerProcess, certificates: Certificates, user: str = "admin") -> dict[str, str]:
    return {"bootstrap.servers": server.address, "client.security.protocol": "SASL_SSL",
            "client.security.ssl.truststore": str(certificates.ca), "client.security.sasl.mechanism": "PLAIN",
            "client.security.sasl.username": user, "client.security.sasl.password": USERS[user]}


async def _write_and_read(config: dict[str, str]) -> dict[str, object] | None:
    async with await Connection.create(config) as connection:
        path = TablePath("fluss", unique_name("tls"))
        schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [1], "v": ["over tls"]}))
        found: dict[str, object] | None = await table.new_lookup().create_lookuper().lookup({"id": 1})
        return found


def test_sasl_over_tls_serves_strom_s_client_and_the_cli_and_refuses_the_rest(
    tmp_path: Path, certificates: Certificates
) -> None:
    plain_port = free_port()
    config = {
        "bind.listeners": f"SECURE://127.0.0.1:0,PYFLUSS://127.0.0.1:{plain_port}",
        "security.protocol.map": "SECURE:SASL_SSL,PYFLUSS:SASL", "security.sasl.enabled.mechanisms": "PLAIN",
        "security.sasl.plain.jaas.config": JAAS, **certificates.server_config(),
    }
    server = ServerProcess(tmp_path / "data", config).start()
    try:
        assert asyncio.run(_write_and_read(_tls_login(server, certificates))) == {"id": 1, "v": "over tls"}

        with pytest.raises((ConnectionFailedError, NetworkError)):  # no TLS: the handshake never happens
            asyncio.run(RpcConnection.connect("127.0.0.1", server.port, timeout_ms=3_000))
        with pytest.raises(ConnectionFailedError, match="CERTIFICATE_VERIFY_FAILED"):  # a CA it does not trust
            asyncio.run(RpcConnection.connect("127.0.0.1", server.port, timeout_ms=3_000,
                                              tls=ssl.create_default_context()))

        listed = subprocess.run(
            [sys.executable, "-m", "strom.cli.main", "lease", "list", "--json", "-b", server.address,
             "--truststore", str(certificates.ca), "-u", "admin", "--password", USERS["admin"]],
            capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert isinstance(json.loads(listed.stdout), list)

        async def through_pyfluss() -> list[str]:  # pyfluss has no TLS: it uses the SASL listener
            client = await pyfluss.FlussConnection.create(pyfluss.Config({
                "bootstrap.servers": f"127.0.0.1:{plain_port}", "security.protocol": "sasl",
                "security.sasl.mechanism": "PLAIN", "security.sasl.username": "admin",
                "security.sasl.password": USERS["admin"]}))
            try:
                return list(await client.get_admin().list_databases())
            finally:
                await client.close()

        assert "fluss" in asyncio.run(through_pyfluss())
    finally:
        assert server.stop() == 0, server.log_text()[-3000:]


def test_a_listener_can_require_client_certificates(tmp_path: Path, certificates: Certificates) -> None:
    probe = ssl.create_default_context(cafile=str(certificates.ca))
    probe.load_cert_chain(str(certificates.client_certificate), str(certificates.client_key))
    config = {"security.protocol.map": "FLUSS:SSL", **certificates.server_config(client_auth="required")}
    server = ServerProcess(tmp_path / "data", config, probe_tls=probe).start()
    try:
        trusted = {"bootstrap.servers": server.address, "client.security.protocol": "SSL",
                   "client.security.ssl.truststore": str(certificates.ca)}
        with pytest.raises((ConnectionFailedError, NetworkError)):
            asyncio.run(_write_and_read(trusted))  # no client certificate
        with_certificate = {**trusted, "client.security.ssl.certificate": str(certificates.client_certificate),
                            "client.security.ssl.key": str(certificates.client_key)}
        assert asyncio.run(_write_and_read(with_certificate)) == {"id": 1, "v": "over tls"}
    finally:
        assert server.stop() == 0, server.log_text()[-3000:]
