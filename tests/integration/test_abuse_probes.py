"""What a hostile or broken client tried against a fresh ``strom server``, each kept as a test: the server
answers with clear errors, keeps serving other clients, and stores nothing it should not."""

from __future__ import annotations

import asyncio
import struct

import pytest

from strom.errors import InvalidConfigError
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import ext, pb

pytestmark = pytest.mark.asyncio


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def _lease_ids(rpc: RpcConnection) -> list[str]:
    response = await rpc.request(ApiKey.LIST_KV_SNAPSHOT_LEASES, ext.ListKvSnapshotLeasesRequest())
    return [lease.lease_id for lease in response.leases]


@pytest.mark.parametrize(
    ("lease_id", "duration_ms", "complaint"),
    [
        ("probe-zero", 0, "duration"),
        ("probe-negative", -5, "duration"),
        ("probe-huge", 2**63 - 1, "duration"),
        ("", 60_000, "empty"),
        ("x" * 100_000, 60_000, "characters"),
        ("bell\x07\x00", 60_000, "unprintable"),
    ],
)
async def test_a_bad_lease_request_gets_a_clear_error_and_stores_nothing(
    server, lease_id: str, duration_ms: int, complaint: str  # type: ignore[no-untyped-def]
) -> None:
    host, port = _host_port(server.address)
    rpc = await RpcConnection.connect(host, port)
    try:
        before = await _lease_ids(rpc)
        request = pb.AcquireKvSnapshotLeaseRequest(lease_id=lease_id, lease_duration_ms=duration_ms)
        with pytest.raises(InvalidConfigError, match=complaint):
            await rpc.request(ApiKey.ACQUIRE_KV_SNAPSHOT_LEASE, request)
        assert await _lease_ids(rpc) == before
    finally:
        await rpc.close()
    assert not [line for line in server.log_text().splitlines() if "Traceback" in line]


async def test_a_lease_id_that_is_not_utf8_is_refused(server) -> None:  # type: ignore[no-untyped-def]
    body = pb.AcquireKvSnapshotLeaseRequest(lease_id="ab", lease_duration_ms=60_000).SerializeToString()
    body = body.replace(b"ab", b"\xff\xfe")
    frame = framing.encode_request(int(ApiKey.ACQUIRE_KV_SNAPSHOT_LEASE), 0, 7, body)
    host, port = _host_port(server.address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(frame)
        await writer.drain()
        (length,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 10))
        answer = await reader.readexactly(length)
        response_type, request_id = framing.RESPONSE_HEADER.unpack_from(answer, 0)
        assert (response_type, request_id) == (framing.RESPONSE_ERROR, 7)
        error = pb.ErrorResponse.FromString(answer[framing.RESPONSE_HEADER_SIZE_BYTES :])
        assert (error.error_code, "UTF-8" in error.error_message) == (InvalidConfigError.code, True)
    finally:
        writer.close()
