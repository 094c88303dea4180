"""The KV tests run once per RocksDB binding built here: strom's native one and rocksdict, its fallback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strom.kv import rocksdb

BINDINGS = ("native", "rocksdict") if rocksdb.NATIVE_AVAILABLE else ("rocksdict",)
PER_BINDING_MODULES = {
    "test_kv_tablet", "test_merge_engines", "test_rocksdb_crash_consistency", "test_scanner_manager",
    "test_rocksdb_binding", "test_kv_tablet_writer", "test_backpressure", "test_standby", "test_rocksdb_options",
}
"""The modules whose tests open RocksDB."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.module.__name__.rsplit(".", 1)[-1] in PER_BINDING_MODULES:
        metafunc.fixturenames.append("rocksdb_binding")
        metafunc.parametrize("rocksdb_binding", BINDINGS, indirect=True)


@pytest.fixture
def rocksdb_binding(request: pytest.FixtureRequest) -> Iterator[str]:
    """The binding the test's databases open with (the process's choice is restored afterwards)."""
    before = rocksdb.binding()
    rocksdb.use_binding(request.param)
    try:
        yield request.param
    finally:
        rocksdb.use_binding(before)
