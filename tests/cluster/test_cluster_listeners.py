"""Fluss's listener model in a cluster: each server listens on several named listeners, registers every one
of them in ZooKeeper, reaches the other servers on ``internal.listener.name``, and tells each client the
endpoints of the listener that client came in through (``advertised.listeners`` where set).

The cluster: ``CLIENT`` (SASL over TLS, strom's client and Spark), ``INTERNAL`` (SASL over TLS, the
servers only) and ``PYFLUSS`` (SASL without TLS, which pyfluss lacks, advertised as ``localhost``)."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import fluss as pyfluss
import pytest

from strom.client import Connection
from strom.errors import AuthenticationError, ConnectionFailedError, NetworkError
from strom.rpc.client import RpcConnection
from strom.rpc.endpoints import Endpoint, parse_endpoints
from strom.security.internal import InternalCredentials
from strom.server.local_cluster import ADMIN, LocalCluster
from strom.zk.metadata_store import connect_kazoo, parse_location
from strom.zk.zookeeper_server import unavailable_reason
from tests.cluster.test_cluster_processes import rows, upsert
from tests.cluster.test_replication import PK_FIELDS, create, wait_for_servers
from tests.tls_support import Certificates, make_certificates

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

LISTENERS = {
    "bind.listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0,PYFLUSS://127.0.0.1:0",
    "internal.listener.name": "INTERNAL",
    "advertised.listeners": "PYFLUSS://localhost:0",
    "security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SASL_SSL,PYFLUSS:SASL",
    "kv.snapshot.interval": "0s",
}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("listener-certs"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, certificates: Certificates) -> Iterator[LocalCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    config = {**LISTENERS, **certificates.server_config()}
    local = LocalCluster(tmp_path_factory.mktemp("listeners") / "cluster", 3, config, secure=True).start()
    try:
        wait_for_servers(local, 3, _client_login(local, certificates))
        yield local
    finally:
        local.stop()


def _registrations(local: LocalCluster) -> dict[str, dict[str, Endpoint]]:
    """What ZooKeeper holds: each tablet server's and the active coordinator's listeners by name."""
    hosts, root = parse_location(local.zookeeper_address)
    client = connect_kazoo(hosts, 10_000, login=local.zookeeper_login())
    try:
        found = {}
        for server_id in client.get_children(f"{root}/tabletservers/ids"):
            document = json.loads(client.get(f"{root}/tabletservers/ids/{server_id}")[0])
            # Fluss's version 4: the server's memory for the coordinator's KV leader capacity
            assert document["version"] == 4 and document["register_timestamp"] > 0 and document["memory_bytes"] > 0
            found[f"tablet-server-{server_id}"] = {e.name: e for e in parse_endpoints(document["listeners"])}
        coordinator = json.loads(client.get(f"{root}/coordinators/active")[0])
        assert coordinator["version"] == 2 and coordinator["id"] == "0"
        found["coordinator"] = {e.name: e for e in parse_endpoints(coordinator["listeners"])}
        return found
    finally:
        client.stop()
        client.close()


def _client_login(local: LocalCluster, certificates: Certificates, bootstrap: str | None = None) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap or local.bootstrap, "client.security.protocol": "SASL_SSL",
            "client.security.ssl.truststore": str(certificates.ca), "client.security.sasl.mechanism": "PLAIN",
            "client.security.sasl.username": ADMIN, "client.security.sasl.password": local.admin_password()}


def test_every_listener_is_registered_in_zookeeper(cluster: LocalCluster) -> None:
    registered = _registrations(cluster)
    assert set(registered) == {"coordinator", "tablet-server-1", "tablet-server-2", "tablet-server-3"}
    for name, endpoints in registered.items():
        assert set(endpoints) == {"CLIENT", "INTERNAL", "PYFLUSS"}, name
        assert endpoints["PYFLUSS"].host == "localhost"  # advertised.listeners; the bound port
        assert endpoints["CLIENT"].host == "127.0.0.1"
        assert len({e.port for e in endpoints.values()}) == 3  # port 0 became three real ports
    assert cluster.bootstrap == f"127.0.0.1:{registered['coordinator']['CLIENT'].port}"


def test_clients_are_told_the_endpoints_of_their_listener(cluster: LocalCluster, certificates: Certificates) -> None:
    registered = _registrations(cluster)

    def expected(listener: str) -> set[tuple[str, int]]:
        return {(e[listener].host, e[listener].port) for e in registered.values()}

    async def nodes(config: dict[str, str]) -> set[tuple[str, int]]:
        async with await Connection.create(config) as connection:
            return {(n.host, n.port) for n in await connection.get_admin().get_server_nodes()}

    assert asyncio.run(nodes(_client_login(cluster, certificates))) == expected("CLIENT")
    pyfluss_port = registered["coordinator"]["PYFLUSS"].port
    plain_sasl = {**_client_login(cluster, certificates, f"127.0.0.1:{pyfluss_port}"), "client.security.protocol": "SASL"}
    assert asyncio.run(nodes(plain_sasl)) == expected("PYFLUSS")


def test_servers_replicate_over_the_internal_listener_which_refuses_plain_clients(
    cluster: LocalCluster, certificates: Certificates
) -> None:
    async def round_trip() -> dict[int, str]:
        async with await Connection.create(_client_login(cluster, certificates)) as connection:
            path = await create(connection, PK_FIELDS, ["id"])  # replication factor 3: followers fetch on INTERNAL
            await upsert(connection, path, range(20), "listener")
            return await rows(connection, path)

    assert asyncio.run(round_trip()) == {i: f"listener{i}" for i in range(20)}
    internal = _registrations(cluster)["tablet-server-1"]["INTERNAL"]
    with pytest.raises((ConnectionFailedError, NetworkError)):  # not TLS: the handshake never completes
        asyncio.run(RpcConnection.connect(internal.host, internal.port, timeout_ms=3_000))


def test_servers_log_in_on_the_internal_listener_only(cluster: LocalCluster, certificates: Certificates) -> None:
    """Even with the secret, a server login on a client listener is refused (no option asks otherwise):
    the secret is of no use on a network that reaches only client listeners."""
    secret = cluster.settings()["security.internal.secret"]
    endpoints = _registrations(cluster)["tablet-server-1"]
    as_coordinator = InternalCredentials(secret, "coordinator", "tablet-server-1")
    with pytest.raises(AuthenticationError, match="accepts no server logins"):
        asyncio.run(RpcConnection.connect(endpoints["PYFLUSS"].host, endpoints["PYFLUSS"].port, credentials=as_coordinator))

    async def internal_login() -> None:
        connection = await RpcConnection.connect(endpoints["INTERNAL"].host, endpoints["INTERNAL"].port,
                                                 credentials=as_coordinator,
                                                 tls=ssl.create_default_context(cafile=str(certificates.ca)))
        await connection.close()

    asyncio.run(internal_login())


def test_pyfluss_writes_and_reads_through_its_own_listener(cluster: LocalCluster, certificates: Certificates) -> None:
    pyfluss_port = _registrations(cluster)["coordinator"]["PYFLUSS"].port

    async def scenario() -> object:
        async with await Connection.create(_client_login(cluster, certificates)) as connection:
            path = await create(connection, PK_FIELDS, ["id"])
        client = await pyfluss.FlussConnection.create(pyfluss.Config({
            "bootstrap.servers": f"localhost:{pyfluss_port}", "security.protocol": "sasl",
            "security.sasl.mechanism": "PLAIN", "security.sasl.username": ADMIN,
            "security.sasl.password": cluster.admin_password()}))
        try:
            table = await client.get_table(pyfluss.TablePath(path.database_name, path.table_name))
            writer = table.new_upsert().create_writer()
            for key in range(6):
                writer.upsert({"id": key, "v": f"py{key}"})
            await writer.flush()
            return await table.new_lookup().create_lookuper().lookup({"id": 5})
        finally:
            await client.close()

    assert asyncio.run(scenario()) == {"id": 5, "v": "py5"}


def test_a_cluster_server_without_a_clear_internal_listener_refuses_to_start(tmp_path: Path) -> None:
    """Checked before ZooKeeper is reached (this address has none)."""
    from strom.config import Configuration
    from strom.errors import InvalidConfigError
    from strom.server.cluster_node import TabletServerNode

    async def start(**settings: str) -> None:
        config = Configuration({"zookeeper.address": "127.0.0.1:1", "security.internal.secret": "s", **settings})
        node = TabletServerNode(tmp_path, "127.0.0.1", 0, config)
        try:
            await node.start()
        finally:
            await node.stop()

    with pytest.raises(InvalidConfigError, match=r"set internal.listener.name"):
        asyncio.run(start(**{"bind.listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0"}))
    with pytest.raises(InvalidConfigError, match=r"internal.listener.name REPLICATION is not one of"):
        asyncio.run(start(**{"bind.listeners": "CLIENT://127.0.0.1:0", "internal.listener.name": "replication"}))
