"""Network fuzzing: tens of thousands of malformed frames at a live ``strom server`` while a valid client works.

The frames are mutations of real requests, captured from strom's own client talking to decoy tables: bit
flips, truncations, length fields that lie (short, long, negative, beyond the limit), random api keys and
versions, spliced and random bodies, requests re-serialised with edge values in their fields and
mutated (CRC-correct) records for the record parsers, many frames per connection cut into random reads, connections closed
gracefully or reset. Meanwhile a valid client keeps looking up and writing rows of its own tables, and idle
connections and half-sent frames stay open throughout. At the end:

* the server process is alive, answers a fresh connection and stops cleanly on SIGTERM (exit 0, no
  broken invariant in its log);
* every row the valid client had acknowledged reads back intact (KV table scanned, log table replayed);
* every valid lookup succeeded, and their latency stayed within a generous factor of a baseline measured
  in the same test before the fuzzing started;
* the server's RSS stayed bounded;
* every response the abusers read was a well-formed response frame, and no request made a handler fail
  with an unexpected exception (a traceback in the server's log).

``STROM_FUZZ_FRAMES`` sets the number of malformed frames (default 20 000, about 30 s).

Mutated frames that would still parse as a legitimate write to, or drop of, the valid client's tables are
not sent: the server must obey those, and the test checks robustness, not that a fuzzer cannot delete data
it is allowed to delete.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import statistics
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from google.protobuf.descriptor import FieldDescriptor

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.records import kv_batch, log_batch
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import DecodeError, pb, request_class
from tests.server_process import ServerProcess

FRAME_COUNT = int(os.environ.get("STROM_FUZZ_FRAMES", "20000"))
FUZZ_TIME_S_MAX = max(120.0, FRAME_COUNT / 100)  # a safety net: the default run takes about 30 s
ABUSER_COUNT = 12
FRAMES_PER_CONNECTION_MAX = 40
IDLE_CONNECTION_COUNT = 100
HALF_FRAME_CONNECTION_COUNT = 50
ROW_COUNT = 300
LOOKUP_TIMEOUT_S = 15.0
LATENCY_FACTOR_MAX = 50  # p90 lookup latency under fuzzing vs the quiet baseline, floored below
LATENCY_FLOOR_S = 1.0
RSS_GROWTH_BYTES_MAX = 512 << 20
MAX_REQUEST_SIZE_BYTES = 100 << 20  # netty.server.max-request-size (default)
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("blob", pa.binary())])

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(int(FUZZ_TIME_S_MAX) + 180)]

# Requests that legitimately destroy or rewrite data: never sent when they parse (see the docstring).
# AlterDatabase is sent: it only rewrites a database's comment and custom properties, which the valid
# client's tables do not depend on, so its mutations exercise the handler's input checks.
_DESTRUCTIVE_KEYS = frozenset(
    {ApiKey.DROP_DATABASE, ApiKey.DROP_TABLE, ApiKey.ALTER_TABLE, ApiKey.DROP_PARTITION, ApiKey.CREATE_ACLS,
     ApiKey.DROP_ACLS, ApiKey.ALTER_CLUSTER_CONFIGS}
)
_WRITE_KEYS = frozenset({ApiKey.PUT_KV, ApiKey.PRODUCE_LOG, ApiKey.LOOKUP})


@pytest.fixture
def fuzz_server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path / "data", {"kv.snapshot.interval": "0s"}).start()
    try:
        yield process
    finally:
        code = process.stop()
        errors = process.internal_errors()
        assert not errors, f"the server logged broken invariants: {errors[:5]}"
        assert code == 0, f"the server exited with {code} on SIGTERM:\n{process.log_text()[-3000:]}"


def _row(id_: int, version: int) -> dict[str, Any]:
    return {"id": id_, "name": f"n{id_}-v{version}", "blob": bytes([id_ % 256, version % 256]) * (id_ % 7)}


async def _capture_real_requests(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Frames of real requests (metadata, admin, writes, lookups, scans) against decoy tables."""
    captured: list[bytes] = []
    encode = framing.encode_request

    def recording(api_key: int, api_version: int, request_id: int, body: bytes) -> bytes:
        frame = encode(api_key, api_version, request_id, body)
        captured.append(frame)
        return frame

    with monkeypatch.context() as patch:
        patch.setattr(framing, "encode_request", recording)
        async with await Connection.create(server.address) as connection:
            admin = connection.get_admin()
            kv_path, log_path = TablePath("fluss", "decoy_kv"), TablePath("fluss", "decoy_log")
            await admin.create_table(kv_path, TableDescriptor(Schema.from_arrow(SCHEMA, primary_key=["id"]), bucket_count=2))
            await admin.create_table(log_path, TableDescriptor(Schema.from_arrow(SCHEMA), bucket_count=1))
            # the other row formats: INDEXED log records, INDEXED kv rows
            indexed_log_path, indexed_kv_path = TablePath("fluss", "decoy_indexed_log"), TablePath("fluss", "decoy_indexed_kv")
            await admin.create_table(
                indexed_log_path,
                TableDescriptor(Schema.from_arrow(SCHEMA), bucket_count=1, properties={"table.log.format": "INDEXED"}),
            )
            await admin.create_table(
                indexed_kv_path,
                TableDescriptor(
                    Schema.from_arrow(SCHEMA, primary_key=["id"]), bucket_count=1, properties={"table.kv.format": "INDEXED"}
                ),
            )
            await admin.list_databases()
            await admin.database_exists("fluss")
            await admin.list_tables("fluss")
            await admin.table_exists(kv_path)
            await admin.get_table_info(kv_path)
            await admin.get_server_nodes()
            await admin.create_database("decoy_db")
            await admin.alter_database(
                "decoy_db", set_properties={"owner": "fuzz"}, reset_properties=["tier"], comment="decoy"
            )
            kv_table, log_table = await connection.get_table(kv_path), await connection.get_table(log_path)
            upserts = kv_table.new_upsert().create_writer()
            appends = log_table.new_append().create_writer()
            for id_ in range(20):
                upserts.upsert(_row(id_, 0))
                appends.append(_row(id_, 0))
            await upserts.flush()
            await appends.flush()
            upserts.delete({"id": 3})
            await upserts.flush()
            for path in (indexed_log_path, indexed_kv_path):
                table = await connection.get_table(path)
                writer = table.new_upsert().create_writer() if table.has_primary_key() else table.new_append().create_writer()
                for id_ in range(5):
                    if table.has_primary_key():
                        writer.upsert(_row(id_, 0))
                    else:
                        writer.append(_row(id_, 0))
                await writer.flush()
                if table.has_primary_key():
                    await table.new_lookup().create_lookuper().lookup({"id": 1})
                else:
                    end = (await admin.list_offsets(path, [0], OffsetSpec.latest()))[0]
                    async for _change in table.new_scan().create_log_scanner().read_range(table.bucket(0), 0, end):
                        pass
            lookuper = kv_table.new_lookup().create_lookuper()
            for id_ in (1, 2, 3):
                await lookuper.lookup({"id": id_})
            await (await kv_table.new_scan().create_batch_scanner()).to_arrow()
            end = (await admin.list_offsets(log_path, [0], OffsetSpec.latest()))[0]
            async for _change in log_table.new_scan().create_log_scanner().read_range(log_table.bucket(0), 0, end):
                pass
    assert len(captured) >= 15, f"captured only {len(captured)} requests"
    return captured


def _api_key(body: bytes) -> int | None:
    return struct.unpack_from(">h", body, 0)[0] if len(body) >= 2 else None


def _harmful(frame: bytes, protected_table_ids: frozenset[int]) -> bool:
    """True if ``frame`` parses as a destructive request, or a write to a protected table."""
    body = frame[framing.LENGTH_SIZE_BYTES :]
    if len(body) < framing.REQUEST_HEADER_SIZE_BYTES:
        return False
    try:
        key = ApiKey(_api_key(body))
    except ValueError:
        return False
    if key not in _DESTRUCTIVE_KEYS and key not in _WRITE_KEYS:
        return False
    cls = request_class(key)
    if cls is None:
        return False
    try:
        request = cls.FromString(body[framing.REQUEST_HEADER_SIZE_BYTES :])
    except DecodeError:
        return False
    if key in _DESTRUCTIVE_KEYS:
        return True
    return int(request.table_id) in protected_table_ids  # type: ignore[attr-defined]


def _set_length(frame: bytearray, length: int) -> None:
    struct.pack_into(">i", frame, 0, length)


_INTERESTING_INTS = (0, 1, -1, 2, 7, 2**31 - 1, -(2**31), 2**15, 1 << 20)
_INTERESTING_LONGS = (2**63 - 1, -(2**63), 2**40, -(2**40))
_INTERESTING_STRINGS = ("", "x" * 300, "__internal", "a$b", "fluss", "dé漢😀", "-", "../..")


def _mutated_records(rng: random.Random, key: ApiKey, records: bytes) -> bytes:
    """Record bytes with a mutation the server's record parsers see: the CRC is recomputed."""
    data = bytearray(records)
    for _ in range(rng.randint(1, 4)):
        if not data:
            break
        choice = rng.randrange(4)
        if choice == 0:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif choice == 1:
            del data[rng.randrange(len(data)) :]
        elif choice == 2 and len(data) >= 4:
            index = rng.randrange(len(data) - 3)
            struct.pack_into("<i", data, index, rng.choice(_INTERESTING_INTS))
        else:
            index = rng.randrange(len(data) + 1)
            data[index:index] = rng.randbytes(rng.randint(1, 16))
    if key is ApiKey.PUT_KV and len(data) >= kv_batch.KV_HEADER_SIZE_BYTES:
        struct.pack_into("<I", data, 5, crc32c.crc32c(bytes(data[kv_batch.KV_CRC_START :])))
    elif key is ApiKey.PRODUCE_LOG and len(data) >= log_batch.HEADER_SIZE_BYTES:
        struct.pack_into("<I", data, log_batch.CRC_OFFSET, crc32c.crc32c(bytes(data[log_batch.SCHEMA_ID_OFFSET :])))
    return bytes(data)


def _perturb(rng: random.Random, key: ApiKey, message: Any, depth: int = 0) -> None:
    """Set some fields of a parsed request to edge values, recursively; records get parser-deep mutations."""
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for child in value if field.is_repeated else [value]:
                if depth < 4:
                    _perturb(rng, key, child, depth + 1)
            continue
        if field.is_repeated or rng.random() < 0.6:
            continue
        if field.name == "records":
            setattr(message, field.name, _mutated_records(rng, key, value))
        elif field.type == FieldDescriptor.TYPE_BOOL:
            setattr(message, field.name, not value)
        elif field.type == FieldDescriptor.TYPE_STRING:
            setattr(message, field.name, rng.choice(_INTERESTING_STRINGS))
        elif field.type == FieldDescriptor.TYPE_BYTES:
            setattr(message, field.name, rng.randbytes(rng.randrange(64)) if rng.random() < 0.5 else value[: len(value) // 2])
        elif field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
            setattr(message, field.name, rng.choice(_INTERESTING_INTS + _INTERESTING_LONGS))
        elif field.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
            setattr(message, field.name, rng.choice(_INTERESTING_INTS))


def _semantic_mutation(rng: random.Random, frame: bytes) -> bytes | None:
    """The request parsed, some fields set to edge values, serialised again: it passes the frame and
    protobuf checks and reaches the handlers and record parsers. None if the frame is not a request."""
    header = framing.decode_request_header(frame[framing.LENGTH_SIZE_BYTES :])
    try:
        key = ApiKey(header.api_key)
    except ValueError:
        return None
    cls = request_class(key)
    if cls is None:
        return None
    message = cls.FromString(frame[framing.LENGTH_SIZE_BYTES + framing.REQUEST_HEADER_SIZE_BYTES :])
    _perturb(rng, key, message)
    return framing.encode_request(header.api_key, header.api_version, header.request_id, message.SerializePartialToString())


def _mutate(rng: random.Random, captured: list[bytes]) -> tuple[bytes, bool]:
    """One malformed frame; the flag says whether it ends the usable stream (the server waits or closes)."""
    frame = bytearray(rng.choice(captured))
    kind = rng.randrange(14)
    if kind >= 11:  # well-framed, parsing requests with edge values in their fields and records
        mutated = _semantic_mutation(rng, bytes(frame))
        return (mutated if mutated is not None else bytes(frame)), False
    if kind == 0:  # bit flips in header and body, the length kept right
        for _ in range(rng.randint(1, 6)):
            index = rng.randrange(framing.LENGTH_SIZE_BYTES, len(frame))
            frame[index] ^= 1 << rng.randrange(8)
    elif kind == 1:  # random api key and version
        struct.pack_into(">hh", frame, 4, rng.choice((rng.randrange(-(2**15), 2**15), rng.randrange(995, 1070))),
                         rng.choice((0, 1, 2, -1, rng.randrange(-(2**15), 2**15))))
    elif kind == 2:  # body bytes overwritten with interesting values
        for _ in range(rng.randint(1, 4)):
            index = rng.randrange(framing.LENGTH_SIZE_BYTES + framing.REQUEST_HEADER_SIZE_BYTES - 1, len(frame))
            frame[index] = rng.choice((0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)))
    elif kind == 3:  # truncated body, the length fixed up (a cut-short protobuf)
        cut = rng.randrange(framing.LENGTH_SIZE_BYTES + framing.REQUEST_HEADER_SIZE_BYTES, len(frame) + 1)
        frame = frame[:cut]
        _set_length(frame, len(frame) - framing.LENGTH_SIZE_BYTES)
    elif kind == 4:  # inserted or deleted bytes, the length fixed up
        index = rng.randrange(framing.LENGTH_SIZE_BYTES + framing.REQUEST_HEADER_SIZE_BYTES, len(frame) + 1)
        if rng.random() < 0.5:
            frame[index:index] = rng.randbytes(rng.randint(1, 64))
        else:
            del frame[index : index + rng.randint(1, 64)]
        _set_length(frame, len(frame) - framing.LENGTH_SIZE_BYTES)
    elif kind == 5:  # a body spliced from two real requests
        other = rng.choice(captured)
        frame = frame[: rng.randrange(framing.LENGTH_SIZE_BYTES + 8, len(frame) + 1)] + other[rng.randrange(len(other)) :]
        _set_length(frame, len(frame) - framing.LENGTH_SIZE_BYTES)
    elif kind == 6:  # a random body after a real header
        frame = frame[: framing.LENGTH_SIZE_BYTES + framing.REQUEST_HEADER_SIZE_BYTES] + rng.randbytes(rng.randrange(300))
        _set_length(frame, len(frame) - framing.LENGTH_SIZE_BYTES)
    elif kind == 7:  # the frame as it was: the server does real work between the garbage
        pass
    elif kind == 8:  # a length that lies short: the rest of the frame is read as the next one
        _set_length(frame, rng.randrange(framing.REQUEST_HEADER_SIZE_BYTES, len(frame) - framing.LENGTH_SIZE_BYTES + 1))
    elif kind == 9:  # a length that lies long: the server waits for bytes that never come
        _set_length(frame, len(frame) + rng.choice((1, 100, 1 << 16, MAX_REQUEST_SIZE_BYTES - len(frame))))
        return bytes(frame), True
    else:  # a length the server refuses outright, or a frame cut off mid-way
        if rng.random() < 0.5:
            _set_length(frame, rng.choice((-1, -(2**31), 0, 3, 7, MAX_REQUEST_SIZE_BYTES + 1, 2**31 - 1)))
        else:
            frame = frame[: rng.randrange(1, len(frame))]
        return bytes(frame), True
    return bytes(frame), False


class _Abuse:
    """Shared counters of the abusing coroutines."""

    def __init__(self, captured: list[bytes], protected_table_ids: frozenset[int], deadline: float) -> None:
        self.captured = captured
        self.protected_table_ids = protected_table_ids
        self.deadline = deadline
        self.frames_sent = 0
        self.frames_skipped = 0
        self.connections = 0
        self.responses = 0
        self.error_responses = 0
        self.connect_failures = 0

    def more(self) -> bool:
        return self.frames_sent < FRAME_COUNT and time.monotonic() < self.deadline


def _check_responses(buffer: bytes) -> tuple[int, int]:
    """(responses, error responses) in what a connection read; every one must be a well-formed frame."""
    responses = errors = 0
    position = 0
    while len(buffer) - position >= framing.LENGTH_SIZE_BYTES:
        (length,) = framing.LENGTH.unpack_from(buffer, position)
        assert framing.RESPONSE_HEADER_SIZE_BYTES <= length <= framing.RESPONSE_FRAME_SIZE_BYTES_MAX, length
        if len(buffer) - position - framing.LENGTH_SIZE_BYTES < length:
            break  # the rest was cut off by our close
        response_type, _request_id = framing.RESPONSE_HEADER.unpack_from(buffer, position + framing.LENGTH_SIZE_BYTES)
        assert response_type in (framing.RESPONSE_SUCCESS, framing.RESPONSE_ERROR), response_type
        if response_type == framing.RESPONSE_ERROR:
            body = buffer[position + framing.LENGTH_SIZE_BYTES + framing.RESPONSE_HEADER_SIZE_BYTES : position + framing.LENGTH_SIZE_BYTES + length]
            assert pb.ErrorResponse.FromString(body).error_code != 0
            errors += 1
        responses += 1
        position += framing.LENGTH_SIZE_BYTES + length
    return responses, errors


async def _abuser(server: ServerProcess, abuse: _Abuse, rng: random.Random) -> None:
    host, _, port = server.address.rpartition(":")
    while abuse.more():
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
        except OSError:
            abuse.connect_failures += 1
            await asyncio.sleep(0.01)
            continue
        abuse.connections += 1
        stream = bytearray()
        for _ in range(rng.randint(1, FRAMES_PER_CONNECTION_MAX)):
            frame, ends_stream = _mutate(rng, abuse.captured)
            if _harmful(frame, abuse.protected_table_ids):
                abuse.frames_skipped += 1
                continue
            stream += frame
            abuse.frames_sent += 1
            if ends_stream:
                break
        received = bytearray()
        try:
            position = 0
            while position < len(stream):  # random read sizes on the server's side
                size = rng.choice((1, 3, 7, 64, 1500, 1 << 16))
                writer.write(stream[position : position + size])
                position += size
                if rng.random() < 0.1:
                    await writer.drain()
            await writer.drain()
            read_until = time.monotonic() + rng.choice((0.0, 0.02, 0.1, 0.3))
            while (remaining := read_until - time.monotonic()) > 0:
                chunk = await asyncio.wait_for(reader.read(1 << 16), remaining)
                if not chunk:
                    break
                received += chunk
        except (TimeoutError, ConnectionError, OSError):
            pass
        finally:
            if rng.random() < 0.3:  # a reset rather than a clean close
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
        responses, errors = _check_responses(bytes(received))
        abuse.responses += responses
        abuse.error_responses += errors


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _sample_rss(pid: int, samples: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            samples.append(_rss_bytes(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def _timed_lookup(lookuper: Any, id_: int) -> tuple[float, dict[str, Any] | None]:
    start = time.perf_counter()
    row = await asyncio.wait_for(lookuper.lookup({"id": id_}), LOOKUP_TIMEOUT_S)
    return time.perf_counter() - start, row


async def _open_idle_connections(server: ServerProcess, rng: random.Random) -> list[asyncio.StreamWriter]:
    """Idle connections, and connections holding a half-sent frame, kept open during the fuzzing."""
    host, _, port = server.address.rpartition(":")
    writers = []
    for index in range(IDLE_CONNECTION_COUNT + HALF_FRAME_CONNECTION_COUNT):
        _reader, writer = await asyncio.open_connection(host, int(port))
        if index >= IDLE_CONNECTION_COUNT:
            frame = framing.encode_request(int(ApiKey.LIST_DATABASES), 0, index, b"\x08\x01" * 20)
            writer.write(frame[: rng.randrange(1, len(frame))])
            await writer.drain()
        writers.append(writer)
    return writers


async def test_malformed_frames_from_many_connections_leave_the_server_serving_and_the_data_intact(
    fuzz_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = int(os.environ.get("STROM_FUZZ_SEED", random.randrange(1 << 30)))
    print(f"seed={seed} frames={FRAME_COUNT}")
    rng = random.Random(seed)
    captured = await _capture_real_requests(fuzz_server, monkeypatch)
    pid = fuzz_server.process.pid  # type: ignore[union-attr]

    async with await Connection.create(fuzz_server.address) as connection:
        admin = connection.get_admin()
        kv_path, log_path = TablePath("fluss", "valid_kv"), TablePath("fluss", "valid_log")
        await admin.create_table(kv_path, TableDescriptor(Schema.from_arrow(SCHEMA, primary_key=["id"]), bucket_count=2))
        await admin.create_table(log_path, TableDescriptor(Schema.from_arrow(SCHEMA), bucket_count=1))
        kv_table, log_table = await connection.get_table(kv_path), await connection.get_table(log_path)
        protected = frozenset({kv_table.get_table_info().table_id, log_table.get_table_info().table_id})
        upserts = kv_table.new_upsert().create_writer()
        appends = log_table.new_append().create_writer()
        expected_kv: dict[int, dict[str, Any]] = {}
        expected_log: list[dict[str, Any]] = []
        for id_ in range(ROW_COUNT):
            upserts.upsert(_row(id_, 0))
            appends.append(_row(id_, 0))
        await upserts.flush()
        await appends.flush()
        expected_kv.update((id_, _row(id_, 0)) for id_ in range(ROW_COUNT))
        expected_log += [_row(id_, 0) for id_ in range(ROW_COUNT)]

        lookuper = kv_table.new_lookup().create_lookuper()
        baseline = []
        for _ in range(100):
            id_ = rng.randrange(ROW_COUNT)
            latency_s, row = await _timed_lookup(lookuper, id_)
            assert row == expected_kv[id_]
            baseline.append(latency_s)
        rss_baseline = _rss_bytes(pid)

        idle = await _open_idle_connections(fuzz_server, rng)
        rss_samples: list[int] = []
        stop = asyncio.Event()
        sampler = asyncio.ensure_future(_sample_rss(pid, rss_samples, stop))
        started = time.monotonic()
        abuse = _Abuse(captured, protected, started + FUZZ_TIME_S_MAX)
        abusers = [asyncio.ensure_future(_abuser(fuzz_server, abuse, random.Random(seed + i))) for i in range(ABUSER_COUNT)]

        # the valid client: lookups, and writes whose acknowledgement it remembers
        latencies: list[float] = []
        version = 0
        while not all(task.done() for task in abusers):
            id_ = rng.randrange(ROW_COUNT + version)
            latency_s, row = await _timed_lookup(lookuper, id_)
            assert row == expected_kv.get(id_), f"seed={seed} id={id_}"
            latencies.append(latency_s)
            if len(latencies) % 10 == 0:
                version += 1
                new_id = ROW_COUNT + version - 1
                updated = rng.randrange(ROW_COUNT)
                await asyncio.wait_for(upserts.upsert_batch(pa.Table.from_pylist([_row(updated, version), _row(new_id, version)], schema=SCHEMA)), LOOKUP_TIMEOUT_S)
                expected_kv[updated] = _row(updated, version)
                expected_kv[new_id] = _row(new_id, version)
                appends.append(_row(new_id, version))
                await asyncio.wait_for(appends.flush(), LOOKUP_TIMEOUT_S)
                expected_log.append(_row(new_id, version))
            await asyncio.sleep(0.005)
        for task in abusers:
            task.result()  # an abuser's assertion (a malformed response) fails the test here
        elapsed_s = time.monotonic() - started
        stop.set()
        await sampler
        print(
            f"seed={seed}: {abuse.frames_sent} frames ({abuse.frames_skipped} destructive ones skipped) over "
            f"{abuse.connections} connections in {elapsed_s:.1f} s; {abuse.responses} responses read "
            f"({abuse.error_responses} errors); {len(latencies)} valid lookups, p50 "
            f"{statistics.median(latencies) * 1000:.1f} ms (baseline {statistics.median(baseline) * 1000:.1f} ms); "
            f"RSS {rss_baseline >> 20} -> max {max(rss_samples, default=0) >> 20} MiB"
        )
        assert abuse.frames_sent >= FRAME_COUNT, f"seed={seed}: only {abuse.frames_sent} frames in {elapsed_s:.0f} s"
        # bad input gets a clear error: no handler failed with an unexpected exception (logged with a traceback)
        log_text = fuzz_server.log_text()
        assert "Traceback" not in log_text, f"seed={seed}: " + log_text[log_text.index("Traceback") - 300 :][:3000]
        assert abuse.responses > 0, "no abuser ever read a response"

        # the server survived, and the valid client was served throughout
        assert fuzz_server.process is not None and fuzz_server.process.poll() is None, "the server died"
        assert len(latencies) >= 20, f"seed={seed}: the valid client made little progress ({len(latencies)} lookups)"
        latency_bound_s = max(LATENCY_FLOOR_S, LATENCY_FACTOR_MAX * statistics.quantiles(baseline, n=10)[-1])
        p90_s = statistics.quantiles(latencies, n=10)[-1]
        assert p90_s <= latency_bound_s, f"seed={seed}: p90 lookup {p90_s:.3f} s > {latency_bound_s:.3f} s"
        assert max(rss_samples) <= rss_baseline + RSS_GROWTH_BYTES_MAX, (
            f"seed={seed}: RSS grew from {rss_baseline >> 20} to {max(rss_samples) >> 20} MiB"
        )

        for writer in idle:  # idle and half-sent connections: still open or closed by the idle timeout
            writer.close()

    # a fresh connection reads every acknowledged row intact
    async with await Connection.create(fuzz_server.address) as connection:
        kv_table, log_table = await connection.get_table(kv_path), await connection.get_table(log_path)
        rows = (await (await kv_table.new_scan().create_batch_scanner()).to_arrow()).to_pylist()
        assert {row["id"]: row for row in rows} == expected_kv, f"seed={seed}"
        assert len(rows) == len(expected_kv)
        end = (await connection.get_admin().list_offsets(log_path, [0], OffsetSpec.latest()))[0]
        seen: list[dict[str, Any]] = []
        async for change in log_table.new_scan().create_log_scanner().read_range(log_table.bucket(0), 0, end):
            seen += change.batch.to_pylist()
        assert seen == expected_log, f"seed={seed}"
        lookuper = kv_table.new_lookup().create_lookuper()
        for id_ in rng.sample(sorted(expected_kv), 50):
            assert await lookuper.lookup({"id": id_}) == expected_kv[id_]
