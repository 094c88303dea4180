"""A lookup that must read RocksDB reads it off the event loop: while its read is in flight the server
answers other lookups and acknowledges writes, and the lookup is answered once its read is done.

The server runs in this process with the row cache off (every lookup reads RocksDB) and a RocksDB writer
whose lookup reads wait until the test releases them, so the order of events is fixed and nothing is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio

from strom.client import Connection, Lookuper, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.kv import kv_tablet, rocksdb
from strom.server.node import StromServer
from tests.kv.test_kv_tablet_writer import HOLD_S, HeldReads

pytestmark = pytest.mark.asyncio

COLD = TablePath("fluss", "cold")
HOT = TablePath("fluss", "hot")
ROWS = 400
FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])


@contextlib.asynccontextmanager
async def server_writing_with(tmp_path: Path, writer: ThreadPoolExecutor) -> AsyncIterator[StromServer]:
    """An in-process server without a row cache whose buckets read and write RocksDB on ``writer`` (which the
    test controls); ``writer`` is shut down at the end."""
    assert rocksdb.NATIVE_AVAILABLE, "reads run off the loop with the native binding, which the suite builds"
    server = StromServer(tmp_path / "data", "127.0.0.1", 0,
                         Configuration({"kv.row-cache.size": "0", "kv.snapshot.interval": "0s"}))
    await server.start()
    assert server.replicas is not None and server.replicas.rocksdb_writer is not None
    real_writer = server.replicas.rocksdb_writer
    server.replicas.rocksdb_writer = writer  # buckets take it as they open, after this
    try:
        yield server
    finally:
        await server.stop()
        writer.shutdown(wait=True)
        real_writer.shutdown(wait=True)


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[StromServer, HeldReads]]:
    """An in-process server without a row cache whose lookup reads wait for the test."""
    held = HeldReads(hold_after_read=False)
    async with server_writing_with(tmp_path, held) as server:
        try:
            yield server, held
        finally:
            held.release.set()  # before the server stops: a held read would hold up its stop


async def _table(connection: Connection, path: TablePath, buckets: int) -> Any:
    await connection.get_admin().create_table(path, TableDescriptor(Schema.from_arrow(FIELDS, ["id"]),
                                                                    bucket_count=buckets))
    table = await connection.get_table(path)
    writer = table.new_upsert().create_writer()
    writer.upsert_arrow_batch(pa.table({"id": list(range(ROWS)), "name": [f"n{i}" for i in range(ROWS)]},
                                       schema=FIELDS))
    await writer.flush()
    return table


async def test_a_lookup_reading_rocksdb_leaves_the_loop_to_other_requests(
        served: tuple[StromServer, HeldReads]) -> None:
    server, held = served
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        cold_table = await _table(connection, COLD, buckets=2)
        hot_table = await _table(connection, HOT, buckets=1)
        cold = cold_table.new_lookup().create_lookuper()
        hot = hot_table.new_lookup().create_lookuper()
        assert isinstance(cold, Lookuper) and isinstance(hot, Lookuper)
        wanted = [*range(0, ROWS, 2), *range(ROWS, ROWS + 50)]  # 200 rows and 50 keys without one
        assert len(wanted) // 2 >= kv_tablet.OFF_LOOP_READ_MIN_KEYS  # each bucket reads off the loop

        reading = asyncio.ensure_future(cold.lookup_arrow(pa.table({"id": pa.array(wanted, pa.int64())})))
        assert await asyncio.to_thread(held.holding.wait, HOLD_S)
        # the cold lookup's reads wait for the test; the server goes on serving meanwhile
        assert await hot.lookup({"id": 7}) == {"id": 7, "name": "n7"}
        writer = hot_table.new_upsert().create_writer()
        await writer.upsert_batch(pa.table({"id": [7], "name": ["changed"]}, schema=FIELDS))
        await writer.flush()
        assert await hot.lookup({"id": 7}) == {"id": 7, "name": "changed"}
        assert not reading.done()

        held.release.set()
        found = await reading
        assert found.to_pylist() == [{"id": i, "name": f"n{i}"} for i in range(0, ROWS, 2)]


async def test_a_blocking_lookuper_and_many_keys_read_off_the_loop_agree_with_the_rows(
        served: tuple[StromServer, HeldReads]) -> None:
    """Without holding: batched lookups of many absent and present keys across buckets, read off the loop,
    answer exactly the rows; single lookups (read on the loop) agree with them."""
    server, held = served
    held.release.set()
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        table = await _table(connection, COLD, buckets=3)
        lookuper = table.new_lookup().create_lookuper()
        assert isinstance(lookuper, Lookuper)
        keys = list(range(-100, ROWS + 100, 3))
        found = await lookuper.lookup_arrow(pa.table({"id": pa.array(keys, pa.int64())}))
        assert found.to_pylist() == [{"id": i, "name": f"n{i}"} for i in keys if 0 <= i < ROWS]
        assert held.holding.is_set()  # they did go through the writer's threads

        def singles() -> list[Any]:
            with table.new_lookup().create_blocking_lookuper() as blocking:
                return [blocking.lookup({"id": i}) for i in (-1, 0, 299, ROWS)]

        assert await asyncio.to_thread(singles) == [None, {"id": 0, "name": "n0"}, {"id": 299, "name": "n299"}, None]

