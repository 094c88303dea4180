"""A secured cluster (``strom cluster start --secure``: clients log in with SASL/PLAIN over TLS with the
cluster's generated CA, ACLs enforced by every server): pyfluss (no TLS) writes and reads through the SASL
listener ``--sasl-listener`` adds, a client without credentials, without TLS or not trusting the CA is
refused, and an ACL granted through the coordinator reaches the tablet servers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import fluss as pyfluss
import pytest

from strom.client import Connection
from strom.errors import (
    AuthenticationError,
    AuthorizationError,
    ConnectionFailedError,
    NetworkError,
    TableNotExistError,
)
from strom.rpc.client import RpcConnection
from strom.security.acl import AclBinding, OperationType, Principal, Resource
from strom.server.local_cluster import LocalCluster
from strom.zk.zookeeper_server import unavailable_reason
from tests.cluster.test_cluster_processes import rows, upsert
from tests.cluster.test_replication import PK_FIELDS, create, wait_for_servers
from tests.tls_support import make_certificates

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

ACL_WAIT_S = 15.0


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = {"security.sasl.plain.credentials": "alice:alice-secret", "kv.snapshot.interval": "0s"}
    with _cluster_with(tmp_path_factory.mktemp("secured") / "cluster", config, sasl_listener=True) as local:
        yield local


def test_pyfluss_logs_in_writes_and_reads_through_a_secured_cluster(secured: LocalCluster) -> None:
    admin = secured.client_config()
    without_login = {key: value for key, value in admin.items() if "sasl" not in key}
    with pytest.raises(AuthenticationError):
        asyncio.run(Connection.create({**without_login, "client.security.protocol": "SSL"}))  # TLS, no login

    async def through_pyfluss() -> object:
        async with await Connection.create(admin) as connection:
            path = await create(connection, PK_FIELDS, ["id"])  # replication factor 3
        # pyfluss names the options without "client."; it has no TLS, so it logs in on the SASL listener
        assert secured.pyfluss_config()["bootstrap.servers"] != secured.bootstrap
        client = await pyfluss.FlussConnection.create(pyfluss.Config(secured.pyfluss_config()))
        try:
            table = await client.get_table(pyfluss.TablePath(path.database_name, path.table_name))
            writer = table.new_upsert().create_writer()
            writer.upsert({"id": 7, "v": "seven"})
            await writer.flush()
            return await table.new_lookup().create_lookuper().lookup({"id": 7})
        finally:
            await client.close()

    assert asyncio.run(through_pyfluss()) == {"id": 7, "v": "seven"}


def test_an_acl_granted_through_the_coordinator_reaches_the_tablet_servers(secured: LocalCluster) -> None:
    admin = secured.client_config()
    alice = secured.client_config("alice", "alice-secret")

    async def scenario() -> None:
        async with await Connection.create(admin) as connection:
            path = await create(connection, PK_FIELDS, ["id"])
            await upsert(connection, path, range(5), "v")
        async with await Connection.create(alice) as connection:
            with pytest.raises((AuthorizationError, TableNotExistError)):  # alice may see nothing yet
                await connection.get_table(path)
        async with await Connection.create(admin) as connection:
            resource = Resource.table(path.database_name, path.table_name)
            await connection.get_admin().create_acls([AclBinding(resource, Principal("User", "alice"), "*",
                                                                 OperationType.READ)])
        deadline = time.monotonic() + ACL_WAIT_S
        async with await Connection.create(alice) as connection:
            while True:  # the coordinator and then the bucket's leader serve her once they have the ACL
                try:
                    table = await connection.get_table(path)
                    assert await table.new_lookup().create_lookuper().lookup({"id": 3}) == {"id": 3, "v": "v3"}
                    return
                except (AuthorizationError, TableNotExistError):
                    assert time.monotonic() < deadline, "the ACL never reached the servers"
                    await asyncio.sleep(0.2)

    asyncio.run(scenario())


def test_the_admin_password_is_generated_and_kept_private(secured: LocalCluster) -> None:
    assert len(secured.admin_password()) >= 16
    assert secured.config_path.stat().st_mode & 0o077 == 0
    for member in secured.state.members:
        assert secured.admin_password() not in Path(f"/proc/{member.pid}/cmdline").read_bytes().decode(errors="replace")



def test_a_secure_cluster_speaks_sasl_over_tls_with_its_own_ca_between_its_servers_and_to_clients(
    secured: LocalCluster, tmp_path: Path,
) -> None:
    """``--secure`` alone means TLS: every server's main listener is SASL_SSL with a certificate of the
    cluster's generated CA, so replication, leadership notices and snapshot commits run over TLS between the
    servers (with their own logins) and clients log in over TLS. A client that does not speak TLS, or does
    not trust the cluster's CA, gets nowhere; the CA's private key was never written down."""
    settings = secured.settings()
    assert settings["security.protocol.map"] == "FLUSS:SASL_SSL,PYFLUSS:SASL"
    generated = secured.certificates
    assert settings["security.ssl.truststore"] == str(generated.ca) and generated.key.stat().st_mode & 0o077 == 0
    assert sorted(path.name for path in generated.directory.iterdir()) == ["ca.pem", "server.key", "server.pem"]
    login = secured.client_config()
    assert (login["client.security.protocol"], login["client.security.ssl.truststore"]) == ("SASL_SSL", str(generated.ca))
    for member in secured.state.members:  # each server says at start what each listener protects
        if member.role != "zookeeper":
            text = Path(member.log).read_text()
            assert f"listener FLUSS on {member.address}: SASL_SSL" in text
            assert (f"WARNING strom.server.listeners: listener PYFLUSS on {member.listeners['PYFLUSS']} is SASL "
                    "without TLS: passwords and data cross the network in clear") in text

    async def replicated_round_trip(login: dict[str, str]) -> dict[int, str]:
        async with await Connection.create(login) as connection:
            path = await create(connection, PK_FIELDS, ["id"])  # replication factor 3
            await upsert(connection, path, range(20), "tls")
            return await rows(connection, path)

    assert asyncio.run(replicated_round_trip(login)) == {i: f"tls{i}" for i in range(20)}
    host, _, port = secured.bootstrap.split(",")[0].rpartition(":")
    with pytest.raises((ConnectionFailedError, NetworkError)):  # no TLS
        asyncio.run(RpcConnection.connect(host, int(port), timeout_ms=3_000))
    other_ca = make_certificates(tmp_path / "another-ca").ca
    with pytest.raises((ConnectionFailedError, NetworkError), match=r"(?i)certificate"):  # TLS, another CA
        asyncio.run(Connection.create({**login, "client.security.ssl.truststore": str(other_ca)}))


@contextlib.contextmanager
def _cluster_with(data_dir: Path, config: dict[str, str], sasl_listener: bool = False) -> Iterator[LocalCluster]:
    """Three tablet servers whose clients must log in (``strom cluster start --secure``)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(data_dir, 3, config, secure=True, sasl_listener=sasl_listener).start()
    try:
        wait_for_servers(local, 3, local.client_config())  # the tests' tables have three replicas
        yield local
    finally:
        local.stop()
