"""Which backend keeps a cluster's metadata and membership: ZooKeeper (``zookeeper.address``, any number of
machines) or, for processes on one machine, a shared SQLite file (``metadata.sqlite.path``, what
``strom server --workers N`` sets). The ZooKeeper room is imported only when ZooKeeper is asked for, so the
one-machine cluster runs without kazoo installed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from strom.config import (
    METADATA_SQLITE_PATH,
    ZOOKEEPER_ADDRESS,
    ZOOKEEPER_SESSION_TIMEOUT,
    Configuration,
    zookeeper_location,
)
from strom.errors import InvalidConfigError
from strom.membership.contract import BucketStates, CoordinatorDirectory, ServerRegistry
from strom.membership.local_membership import (
    LocalBucketStates,
    LocalCoordinatorDirectory,
    LocalServerRegistry,
)
from strom.metadata.store import MetadataStore
from strom.server.metadata_stores import open_store

if TYPE_CHECKING:
    from strom.zk.login import ZooKeeperLogin


class ClusterMembership(ABC):
    """Opens a cluster process's metadata store and membership objects on one backend."""

    description: str
    """How start-up lines name the backend: ``ZooKeeper host:port`` or ``SQLite file <path>``."""

    @abstractmethod
    def open_store(self) -> MetadataStore: ...

    @abstractmethod
    def registry(self, internal_listener: str) -> ServerRegistry: ...

    @abstractmethod
    def coordinator_directory(self, internal_listener: str,
                              on_deposed: Callable[[], None] | None = None) -> CoordinatorDirectory: ...

    @abstractmethod
    def bucket_states(self, registry: ServerRegistry) -> BucketStates:
        """The bucket states (on ZooKeeper, through the registry's client and session)."""

    @property
    def registration_expiry_s(self) -> float:
        """How long the registration of a crashed process may outlive it (a restart waits that long)."""
        return 0.0


class ZooKeeperMembership(ClusterMembership):
    def __init__(self, address: str, config: Configuration) -> None:
        from strom.zk.login import ZooKeeperLogin

        self.address = address
        self.description = f"ZooKeeper {address}"
        self._login: ZooKeeperLogin = ZooKeeperLogin.from_config(config)
        self._session_ms = config.get_ms(ZOOKEEPER_SESSION_TIMEOUT)

    def open_store(self) -> MetadataStore:
        return open_store("zookeeper", self.address, self._login)

    def registry(self, internal_listener: str) -> ServerRegistry:
        from strom.zk.registry import TabletServerRegistry

        return TabletServerRegistry(self.address, self._session_ms, internal_listener, self._login)

    def coordinator_directory(self, internal_listener: str,
                              on_deposed: Callable[[], None] | None = None) -> CoordinatorDirectory:
        from strom.zk.coordinator_address import CoordinatorAddress

        return CoordinatorAddress(self.address, self._session_ms, internal_listener, self._login, on_deposed)

    def bucket_states(self, registry: ServerRegistry) -> BucketStates:
        from strom.zk.bucket_state import ZooKeeperBucketStates
        from strom.zk.registry import TabletServerRegistry

        assert isinstance(registry, TabletServerRegistry)
        return ZooKeeperBucketStates(registry.client, registry.root)

    @property
    def registration_expiry_s(self) -> float:
        return self._session_ms / 1000


class LocalMembership(ClusterMembership):
    """Processes on one machine sharing the embedded store's SQLite file (no session timeout: a registration
    ends with its process)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.description = f"SQLite file {path}"

    def open_store(self) -> MetadataStore:
        return open_store("sqlite", self.path)

    def registry(self, internal_listener: str) -> ServerRegistry:
        return LocalServerRegistry(self.path, internal_listener)

    def coordinator_directory(self, internal_listener: str,
                              on_deposed: Callable[[], None] | None = None) -> CoordinatorDirectory:
        return LocalCoordinatorDirectory(self.path, internal_listener, on_deposed)

    def bucket_states(self, registry: ServerRegistry) -> BucketStates:
        return LocalBucketStates(self.path)


def cluster_membership(config: Configuration) -> ClusterMembership:
    """The backend ``config`` names: ZooKeeper when ``zookeeper.address`` is set, else the SQLite file of
    ``metadata.sqlite.path``.

    Raises:
        InvalidConfigError: neither is set.
    """
    address = zookeeper_location(config)
    if address:
        return ZooKeeperMembership(address, config)
    path = config.get(METADATA_SQLITE_PATH)
    if path:
        return LocalMembership(path)
    raise InvalidConfigError(
        f"a cluster keeps its metadata in ZooKeeper (set {ZOOKEEPER_ADDRESS.key}) or, with every process on one "
        f"machine, in a shared SQLite file (set {METADATA_SQLITE_PATH.key}; `strom server --workers N` does)"
    )


__all__ = ["ClusterMembership", "LocalMembership", "ZooKeeperMembership", "cluster_membership"]
