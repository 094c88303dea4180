"""Limits before login, against a real secured server: connections per address, memory held by connections
that have not logged in, their idle time, and failed logins per source address.

Each test is an attack that worked before: 2 000 connections each holding 512 KiB - 1 of one frame took the
server from 143 MB to 1 152 MB for the 10-minute idle timeout; 64 connections made 592 wrong guesses a
second (the delay held per connection only); nothing limited connections from one address.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.rpc import framing
from tests.integration.security_support import SECURE_CONFIG
from tests.integration.test_authentication_limits import _authenticate, _closed_by_server, _connect
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("security")]

HALF_FRAME_BYTES = 500 * 1024


def _answer(sock: socket.socket) -> bytes:
    """One response frame's body ("" when the server closed the connection instead)."""
    try:
        header = sock.recv(framing.LENGTH_SIZE_BYTES)
    except ConnectionResetError:  # closed as it was accepted
        return b""
    if len(header) < framing.LENGTH_SIZE_BYTES:
        return b""
    (length,) = framing.LENGTH.unpack(header)
    data = b""
    while len(data) < length:
        chunk = sock.recv(length - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_connections_from_one_address_are_capped(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory({**SECURE_CONFIG, "max.connections.per.ip": "5"})
    held = [_connect(server) for _ in range(5)]
    try:
        with _connect(server) as refused:
            assert _closed_by_server(refused, 5), "a sixth connection from the address was served"
        held.pop().close()
        time.sleep(0.3)
        with _connect(server) as again:
            again.sendall(_authenticate("admin", "admin-secret"))
            assert _answer(again)[:1] == bytes([framing.RESPONSE_SUCCESS]), "room again once one closed"
    finally:
        for sock in held:
            sock.close()


def test_half_frames_of_connections_that_have_not_logged_in_stay_under_the_cap(
    server_factory: Callable[..., ServerProcess],
) -> None:
    cap = 8 << 20
    server = server_factory({**SECURE_CONFIG, "security.unauthenticated.max-buffered-bytes": "8mb"})
    assert server.process is not None
    before = _rss_bytes(server.process.pid)
    socks = []
    try:
        for _ in range(300):  # 150 MB of half frames offered
            sock = _connect(server)
            socks.append(sock)
            try:
                sock.sendall(framing.LENGTH.pack(512 * 1024 - 1) + b"\0" * HALF_FRAME_BYTES)
            except OSError:
                continue  # closed by the server: over the cap
        time.sleep(1.0)
        grown = _rss_bytes(server.process.pid) - before
        assert grown < cap + (32 << 20), f"the server grew {grown >> 20} MB holding half frames"
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.5)
    with _connect(server) as admin:  # the held bytes were given back with their connections
        admin.sendall(_authenticate("admin", "admin-secret"))
        assert _answer(admin)[:1] == bytes([framing.RESPONSE_SUCCESS])


def test_a_connection_that_does_not_log_in_is_closed_after_the_short_idle_time(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory({**SECURE_CONFIG, "security.unauthenticated.max-idle-time": "1s"})
    with _connect(server) as silent, _connect(server) as logged_in:
        logged_in.sendall(_authenticate("admin", "admin-secret"))
        assert _answer(logged_in)[:1] == bytes([framing.RESPONSE_SUCCESS])
        assert _closed_by_server(silent, 5), "a connection that never logged in outlived the short idle time"
        assert not _closed_by_server(logged_in, 1.5), "a logged-in connection has the long idle time"


def test_failed_logins_from_one_address_are_paced_then_blocked_across_connections(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory({**SECURE_CONFIG, "security.failed-authentication.max-per-address": "4",
                             "security.failed-authentication.block-time": "3s"})
    waits = []
    for attempt in range(4):
        with _connect(server) as sock:
            started = time.monotonic()
            sock.sendall(_authenticate("admin", f"guess-{attempt}"))
            assert _answer(sock)[:1] == bytes([framing.RESPONSE_ERROR])
            waits.append(time.monotonic() - started)
    assert waits[-1] >= 0.7 and waits[-1] > 3 * waits[0], f"each failure of the address waits longer: {waits}"
    with _connect(server) as blocked:  # blocked now: even the right password gets no answer
        blocked.sendall(_authenticate("admin", "admin-secret"))
        assert _answer(blocked) == b""
    time.sleep(3.2)
    with _connect(server) as later:
        later.sendall(_authenticate("admin", "admin-secret"))
        assert _answer(later)[:1] == bytes([framing.RESPONSE_SUCCESS]), "the block ends"
    log = server.log_text()
    assert log.count("blocking 127.0.0.1") == 1, "the block is logged once"


def test_per_address_overrides_are_read_in_kafkas_form() -> None:
    from strom.config import Configuration
    from strom.errors import InvalidConfigError
    from strom.server.node import admission_limits

    limits = admission_limits(Configuration({"max.connections.per.ip.overrides": "10.0.0.7:10000, ::1:3"}))
    assert dict(limits.per_address_overrides) == {"10.0.0.7": 10_000, "::1": 3}
    with pytest.raises(InvalidConfigError, match="ADDRESS:COUNT"):
        admission_limits(Configuration({"max.connections.per.ip.overrides": "10.0.0.7"}))
