"""A fake tablet server registered in ZooKeeper learns nothing that logs in.

The attacker here holds ZooKeeper's credentials (one without them can no longer write there:
``test_zookeeper_acls.py``) and registers ``/tabletservers/ids/99`` pointing at a server of its own. The
coordinator then reaches that server, as it reaches every registered tablet server:

- on a ``--secure`` cluster the fake must speak TLS, but its certificate is not from the cluster's CA: the
  coordinator ends every handshake, and a client that is sent there does too, so not one byte of a login
  or a password reaches it;
- on a cluster whose listener is SASL without TLS, the fake speaks strom's RPCs and answers logins without
  the cluster's secret: the coordinator sends the first message of its login (its name, the name it meant
  to reach, a fresh nonce), finds the fake's proof wrong and sends nothing more, and what the fake saw
  does not log in to the real coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from kazoo.client import KazooClient

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import AuthenticationError, ConnectionFailedError, NetworkError
from strom.rpc.api_keys import ApiKey
from strom.rpc.auth import Challenge, Principal
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.rpc.server import RpcServer, bind_listener
from strom.security.internal import INTERNAL_MECHANISM, InternalAuthenticator
from strom.server.local_cluster import LocalCluster
from strom.zk.metadata_store import connect_kazoo, parse_location
from strom.zk.zookeeper_server import unavailable_reason
from tests.conftest import unique_name
from tests.tls_support import make_certificates

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

FAKE_ID = 99
WAIT_S = 30.0


@contextlib.contextmanager
def _cluster(data_dir: Path, config: dict[str, str]) -> Iterator[LocalCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(data_dir, 1, {"kv.snapshot.interval": "0s", **config}, secure=True).start()
    try:
        yield local
    finally:
        local.stop()


def _register_fake(local: LocalCluster, port: int) -> KazooClient:
    """Register tablet server 99 at ``port`` with the cluster's own ZooKeeper credentials (the session
    holds the ephemeral node: close it to take the registration away)."""
    hosts, root = parse_location(local.zookeeper_address)
    client = connect_kazoo(hosts, 10_000, login=local.zookeeper_login())
    document = {"version": 3, "listeners": f"FLUSS://127.0.0.1:{port}", "register_timestamp": int(time.time() * 1000)}
    client.create(f"{root}/tabletservers/ids/{FAKE_ID}", json.dumps(document).encode(), ephemeral=True)
    return client


def _place_buckets(local: LocalCluster) -> None:
    """Create a table of one replica per bucket and more buckets than servers: some land on server 99, and
    the coordinator tells it it leads them (that is when it reaches a tablet server)."""
    async def create() -> None:
        async with await Connection.create(local.client_config()) as connection:
            path = TablePath("fluss", unique_name("spread"))
            schema = Schema.from_arrow(pa.schema([pa.field("id", pa.int64(), nullable=False)]), ["id"])
            await connection.get_admin().create_table(path, TableDescriptor(
                schema, bucket_count=8, properties={"table.replication.factor": "1"}))

    asyncio.run(create())


def _secrets(local: LocalCluster) -> list[bytes]:
    settings = local.settings()
    return [local.admin_password().encode(), settings["security.internal.secret"].encode(),
            settings["zookeeper.auth.digest"].encode()]


@dataclass
class FakeTlsServer:
    """A TLS listener with the attacker's own certificate, recording what it is sent after a handshake."""

    context: ssl.SSLContext
    sock: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))
    connections: int = 0
    handshakes: int = 0
    received: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            raw.settimeout(5)
            try:
                with self.context.wrap_socket(raw, server_side=True) as tls:
                    self.handshakes += 1
                    while chunk := tls.recv(65536):
                        self.received += chunk
            except (ssl.SSLError, OSError):
                raw.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close()


def _wait(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_on_a_secure_cluster_a_fake_server_gets_no_handshake_and_no_byte(tmp_path: Path) -> None:
    certificates = make_certificates(tmp_path / "attacker")  # a CA of the attacker's, not the cluster's
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates.server_certificate, certificates.server_key)
    fake = FakeTlsServer(context)
    try:
        with _cluster(tmp_path / "cluster", {}) as local:
            assert local.uses_tls()
            registration = _register_fake(local, fake.port)
            try:
                _place_buckets(local)
                _wait(lambda: fake.connections >= 1, "the coordinator to reach the registered server")
                # a client sent there (the metadata names server 99) logs in over TLS too: it fails first
                with pytest.raises((ConnectionFailedError, NetworkError)):
                    asyncio.run(Connection.create({**local.client_config(), "bootstrap.servers": f"127.0.0.1:{fake.port}"}))
                time.sleep(1.0)  # the coordinator keeps trying: give it time to send anything it would
            finally:
                registration.stop()
                registration.close()
            assert fake.handshakes == 0, "a member or client accepted the attacker's certificate"
            assert bytes(fake.received) == b""
    finally:
        fake.close()


class RecordingAuthenticator:
    """A fake server's logins: it does not know the cluster's secret, answers server logins with a proof
    under a guess, and records every token it is sent."""

    def __init__(self) -> None:
        self.tokens: list[tuple[str, bytes]] = []
        self._guess = InternalAuthenticator("a guessed secret", ["tablet-server-99"])

    def begin(self, mechanism: str) -> RecordingExchange:
        return RecordingExchange(self, mechanism)


class RecordingExchange:
    def __init__(self, owner: RecordingAuthenticator, mechanism: str) -> None:
        self._owner, self._mechanism = owner, mechanism
        self._inner = owner._guess.begin(INTERNAL_MECHANISM) if mechanism == INTERNAL_MECHANISM else None

    def step(self, token: bytes) -> Principal | Challenge:
        self._owner.tokens.append((self._mechanism, token))
        if self._inner is None:
            raise AuthenticationError("authentication failed")
        return self._inner.step(token)


def test_without_tls_a_fake_server_sees_only_a_login_s_first_message_which_does_not_log_in(tmp_path: Path) -> None:
    with _cluster(tmp_path / "cluster", {"security.protocol.map": "FLUSS:SASL"}) as local:
        assert not local.uses_tls()
        recorder = RecordingAuthenticator()

        async def fake_server_while_registered(local: LocalCluster, recorder: RecordingAuthenticator) -> None:
            server = RpcServer({}, frame_size_bytes_max=1 << 20, in_flight_count_max=8, idle_timeout_ms=60_000,
                               authenticator=recorder, failed_authentication_delay_ms=10)  # type: ignore[arg-type]
            sock = bind_listener("127.0.0.1", 0)
            await server.start(sock)
            registration = await asyncio.to_thread(_register_fake, local, sock.getsockname()[1])
            try:
                await asyncio.to_thread(_place_buckets, local)
                deadline = time.monotonic() + WAIT_S
                while not recorder.tokens:
                    assert time.monotonic() < deadline, "the coordinator never tried to log in to server 99"
                    await asyncio.sleep(0.1)
                await asyncio.sleep(2.0)  # its retries: each must stop after the first message too
            finally:
                registration.stop()
                registration.close()
                await server.stop()

        asyncio.run(fake_server_while_registered(local, recorder))
        mechanisms = {mechanism for mechanism, _ in recorder.tokens}
        assert mechanisms == {INTERNAL_MECHANISM}, "only server logins reached it; no client's password"
        for _, token in recorder.tokens:
            name, target, nonce = token.split(b"\0")
            assert (name, target, len(nonce) >= 16) == (b"coordinator", f"tablet-server-{FAKE_ID}".encode(), True)
        assert len({token for _, token in recorder.tokens}) == len(recorder.tokens), "a fresh nonce every time"
        everything = b"".join(token for _, token in recorder.tokens)
        assert not any(secret in everything for secret in _secrets(local))

        async def replay(local: LocalCluster, recorder: RecordingAuthenticator) -> None:
            """What the fake saw, sent to the real coordinator: as it is, it names server 99 and is refused;
            edited to name the coordinator, it draws a challenge that nothing recorded answers."""
            host, _, port = local.bootstrap.partition(",")[0].rpartition(":")
            first = recorder.tokens[0][1]
            name, _target, nonce = first.split(b"\0")
            for attempt in ([first], [b"\0".join([name, b"coordinator", nonce]), recorder.tokens[-1][1]]):
                connection = await RpcConnection.connect(host, int(port))
                try:
                    *opening, last = attempt
                    for token in opening:
                        answer = await connection.request(ApiKey.AUTHENTICATE, pb.AuthenticateRequest(
                            protocol=INTERNAL_MECHANISM, token=token))
                        assert answer.challenge, "a first message naming the coordinator draws a challenge"
                    with pytest.raises(AuthenticationError):
                        await connection.request(ApiKey.AUTHENTICATE, pb.AuthenticateRequest(
                            protocol=INTERNAL_MECHANISM, token=last))
                finally:
                    await connection.close()

        asyncio.run(replay(local, recorder))
