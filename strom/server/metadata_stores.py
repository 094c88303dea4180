"""Which metadata store a server opens, by name: the embedded SQLite file or ZooKeeper.

The registry sits above the :class:`~strom.metadata.store.MetadataStore` contract and its backends, and
imports a backend only when it is asked for, so ``strom server`` on the embedded store runs without
ZooKeeper's client installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from strom.errors import NotInstalledError
from strom.metadata.store import MetadataStore

if TYPE_CHECKING:  # the ZooKeeper room loads only when a ZooKeeper store is opened
    from strom.zk.login import ZooKeeperLogin


def _open_sqlite(location: str, login: ZooKeeperLogin | None = None) -> MetadataStore:
    from strom.metadata.sqlite_store import SqliteMetadataStore

    return SqliteMetadataStore(location)


def _open_zookeeper(location: str, login: ZooKeeperLogin | None = None) -> MetadataStore:
    try:
        from strom.zk.metadata_store import ZooKeeperMetadataStore
    except ImportError as exc:
        raise NotInstalledError("ZooKeeper support not installed: pip install 'strom[zookeeper]'") from exc
    return ZooKeeperMetadataStore(location, login=login)


STORES: dict[str, Callable[[str, ZooKeeperLogin | None], MetadataStore]] = {
    "sqlite": _open_sqlite, "zookeeper": _open_zookeeper,
}
"""Store name -> opener taking the store's location (and, for ZooKeeper, how to log in)."""


def open_store(kind: str, location: str, login: ZooKeeperLogin | None = None) -> MetadataStore:
    """Open the backend ``kind`` at ``location`` ("sqlite": a file path; "zookeeper": ``host:port[/root]``,
    the root ``/fluss`` when none is given; ``login``: ZooKeeper's digest identity and TLS).

    Raises:
        ValueError: an unknown ``kind``.
        NotInstalledError: the backend's library is not installed.
    """
    try:
        opener = STORES[kind]
    except KeyError:
        raise ValueError(f"unknown metadata store {kind!r}; choose one of {sorted(STORES)}") from None
    return opener(location, login)


__all__ = ["STORES", "open_store"]
