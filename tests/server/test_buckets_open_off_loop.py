"""The first write into a new table opens its buckets off the event loop: while their logs and RocksDB open
the server answers other lookups and acknowledges other writes, and the new table's writes are acknowledged,
in the order they were sent, once the buckets are open.

The server runs in this process with a bucket opener whose opens wait until the test releases them, so the
order of events is fixed and nothing is timed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio

from strom.client import Connection, Lookuper, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.kv import rocksdb
from strom.server.node import StromServer

pytestmark = pytest.mark.asyncio

HOT, NEW = TablePath("fluss", "hot"), TablePath("fluss", "new")
ROWS = 200
FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
HOLD_S = 30.0
"""The longest a held open waits (a failing test must not hang)."""


class HeldOpens(ThreadPoolExecutor):
    """A bucket opener whose opens wait for :attr:`release`."""

    def __init__(self) -> None:
        super().__init__(4, thread_name_prefix="test-held-opens")
        self.release = threading.Event()
        self.holding = threading.Event()
        """Set once an open waits for the release."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        def held() -> Any:
            self.holding.set()
            self.release.wait(HOLD_S)
            return fn(*args, **kwargs)

        return super().submit(held)


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[StromServer]:
    assert rocksdb.NATIVE_AVAILABLE, "buckets open ahead with the native binding, which the suite builds"
    served = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration({"kv.snapshot.interval": "0s"}))
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


def _rows(names: str) -> pa.Table:
    return pa.table({"id": list(range(ROWS)), "name": [f"{names}{i}" for i in range(ROWS)]}, schema=FIELDS)


async def _create(connection: Connection, path: TablePath, buckets: int) -> Any:
    await connection.get_admin().create_table(path, TableDescriptor(Schema.from_arrow(FIELDS, ["id"]),
                                                                    bucket_count=buckets))
    return await connection.get_table(path)


async def test_a_new_tables_first_writes_wait_for_its_buckets_off_the_loop(server: StromServer) -> None:
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        hot_table = await _create(connection, HOT, buckets=1)
        writer = hot_table.new_upsert().create_writer()
        writer.upsert_arrow_batch(_rows("h"))
        await writer.flush()
        hot = hot_table.new_lookup().create_lookuper()
        assert isinstance(hot, Lookuper)

        held = HeldOpens()
        assert server.replicas is not None and server.replicas.bucket_opener is not None
        real_opener, server.replicas.bucket_opener = server.replicas.bucket_opener, held
        try:
            new_table = await _create(connection, NEW, buckets=4)
            new_writer = new_table.new_upsert().create_writer()
            first = new_writer.upsert_arrow_batch(_rows("first"))  # sent at once, pipelined
            second = new_writer.upsert_arrow_batch(_rows("second"))
            assert await asyncio.to_thread(held.holding.wait, HOLD_S)
            # the new table's buckets wait to open; the server goes on serving meanwhile
            assert await hot.lookup({"id": 7}) == {"id": 7, "name": "h7"}
            await writer.upsert_batch(pa.table({"id": [7], "name": ["changed"]}, schema=FIELDS))
            await writer.flush()
            assert await hot.lookup({"id": 7}) == {"id": 7, "name": "changed"}
            waits = asyncio.ensure_future(asyncio.gather(first.wait(), second.wait()))
            await asyncio.sleep(0.05)
            assert not waits.done()

            held.release.set()
            await waits
            new = new_table.new_lookup().create_lookuper()
            assert isinstance(new, Lookuper)
            found = await new.lookup_arrow(pa.table({"id": pa.array(range(ROWS), pa.int64())}))
            assert found.to_pylist() == _rows("second").to_pylist()  # the second write, sent last, is the latest
        finally:
            held.release.set()
            held.shutdown(wait=True)
            server.replicas.bucket_opener = real_opener
