"""The tablet server registry on a real ZooKeeper: registration, the live view of other registries,
refused duplicate ids, departure on close and re-registration after a session expiry."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from strom.errors import InvalidConfigError
from strom.zk.metadata_store import parse_location
from strom.zk.registry import RegisteredServer, TabletServerRegistry
from strom.zk.zookeeper_server import ZooKeeperServer

WAIT_S = 10.0

pytestmark = pytest.mark.timeout(60)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.02)


@pytest.fixture
def registries(zookeeper_location: str) -> Iterator[Callable[..., TabletServerRegistry]]:
    """Opens registries on the test's root; closes them all at the end."""
    opened: list[TabletServerRegistry] = []

    def open_registry(**kwargs: int) -> TabletServerRegistry:
        registry = TabletServerRegistry(zookeeper_location, **kwargs)
        opened.append(registry)
        return registry

    yield open_registry
    for registry in opened:
        registry.close()


def test_registered_servers_are_live_in_every_registry(registries: Callable[..., TabletServerRegistry]) -> None:
    first, second, observer = registries(), registries(), registries()
    assert observer.live() == {}
    a = RegisteredServer(1, "127.0.0.1", 9123)
    b = RegisteredServer(2, "10.0.0.2", 9124)
    first.register(a)
    second.register(b)
    for registry in (first, second, observer):
        wait_until(lambda: registry.live() == {1: a, 2: b}, "both servers live")  # noqa: B023 (used at once)


def test_the_registration_is_an_ephemeral_node_at_flusss_path(
    zookeeper_location: str, registries: Callable[..., TabletServerRegistry]
) -> None:
    registry = registries()
    registry.register(RegisteredServer(7, "host-7", 9123))
    hosts, root = parse_location(zookeeper_location)
    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    try:
        data, stat = client.get(f"{root}/tabletservers/ids/7")
        assert json.loads(data) == {"host": "host-7", "port": 9123}
        assert stat.ephemeralOwner != 0
    finally:
        client.stop()
        client.close()


def test_a_duplicate_id_is_refused_while_its_holder_lives(registries: Callable[..., TabletServerRegistry]) -> None:
    first, second = registries(), registries()
    first.register(RegisteredServer(3, "127.0.0.1", 9123))
    with pytest.raises(InvalidConfigError) as refused:
        second.register(RegisteredServer(3, "127.0.0.1", 9999))
    assert str(refused.value) == "tablet-server.id 3 is already registered by a live tablet server at 127.0.0.1:9123"
    first.close()
    second.register(RegisteredServer(3, "127.0.0.1", 9999))
    wait_until(lambda: second.live() == {3: RegisteredServer(3, "127.0.0.1", 9999)}, "the new holder live")


def test_a_closed_registry_takes_its_server_out_of_the_others_live_view(
    registries: Callable[..., TabletServerRegistry],
) -> None:
    leaving, staying = registries(), registries()
    leaving.register(RegisteredServer(1, "127.0.0.1", 9123))
    staying.register(RegisteredServer(2, "127.0.0.1", 9124))
    wait_until(lambda: set(staying.live()) == {1, 2}, "both servers live")
    leaving.close()
    leaving.close()  # again: a no-op
    wait_until(lambda: set(staying.live()) == {2}, "the closed server gone")


def test_a_server_registers_again_after_its_session_expires(
    zookeeper_server: ZooKeeperServer, registries: Callable[..., TabletServerRegistry]
) -> None:
    registry = registries(session_timeout_ms=4_000)
    observer = registries()
    server = RegisteredServer(5, "127.0.0.1", 9123)
    registry.register(server)
    wait_until(lambda: observer.live() == {5: server}, "the server live")
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
    wait_until(lambda: observer.live() == {5: server}, "the server live again")
    wait_until(lambda: registry.live() == {5: server}, "the server live in its own view")
    # the node belongs to the new session: a duplicate is still refused
    with pytest.raises(InvalidConfigError):
        observer.register(RegisteredServer(5, "127.0.0.1", 9999))
