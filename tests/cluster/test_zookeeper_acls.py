"""ZooKeeper closed to strangers: a ``--secure`` cluster's ZooKeeper speaks only TLS and requires a login,
and every node strom creates is readable and writable by strom's own identity (``zookeeper.auth.digest``)
alone; a tree created open is closed by ``strom zookeeper secure``.

The attacks these stand for worked against an open ZooKeeper: registering a fake
``/fluss/tabletservers/ids/99`` made the servers log in to it; writing ``/fluss/fluss-acls/…`` directly gave a
user ALL within about two seconds; and the registrations and ACLs could be read by anyone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, NoAuthError, SessionClosedRequireSaslError
from kazoo.handlers.threading import KazooTimeoutError

from strom.cli.main import main
from strom.server.local_cluster import LocalCluster
from strom.zk.login import ZooKeeperLogin
from strom.zk.metadata_store import ZooKeeperMetadataStore, parse_location
from strom.zk.zookeeper_server import ZooKeeperServer, unavailable_reason
from tests.cluster.test_cluster_processes import create_table, rows, upsert

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

REFUSED = (NoAuthError, AuthFailedError, SessionClosedRequireSaslError)


def _client(hosts: str, digest: str | None, tls: ZooKeeperLogin | None = None) -> KazooClient:
    """A started client logged in as ``digest`` (none: anonymous), over TLS as ``tls`` says."""
    client = KazooClient(hosts=hosts, timeout=10, auth_data=[("digest", digest)] if digest else None,
                         **(tls.tls_options() if tls is not None else {}))  # type: ignore[arg-type]
    client.start(timeout=10)
    return client


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[LocalCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(tmp_path / "cluster", 1, {"kv.snapshot.interval": "0s"}, secure=True).start()
    try:
        yield local
    finally:
        local.stop()


def test_a_secure_cluster_s_zookeeper_refuses_strangers_and_the_cluster_works(secured: LocalCluster) -> None:
    hosts, root = parse_location(secured.zookeeper_address)
    digest = secured.settings()["zookeeper.auth.digest"]
    tls = secured.zookeeper_login()
    assert tls.tls and tls.truststore == str(secured.certificates.ca)

    async def write_and_read() -> dict[int, str]:
        from strom.client import Connection

        async with await Connection.create(secured.client_config()) as connection:
            path = await create_table(connection, buckets=1)
            await upsert(connection, path, range(5), "z")
            return await rows(connection, path)

    assert asyncio.run(write_and_read()) == {i: f"z{i}" for i in range(5)}

    plain = KazooClient(hosts=hosts, timeout=3, connection_retry={"max_tries": 2})
    try:
        with pytest.raises(KazooTimeoutError):  # the port speaks only TLS: nothing without it gets a session
            plain.start(timeout=3)
    finally:
        plain.close()

    stranger = _client(hosts, "someone:else", tls)  # logged in, but not as strom
    try:
        for read in (lambda: stranger.get_children(f"{root}/tabletservers/ids"),
                     lambda: stranger.get(f"{root}/tabletservers/ids/1"),
                     lambda: stranger.get_children(root)):
            with pytest.raises(NoAuthError):
                read()
        fake = json.dumps({"version": 3, "listeners": "FLUSS://127.0.0.1:1", "register_timestamp": 1}).encode()
        with pytest.raises(NoAuthError):
            stranger.create(f"{root}/tabletservers/ids/99", fake, ephemeral=True)
        with pytest.raises(NoAuthError):
            stranger.create(f"{root}/fluss-acls/intruder", b"{}", makepath=True)
    finally:
        stranger.stop()
        stranger.close()

    anonymous = _client(hosts, None, tls)
    try:
        with pytest.raises(REFUSED):  # the server requires a login before anything else
            anonymous.get_children(root)
    finally:
        anonymous.stop()
        anonymous.close()

    strom = _client(hosts, digest, tls)
    try:
        assert strom.get_children(f"{root}/tabletservers/ids") == ["1"]
    finally:
        strom.stop()
        strom.close()


def test_an_open_tree_is_closed_by_strom_zookeeper_secure(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = ZooKeeperServer(tmp_path / "zookeeper").start()
    try:
        location = f"{server.address}/strom"
        ZooKeeperMetadataStore(location).close()  # created open, as before zookeeper.auth.digest
        digest = "strom:a-digest-secret"
        result = CliRunner().invoke(main, ["zookeeper", "secure", "-D", f"zookeeper.address={location}",
                                           "-D", f"zookeeper.auth.digest={digest}"])
        assert result.exit_code == 0, result.output
        assert "nodes under /strom are now strom's alone" in result.output
        stranger = _client(server.address, None)
        try:
            with pytest.raises(NoAuthError):
                stranger.get_children("/strom")
        finally:
            stranger.stop()
            stranger.close()
        ZooKeeperMetadataStore(location, login=ZooKeeperLogin(digest)).close()  # strom's servers go on with the tree
    finally:
        server.stop()
