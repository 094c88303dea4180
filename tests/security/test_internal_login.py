"""Server logins (STROM-INTERNAL) with malformed proofs are failed logins like wrong ones: the authenticator
raises AuthenticationError, and the RPC server counts and delays any failure of an authenticator, whatever
it raised, instead of dropping the connection with a traceback (a proof of ``\\xff`` once raised TypeError:
no delay, no count, ~1.5 KB of traceback logged per attempt)."""

from __future__ import annotations

import asyncio
import time

import pytest

from strom.errors import AuthenticationError
from strom.rpc.api_keys import ApiKey
from strom.rpc.auth import Principal
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.rpc.server import RpcServer, bind_listener
from strom.security.internal import INTERNAL_MECHANISM, InternalAuthenticator, InternalCredentials

SECRET = "shared-secret"


@pytest.mark.parametrize("token", [b"coordinator\0\xff", b"coordinator\0\xff" * 8, b"\xff\0abc", b"coordinator",
                                   b"tablet-server-1\0" + "é".encode() * 32])
def test_a_malformed_server_proof_is_a_failed_login(token: bytes) -> None:
    with pytest.raises(AuthenticationError, match="invalid server credentials"):
        InternalAuthenticator(SECRET).authenticate(INTERNAL_MECHANISM, token)


def test_a_valid_server_proof_logs_in() -> None:
    token = InternalCredentials(SECRET, "tablet-server-3").token()
    assert InternalAuthenticator(SECRET).authenticate(INTERNAL_MECHANISM, token) == Principal("Server", "tablet-server-3")


class BrokenAuthenticator:
    """An authenticator with a bug: whatever comes, it raises something other than an authentication error."""

    def authenticate(self, _mechanism: str, _token: bytes) -> Principal:
        raise TypeError("a bug in an authenticator")


@pytest.mark.asyncio
async def test_whatever_an_authenticator_raises_is_a_delayed_and_counted_failed_login() -> None:
    server = RpcServer({}, frame_size_bytes_max=1 << 16, in_flight_count_max=4, idle_timeout_ms=60_000,
                       authenticator=BrokenAuthenticator(), failed_authentication_delay_ms=300)  # type: ignore[arg-type]
    sock = bind_listener("127.0.0.1", 0)
    await server.start(sock)
    try:
        connection = await RpcConnection.connect("127.0.0.1", sock.getsockname()[1])
        try:
            started = time.monotonic()
            with pytest.raises(AuthenticationError, match="malformed token"):
                await connection.request(ApiKey.AUTHENTICATE, pb.AuthenticateRequest(protocol="PLAIN", token=b"x"))
            assert time.monotonic() - started >= 0.25, "answered after the failed-login delay"
            assert server.stats.failed_authentications == 1
        finally:
            await connection.close()
        await asyncio.sleep(0)
    finally:
        await server.stop()
