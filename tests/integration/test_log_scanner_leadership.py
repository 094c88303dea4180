"""strom's log scanner while a bucket's leader cannot be read: it keeps polling the other buckets and asks
the metadata again (the leadership may be moving), and gives the error up only after LEADERSHIP_WAIT_S."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath, log_scanner
from strom.errors import ConnectionFailedError, NetworkError
from tests.conftest import unique_name

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def test_a_poll_waits_out_a_lost_leader_then_raises_its_error(
    server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_scanner, "LEADERSHIP_WAIT_S", 1.0)
    server = server_factory({"kv.snapshot.interval": "0s"})
    async with await Connection.create(server.address) as connection:
        path = TablePath("fluss", unique_name("scanned"))
        schema = Schema.from_arrow(pa.schema([("id", pa.int64())]))
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        await table.new_append().create_writer().append_arrow_batch(pa.table({"id": [1, 2, 3]})).wait()
        scanner = table.new_scan().create_log_scanner()
        scanner.subscribe(0, 0)
        assert [i for b in await scanner.poll(1000) for i in b.batch.column("id").to_pylist()] == [1, 2, 3]
        server.kill()
        started = time.monotonic()
        polls = 0
        with pytest.raises((ConnectionFailedError, NetworkError)):
            while polls < 100:
                assert await scanner.poll(100) == []  # no leader to read from: nothing, and no error yet
                polls += 1
        assert polls >= 1 and time.monotonic() - started >= 1.0


async def test_subscribing_a_bucket_the_table_does_not_have_fails_at_once(server: Any) -> None:
    async with await Connection.create(server.address) as connection:
        path = TablePath("fluss", unique_name("scanned"))
        schema = Schema.from_arrow(pa.schema([("id", pa.int64())]))
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2))
        scanner = (await connection.get_table(path)).new_scan().create_log_scanner()
        with pytest.raises(ValueError, match="has buckets 0 to 1, not 2"):
            scanner.subscribe(2, 0)
