"""Compressed ARROW log batches through a real server and the official client: a primary-key table's
changelog, compressed by the server, and a log table's appends, compressed by strom's client, each at the
codec and ZSTD level the table names, are read back whole by pyfluss (arrow-rs) and by strom's client."""

from __future__ import annotations

from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.records import log_batch
from tests.conftest import unique_name
from tests.integration.pyfluss_support import change_types, changelog, poll_arrow

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

ROWS = 3_000
FIELDS = [pa.field("id", pa.int32()), pa.field("name", pa.string()), pa.field("score", pa.float64())]
COMPRESSIONS = [
    {},  # Fluss's default: ZSTD at level 3
    {"table.log.arrow.compression.zstd.level": "12"},
    {"table.log.arrow.compression.type": "LZ4_FRAME"},
]


def _row(i: int, round_: int) -> dict[str, Any]:
    return {"id": i, "name": f"name-{i % 97}-{round_}" * 2, "score": i / 7 + round_}


@pytest.mark.parametrize("properties", COMPRESSIONS)
async def test_pyfluss_reads_a_changelog_the_server_compressed(
    server: Any, fluss: Any, properties: dict[str, str]
) -> None:
    """Written with strom's client: pyfluss 1.0 refuses to write a table whose ZSTD level is not 3."""
    path = TablePath("fluss", unique_name("compressed_changelog"))
    schema = pa.schema([FIELDS[0].with_nullable(False), *FIELDS[1:]])
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(
            Schema.from_arrow(schema, primary_key=["id"]), bucket_count=1, properties=properties))
        writer = (await connection.get_table(path)).new_upsert().create_writer()
        for round_ in (0, 1):  # inserts, then an update of every row: +I, then -U/+U pairs
            writer.upsert_arrow_batch(pa.RecordBatch.from_pylist([_row(i, round_) for i in range(ROWS)], schema=schema))
            await writer.flush()
    table = await fluss.get_table(pyfluss.TablePath(path.database_name, path.table_name))
    records = await changelog(table, 3 * ROWS)
    inserts, updates = records[:ROWS], records[ROWS:]
    assert change_types(inserts) == ["+I"] * ROWS and change_types(updates) == ["-U", "+U"] * ROWS
    assert [dict(r.row) for r in inserts] == [_row(i, 0) for i in range(ROWS)]
    assert [dict(r.row) for r in updates] == [row for i in range(ROWS) for row in (_row(i, 0), _row(i, 1))]


@pytest.mark.parametrize("properties", COMPRESSIONS)
async def test_appends_strom_compressed_read_back_in_pyfluss_and_strom(
    server: Any, fluss: Any, properties: dict[str, str]
) -> None:
    path = TablePath("fluss", unique_name("compressed_appends"))
    schema = pa.schema(FIELDS)
    batch = pa.RecordBatch.from_pylist([_row(i, 0) for i in range(ROWS)], schema=schema)
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(
            path, TableDescriptor(Schema.from_arrow(schema), bucket_count=1, properties=properties))
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        writer.append_arrow_batch(batch)
        await writer.flush()
        scanner = table.new_scan().create_log_scanner()
        scanner.subscribe(0, 0)
        scanned: list[pa.RecordBatch] = []
        while sum(b.num_rows for b in scanned) < ROWS:
            scanned += [record.batch for record in await scanner.poll(500)]
    assert pa.Table.from_batches(scanned).equals(pa.Table.from_batches([batch]))
    assert batch.get_total_buffer_size() >= log_batch.COMPRESSION_MIN_BYTES  # so its batches were compressed
    pyfluss_table = await fluss.get_table(pyfluss.TablePath(path.database_name, path.table_name))
    pyfluss_scanner = await pyfluss_table.new_scan().create_record_batch_log_scanner()
    pyfluss_scanner.subscribe(0, 0)
    assert (await poll_arrow(pyfluss_scanner, ROWS)).equals(pa.Table.from_batches([batch]))
