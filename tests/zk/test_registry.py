"""The tablet server registry on a real ZooKeeper: registration, the live view of other registries,
refused duplicate ids, departure on close and re-registration after a session expiry."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from strom.errors import InvalidConfigError
from strom.membership.contract import RegisteredServer
from strom.rpc.endpoints import Endpoint
from strom.rpc.peers import ServerNode
from strom.zk.metadata_store import parse_location
from strom.zk.registry import TabletServerRegistry
from strom.zk.zookeeper_server import ZooKeeperServer

WAIT_S = 10.0

pytestmark = pytest.mark.timeout(60)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.02)


def server(server_id: int, host: str, port: int) -> RegisteredServer:
    """A server with one listener, FLUSS (the default internal listener)."""
    return RegisteredServer(server_id, (Endpoint("FLUSS", host, port),))


def node(server_id: int, host: str, port: int) -> ServerNode:
    """How :meth:`TabletServerRegistry.live` names :func:`server`'s registration."""
    return ServerNode(server_id, host, port, (Endpoint("FLUSS", host, port),))


@pytest.fixture
def registries(zookeeper_location: str) -> Iterator[Callable[..., TabletServerRegistry]]:
    """Opens registries on the test's root; closes them all at the end."""
    opened: list[TabletServerRegistry] = []

    def open_registry(**kwargs: object) -> TabletServerRegistry:
        registry = TabletServerRegistry(zookeeper_location, **kwargs)  # type: ignore[arg-type]
        opened.append(registry)
        return registry

    yield open_registry
    for registry in opened:
        registry.close()


def test_registered_servers_are_live_in_every_registry(registries: Callable[..., TabletServerRegistry]) -> None:
    first, second, observer = registries(), registries(), registries()
    assert observer.live() == {}
    first.register(server(1, "127.0.0.1", 9123))
    second.register(server(2, "10.0.0.2", 9124))
    expected = {1: node(1, "127.0.0.1", 9123), 2: node(2, "10.0.0.2", 9124)}
    for registry in (first, second, observer):
        wait_until(lambda: registry.live() == expected, "both servers live")  # noqa: B023 (used at once)


def test_the_registration_is_an_ephemeral_node_at_flusss_path(
    zookeeper_location: str, registries: Callable[..., TabletServerRegistry]
) -> None:
    registry = registries()
    registry.register(RegisteredServer(7, (Endpoint("CLIENT", "public-7", 9123), Endpoint("FLUSS", "host-7", 9124)),
                                       register_timestamp_ms=1_700_000_000_000))
    hosts, root = parse_location(zookeeper_location)
    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    try:
        data, stat = client.get(f"{root}/tabletservers/ids/7")
        assert json.loads(data) == {  # Fluss's TabletServerRegistration, version 3
            "version": 3, "listeners": "CLIENT://public-7:9123,FLUSS://host-7:9124", "register_timestamp": 1_700_000_000_000,
        }
        assert stat.ephemeralOwner != 0
    finally:
        client.stop()
        client.close()


def test_a_duplicate_id_is_refused_while_its_holder_lives(registries: Callable[..., TabletServerRegistry]) -> None:
    first, second = registries(), registries()
    first.register(server(3, "127.0.0.1", 9123))
    with pytest.raises(InvalidConfigError) as refused:
        second.register(server(3, "127.0.0.1", 9999))
    assert str(refused.value) == "tablet-server.id 3 is already registered by a live tablet server at FLUSS://127.0.0.1:9123"
    first.close()
    second.register(server(3, "127.0.0.1", 9999))
    wait_until(lambda: second.live() == {3: node(3, "127.0.0.1", 9999)}, "the new holder live")


def test_a_closed_registry_takes_its_server_out_of_the_others_live_view(
    registries: Callable[..., TabletServerRegistry],
) -> None:
    leaving, staying = registries(), registries()
    leaving.register(server(1, "127.0.0.1", 9123))
    staying.register(server(2, "127.0.0.1", 9124))
    wait_until(lambda: set(staying.live()) == {1, 2}, "both servers live")
    leaving.close()
    leaving.close()  # again: a no-op
    wait_until(lambda: set(staying.live()) == {2}, "the closed server gone")


def test_a_server_registers_again_after_its_session_expires(
    zookeeper_server: ZooKeeperServer, registries: Callable[..., TabletServerRegistry]
) -> None:
    registry = registries(session_timeout_ms=4_000)
    observer = registries()
    registry.register(server(5, "127.0.0.1", 9123))
    live = {5: node(5, "127.0.0.1", 9123)}
    wait_until(lambda: observer.live() == live, "the server live")
    old_session = registry._client.client_id
    assert old_session is not None
    # end the registry's session from outside, as a partition longer than the session timeout would
    intruder = KazooClient(hosts=zookeeper_server.address, client_id=old_session, timeout=10)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()
    wait_until(
        lambda: registry._client.client_id is not None and registry._client.client_id[0] != old_session[0],
        "a new session",
    )

    def registered_by_new_session() -> bool:
        stat = observer._client.exists(f"{observer._ids_path}/5")
        session = registry._client.client_id
        return stat is not None and session is not None and stat.ephemeralOwner == session[0]

    wait_until(registered_by_new_session, "the node created again by the new session")
    wait_until(lambda: observer.live() == live, "the server live again")
    wait_until(lambda: registry.live() == live, "the server live in its own view")
    # the node belongs to the new session: a duplicate is still refused
    with pytest.raises(InvalidConfigError):
        observer.register(server(5, "127.0.0.1", 9999))


def test_live_servers_are_named_by_their_internal_listener(registries: Callable[..., TabletServerRegistry]) -> None:
    """Every listener is registered; the others reach a server at its ``internal.listener.name`` endpoint, and
    a server registered without that listener is left out (no one could reach it)."""
    registering, observer = registries(), registries(internal_listener="INTERNAL")
    both = (Endpoint("CLIENT", "public.example", 9123), Endpoint("INTERNAL", "10.0.0.1", 9124))
    registering.register(RegisteredServer(1, both))
    registering.register(RegisteredServer(2, (Endpoint("CLIENT", "public.example", 9125),)))
    wait_until(lambda: set(observer._client.get_children(observer._ids_path)) == {"1", "2"}, "both registered")
    wait_until(lambda: observer.live() == {1: ServerNode(1, "10.0.0.1", 9124, both)}, "server 1 at its internal endpoint")
    assert registering.live() == {}  # neither has a FLUSS listener
    assert observer.live()[1].for_listener("CLIENT") == ServerNode(1, "public.example", 9123)


def test_flusss_registration_versions_decode() -> None:
    from strom.membership.contract import decode_registration

    v1 = b'{"version":1,"host":"h1","port":9123,"register_timestamp":5}'
    assert decode_registration(1, v1).endpoints == (Endpoint("FLUSS", "h1", 9123),)
    v4 = (b'{"version":4,"listeners":"CLIENT://[::1]:9123,FLUSS://h:9124","register_timestamp":5,'
          b'"rack":"r1","cpu_cores":8.0,"memory_bytes":1024}')
    decoded = decode_registration(2, v4)
    assert decoded.endpoints == (Endpoint("CLIENT", "::1", 9123), Endpoint("FLUSS", "h", 9124))
    assert decoded.register_timestamp_ms == 5
    assert str(decoded.endpoints[0]) == "CLIENT://[::1]:9123"
    assert decoded.rack == "r1"
    assert decode_registration(1, v1).rack is None


def test_a_rack_round_trips_through_the_registration_and_reaches_the_metadata() -> None:
    from strom.membership.contract import decode_registration, encode_registration

    endpoints = (Endpoint("FLUSS", "h", 9124),)
    racked = decode_registration(3, encode_registration(RegisteredServer(3, endpoints, "eu-1a")))
    assert racked.rack == "eu-1a" and json.loads(encode_registration(racked))["rack"] == "eu-1a"
    node = racked.node("FLUSS")
    assert node is not None and node.rack == "eu-1a" and node.to_pb().rack == "eu-1a"
    assert node.for_listener("FLUSS") == ServerNode(3, "h", 9124, rack="eu-1a")
    plain = decode_registration(4, encode_registration(RegisteredServer(4, endpoints)))
    assert plain.rack is None and "rack" not in json.loads(encode_registration(plain))
    assert not plain.node("FLUSS").to_pb().HasField("rack")  # type: ignore[union-attr]
