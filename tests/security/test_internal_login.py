"""Server logins (STROM-INTERNAL): a mutual challenge-response over the cluster's secret.

What each test stands for is an attack that worked against the static token the login used to be: a token
read once off the wire logged in again; a fake server registered in ZooKeeper harvested the token of every
server that connected to it; a proof of ``\\xff`` raised TypeError in the authenticator (no delay, no
count, a traceback logged per attempt).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from strom.errors import AuthenticationError
from strom.rpc.api_keys import ApiKey
from strom.rpc.auth import Challenge, OneStep, Principal
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.rpc.server import RpcServer, bind_listener
from strom.security.internal import (
    INTERNAL_MECHANISM,
    InternalAuthenticator,
    InternalCredentials,
    ListenerAuthenticator,
)

SECRET = "shared-secret"
COORDINATOR = InternalAuthenticator(SECRET, ["coordinator"])


def login(credentials: InternalCredentials, server: InternalAuthenticator) -> tuple[Principal, list[bytes]]:
    """A whole login; returns the principal and what the connecting side sent."""
    client, exchange = credentials.exchange(), server.begin(INTERNAL_MECHANISM)
    sent = [client.first()]
    challenge = exchange.step(sent[0])
    assert isinstance(challenge, Challenge)
    sent.append(client.respond(challenge.data))
    principal = exchange.step(sent[1])
    assert isinstance(principal, Principal)
    client.finish()
    return principal, sent


def test_a_server_logs_in_with_the_secret() -> None:
    principal, _ = login(InternalCredentials(SECRET, "tablet-server-3", "coordinator"), COORDINATOR)
    assert principal == Principal("Server", "tablet-server-3")


def test_what_was_sent_once_does_not_log_in_again() -> None:
    _, sent = login(InternalCredentials(SECRET, "tablet-server-3", "coordinator"), COORDINATOR)
    replayed = COORDINATOR.begin(INTERNAL_MECHANISM)
    assert isinstance(replayed.step(sent[0]), Challenge)  # a fresh nonce of the server's ...
    with pytest.raises(AuthenticationError, match="invalid server credentials"):
        replayed.step(sent[1])  # ... which the captured proof does not cover


def test_a_server_without_the_secret_learns_nothing_replayable() -> None:
    """A fake registration: whoever connects to it finds it cannot prove the secret, and stops."""
    client = InternalCredentials(SECRET, "coordinator", "tablet-server-99").exchange()
    first = client.first()
    fake = InternalAuthenticator("not-the-secret", ["tablet-server-99"]).begin(INTERNAL_MECHANISM)
    challenge = fake.step(first)
    assert isinstance(challenge, Challenge)
    with pytest.raises(AuthenticationError, match="could not prove it knows the cluster's secret"):
        client.respond(challenge.data)
    assert b"\0".join(first.split(b"\0")[:2]) == b"coordinator\0tablet-server-99", "only names and a nonce went out"

    accepting = InternalCredentials(SECRET, "coordinator", "tablet-server-99").exchange()
    accepting.first()
    with pytest.raises(AuthenticationError, match="without proving"):
        accepting.finish()  # a fake that answers "authenticated" at once is refused too


def test_a_login_meant_for_another_server_is_refused() -> None:
    """A relay: a login one server meant for a fake registration, passed on to a real server."""
    client = InternalCredentials(SECRET, "coordinator", "tablet-server-99").exchange()
    with pytest.raises(AuthenticationError, match="invalid server login"):
        InternalAuthenticator(SECRET, ["tablet-server-1"]).begin(INTERNAL_MECHANISM).step(client.first())


@pytest.mark.parametrize("first", [
    b"coordinator\0\xff", b"coordinator\0coordinator\0\xff" * 8, b"\xff\0coordinator\0" + b"0" * 64, b"coordinator",
    b"tablet-server-1\0coordinator\0" + "é".encode() * 32, b"user\0coordinator\0" + b"0" * 64, b"",
])
def test_a_malformed_first_message_is_a_failed_login(first: bytes) -> None:
    with pytest.raises(AuthenticationError):
        COORDINATOR.begin(INTERNAL_MECHANISM).step(first)


@pytest.mark.parametrize("proof", [b"\xff", b"0" * 64, b"a\0b", "é".encode() * 40])
def test_a_malformed_proof_is_a_failed_login(proof: bytes) -> None:
    exchange = COORDINATOR.begin(INTERNAL_MECHANISM)
    assert isinstance(exchange.step(InternalCredentials(SECRET, "tablet-server-1").exchange().first()), Challenge)
    with pytest.raises(AuthenticationError):
        exchange.step(proof)


async def _serve(authenticator: object) -> tuple[RpcServer, int]:
    server = RpcServer({}, frame_size_bytes_max=1 << 16, in_flight_count_max=4, idle_timeout_ms=60_000,
                       authenticator=authenticator, failed_authentication_delay_ms=300)  # type: ignore[arg-type]
    sock = bind_listener("127.0.0.1", 0)
    await server.start(sock)
    return server, sock.getsockname()[1]


@pytest.mark.asyncio
async def test_servers_log_in_over_rpc_in_two_rounds() -> None:
    server, port = await _serve(ListenerAuthenticator(None, InternalAuthenticator(SECRET, ["tablet-server-2"])))
    try:
        connection = await RpcConnection.connect("127.0.0.1", port,
                                                 credentials=InternalCredentials(SECRET, "coordinator", "tablet-server-2"))
        await connection.close()
        with pytest.raises(AuthenticationError, match="invalid server login"):
            await RpcConnection.connect("127.0.0.1", port,
                                        credentials=InternalCredentials(SECRET, "coordinator", "tablet-server-7"))
        assert server.stats.failed_authentications == 1
    finally:
        await server.stop()


class BrokenAuthenticator:
    """An authenticator with a bug: whatever comes, it raises something other than an authentication error."""

    def begin(self, _mechanism: str) -> OneStep:
        def check(_token: bytes) -> Principal:
            raise TypeError("a bug in an authenticator")

        return OneStep(check)


@pytest.mark.asyncio
async def test_whatever_an_authenticator_raises_is_a_delayed_and_counted_failed_login() -> None:
    server, port = await _serve(BrokenAuthenticator())
    try:
        connection = await RpcConnection.connect("127.0.0.1", port)
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
