"""A PutKv whose old values the row cache lacks reads them on a writer thread before its turn
(strom/kv/read_ahead.py): while the read is in flight the server serves other tables, and the PutKv
requests for its bucket that arrive meanwhile append after it, in the order they were sent.

The server runs in this process with the row cache off (every key's old value comes from RocksDB) and a
RocksDB writer whose reads wait until the test releases them, so the order of events is fixed and nothing
is timed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio

from strom.client import Connection, Lookuper, TablePath
from strom.kv import kv_tablet
from strom.server.node import StromServer
from tests.kv.test_kv_tablet_writer import HOLD_S
from tests.server.test_lookup_reads_off_loop import COLD, FIELDS, HOT, ROWS, _table, server_writing_with

pytestmark = pytest.mark.asyncio


class EachHeld(ThreadPoolExecutor):
    """A RocksDB writer whose reads (``kv_tablet._read_database``) each wait for their own release once
    :attr:`holding` is set; writes pass."""

    def __init__(self) -> None:
        super().__init__(4, thread_name_prefix="test-each-held")
        self.holding = False
        self.waiting: list[threading.Event] = []
        self.done: list[threading.Event] = []
        self.arrived = threading.Semaphore(0)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if fn is not kv_tablet._read_database or not self.holding:
            return super().submit(fn, *args, **kwargs)
        release, done = threading.Event(), threading.Event()
        self.waiting.append(release)
        self.done.append(done)

        def held() -> Any:
            self.arrived.release()
            release.wait(HOLD_S)
            try:
                return fn(*args, **kwargs)
            finally:
                done.set()

        return super().submit(held)

    def release_all(self) -> None:
        for release in self.waiting:
            release.set()


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[StromServer, EachHeld]]:
    """An in-process server without a row cache whose reads wait for the test once it says so."""
    held = EachHeld()
    async with server_writing_with(tmp_path, held) as server:
        try:
            yield server, held
        finally:
            held.holding = False
            held.release_all()  # before the server stops: a held read would hold up its stop


def _rows(ids: range, name: str) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"{name}{i}" for i in ids]}, schema=FIELDS)


async def _changelog(connection: Connection, path: TablePath, start: int) -> list[tuple[str, int, str]]:
    """Bucket 0's changelog from ``start`` to its end: (change, id, name)."""
    table = await connection.get_table(path)
    scanner = table.new_scan().create_log_scanner()
    scanner.subscribe(0, start)
    changes: list[tuple[str, int, str]] = []
    short = {0: "+A", 1: "+I", 2: "-U", 3: "+U", 4: "-D"}
    for _ in range(50):
        for batch in await scanner.poll(1_000):
            assert batch.change_types is not None
            changes += [(short[kind], row["id"], row["name"])
                        for kind, row in zip(batch.change_types, batch.batch.to_pylist(), strict=True)]
        if len(changes) >= 4 * ROWS:
            break
    return changes


async def test_a_put_reading_its_old_values_leaves_the_loop_to_others_and_keeps_its_order(
        served: tuple[StromServer, EachHeld]) -> None:
    """Two puts of the same keys by one writer, each reading ahead; the second's read ends first, yet it
    appends after the first: each key's changelog is n -> second -> third, and the table ends at third."""
    server, held = served
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        cold_table = await _table(connection, COLD, buckets=1)
        hot_table = await _table(connection, HOT, buckets=1)
        assert ROWS >= kv_tablet.OFF_LOOP_READ_MIN_KEYS
        held.holding = True

        writer = cold_table.new_upsert().create_writer()
        first = asyncio.ensure_future(writer.upsert_batch(_rows(range(ROWS), "second")))
        assert await asyncio.to_thread(held.arrived.acquire, True, HOLD_S)  # its read waits on a thread
        second = asyncio.ensure_future(writer.upsert_batch(_rows(range(ROWS), "third")))
        assert await asyncio.to_thread(held.arrived.acquire, True, HOLD_S)
        # one key: read on the loop, and this bucket waits for nothing
        hot_writer = hot_table.new_upsert().create_writer()
        await hot_writer.upsert_batch(_rows(range(7, 8), "changed"))
        await hot_writer.flush()
        hot = hot_table.new_lookup().create_lookuper()
        assert isinstance(hot, Lookuper)
        assert await hot.lookup({"id": 7}) == {"id": 7, "name": "changed7"}
        assert not first.done() and not second.done()

        held.waiting[1].set()  # the second's read ends first, and reaches the loop
        assert await asyncio.to_thread(held.done[1].wait, HOLD_S)
        assert await hot.lookup({"id": 7}) == {"id": 7, "name": "changed7"}
        assert not first.done() and not second.done()  # it waits for the first, in arrival order
        held.holding = False
        held.release_all()
        await asyncio.gather(first, second)
        await writer.flush()
        cold = cold_table.new_lookup().create_lookuper()
        assert isinstance(cold, Lookuper)
        assert await cold.lookup({"id": 3}) == {"id": 3, "name": "third3"}
        changes = await _changelog(connection, COLD, ROWS)
        assert changes == [
            *[entry for i in range(ROWS) for entry in (("-U", i, f"n{i}"), ("+U", i, f"second{i}"))],
            *[entry for i in range(ROWS) for entry in (("-U", i, f"second{i}"), ("+U", i, f"third{i}"))],
        ]
        assert server.replicas is not None
        (replica,) = [r for r in server.replicas.hosted() if r.table.path == COLD]
        assert replica.kv_if_open is not None
        assert replica.kv_if_open.reads_ahead.read == 2, "each put read once: none was refused as out of order"


async def test_a_lookup_that_inserts_missing_keys_reads_them_off_the_loop(
        served: tuple[StromServer, EachHeld]) -> None:
    """``insert_if_not_exists``: the lookup's read of keys the cache lacks waits on a writer thread while the
    server serves another table; then the missing keys are inserted and every key answered."""
    server, held = served
    async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
        cold_table = await _table(connection, COLD, buckets=1)
        hot_table = await _table(connection, HOT, buckets=1)
        held.holding = True
        inserting = cold_table.new_lookup().insert_if_not_exists().create_lookuper()
        assert isinstance(inserting, Lookuper)
        wanted = list(range(ROWS - 50, ROWS + 50))  # 50 stored rows, 50 keys to insert
        reading = asyncio.ensure_future(inserting.lookup_arrow(pa.table({"id": pa.array(wanted, pa.int64())})))
        assert await asyncio.to_thread(held.arrived.acquire, True, HOLD_S)
        hot = hot_table.new_lookup().create_lookuper()
        assert isinstance(hot, Lookuper)
        assert await hot.lookup({"id": 9}) == {"id": 9, "name": "n9"}
        assert not reading.done()
        held.holding = False
        held.release_all()
        found = await reading
        assert found.to_pylist() == [{"id": i, "name": f"n{i}" if i < ROWS else None} for i in wanted]
        plain = cold_table.new_lookup().create_lookuper()
        assert isinstance(plain, Lookuper)
        assert await plain.lookup({"id": ROWS + 7}) == {"id": ROWS + 7, "name": None}
