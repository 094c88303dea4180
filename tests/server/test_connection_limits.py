"""Limits that keep one hostile client from hurting the others, probed against a StromServer in this
process so the test can see how much the server actually did: how many requests it answered for a client
that never reads, how many bytes it buffered for frames that never complete, which scan sessions it kept."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.errors import InvalidScanRequestError, TooManyScannersError
from strom.records.kv_batch import parse_value_batch
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.budget import SMALL_FRAME_SIZE_BYTES
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.server.node import StromServer
from strom.tablet import tablet_service as tablet_server

pytestmark = pytest.mark.asyncio

HANG_GUARD_S = 20  # a bound on waiting for an answer, so a regression fails instead of hanging


async def _started(tmp_path: Path, config: dict[str, str] | None = None) -> StromServer:
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration({"kv.snapshot.interval": "0s", **(config or {})}))
    await server.start()
    return server


async def _pk_table(server: StromServer, name: str, rows: int) -> tuple[Connection, Any]:
    connection = await Connection.create(f"127.0.0.1:{server.port}")
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    await connection.get_admin().create_table(TablePath("fluss", name), TableDescriptor(schema, bucket_count=1))
    table = await connection.get_table(TablePath("fluss", name))
    await table.new_upsert().create_writer().upsert_batch(
        pa.table({"id": list(range(rows)), "v": [f"{i:0100d}" for i in range(rows)]})
    )
    return connection, table


async def _lookup_still_answers(table: Any) -> None:
    lookuper = table.new_lookup().create_lookuper()
    row = await asyncio.wait_for(lookuper.lookup({"id": 7}), HANG_GUARD_S)
    assert row is not None and row["v"] == f"{7:0100d}"


async def test_pipelined_limit_scans_from_a_client_that_never_reads_are_paced_by_its_reading(tmp_path: Path) -> None:
    server = await _started(tmp_path)
    try:
        connection, table = await _pk_table(server, "flooded", 2_000)
        request = pb.LimitScanRequest(table_id=table.table_info.table_id, bucket_id=0, limit=2_000)
        body = request.SerializeToString()
        flood = b"".join(framing.encode_request(int(ApiKey.LIMIT_SCAN), 0, i, body) for i in range(1_200))
        assert server.rpc is not None
        before = server.rpc.stats.requests
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(flood)  # ~26 KB of requests asking for ~250 MB of answers, which are never read
        await writer.drain()
        await asyncio.sleep(0.5)
        await _lookup_still_answers(table)
        answered = server.rpc.stats.requests - before
        # what fits in the socket buffers is answered; the rest waits until the client reads
        assert answered < 300, f"{answered} LimitScans answered for a client that reads nothing"
        writer.close()
        await connection.close()
    finally:
        await server.stop()


async def test_limit_scan_bounds_its_answer_by_size_not_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = await _started(tmp_path)
    try:
        connection, table = await _pk_table(server, "limited", 10)
        rpc = await RpcConnection.connect("127.0.0.1", server.port)
        try:
            def limit_scan(limit: int) -> Any:
                request = pb.LimitScanRequest(table_id=table.table_info.table_id, bucket_id=0, limit=limit)
                return rpc.request(ApiKey.LIMIT_SCAN, request)

            for limit in (0, -1):
                refused = await limit_scan(limit)
                assert refused.error_code == InvalidScanRequestError.code and "positive limit" in refused.error_message
            whole = await limit_scan(2**31 - 1)  # clients read a whole small table with a huge limit
            assert not whole.HasField("error_code") and len(parse_value_batch(whole.records)) == 10
            monkeypatch.setattr(tablet_server, "LIMIT_SCAN_BYTES_MAX", 500)  # ~4 of these rows
            too_big = await limit_scan(10)
            assert too_big.error_code == InvalidScanRequestError.code and "KV scan" in too_big.error_message
            assert len(parse_value_batch((await limit_scan(3)).records)) == 3
        finally:
            await rpc.close()
            await connection.close()
    finally:
        await server.stop()


def _open_request(table_id: int) -> Any:
    request = pb.ScanKvRequest(call_seq_id=0, batch_size_bytes=1)
    request.bucket_scan_req.table_id = table_id
    request.bucket_scan_req.bucket_id = 0
    return request


async def test_scan_sessions_of_a_vanished_client_make_room_yet_stay_resumable(tmp_path: Path) -> None:
    server = await _started(tmp_path, {"kv.scanner.max-per-bucket": "8"})
    try:
        connection, table = await _pk_table(server, "scanned", 50)
        table_id = table.table_info.table_id
        hog = await RpcConnection.connect("127.0.0.1", server.port)
        opened = [await hog.request(ApiKey.SCAN_KV, _open_request(table_id)) for _ in range(8)]
        assert all(o.has_more_results and not o.HasField("error_code") for o in opened)
        other = await RpcConnection.connect("127.0.0.1", server.port)
        try:
            full = await other.request(ApiKey.SCAN_KV, _open_request(table_id))
            assert full.error_code == TooManyScannersError.code  # the hog is still connected: its sessions count
            await hog.close()
            await asyncio.sleep(0.1)  # the server sees the connection close

            # one of the hog's sessions, resumed from a new connection before pressure evicts it, adopts it
            resumed = await other.request(
                ApiKey.SCAN_KV, pb.ScanKvRequest(scanner_id=opened[0].scanner_id, call_seq_id=1, batch_size_bytes=1)
            )
            assert not resumed.HasField("error_code") and resumed.has_more_results

            # a newcomer gets a session: an orphan (the oldest one not resumed) makes room
            fresh = await other.request(ApiKey.SCAN_KV, _open_request(table_id))
            assert not fresh.HasField("error_code") and fresh.has_more_results
            assert server.scans is not None and server.scans.scanners.session_count == 8
            again = await other.request(
                ApiKey.SCAN_KV, pb.ScanKvRequest(scanner_id=opened[0].scanner_id, call_seq_id=2, batch_size_bytes=1)
            )
            assert not again.HasField("error_code"), "the adopted session must not be evicted"
        finally:
            await other.close()
            await connection.close()
    finally:
        await server.stop()


async def test_partly_sent_large_frames_share_one_server_wide_budget(tmp_path: Path) -> None:
    frame_max = 8 << 20
    budget = 16 << 20
    server = await _started(
        tmp_path, {"netty.server.max-request-size": str(frame_max), "server.max-buffered-request-bytes": str(budget)}
    )
    try:
        connection, table = await _pk_table(server, "budgeted", 10)
        assert server.rpc is not None
        body_size = frame_max - 1024
        header = struct.pack(">i", body_size) + framing.REQUEST_HEADER.pack(int(ApiKey.LOOKUP), 0, 1)
        stalled = []
        for _ in range(4):  # each sends most of a large frame, then stalls
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(header + b"\x00" * (body_size - (2 << 20)))
            stalled.append((reader, writer))
        await asyncio.sleep(1.0)
        buffered = sum(c._frames.buffered_size_bytes for c in server.rpc._connections.values())
        assert server.rpc.budget.reserved_bytes <= budget
        assert server.rpc.budget.waiter_count == 2  # two frames fit the budget; two connections wait
        assert buffered <= budget + 2 * (4 << 20), f"{buffered} bytes buffered for stalled frames"
        await _lookup_still_answers(table)  # small frames need no budget

        # one stalled frame completes (an unparsable body: answered with an error): a waiter gets its turn
        reader, writer = stalled[0]
        writer.write(b"\x00" * ((2 << 20) - framing.REQUEST_HEADER_SIZE_BYTES))
        (length,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), HANG_GUARD_S))
        await reader.readexactly(length)
        await asyncio.sleep(0.2)
        assert server.rpc.budget.waiter_count == 1
        for _reader, writer in stalled:
            writer.close()
        await asyncio.sleep(0.2)
        assert server.rpc.budget.reserved_bytes == 0 and server.rpc.budget.waiter_count == 0
        assert body_size > SMALL_FRAME_SIZE_BYTES
        await connection.close()
    finally:
        await server.stop()
