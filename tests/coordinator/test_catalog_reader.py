"""The catalog reader's three ways of reading: a complete catalog (the active coordinator) reads the store
once and never again; a tablet server's metadata cache reads a table once, again when told it changed or
once its bound passed; a reader without a cache reads the store each time. Store calls from coroutines run
off the event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from strom.coordinator.catalog import CatalogReader
from strom.coordinator.placement import SingleNodePlacement
from strom.errors import TableNotExistError
from strom.ids import TablePath
from strom.metadata.off_loop import on_event_loop
from strom.metadata.sqlite_store import SqliteMetadataStore
from strom.metadata.store import DatabaseRecord, MetadataStore
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import BigIntType
from strom.rpc.peers import ServerNode

pytestmark = pytest.mark.asyncio

TABLE_JSON = TableDescriptor(Schema.of([("id", BigIntType())]), bucket_count=1).to_json()
ORDERS = TablePath("db", "orders")


class CountingStore:
    """Counts table reads, and the reads made on an event loop."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self.table_reads = 0
        self.on_loop = 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not name.startswith("get_table"):
            return found

        def read(*args: Any) -> Any:
            self.table_reads += 1
            self.on_loop += on_event_loop()
            return found(*args)

        return read


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    sqlite = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    sqlite.create_database(DatabaseRecord("db", b"{}", 0, 0))
    sqlite.create_table("db", "orders", TABLE_JSON, 1, 0)
    return CountingStore(sqlite)


def _reader(store: CountingStore, **options: Any) -> CatalogReader:
    return CatalogReader(store, SingleNodePlacement(ServerNode(1, "127.0.0.1", 9123)), **options)  # type: ignore[arg-type]


async def test_a_complete_catalog_reads_the_store_once(store: CountingStore) -> None:
    catalog = _reader(store)
    await catalog.load()
    loaded = store.table_reads
    table = await catalog.resolve_table(ORDERS)
    assert catalog.table_info_by_id(table.table_id) is table
    with pytest.raises(TableNotExistError):
        await catalog.resolve_table(TablePath("db", "missing"))  # a miss is an answer, not a read
    assert store.table_reads == loaded and store.on_loop == 0


async def test_a_tablet_servers_cache_reads_a_table_again_when_told_or_once_its_bound_passed(
    store: CountingStore,
) -> None:
    catalog = _reader(store, cache_max_age_s=0.3)
    table = await catalog.resolve_table(ORDERS)
    assert catalog.table_info(ORDERS) is table and catalog.table_info_by_id(table.table_id) is table
    assert store.table_reads == 1  # the two sync lookups came from the cache

    store.update_table(table.table_id, TABLE_JSON, 5)  # altered: a new modified time
    assert catalog.table_info_by_id(table.table_id) is table  # no notice yet: the cached table
    catalog.forget_table(table.table_id)  # UpdateMetadata
    altered = await catalog.resolve_table_by_id(table.table_id)
    assert altered is not None and altered.modified_ms == 5 and store.table_reads == 2

    await asyncio.sleep(0.35)  # a lost notice costs at most the bound
    await catalog.resolve_table(ORDERS)
    assert store.table_reads == 3

    store.drop_table(table.table_id)
    catalog.forget_all()  # a new coordinator
    with pytest.raises(TableNotExistError):
        await catalog.resolve_table(ORDERS)
    assert store.on_loop == 0  # every read of a coroutine ran on a store thread


async def test_without_a_cache_each_lookup_reads_the_store(store: CountingStore) -> None:
    catalog = _reader(store)
    await catalog.resolve_table(ORDERS)
    await catalog.resolve_table(ORDERS)
    assert store.table_reads == 2 and store.on_loop == 0
