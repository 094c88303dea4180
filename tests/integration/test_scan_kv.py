"""Server-side KV scans (ScanKv, FIP-17) against a real server: semantics, errors, expiry and replay."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
import pytest_asyncio

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.client.batch_scanner import BucketBatchScanner, StateThenChanges
from strom.records.kv_batch import parse_value_batch
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.snapshot_support import create_pk_table, write_round

pytestmark = pytest.mark.asyncio

SCANNER_CONFIG = {
    "kv.scanner.ttl": "1s",
    "kv.scanner.expiration-interval": "100ms",
    "kv.scanner.max-per-bucket": "2",
    "kv.scanner.max-per-server": "3",
}


def _open(table_id: int, bucket: int, *, limit: int | None = None, batch_size: int = 1 << 20, seq: int | None = 0) -> object:
    request = pb.ScanKvRequest(batch_size_bytes=batch_size)
    request.bucket_scan_req.table_id = table_id
    request.bucket_scan_req.bucket_id = bucket
    if limit is not None:
        request.bucket_scan_req.limit = limit
    if seq is not None:
        request.call_seq_id = seq
    return request


def _next(scanner_id: bytes, seq: int | None, batch_size: int = 1 << 20) -> object:
    request = pb.ScanKvRequest(scanner_id=scanner_id, batch_size_bytes=batch_size)
    if seq is not None:
        request.call_seq_id = seq
    return request


async def _raw(server_address: str) -> RpcConnection:
    host, port = server_address.split(":")
    return await RpcConnection.connect(host, int(port))


async def test_whole_table_and_single_bucket_scans_return_exactly_the_rows(fluss_table_with_rows) -> None:  # type: ignore[no-untyped-def]
    _connection, table, expected = fluss_table_with_rows
    everything = await (await table.new_scan().create_batch_scanner()).to_arrow()
    assert sorted(everything.column("id").to_pylist()) == sorted(expected)
    assert all(v == f"r0-{i}" for i, v in zip(everything.column("id").to_pylist(), everything.column("v").to_pylist(), strict=True))
    per_bucket = 0
    for bucket in range(3):
        scanner = table.new_scan().create_bucket_batch_scanner(table.bucket(bucket))
        rows = [row for batch in [b async for b in scanner] for row in batch.column("id").to_pylist()]
        assert len(rows) == len(set(rows))
        per_bucket += len(rows)
        assert scanner.log_offset is not None and scanner.log_offset > 0
    assert per_bucket == len(expected)


@pytest_asyncio.fixture
async def fluss_table_with_rows(server):  # type: ignore[no-untyped-def]
    path = TablePath("fluss", unique_name("scan"))
    async with await Connection.create(server.address) as connection:
        table = await create_pk_table(connection, path, buckets=3)
        await write_round(table, range(2000), "r0")
        yield connection, table, list(range(2000))


async def test_an_empty_table_scans_to_no_rows_with_a_log_offset(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        table = await create_pk_table(connection, TablePath("fluss", unique_name("empty")), buckets=2)
        rows = await (await table.new_scan().create_batch_scanner()).to_arrow()
        assert rows.num_rows == 0
        raw = await _raw(server.address)
        try:
            response = await raw.request(ApiKey.SCAN_KV, _open(table.table_info.table_id, 0))
        finally:
            await raw.close()
        assert not response.has_more_results and response.log_offset == 0 and not response.HasField("scanner_id")


async def test_rows_written_after_the_open_are_invisible_to_the_session(fluss_table_with_rows) -> None:  # type: ignore[no-untyped-def]
    _connection, table, expected = fluss_table_with_rows
    scanner = BucketBatchScanner(table, table.bucket(0), batch_size_bytes=1)
    first = await scanner.next_batch()
    assert first is not None and first.num_rows == 1
    await write_round(table, range(100_000, 100_300), "late")
    writer = table.new_upsert().create_writer()
    for key in expected[:50]:
        writer.delete({"id": key})
    await writer.flush()
    seen = first.column("v").to_pylist()
    while (batch := await scanner.next_batch()) is not None:
        seen += batch.column("v").to_pylist()
    assert not any(value.startswith("late") for value in seen)
    lookuper = table.new_lookup().create_lookuper()
    bucket0_before = [v for v in seen]
    assert len(bucket0_before) == len(set(bucket0_before))
    deleted_in_bucket0 = [k for k in expected[:50] if f"r0-{k}" in seen]
    assert deleted_in_bucket0, "some deleted key of bucket 0 must still have been seen by the old view"
    assert await lookuper.lookup({"id": deleted_in_bucket0[0]}) is None


async def test_limit_caps_rows_across_batches_and_tiny_batches_still_progress(fluss_table_with_rows) -> None:  # type: ignore[no-untyped-def]
    _connection, table, _expected = fluss_table_with_rows
    scanner = BucketBatchScanner(table, table.bucket(1), limit=7, batch_size_bytes=1)
    batches = [b async for b in scanner]
    assert [b.num_rows for b in batches] == [1] * 7
    limited = await (await table.new_scan().limit(11).create_batch_scanner()).to_arrow()
    assert limited.num_rows == 11


async def test_every_invalid_request_gets_its_code_and_other_sessions_survive(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SCANNER_CONFIG)
    async with await Connection.create(server.address) as connection:
        table = await create_pk_table(connection, TablePath("fluss", unique_name("errors")), buckets=2)
        await write_round(table, range(200), "r0")
        log_path = TablePath("fluss", unique_name("log"))
        await connection.get_admin().create_table(
            log_path, TableDescriptor(Schema.from_arrow(pa.schema([("id", pa.int64())])), bucket_count=1)
        )
        log_table = await connection.get_table(log_path)
    table_id = table.table_info.table_id
    raw = await _raw(server.address)
    try:
        survivor = await raw.request(ApiKey.SCAN_KV, _open(table_id, 0, batch_size=1))
        assert survivor.has_more_results and not survivor.HasField("error_code")

        async def code_of(request: object) -> int:
            response = await raw.request(ApiKey.SCAN_KV, request)
            return response.error_code if response.HasField("error_code") else 0

        both = _open(table_id, 1)
        both.scanner_id = survivor.scanner_id
        assert await code_of(both) == 68
        assert await code_of(pb.ScanKvRequest(batch_size_bytes=10, call_seq_id=0)) == 68
        close_with_open = _open(table_id, 1)
        close_with_open.close_scanner = True
        assert await code_of(close_with_open) == 68
        assert await code_of(_open(table_id, 1, seq=None)) == 68
        assert await code_of(_open(table_id, 1, seq=3)) == 68
        assert await code_of(_open(table_id, 1, batch_size=0)) == 68
        assert await code_of(_next(b"0" * 32, 1)) == 67
        assert await code_of(_open(log_table.table_info.table_id, 0)) == 20
        assert await code_of(_open(999_999, 0)) == 21
        # a second session on the same connection, then a bad continuation kills only that session
        victim = await raw.request(ApiKey.SCAN_KV, _open(table_id, 1, batch_size=1))
        assert await code_of(_next(victim.scanner_id, 5, batch_size=1)) == 68
        assert await code_of(_next(victim.scanner_id, 1, batch_size=1)) == 67
        # caps: 2 per bucket, 3 per server (the survivor holds one)
        extra = await raw.request(ApiKey.SCAN_KV, _open(table_id, 0, batch_size=1))
        assert not extra.HasField("error_code")
        assert await code_of(_open(table_id, 0, batch_size=1)) == 69
        third = await raw.request(ApiKey.SCAN_KV, _open(table_id, 1, batch_size=1))
        assert not third.HasField("error_code")
        assert await code_of(_open(table_id, 1, batch_size=1)) == 69
        # closing is idempotent, needs no sequence number, and frees the slot
        close = pb.ScanKvRequest(scanner_id=extra.scanner_id, close_scanner=True)
        assert await code_of(close) == 0
        assert await code_of(close) == 0
        again = await raw.request(ApiKey.SCAN_KV, _open(table_id, 0, batch_size=1))
        assert not again.HasField("error_code")
        # the survivor was untouched by all of this
        follow = await raw.request(ApiKey.SCAN_KV, _next(survivor.scanner_id, 1, batch_size=1))
        assert not follow.HasField("error_code") and len(parse_value_batch(follow.records)) == 1
    finally:
        await raw.close()


async def test_an_idle_session_expires_and_a_late_continuation_gets_scanner_expired(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SCANNER_CONFIG)
    async with await Connection.create(server.address) as connection:
        table = await create_pk_table(connection, TablePath("fluss", unique_name("ttl")), buckets=1)
        await write_round(table, range(50), "r0")
    raw = await _raw(server.address)
    try:
        opened = await raw.request(ApiKey.SCAN_KV, _open(table.table_info.table_id, 0, batch_size=1))
        await asyncio.sleep(1.6)
        late = await raw.request(ApiKey.SCAN_KV, _next(opened.scanner_id, 1, batch_size=1))
        assert late.error_code == 66
    finally:
        await raw.close()


async def test_dropping_the_table_closes_its_sessions(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(SCANNER_CONFIG)
    path = TablePath("fluss", unique_name("drop"))
    async with await Connection.create(server.address) as connection:
        table = await create_pk_table(connection, path, buckets=1)
        await write_round(table, range(50), "r0")
        raw = await _raw(server.address)
        try:
            opened = await raw.request(ApiKey.SCAN_KV, _open(table.table_info.table_id, 0, batch_size=1))
            await connection.get_admin().drop_table(path)
            after = await raw.request(ApiKey.SCAN_KV, _next(opened.scanner_id, 1, batch_size=1))
            assert after.error_code == 66
        finally:
            await raw.close()


async def test_repeating_the_last_call_seq_id_replays_the_same_batch_and_the_scan_has_no_duplicates(
    fluss_table_with_rows,  # type: ignore[no-untyped-def]
    server,  # type: ignore[no-untyped-def]
) -> None:
    _connection, table, _expected = fluss_table_with_rows
    raw = await _raw(server.address)
    try:
        response = await raw.request(ApiKey.SCAN_KV, _open(table.table_info.table_id, 2, batch_size=200))
        scanner_id = response.scanner_id
        rows = parse_value_batch(response.records)
        seq = 0
        while response.has_more_results:
            seq += 1
            response = await raw.request(ApiKey.SCAN_KV, _next(scanner_id, seq, batch_size=200))
            replay = await raw.request(ApiKey.SCAN_KV, _next(scanner_id, seq, batch_size=200))  # "lost" response
            assert replay.records == response.records and replay.has_more_results == response.has_more_results
            rows += parse_value_batch(response.records)
        assert len(rows) == len(set(rows)) > 0
        done = await raw.request(ApiKey.SCAN_KV, _next(scanner_id, seq + 1, batch_size=200))
        assert done.error_code == 67  # finished scans are gone (and a skipped sequence is never replayed)
    finally:
        await raw.close()


async def test_the_client_retries_a_lost_continuation_and_reads_every_row_once(fluss_table_with_rows) -> None:  # type: ignore[no-untyped-def]
    connection, table, _expected = fluss_table_with_rows
    scanner = BucketBatchScanner(table, table.bucket(0), batch_size_bytes=256)
    rows = (await scanner.next_batch()).column("id").to_pylist()  # type: ignore[union-attr]
    # cut the connection under the scanner: its next continuation fails, and it asks for the batch again
    for rpc in list(connection._connections.values()):
        rpc.abort()
    while (batch := await scanner.next_batch()) is not None:
        rows += batch.column("id").to_pylist()
    expected = [r for r in (await (await table.new_scan().create_batch_scanner()).to_arrow()).column("id").to_pylist()]
    bucket0 = set(rows)
    assert len(rows) == len(bucket0)
    assert bucket0 <= set(expected)
    scan_again = [b async for b in table.new_scan().create_bucket_batch_scanner(table.bucket(0))]
    assert bucket0 == {r for b in scan_again for r in b.column("id").to_pylist()}


async def test_state_then_changes_from_the_log_offset_equals_the_final_table(server) -> None:  # type: ignore[no-untyped-def]
    async with await Connection.create(server.address) as connection:
        table = await create_pk_table(connection, TablePath("fluss", unique_name("handoff")), buckets=2)
        await write_round(table, range(1000), "r0")
        stop = asyncio.Event()

        async def keep_writing() -> None:
            writer = table.new_upsert().create_writer()
            round_ = 0
            while not stop.is_set():
                round_ += 1
                await writer.upsert_batch(pa.table({"id": list(range(round_ * 7 % 900, round_ * 7 % 900 + 40)),
                                                    "v": [f"w{round_}"] * 40}))
                writer.delete({"id": round_ % 1000})
                await writer.flush()

        writer_task = asyncio.ensure_future(keep_writing())
        state: dict[int, dict[str, object]] = {}
        followers = []
        for bucket in range(2):
            follower = StateThenChanges(table, table.bucket(bucket))
            async for batch in follower.state():
                for row in batch.to_pylist():
                    state[row["id"]] = row
            followers.append(follower)
        await asyncio.sleep(0.5)
        stop.set()
        await writer_task
        offsets = await connection.get_admin().list_offsets(table.table_path, [0, 1], OffsetSpec.latest())
        for bucket, follower in enumerate(followers):
            scanner = follower.changes()
            async for change in scanner.read_range(table.bucket(bucket), follower.log_offset, offsets[bucket]):
                for change_type, row in zip(change.change_types or b"", change.batch.to_pylist(), strict=True):
                    if change_type in (1, 3):
                        state[row["id"]] = row
                    elif change_type == 4:
                        state.pop(row["id"], None)
        lookuper = table.new_lookup().create_lookuper()
        looked_up = await lookuper.lookup_many([{"id": i} for i in range(1000)])
        truth = {row["id"]: row for row in looked_up if row is not None}
        assert state == truth
