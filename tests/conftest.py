"""Shared fixtures: real strom servers on loopback ports, and official pyfluss connections to them."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from strom.zk.zookeeper_server import ZooKeeperServer, unavailable_reason
from tests.server_process import ServerProcess

_names = itertools.count()


def unique_name(prefix: str = "t") -> str:
    """Table and database names unique within a test run (tests share a server per worker)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw")
    return f"{prefix}_{worker}_{os.getpid()}_{next(_names)}"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server per test worker, shared by tests that only need a running server."""
    process = ServerProcess(tmp_path_factory.mktemp("shared") / "data", {"kv.snapshot.interval": "0s"}).start()
    yield process
    code = process.stop()
    errors = process.internal_errors()
    assert not errors, f"the shared server logged broken invariants: {errors[:5]}"
    assert code == 0, f"the shared server exited with {code} on SIGTERM:\n{process.log_text()[-3000:]}"


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    """Start dedicated servers (for restarts and crashes); all are stopped at the end of the test."""
    started: list[ServerProcess] = []

    def start(config: dict[str, str] | None = None, data_dir: Path | None = None, port: int | None = None) -> ServerProcess:
        process = ServerProcess(data_dir or tmp_path / f"data{len(started)}", config, port).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
        errors = process.internal_errors()
        assert not errors, f"server logged broken invariants: {errors[:5]}"


@pytest_asyncio.fixture
async def fluss(server: ServerProcess) -> AsyncIterator[object]:
    """An official pyfluss connection to the shared server."""
    import fluss

    connection = await fluss.FlussConnection.create(fluss.Config({"bootstrap.servers": server.address}))
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper on a free loopback port, one per test worker; skips only when ZooKeeper is not
    installed (`make install` installs it)."""
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
