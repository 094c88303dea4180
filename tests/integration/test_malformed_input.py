"""Bad input gets a clear error and loses nothing: malformed frames, unknown apis, corrupt bodies and records.

Requests are built by hand (strom.rpc.framing, the protobuf classes, the record builders) and sent over raw
loopback sockets to the shared server. After each abuse the server must still serve: the same connection
when the frame was well formed, and always a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest
import pytest_asyncio

from strom.records import kv_batch, log_batch
from strom.records.compacted import CompactedKeyEncoder, CompactedRowEncoder
from strom.records.types import DataField, IntType, RowType, StringType
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(120)

UNSUPPORTED_VERSION = 2
CORRUPT_MESSAGE = 3
CORRUPT_RECORD = 14
UNKNOWN_TABLE_OR_BUCKET = 21
MAX_REQUEST_SIZE_BYTES = 100 << 20  # netty.server.max-request-size of the shared server (the default)
READ_TIMEOUT_S = 10.0
MISSING_TABLE_ID = 2**40
FIELDS = [pa.field("id", pa.int32()), pa.field("name", pa.string())]
ARROW_SCHEMA = pa.schema([pa.field("id", pa.int32()), pa.field("name", pa.string())])
ROW_TYPE = RowType((DataField("id", IntType(nullable=False)), DataField("name", StringType())))


class RawConnection:
    """A bare TCP connection speaking Fluss frames, with nothing checked on the way out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._next_request_id = 1

    @classmethod
    async def open(cls, server: ServerProcess) -> RawConnection:
        host, _, port = server.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def request(self, api_key: int, api_version: int, body: bytes) -> tuple[int, bytes]:
        """Send one request; returns the response type and body (the response must carry our request id)."""
        request_id = self._next_request_id
        self._next_request_id += 1
        await self.send(framing.encode_request(api_key, api_version, request_id, body))
        (length,) = struct.unpack(">i", await asyncio.wait_for(self._reader.readexactly(4), READ_TIMEOUT_S))
        frame = await asyncio.wait_for(self._reader.readexactly(length), READ_TIMEOUT_S)
        response_type, response_id = framing.RESPONSE_HEADER.unpack_from(frame, 0)
        assert response_id == request_id
        return response_type, frame[framing.RESPONSE_HEADER_SIZE_BYTES :]

    async def error_code(self, api_key: int, api_version: int, body: bytes) -> int:
        response_type, body = await self.request(api_key, api_version, body)
        assert response_type == framing.RESPONSE_ERROR, "expected an error response"
        return int(pb.ErrorResponse.FromString(body).error_code)

    async def success(self, api_key: ApiKey, message: Any, response_class: Any, api_version: int = 0) -> Any:
        response_type, body = await self.request(int(api_key), api_version, message.SerializeToString())
        assert response_type == framing.RESPONSE_SUCCESS, pb.ErrorResponse.FromString(body)
        return response_class.FromString(body)

    async def closed_by_server(self) -> bool:
        """True once the server closed the connection (EOF or reset) within the read timeout."""
        try:
            data = await asyncio.wait_for(self._reader.read(1 << 16), READ_TIMEOUT_S)
        except ConnectionResetError:
            return True
        return data == b""

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


@pytest_asyncio.fixture
async def raw(server: ServerProcess) -> AsyncIterator[RawConnection]:
    connection = await RawConnection.open(server)
    try:
        yield connection
    finally:
        await connection.close()


async def assert_serving(server: ServerProcess) -> None:
    """The server process is alive and answers a fresh connection."""
    assert server.process is not None and server.process.poll() is None, "the server process died"
    host, _, port = server.address.rpartition(":")
    connection = await RpcConnection.connect(host, int(port))
    try:
        response = await connection.request(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest())
        assert "fluss" in list(response.database_name)
    finally:
        await connection.close()


async def assert_usable(raw: RawConnection) -> None:
    response = await raw.success(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest(), pb.ListDatabasesResponse)
    assert "fluss" in list(response.database_name)


async def create_table(fluss: Any, *, primary_key: bool) -> tuple[Any, int]:
    path = pyfluss.TablePath("fluss", unique_name("bad_input"))
    schema = pyfluss.Schema(pa.schema(FIELDS), primary_keys=["id"] if primary_key else None)
    await fluss.get_admin().create_table(path, pyfluss.TableDescriptor(schema, bucket_count=1))
    table = await fluss.get_table(path)
    return path, table.get_table_info().table_id


def log_records(ids: list[int]) -> bytearray:
    batch = pa.RecordBatch.from_pydict({"id": ids, "name": [f"n{i}" for i in ids]}, schema=ARROW_SCHEMA)
    return bytearray(log_batch.build_arrow_batch(batch, schema_id=1))


def kv_records(ids: list[int]) -> bytearray:
    key_encoder = CompactedKeyEncoder(ROW_TYPE, [0])
    value_encoder = CompactedRowEncoder(ROW_TYPE)
    rows = [(i, f"n{i}") for i in ids]
    return bytearray(
        kv_batch.build_kv_batch(1, [key_encoder.encode(r) for r in rows], [value_encoder.encode(r) for r in rows])
    )


def produce_request(table_id: int, records: bytes) -> Any:
    request = pb.ProduceLogRequest(acks=-1, table_id=table_id, timeout_ms=30_000)
    request.buckets_req.add(bucket_id=0, records=bytes(records))
    return request


def put_kv_request(table_id: int, records: bytes) -> Any:
    request = pb.PutKvRequest(acks=-1, table_id=table_id, timeout_ms=30_000)
    request.buckets_req.add(bucket_id=0, records=bytes(records))
    return request


async def latest_offset(raw: RawConnection, table_id: int) -> int:
    request = pb.ListOffsetsRequest(follower_server_id=-1, offset_type=1, table_id=table_id, bucket_id=[0])
    response = await raw.success(ApiKey.LIST_OFFSETS, request, pb.ListOffsetsResponse)
    (bucket,) = response.buckets_resp
    assert not bucket.HasField("error_code") or bucket.error_code == 0, bucket
    return int(bucket.offset)


# ---- frames ----


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "length", [-1, -(2**31), 0, 4, 7, MAX_REQUEST_SIZE_BYTES + 1, 2**31 - 1], ids=lambda n: f"length={n}"
)
async def test_a_frame_length_outside_the_limits_closes_the_connection_and_nothing_else(
    server: ServerProcess, raw: RawConnection, length: int
) -> None:
    await raw.send(struct.pack(">i", length) + b"\x00" * 16)
    assert await raw.closed_by_server()
    await assert_serving(server)


@pytest.mark.asyncio
async def test_a_frame_cut_off_mid_body_then_closed_leaves_the_server_unaffected(server: ServerProcess) -> None:
    for cut in (1, 4, 6, 12, 30):
        connection = await RawConnection.open(server)
        frame = framing.encode_request(int(ApiKey.LIST_DATABASES), 0, 1, b"\x08\x01" * 20)
        await connection.send(frame[:cut])
        await connection.close()
    await assert_serving(server)


@pytest.mark.asyncio
async def test_an_unknown_api_key_is_unsupported_version_and_the_connection_stays_usable(raw: RawConnection) -> None:
    for api_key in (0, 999, 2999, 32_000, -5):
        assert await raw.error_code(api_key, 0, b"\x01\x02\x03") == UNSUPPORTED_VERSION, api_key
    assert await raw.error_code(int(ApiKey.ADJUST_ISR), 0, b"") == UNSUPPORTED_VERSION  # known but not served
    await assert_usable(raw)


@pytest.mark.asyncio
@pytest.mark.parametrize(("api_key", "version"), [(ApiKey.LIST_DATABASES, 1), (ApiKey.PUT_KV, 3), (ApiKey.LOOKUP, -1)])
async def test_an_api_version_out_of_range_is_unsupported_version(raw: RawConnection, api_key: ApiKey, version: int) -> None:
    assert await raw.error_code(int(api_key), version, pb.ListDatabasesRequest().SerializeToString()) == 2
    await assert_usable(raw)


@pytest.mark.asyncio
async def test_a_truncated_protobuf_body_is_corrupt_message_and_the_connection_stays_usable(raw: RawConnection) -> None:
    body = pb.CreateDatabaseRequest(database_name="never_created", ignore_if_exists=False).SerializeToString()
    for cut in range(1, len(body)):
        assert await raw.error_code(int(ApiKey.CREATE_DATABASE), 0, body[:cut]) == CORRUPT_MESSAGE, cut
    assert await raw.error_code(int(ApiKey.CREATE_DATABASE), 0, b"") == CORRUPT_MESSAGE  # required fields unset
    await assert_usable(raw)
    database_exists = await raw.success(
        ApiKey.DATABASE_EXISTS, pb.DatabaseExistsRequest(database_name="never_created"), pb.DatabaseExistsResponse
    )
    assert not database_exists.exists


@pytest.mark.asyncio
async def test_random_bytes_as_a_body_are_corrupt_message(raw: RawConnection) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    for _ in range(50):
        body = rng.randbytes(rng.randint(1, 200))
        for api_key in (ApiKey.PRODUCE_LOG, ApiKey.PUT_KV, ApiKey.CREATE_TABLE, ApiKey.LIST_OFFSETS):
            # a body that happens to parse would be answered normally; these all have required fields
            assert await raw.error_code(int(api_key), 0, body) == CORRUPT_MESSAGE, f"seed={seed} {body.hex()}"
    await assert_usable(raw)


@pytest.mark.asyncio
async def test_requests_after_a_bad_one_on_the_same_connection_are_answered_in_order(raw: RawConnection) -> None:
    assert await raw.error_code(999, 0, b"") == UNSUPPORTED_VERSION
    assert await raw.error_code(int(ApiKey.PRODUCE_LOG), 0, b"\xff") == CORRUPT_MESSAGE
    await assert_usable(raw)
    assert await raw.error_code(int(ApiKey.LIST_DATABASES), 9, b"") == UNSUPPORTED_VERSION
    await assert_usable(raw)


# ---- records ----


@pytest.mark.asyncio
async def test_produce_log_with_a_bad_crc_is_corrupt_record_and_appends_nothing(fluss: Any, raw: RawConnection) -> None:
    _path, table_id = await create_table(fluss, primary_key=False)
    good = await raw.success(ApiKey.PRODUCE_LOG, produce_request(table_id, log_records([1, 2])), pb.ProduceLogResponse)
    assert [(b.bucket_id, b.base_offset, b.error_code) for b in good.buckets_resp] == [(0, 0, 0)]
    assert await latest_offset(raw, table_id) == 2

    corrupt = log_records([3, 4])
    corrupt[-5] ^= 0x40  # inside the CRC'd range
    torn = log_records([5])[:-7]
    crc_only = log_records([6])
    crc_only[log_batch.CRC_OFFSET] ^= 0x01
    for records in (corrupt, torn, crc_only, log_records([7]) + corrupt, b"\x00" * 10):
        response = await raw.success(ApiKey.PRODUCE_LOG, produce_request(table_id, records), pb.ProduceLogResponse)
        (bucket,) = response.buckets_resp
        assert (bucket.bucket_id, bucket.error_code) == (0, CORRUPT_RECORD), bucket
        assert bucket.error_message
    assert await latest_offset(raw, table_id) == 2


@pytest.mark.asyncio
async def test_put_kv_with_a_corrupt_kv_batch_is_corrupt_record_and_writes_nothing(fluss: Any, raw: RawConnection) -> None:
    path, table_id = await create_table(fluss, primary_key=True)
    good = await raw.success(ApiKey.PUT_KV, put_kv_request(table_id, kv_records([1])), pb.PutKvResponse)
    assert [(b.bucket_id, b.error_code) for b in good.buckets_resp] == [(0, 0)]

    bad_crc = kv_records([2, 3])
    bad_crc[-1] ^= 0x01
    overrun = kv_records([4])
    struct.pack_into("<i", overrun, kv_batch.KV_HEADER_SIZE_BYTES, 10_000)  # the record claims more than is there
    overrun[5:9] = struct.pack("<I", __import__("crc32c").crc32c(bytes(overrun[kv_batch.KV_CRC_START :])))
    for records in (bad_crc, kv_records([5])[:-3], overrun, b"\x01\x02"):
        response = await raw.success(ApiKey.PUT_KV, put_kv_request(table_id, records), pb.PutKvResponse)
        (bucket,) = response.buckets_resp
        assert (bucket.bucket_id, bucket.error_code) == (0, CORRUPT_RECORD), bucket
    assert await latest_offset(raw, table_id) == 1
    lookuper = (await fluss.get_table(path)).new_lookup().create_lookuper()
    assert await lookuper.lookup({"id": 1}) == {"id": 1, "name": "n1"}
    assert await lookuper.lookup({"id": 2}) is None


@pytest.mark.asyncio
async def test_writes_to_a_missing_table_fail_per_bucket_inside_a_success_response(raw: RawConnection) -> None:
    # a request-level error would make the official client retry the write forever
    produce = await raw.success(
        ApiKey.PRODUCE_LOG, produce_request(MISSING_TABLE_ID, log_records([1])), pb.ProduceLogResponse
    )
    assert [(b.bucket_id, b.error_code) for b in produce.buckets_resp] == [(0, UNKNOWN_TABLE_OR_BUCKET)]
    put = await raw.success(ApiKey.PUT_KV, put_kv_request(MISSING_TABLE_ID, kv_records([1])), pb.PutKvResponse)
    assert [(b.bucket_id, b.error_code) for b in put.buckets_resp] == [(0, UNKNOWN_TABLE_OR_BUCKET)]


@pytest.mark.asyncio
async def test_a_missing_bucket_of_an_existing_table_fails_only_that_bucket(fluss: Any, raw: RawConnection) -> None:
    _path, table_id = await create_table(fluss, primary_key=False)
    request = pb.ProduceLogRequest(acks=-1, table_id=table_id, timeout_ms=30_000)
    request.buckets_req.add(bucket_id=0, records=bytes(log_records([1])))
    request.buckets_req.add(bucket_id=7, records=bytes(log_records([2])))
    response = await raw.success(ApiKey.PRODUCE_LOG, request, pb.ProduceLogResponse)
    assert sorted((b.bucket_id, b.error_code) for b in response.buckets_resp) == [(0, 0), (7, UNKNOWN_TABLE_OR_BUCKET)]
    assert await latest_offset(raw, table_id) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("key_count", [1, 500])  # single gets, and one key-ordered multi-get
async def test_a_lookup_into_a_missing_bucket_fails_only_that_bucket(fluss: Any, raw: RawConnection, key_count: int) -> None:
    _path, table_id = await create_table(fluss, primary_key=True)
    keys = [bytes([i % 128]) for i in range(key_count)]
    request = pb.LookupRequest(table_id=table_id)
    request.buckets_req.add(bucket_id=0, keys=keys)
    request.buckets_req.add(bucket_id=7, keys=keys)
    response = await raw.success(ApiKey.LOOKUP, request, pb.LookupResponse)
    assert [(b.bucket_id, b.error_code, len(b.values)) for b in response.buckets_resp] == [
        (0, 0, key_count), (7, UNKNOWN_TABLE_OR_BUCKET, 0)
    ]
    missing = pb.LookupRequest(table_id=MISSING_TABLE_ID)
    missing.buckets_req.add(bucket_id=0, keys=keys)
    response = await raw.success(ApiKey.LOOKUP, missing, pb.LookupResponse)
    assert [(b.bucket_id, b.error_code) for b in response.buckets_resp] == [(0, UNKNOWN_TABLE_OR_BUCKET)]


# ---- abuse under load ----


async def send_garbage(server: ServerProcess, rng: random.Random, deadline: float) -> int:
    """One abusive client: garbage lengths, garbage bodies, half frames; returns the connections it used."""
    used = 0
    while time.monotonic() < deadline:
        used += 1
        try:
            connection = await RawConnection.open(server)
        except OSError:
            continue
        try:
            kind = rng.randrange(4)
            if kind == 0:  # a length the server must refuse
                await connection.send(struct.pack(">i", rng.choice([-7, 3, MAX_REQUEST_SIZE_BYTES + 9])))
            elif kind == 1:  # well-framed requests with random keys and bodies
                for _ in range(rng.randint(1, 5)):
                    api_key = rng.choice([int(ApiKey.PRODUCE_LOG), int(ApiKey.PUT_KV), 1234, rng.randrange(-1, 1100)])
                    await connection.send(framing.encode_request(api_key, rng.randrange(3), 1, rng.randbytes(64)))
            elif kind == 2:  # a frame cut short
                await connection.send(framing.encode_request(int(ApiKey.FETCH_LOG), 0, 1, rng.randbytes(300))[:40])
            else:  # pure noise
                await connection.send(rng.randbytes(rng.randint(1, 4096)))
            await asyncio.sleep(rng.random() * 0.01)
        except (ConnectionError, OSError):
            pass
        finally:
            await connection.close()
    return used


@pytest.mark.asyncio
async def test_garbage_from_many_connections_loses_none_of_a_concurrent_clients_data(
    server: ServerProcess, fluss: Any
) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    kv_path, _ = await create_table(fluss, primary_key=True)
    log_path, _ = await create_table(fluss, primary_key=False)
    kv_table = await fluss.get_table(kv_path)
    log_table = await fluss.get_table(log_path)
    upserts = kv_table.new_upsert().create_writer()
    appends = log_table.new_append().create_writer()

    deadline = time.monotonic() + 2.0
    abusers = [asyncio.ensure_future(send_garbage(server, random.Random(seed + i), deadline)) for i in range(16)]
    row_count = 300
    handles = []
    for id_ in range(row_count):
        handles.append(upserts.upsert({"id": id_, "name": f"v{id_}"}))
        handles.append(appends.append({"id": id_, "name": f"a{id_}"}))
        if id_ % 50 == 49:
            await asyncio.gather(*(handle.wait() for handle in handles))
            handles.clear()
            await asyncio.sleep(0.05)
    await asyncio.gather(*(handle.wait() for handle in handles))
    used = sum(await asyncio.gather(*abusers))
    assert used > 16, f"seed={seed}: the abusers barely ran"

    table_id = kv_table.get_table_info().table_id
    scanner = kv_table.new_scan().limit(10_000).create_bucket_batch_scanner(pyfluss.TableBucket(table_id, 0))
    rows = (await scanner.to_arrow()).to_pylist()
    assert sorted((r["id"], r["name"]) for r in rows) == [(i, f"v{i}") for i in range(row_count)], f"seed={seed}"

    log_scanner = await log_table.new_scan().create_log_scanner()
    log_scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    seen: list[tuple[int, str]] = []
    poll_deadline = time.monotonic() + 15
    while len(seen) < row_count and time.monotonic() < poll_deadline:
        seen.extend((r.row["id"], r.row["name"]) for r in await log_scanner.poll(500))
    assert sorted(seen) == [(i, f"a{i}") for i in range(row_count)], f"seed={seed}"
    await assert_serving(server)
