"""Log tables in format INDEXED (``table.log.format = INDEXED``) on a real server.

The official pyfluss client creates such tables but neither writes nor reads their records: its writer only
encodes Arrow, and its scanners refuse any log format but ARROW. strom's own client writes INDEXED records
(Fluss's IndexedLogRecord layout, as the Java client does) and decodes them back into Arrow. A batch built by
hand in that layout goes through ProduceLog and comes back from FetchLog byte for byte.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor
from strom.client import TablePath as StromTablePath
from strom.errors import InvalidConfigError
from strom.records import log_batch
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.pyfluss_support import create_table
from tests.integration.test_data_types import (
    ALL_FIELDS,
    COLUMNS,
    EDGE_READ,
    EDGE_WRITTEN,
    FULL_READ,
    FULL_WRITTEN,
    canonical,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

INDEXED = {"log_format": "INDEXED"}
ERROR_INVALID_TABLE = 15
ERROR_INVALID_COLUMN_PROJECTION = 34
ERROR_INVALID_CONFIG = 39


async def read_all(
    table: Any, bucket_count: int, projection: list[int] | None = None
) -> list[dict[str, Any]]:
    """Every record of every bucket, through strom's log scanner, in bucket then offset order."""
    ends = await table.connection.get_admin().list_offsets(
        table.table_info.path, list(range(bucket_count)), OffsetSpec.latest()
    )
    scanner = (
        table.new_scan().project(projection).create_log_scanner()
        if projection
        else (table.new_scan().create_log_scanner())
    )
    rows: list[dict[str, Any]] = []
    for bucket in range(bucket_count):
        async for scan_batch in scanner.read_range(table.bucket(bucket), 0, ends[bucket]):
            assert scan_batch.change_types is None
            rows += scan_batch.batch.to_pylist()
    return rows


def strom_path(path: pyfluss.TablePath) -> StromTablePath:
    return StromTablePath(path.database_name, path.table_name)


async def create_row_log_table(
    server: Any, fluss: Any, fields: list[pa.Field], log_format: str, bucket_count: int
) -> pyfluss.TablePath:
    """A log table in ``log_format``: INDEXED created by pyfluss, COMPACTED by strom's client (pyfluss 1.0
    refuses to create it: "Unknown log format: COMPACTED")."""
    if log_format == "INDEXED":
        path, _ = await create_table(fluss, fields, prefix="rowlog", bucket_count=bucket_count, log_format=log_format)
        return path
    path = pyfluss.TablePath("fluss", unique_name("rowlog"))
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(strom_path(path), TableDescriptor(
            Schema.from_arrow(pa.schema(fields)), bucket_count=bucket_count,
            properties={"table.log.format": log_format}))
    return path


@pytest.mark.parametrize("log_format", ["INDEXED", "COMPACTED"])
async def test_a_row_log_table_created_by_pyfluss_round_trips_every_type_through_strom_client(
    server: Any, fluss: Any, log_format: str
) -> None:
    path = await create_row_log_table(server, fluss, ALL_FIELDS, log_format, 1)
    table = await fluss.get_table(path)
    assert table.get_table_info().get_properties()["table.log.format"] == log_format

    async with await Connection.create(server.address) as connection:
        strom_table = await connection.get_table(strom_path(path))
        writer = strom_table.new_append().create_writer()
        writer.append({"id": 1, **FULL_WRITTEN})
        writer.append({"id": 2, **EDGE_WRITTEN})
        writer.append({"id": 3, **dict.fromkeys(COLUMNS)})
        await writer.flush()

        rows = await read_all(strom_table, 1)

    assert [row["id"] for row in rows] == [1, 2, 3]
    for column in COLUMNS:
        assert canonical(rows[0][column]) == canonical(FULL_READ[column]), column
        assert canonical(rows[1][column]) == canonical(EDGE_READ[column]), column
        assert rows[2][column] is None, column


@pytest.mark.parametrize("log_format", ["INDEXED", "COMPACTED"])
async def test_row_and_arrow_logs_of_the_same_rows_read_back_identically(server: Any, fluss: Any, log_format: str) -> None:
    fields = [pa.field("seq", pa.int64()), pa.field("name", pa.string()), pa.field("ts", pa.timestamp("ns"))]
    data = pa.table(
        {
            "seq": pa.array(range(3000), pa.int64()),
            "name": [None if i % 7 == 0 else f"row-{i}" * (i % 5) for i in range(3000)],
            "ts": pa.array([i * 1_000_000_007 - 10**15 for i in range(3000)], pa.timestamp("ns")),
        }
    )
    arrow_path, _ = await create_table(fluss, fields, prefix="arrowlog", bucket_count=3)
    indexed_path = await create_row_log_table(server, fluss, fields, log_format, 3)

    async with await Connection.create(server.address) as connection:
        tables = [await connection.get_table(strom_path(p)) for p in (arrow_path, indexed_path)]
        for table in tables:
            writer = table.new_append().create_writer()
            for start in range(0, 3000, 500):
                writer.append_arrow_batch(data.slice(start, 500))
            await writer.flush()
        arrow_rows, indexed_rows = [await read_all(table, 3) for table in tables]
        projected = await read_all(tables[1], 3, projection=[2, 0])

    assert sorted(indexed_rows, key=lambda r: r["seq"]) == data.to_pylist()
    assert indexed_rows == arrow_rows  # the same buckets (round robin per batch) and order
    assert projected == [{"ts": row["ts"], "seq": row["seq"]} for row in indexed_rows]


async def test_pyfluss_appending_arrow_to_an_indexed_table_fails_at_once_with_the_reason(fluss: Any) -> None:
    _, table = await create_table(
        fluss, [pa.field("id", pa.int32())], prefix="indexed", bucket_count=1, **INDEXED
    )
    writer = table.new_append().create_writer()
    started = time.monotonic()

    with pytest.raises(pyfluss.FlussError) as raised:
        await writer.append({"id": 1}).wait()

    assert raised.value.error_code == ERROR_INVALID_TABLE
    assert "INDEXED" in str(raised.value)
    assert time.monotonic() - started < 10, "the refusal must not be retried"


async def test_pyfluss_refuses_a_limit_scan_of_an_indexed_table_it_created(fluss: Any) -> None:
    path, table = await create_table(
        fluss, [pa.field("c1", pa.int32())], prefix="indexed", bucket_count=1, bucket_keys=["c1"], **INDEXED
    )
    bucket = pyfluss.TableBucket(table.get_table_info().table_id, 0)
    with pytest.raises(pyfluss.FlussError, match="ARROW"):
        table.new_scan().limit(1).create_bucket_batch_scanner(bucket)
    await fluss.get_admin().drop_table(path, ignore_if_not_exists=False)


async def test_an_indexed_log_on_a_primary_key_table_is_refused_at_create(fluss: Any) -> None:
    fields = [pa.field("id", pa.int32()), pa.field("v", pa.string())]
    with pytest.raises(pyfluss.FlussError, match="Primary Key Table supports ARROW or COMPACTED log format") as raised:
        await create_table(fluss, fields, primary_keys=["id"], bucket_count=1, **INDEXED)
    assert raised.value.error_code == ERROR_INVALID_CONFIG


async def test_a_compacted_log_on_a_primary_key_table_is_refused_at_create(server: Any) -> None:
    schema = Schema.from_arrow(pa.schema([("id", pa.int32())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        with pytest.raises(InvalidConfigError, match="is for log tables"):
            await connection.get_admin().create_table(
                StromTablePath("fluss", unique_name("compacted")),
                TableDescriptor(schema, bucket_count=1, properties={"table.log.format": "COMPACTED"}),
            )


# ---- the wire: a batch in Fluss's IndexedLogRecord layout, built by hand ----


def indexed_row(row_id: int, name: str) -> bytes:
    """IndexedRow of (INT, STRING): null bitset, the STRING's i32 length, then the values."""
    payload = name.encode()
    return b"\x00" + struct.pack("<i", len(payload)) + struct.pack("<i", row_id) + payload


def indexed_records(rows: list[bytes]) -> bytes:
    """IndexedLogRecord per row: i32 length of what follows, change type +A (0), the row."""
    return b"".join(struct.pack("<i", len(row) + 1) + b"\x00" + row for row in rows)


async def test_a_hand_built_indexed_batch_is_stored_and_fetched_byte_for_byte(
    server: Any, fluss: Any
) -> None:
    path, table = await create_table(
        fluss,
        [pa.field("id", pa.int32()), pa.field("name", pa.string())],
        prefix="wire",
        bucket_count=1,
        **INDEXED,
    )
    table_id = table.get_table_info().table_id
    batches = [
        log_batch.build_batch(
            schema_id=1, record_count=len(rows), records=indexed_records(rows), append_only=True
        )
        for rows in ([indexed_row(1, "one"), indexed_row(2, "")], [indexed_row(3, "drei ✓")])
    ]
    host, _, port = server.address.rpartition(":")
    connection = await RpcConnection.connect(host, int(port))
    try:
        offsets = []
        for batch in batches:
            produced = await connection.request(
                ApiKey.PRODUCE_LOG,
                pb.ProduceLogRequest(
                    acks=-1,
                    table_id=table_id,
                    timeout_ms=10_000,
                    buckets_req=[pb.PbProduceLogReqForBucket(bucket_id=0, records=batch)],
                ),
            )
            (bucket_response,) = produced.buckets_resp
            assert not bucket_response.error_code, bucket_response.error_message
            offsets.append(bucket_response.base_offset)
        assert offsets == [0, 2]

        def fetch(projection: list[int] | None) -> pb.FetchLogRequest:
            request = pb.FetchLogRequest(follower_server_id=-1, max_bytes=1 << 20, max_wait_ms=0, min_bytes=1)
            table_request = request.tables_req.add(
                table_id=table_id, projection_pushdown_enabled=projection is not None
            )
            table_request.projected_fields.extend(projection or [])
            table_request.buckets_req.add(bucket_id=0, fetch_offset=0, max_fetch_bytes=1 << 20)
            return request

        (fetched,) = (await connection.request(ApiKey.FETCH_LOG, fetch(None))).tables_resp[0].buckets_resp
        assert not fetched.error_code, fetched.error_message
        assert fetched.high_watermark == 3
        stored = list(log_batch.iter_batches(fetched.records))
        assert [header.base_offset for _, header in stored] == [0, 2]
        for (position, header), sent in zip(stored, batches, strict=True):
            assert header.commit_timestamp > 0
            unstamped = bytearray(fetched.records[position : position + header.size_bytes])
            log_batch.stamp(unstamped, 0, 0, 0)
            assert bytes(unstamped) == sent

        (projected,) = (await connection.request(ApiKey.FETCH_LOG, fetch([1]))).tables_resp[0].buckets_resp
        assert projected.error_code == ERROR_INVALID_COLUMN_PROJECTION
        assert "INDEXED" in projected.error_message
    finally:
        await connection.close()

    async with await Connection.create(server.address) as strom_connection:
        strom_table = await strom_connection.get_table(strom_path(path))
        assert await read_all(strom_table, 1) == [
            {"id": 1, "name": "one"},
            {"id": 2, "name": ""},
            {"id": 3, "name": "drei ✓"},
        ]


async def test_an_indexed_log_survives_a_crash_and_reads_back_after_recovery(
    server_factory: Any, tmp_path: Any
) -> None:
    data_dir = tmp_path / "indexed-data"
    first = server_factory(data_dir=data_dir)
    schema = Schema.from_arrow(pa.schema([("seq", pa.int64()), ("note", pa.string())]))
    path = StromTablePath("fluss", unique_name("indexedcrash"))
    async with await Connection.create(first.address) as connection:
        await connection.get_admin().create_table(
            path, TableDescriptor(schema, bucket_count=2, properties={"table.log.format": "INDEXED"})
        )
        writer = (await connection.get_table(path)).new_append().create_writer()
        for start in range(0, 400, 100):
            await writer.write_arrow_batch(
                pa.table(
                    {
                        "seq": list(range(start, start + 100)),
                        "note": [f"n{i}" for i in range(start, start + 100)],
                    }
                )
            )
    first.kill()

    second = server_factory(data_dir=data_dir, port=first.port)
    async with await Connection.create(second.address) as connection:
        table = await connection.get_table(path)
        rows = await read_all(table, 2)
        writer = table.new_append().create_writer()
        await writer.write_arrow_batch(pa.table({"seq": [400], "note": ["after"]}))
        rows_after = await read_all(table, 2)

    assert sorted(row["seq"] for row in rows) == list(range(400))
    assert all(row["note"] == f"n{row['seq']}" for row in rows)
    assert sorted(row["seq"] for row in rows_after) == list(range(401))
