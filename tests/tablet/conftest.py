"""Fixtures of the tablet tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strom.kv import rocksdb


@pytest.fixture
def binding_kept() -> Iterator[None]:
    """A ReplicaManager picks the process's binding from its configuration: put back the one before."""
    before = rocksdb.binding()
    try:
        yield
    finally:
        rocksdb.use_binding(before)
