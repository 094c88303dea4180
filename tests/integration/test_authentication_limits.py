"""What a connection that has not authenticated can cost a secured server: small frames only, none of the
shared request budget, no escape from the idle timeout by trickling bytes, and one paced guess per
connection (Kafka's ``sasl.server.max.receive.size`` and ``connection.failed.authentication.delay.ms``).

Each test is an attack that worked before: ~100 MB frame declarations trickled a byte at a time held the
server-wide budget and stalled an admin's 100 KiB request; 17 000 wrong passwords per second went through
one connection, each logged.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.security_support import SECURE_CONFIG, strom_config
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("security")]

IDLE_S = 2
LIMITED = {**SECURE_CONFIG, "server.max-buffered-request-bytes": "1mb", "netty.connection.max-idle-time": f"{IDLE_S}s"}
"""A 1 MB shared budget: two unauthenticated ~500 KB frames would have taken all of it."""


@pytest.fixture
def secured(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    yield server_factory(LIMITED)


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` within ``within_s`` (reading past any answer it sent)."""
    sock.settimeout(within_s)
    deadline = time.monotonic() + within_s
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def _authenticate(user: str, password: str, request_id: int = 1) -> bytes:
    token = b"\0" + user.encode() + b"\0" + password.encode()
    body = pb.AuthenticateRequest(protocol="PLAIN", token=token).SerializeToString()
    return framing.encode_request(int(ApiKey.AUTHENTICATE), 0, request_id, body)


def test_a_large_frame_before_authentication_closes_the_connection(secured: ServerProcess) -> None:
    for declared in (600 * 1024, 100 << 20):
        with _connect(secured) as sock:
            sock.sendall(framing.LENGTH.pack(declared) + b"\0" * 16)
            assert _closed_by_server(sock, 10), f"a {declared}-byte frame was accepted before authentication"


def test_trickled_half_frames_neither_hold_the_budget_nor_escape_the_idle_timeout(secured: ServerProcess) -> None:
    trickling = [_connect(secured) for _ in range(3)]
    try:
        for sock in trickling:  # each declares a ~500 KB frame (allowed size) and sends a few bytes of it
            sock.sendall(framing.LENGTH.pack(500 * 1024) + b"\x03\xea\x00\x00")

        async def admin_request() -> None:
            async with await Connection.create(strom_config(secured, "admin")) as connection:
                path = TablePath("fluss", unique_name("budget"))
                schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("blob", pa.binary())]), ["id"])
                await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
                table = await connection.get_table(path)
                writer = table.new_upsert().create_writer()  # one ~100 KiB request
                await writer.upsert_batch(pa.table({"id": [1], "blob": [b"x" * (100 * 1024)]}))

        asyncio.run(asyncio.wait_for(admin_request(), 30))  # would wait as long as the trickle lasts
        closed = []
        deadline = time.monotonic() + IDLE_S * 6
        while len(closed) < len(trickling) and time.monotonic() < deadline:
            for sock in trickling:
                if sock in closed:
                    continue
                try:
                    sock.sendall(b"\0")  # a byte every 0.3 s: activity before, not any more
                except OSError:
                    closed.append(sock)
                    continue
                if _closed_by_server(sock, 0.1):
                    closed.append(sock)
            time.sleep(0.3)
        assert len(closed) == len(trickling), "a trickling unauthenticated connection outlived the idle timeout"
    finally:
        for sock in trickling:
            sock.close()


def test_a_wrong_password_is_answered_late_and_ends_the_connection(secured: ServerProcess) -> None:
    guesses = 4  # answered after 0.1, 0.2, 0.4 and 0.8 s: each failure of an address waits twice the last
    started = time.monotonic()
    for attempt in range(guesses):
        with _connect(secured) as sock:
            sock.sendall(_authenticate("admin", f"guess-{attempt}"))
            length = framing.LENGTH.unpack(sock.recv(framing.LENGTH_SIZE_BYTES))[0]
            answer = sock.recv(length)
            assert answer[0] == framing.RESPONSE_ERROR
            sock.sendall(_authenticate("admin", "another-guess", 2))  # no second try on this connection
            assert _closed_by_server(sock, 10)
    assert guesses / (time.monotonic() - started) < 10, "each failure is answered after 100 ms at the least"
    failures_logged = [line for line in secured.log_text().splitlines() if "authentication from" in line]
    assert len(failures_logged) <= 2, failures_logged


def test_new_wrong_credentials_on_an_authenticated_connection_fail(secured: ServerProcess) -> None:
    with _connect(secured) as sock:
        sock.sendall(_authenticate("admin", "admin-secret"))
        length = framing.LENGTH.unpack(sock.recv(framing.LENGTH_SIZE_BYTES))[0]
        assert sock.recv(length)[0] == framing.RESPONSE_SUCCESS
        sock.sendall(_authenticate("admin", "wrong", 2))
        length = framing.LENGTH.unpack(sock.recv(framing.LENGTH_SIZE_BYTES))[0]
        assert sock.recv(length)[0] == framing.RESPONSE_ERROR
        assert _closed_by_server(sock, 10)
