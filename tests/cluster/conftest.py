"""The cluster tests use the metadata tests' real ZooKeeper (one server per worker, a fresh root per test)."""

from tests.metadata.conftest import zookeeper_location, zookeeper_server

__all__ = ["zookeeper_location", "zookeeper_server"]
