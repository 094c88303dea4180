"""A secured cluster (``strom cluster start --secure``: clients log in with SASL/PLAIN, ACLs enforced by
every server): pyfluss writes and reads through it with credentials, a client without them is refused, and
an ACL granted through the coordinator reaches the tablet servers."""

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
from strom.server.local_cluster import ADMIN, LocalCluster
from strom.zk.zookeeper_server import unavailable_reason
from tests.cluster.test_cluster_processes import rows, upsert
from tests.cluster.test_replication import PK_FIELDS, create, wait_for_servers
from tests.tls_support import make_certificates

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

ACL_WAIT_S = 15.0


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = {"security.sasl.plain.credentials": "alice:alice-secret", "kv.snapshot.interval": "0s"}
    with _cluster_with(tmp_path_factory.mktemp("secured") / "cluster", config) as local:
        yield local


def _login(local: LocalCluster, user: str, password: str) -> dict[str, str]:
    return {"bootstrap.servers": local.bootstrap, "client.security.protocol": "SASL",
            "client.security.sasl.mechanism": "PLAIN", "client.security.sasl.username": user,
            "client.security.sasl.password": password}


def test_pyfluss_logs_in_writes_and_reads_through_a_secured_cluster(secured: LocalCluster) -> None:
    admin = _login(secured, ADMIN, secured.admin_password())
    with pytest.raises(AuthenticationError):
        asyncio.run(Connection.create(secured.bootstrap))  # no credentials

    async def through_pyfluss() -> object:
        async with await Connection.create(admin) as connection:
            path = await create(connection, PK_FIELDS, ["id"])  # replication factor 3
        client = await pyfluss.FlussConnection.create(pyfluss.Config({  # pyfluss names the options without "client."
            "bootstrap.servers": secured.bootstrap, "security.protocol": "sasl", "security.sasl.mechanism": "PLAIN",
            "security.sasl.username": ADMIN, "security.sasl.password": secured.admin_password()}))
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
    admin = _login(secured, ADMIN, secured.admin_password())
    alice = _login(secured, "alice", "alice-secret")

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



def test_a_cluster_speaks_sasl_over_tls_between_its_servers_and_to_clients(tmp_path: Path) -> None:
    """Every server's one listener is SASL_SSL: replication, leadership notices and snapshot commits run
    over TLS between the servers (with their own logins), clients log in over TLS, and a client that does
    not speak TLS gets nowhere."""
    certificates = make_certificates(tmp_path / "certs")
    config = {"security.protocol.map": "FLUSS:SASL_SSL", "kv.snapshot.interval": "0s", **certificates.server_config()}
    with _cluster_with(tmp_path / "cluster", config) as local:
        login = {**_login(local, ADMIN, local.admin_password()), "client.security.protocol": "SASL_SSL",
                 "client.security.ssl.truststore": str(certificates.ca)}

        async def replicated_round_trip(login: dict[str, str]) -> dict[int, str]:
            async with await Connection.create(login) as connection:
                path = await create(connection, PK_FIELDS, ["id"])  # replication factor 3
                await upsert(connection, path, range(20), "tls")
                return await rows(connection, path)

        assert asyncio.run(replicated_round_trip(login)) == {i: f"tls{i}" for i in range(20)}
        host, _, port = local.bootstrap.split(",")[0].rpartition(":")
        with pytest.raises((ConnectionFailedError, NetworkError)):
            asyncio.run(RpcConnection.connect(host, int(port), timeout_ms=3_000))


@contextlib.contextmanager
def _cluster_with(data_dir: Path, config: dict[str, str]) -> Iterator[LocalCluster]:
    """Three tablet servers whose clients must log in (``strom cluster start --secure``)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(data_dir, 3, config, secure=True).start()
    try:
        login = _login(local, ADMIN, local.admin_password())
        if local.uses_tls():
            login = {**login, "client.security.protocol": "SASL_SSL",
                     "client.security.ssl.truststore": local.settings()["security.ssl.truststore"]}
        wait_for_servers(local, 3, login)  # the tests' tables have three replicas
        yield local
    finally:
        local.stop()
