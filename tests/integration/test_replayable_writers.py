"""Replayable writers against a real server: running the same writes again under the same writer identity
— whole, or after a first run that stopped part-way — leaves a log table, a primary-key table and an
aggregation table exactly as one run would; a later run (the next micro-batch) writes normally."""

from __future__ import annotations

import pyarrow as pa
import pytest

from strom.client import Connection, OffsetSpec, ReplayableWriterId, Schema, TableDescriptor, TablePath
from strom.records.log_batch import REPLAYABLE_WRITER_ID_MIN
from tests.conftest import unique_name
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])
BATCHES = [pa.table({"id": [i % 7 for i in range(s, s + 50)], "v": list(range(s, s + 50))}) for s in range(0, 500, 50)]
KINDS = {
    "log": ({}, None),
    "pk": ({}, ["id"]),
    "aggregation": ({"table.merge-engine": "aggregation", "fields.v.agg": "sum"}, ["id"]),
}


async def create(connection: Connection, kind: str) -> TablePath:
    properties, key = KINDS[kind]
    path = TablePath("fluss", unique_name(f"replay_{kind}"))
    schema = Schema.from_arrow(FIELDS, primary_key=key)
    await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=3, properties=properties))
    return path


async def run(connection: Connection, path: TablePath, identity: ReplayableWriterId, batches: list[pa.Table]) -> None:
    table = await connection.get_table(path)
    writer = (table.new_upsert() if table.layout.primary_key else table.new_append()).create_writer(identity)
    for batch in batches:
        handle = writer.upsert_arrow_batch(batch) if table.layout.primary_key else writer.append_arrow_batch(batch)
        await handle.wait()
    await writer.flush()


async def contents(connection: Connection, path: TablePath) -> list[tuple[int, int]]:
    """A log table's rows, or a primary-key table's current rows, sorted."""
    table = await connection.get_table(path)
    if table.layout.primary_key:
        found = await table.new_lookup().create_lookuper().lookup_arrow(pa.table({"id": list(range(7))}))
        return sorted(zip(found.column("id").to_pylist(), found.column("v").to_pylist(), strict=True))
    ends = await connection.get_admin().list_offsets(path, [0, 1, 2], OffsetSpec.latest())
    scanner = table.new_scan().create_log_scanner()
    scanner.subscribe_buckets({bucket: 0 for bucket in range(3)})
    rows: list[tuple[int, int]] = []
    while sum(ends.values()) > len(rows):
        for scanned in await scanner.poll(1000):
            rows += zip(scanned.batch.column("id").to_pylist(), scanned.batch.column("v").to_pylist(), strict=True)
    return sorted(rows)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_replayed_run_writes_nothing_twice(server: ServerProcess, kind: str) -> None:
    async with await Connection.create(server.address) as connection:
        once, replayed = await create(connection, kind), await create(connection, kind)
        identity = ReplayableWriterId(REPLAYABLE_WRITER_ID_MIN + 7, run=3)
        await run(connection, once, ReplayableWriterId(REPLAYABLE_WRITER_ID_MIN + 8, run=3), BATCHES)
        await run(connection, replayed, identity, BATCHES[:4])  # a first run that stopped part-way
        await run(connection, replayed, identity, BATCHES)  # the task runs again, from the start
        await run(connection, replayed, identity, BATCHES)  # and once more, whole
        assert await contents(connection, replayed) == await contents(connection, once)
        following = [pa.table({"id": [1, 2], "v": [1000, 2000]})]  # the next micro-batch: a later run
        await run(connection, replayed, ReplayableWriterId(identity.writer_id, run=4), following)
        await run(connection, once, ReplayableWriterId(REPLAYABLE_WRITER_ID_MIN + 8, run=4), following)
        assert await contents(connection, replayed) == await contents(connection, once)
        if kind == "log":
            assert len(await contents(connection, replayed)) == 502
        if kind == "aggregation":
            sums = dict(await contents(connection, replayed))
            assert sums[1] == sum(v for v in range(500) if v % 7 == 1) + 1000


async def test_identities_outside_the_replayable_range_are_refused() -> None:
    with pytest.raises(ValueError, match="2\\^62"):
        ReplayableWriterId(5)
    with pytest.raises(ValueError, match="run"):
        ReplayableWriterId(REPLAYABLE_WRITER_ID_MIN, run=-1)
