"""The first write into a new table opens its buckets off the event loop: while their logs and RocksDB open
the server answers other lookups and acknowledges other writes, and the new table's writes are acknowledged,
in the order they were sent, once the buckets are open. A log table's buckets open their logs so too, and
a restarted server's buckets so on its first lookup of them, replaying there what a crash left RocksDB
without.

The server runs in this process with a bucket opener whose opens wait until the test releases them, so the
order of events is fixed and nothing is timed.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio

from strom.client import Connection, Lookuper, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.ids import TableBucket
from strom.kv import changelog_replay, rocksdb
from strom.server.node import StromServer
from tests.tablet.test_open_ahead import HOLD_S, HeldOpener

pytestmark = pytest.mark.asyncio

HOT, NEW, EVENTS = TablePath("fluss", "hot"), TablePath("fluss", "new"), TablePath("fluss", "events")
ROWS = 200
FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])


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


async def _create(connection: Connection, path: TablePath, buckets: int, *, log_table: bool = False) -> Any:
    schema = Schema.from_arrow(FIELDS, None if log_table else ["id"])
    await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=buckets))
    return await connection.get_table(path)


@contextmanager
def _held(server: StromServer) -> Iterator[HeldOpener]:
    """The server's bucket opens wait for the test's release while in the block."""
    held = HeldOpener()
    assert server.replicas is not None and server.replicas.bucket_opener is not None
    real_opener, server.replicas.bucket_opener = server.replicas.bucket_opener, held
    try:
        yield held
    finally:
        held.release.set()
        held.shutdown(wait=True)
        server.replicas.bucket_opener = real_opener


async def _loaded(connection: Connection, path: TablePath, buckets: int) -> tuple[Any, Any]:
    """A primary-key table holding ``_rows(path.table_name)``, and the writer that wrote them."""
    table = await _create(connection, path, buckets)
    writer = table.new_upsert().create_writer()
    writer.upsert_arrow_batch(_rows(path.table_name))
    await writer.flush()
    return table, writer


async def _hot(connection: Connection) -> tuple[Lookuper, Any]:
    """The other table: a lookuper of it, and its writer."""
    table, writer = await _loaded(connection, HOT, buckets=1)
    lookuper = table.new_lookup().create_lookuper()
    assert isinstance(lookuper, Lookuper)
    return lookuper, writer


async def _restarted_lookupers(connection: Connection) -> tuple[Lookuper, Lookuper]:
    """Lookupers of HOT and NEW on a restarted server; HOT's bucket opened and answering."""
    hot = (await connection.get_table(HOT)).new_lookup().create_lookuper()
    new = (await connection.get_table(NEW)).new_lookup().create_lookuper()
    assert isinstance(hot, Lookuper) and isinstance(new, Lookuper)
    assert await hot.lookup({"id": 1}) == {"id": 1, "name": "hot1"}
    return hot, new


async def _still_waiting(*handles: Any) -> asyncio.Future[Any]:
    """The writes' acknowledgements, checked not to have come yet."""
    waits = asyncio.ensure_future(asyncio.gather(*(handle.wait() for handle in handles)))
    await asyncio.sleep(0.05)
    assert not waits.done()
    return waits


async def test_a_new_tables_first_writes_wait_for_its_buckets_off_the_loop(server: StromServer) -> None:
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        hot, writer = await _hot(connection)
        with _held(server) as held:
            new_table = await _create(connection, NEW, buckets=4)
            new_writer = new_table.new_upsert().create_writer()
            first = new_writer.upsert_arrow_batch(_rows("first"))  # sent at once, pipelined
            second = new_writer.upsert_arrow_batch(_rows("second"))
            assert await asyncio.to_thread(held.holding.wait, HOLD_S)
            # the new table's buckets wait to open; the server goes on serving meanwhile
            assert await hot.lookup({"id": 7}) == {"id": 7, "name": "hot7"}
            await writer.upsert_batch(pa.table({"id": [7], "name": ["changed"]}, schema=FIELDS))
            await writer.flush()
            assert await hot.lookup({"id": 7}) == {"id": 7, "name": "changed"}
            waits = await _still_waiting(first, second)
            held.release.set()
            await waits
        new = new_table.new_lookup().create_lookuper()
        assert isinstance(new, Lookuper)
        found = await new.lookup_arrow(pa.table({"id": pa.array(range(ROWS), pa.int64())}))
        assert found.to_pylist() == _rows("second").to_pylist()  # the second write, sent last, is the latest


async def test_a_new_log_tables_first_appends_wait_for_its_logs_off_the_loop(server: StromServer) -> None:
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        hot, _writer = await _hot(connection)
        with _held(server) as held:
            events = await _create(connection, EVENTS, buckets=3, log_table=True)
            writer = events.new_append().create_writer()
            first, second = writer.append_arrow_batch(_rows("first")), writer.append_arrow_batch(_rows("second"))
            assert await asyncio.to_thread(held.holding.wait, HOLD_S)
            assert await hot.lookup({"id": 3}) == {"id": 3, "name": "hot3"}
            waits = await _still_waiting(first, second)
            held.release.set()
            await waits
        assert server.replicas is not None
        table_id = events.layout.info.table_id
        ends = [server.replicas.get(TableBucket(table_id, bucket)).log.log_end_offset for bucket in range(3)]
        assert sum(ends) == 2 * ROWS


async def test_a_restarted_servers_first_lookups_wait_for_their_buckets_off_the_loop(tmp_path: Path) -> None:
    # remote log storage off: its first round would open every bucket right at the start (on threads too)
    config = Configuration({"kv.snapshot.interval": "0s", "remote.log.task-interval-duration": "0s"})
    first = StromServer(tmp_path / "data", "127.0.0.1", 0, config)
    await first.start()
    try:
        async with await Connection.create(f"127.0.0.1:{first.port}") as connection:
            await _loaded(connection, HOT, buckets=1)
            await _loaded(connection, NEW, buckets=4)
    finally:
        await first.stop()
    restarted = StromServer(tmp_path / "data", "127.0.0.1", 0, config)
    await restarted.start()
    try:
        async with await Connection.create(f"127.0.0.1:{restarted.port}") as connection:
            hot, new = await _restarted_lookupers(connection)
            with _held(restarted) as held:
                reading = asyncio.ensure_future(new.lookup_arrow(pa.table({"id": pa.array(range(ROWS), pa.int64())})))
                assert await asyncio.to_thread(held.holding.wait, HOLD_S)
                assert await hot.lookup({"id": 2}) == {"id": 2, "name": "hot2"}  # served while NEW's buckets open
                assert not reading.done()
                held.release.set()
                assert (await reading).to_pylist() == _rows("new").to_pylist()
    finally:
        await restarted.stop()


async def test_a_crashed_buckets_changelog_replays_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RocksDB came back at its last flush (a crash; WAL off): the restarted server replays the changelog
    since on the thread that opens the bucket, answering another table meanwhile."""
    config = Configuration({"kv.snapshot.interval": "0s", "remote.log.task-interval-duration": "0s"})

    async def run(write: Callable[[Connection], Awaitable[None]]) -> None:
        served = StromServer(tmp_path / "data", "127.0.0.1", 0, config)
        await served.start()
        try:
            async with await Connection.create(f"127.0.0.1:{served.port}") as connection:
                await write(connection)
        finally:
            await served.stop()

    async def first(connection: Connection) -> None:
        await _loaded(connection, HOT, buckets=1)
        await _loaded(connection, NEW, buckets=2)

    async def second(connection: Connection) -> None:
        writer = (await connection.get_table(NEW)).new_upsert().create_writer()
        writer.upsert_arrow_batch(_rows("second"))
        await writer.flush()

    await run(first)
    flushed = {kv: tmp_path / f"flushed-{i}" for i, kv in enumerate((tmp_path / "data").glob("tablets/fluss/new-*/*/kv"))}
    assert len(flushed) == 2
    for kv, copy in flushed.items():
        shutil.copytree(kv, copy)
    await run(second)
    for kv, copy in flushed.items():  # RocksDB as a crash leaves it: without what came after its flush
        shutil.rmtree(kv)
        shutil.copytree(copy, kv)

    replaying, release = threading.Event(), threading.Event()
    threads: list[str] = []
    real = changelog_replay.catch_up_opened

    def held(database: Any, log: Any, row_format: Any, written: Any = None) -> int:
        if log.directory.parent.parent.name.startswith("new-"):  # NEW's buckets wait for the test
            threads.append(threading.current_thread().name)
            replaying.set()
            release.wait(HOLD_S)
        return real(database, log, row_format, written)

    monkeypatch.setattr(changelog_replay, "catch_up_opened", held)
    restarted = StromServer(tmp_path / "data", "127.0.0.1", 0, config)
    await restarted.start()
    try:
        async with await Connection.create(f"127.0.0.1:{restarted.port}") as connection:
            hot, new = await _restarted_lookupers(connection)
            reading = asyncio.ensure_future(new.lookup_arrow(pa.table({"id": pa.array(range(ROWS), pa.int64())})))
            try:
                assert await asyncio.to_thread(replaying.wait, HOLD_S)
                assert await hot.lookup({"id": 2}) == {"id": 2, "name": "hot2"}  # served while NEW replays
                assert not reading.done()
            finally:
                release.set()
            assert (await reading).to_pylist() == _rows("second").to_pylist()
        assert threads and all(name.startswith("strom-bucket-open") for name in threads)
    finally:
        release.set()
        await restarted.stop()
