"""A real ZooKeeper for the metadata tests: one server per test worker, a fresh root per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from strom.cluster.zookeeper_server import ZooKeeperServer, unavailable_reason


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper on a free loopback port; skips only when ZooKeeper is not installed."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


@pytest.fixture
def zookeeper_location(zookeeper_server: ZooKeeperServer) -> str:
    """``host:port/root`` with a root no other test uses."""
    return f"{zookeeper_server.address}/strom-test-{uuid.uuid4().hex[:12]}"
