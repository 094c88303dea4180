"""A throw-away standalone ZooKeeper server for tests and local development.

It runs Debian's ``zookeeper`` package (``scripts/install-zookeeper.sh`` installs it) as one ``java``
process: its own data directory, a free loopback port, no admin HTTP server, and the ``ruok`` four-letter
word enabled so readiness is checked without a client library. The caller owns the process: ``start()``
returns once the server answers ``imok``; ``stop()`` ends exactly that process (by its pid). With ``tls``
its only port speaks TLS (ZooKeeper's ``secureClientPort``, on Netty), presenting a certificate of the
cluster's CA in PEM files.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

from strom.security.certificates import ClusterCertificates, write_secret_file

# Debian installs the server jar here; its manifest's Class-Path names every dependency jar.
ZOOKEEPER_JARS = (Path("/usr/share/java/zookeeper.jar"),)
ZOOKEEPER_MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
NETTY_JARS = (Path("/usr/share/java/netty-codec.jar"), Path("/usr/share/java/netty-resolver.jar"))
"""What ZooKeeper's Netty server (its TLS port) needs beyond the jars Debian's manifest names."""

START_TIMEOUT_MS = 30_000
STOP_TIMEOUT_MS = 10_000
# ZooKeeper's unit of time; sessions may last 2..20 ticks, so a test can expire one in a second.
TICK_TIME_MS = 500
JAVA_HEAP_MB = 128


def zookeeper_jar() -> Path | None:
    """The ZooKeeper server jar, or None when the package is not installed."""
    configured = os.environ.get("STROM_ZOOKEEPER_JAR")
    candidates = (Path(configured),) if configured else ZOOKEEPER_JARS
    return next((jar for jar in candidates if jar.is_file()), None)


def unavailable_reason() -> str | None:
    """Why a ZooKeeper server cannot be started here, or None when it can."""
    if zookeeper_jar() is None:
        return (
            "ZooKeeper is not installed (no /usr/share/java/zookeeper.jar); "
            "run scripts/install-zookeeper.sh (make install does)"
        )
    if shutil.which("java") is None:
        return "no java on PATH to run ZooKeeper"
    return None


EPHEMERAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FIXED_PORT_LOW = 10_000
"""The lowest port :func:`free_port` picks below the kernel's ephemeral range."""
FIXED_PORT_TRIES = 64


def free_port() -> int:
    """A loopback port that is free now, below the kernel's ephemeral range where there is room (Linux's
    default range starts at 32768).

    A port the kernel hands out for ``bind(0)`` lies in that range, and so does the source port of every
    outgoing connection: between this call and the server's bind (or while a killed member is down before
    its restart on the same port), any connection made on the machine could take it, and the server would
    then fail with "address already in use". A port below the range is only ever taken by a bind that
    names it.
    """
    try:
        low = int(EPHEMERAL_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low - FIXED_PORT_LOW >= 1_000:
        for _ in range(FIXED_PORT_TRIES):
            # os.urandom, not random: processes that seed random alike (test runners do) would pick alike
            port = FIXED_PORT_LOW + int.from_bytes(os.urandom(2), "big") % (low - FIXED_PORT_LOW)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def four_letter_word(host: str, port: int, word: str, timeout_ms: int = 1_000,
                     tls: ssl.SSLContext | None = None) -> str:
    """Send a ZooKeeper four-letter command (``ruok``, ``srvr``) and return the reply (over TLS with ``tls``)."""
    with socket.create_connection((host, port), timeout=timeout_ms / 1000) as raw:
        connection = tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
        connection.sendall(word.encode("ascii"))
        chunks = []
        while chunk := connection.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("ascii", "replace")


class ZooKeeperServer:
    """One standalone ZooKeeper on ``127.0.0.1:port`` with its data under ``directory``."""

    def __init__(self, directory: Path, port: int | None = None, *, detached: bool = False,
                 require_auth: bool = False, tls: ClusterCertificates | None = None) -> None:
        """``detached``: the server runs in its own session, so it outlives the starting process (``strom
        cluster start``) and a Ctrl-C in that terminal does not reach it; stop it by its pid.
        ``require_auth``: a client must authenticate (digest) before anything else (ZooKeeper's
        ``enforce.auth.enabled``); the nodes' ACLs then decide what it may do. ``tls``: the port speaks
        only TLS, with these files' server certificate (clients trust their CA)."""
        self._require_auth = require_auth
        self.tls = tls
        self.directory = directory.absolute()  # java runs in it: zoo.cfg's path must not be relative to it
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self._detached = detached
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``host:port``, as ``zookeeper.address`` takes it."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.log"

    def start(self) -> ZooKeeperServer:
        """Start the server and wait until it answers ``ruok``.

        Raises:
            RuntimeError: ZooKeeper is not installed, or it did not become ready within START_TIMEOUT_MS.
        """
        assert self._process is None, "a ZooKeeperServer is started once"
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        jar = zookeeper_jar()
        assert jar is not None
        data_dir = self.directory / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.directory / "zoo.cfg"
        config_path.write_text(
            "\n".join(
                [
                    f"tickTime={TICK_TIME_MS}",
                    f"dataDir={data_dir}",
                    *(self._tls_settings() if self.tls is not None else
                      [f"clientPort={self.port}", f"clientPortAddress={self.host}"]),
                    "maxClientCnxns=0",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr,stat",
                    # a test run makes many small snapshots of nothing: keep the disk quiet
                    "snapCount=100000",
                    "autopurge.snapRetainCount=3",
                    *(["enforce.auth.enabled=true", "enforce.auth.schemes=digest"] if self._require_auth else []),
                    "",
                ]
            )
        )
        command = [
            shutil.which("java") or "java",
            f"-Xmx{JAVA_HEAP_MB}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            ":".join([str(jar), *(str(extra) for extra in NETTY_JARS if self.tls is not None and extra.is_file())]),
            ZOOKEEPER_MAIN_CLASS,
            str(config_path),
        ]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.directory,
                start_new_session=self._detached,
            )
        deadline = time.monotonic() + START_TIMEOUT_MS / 1000
        client_tls = self.client_tls()
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited with {self._process.returncode} at start:\n{self.log_text()[-2000:]}"
                )
            try:
                if four_letter_word(self.host, self.port, "ruok", tls=client_tls) == "imok":
                    return self
            except (OSError, ssl.SSLError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not answer ruok within {START_TIMEOUT_MS} ms:\n{self.log_text()[-2000:]}")

    def _tls_settings(self) -> list[str]:
        """zoo.cfg's lines for a TLS-only port; ZooKeeper reads its key and certificate from one PEM file."""
        assert self.tls is not None
        keystore = self.directory / "keystore.pem"
        write_secret_file(keystore, self.tls.key.read_bytes() + self.tls.certificate.read_bytes())
        return [
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"secureClientPort={self.port}",
            f"secureClientPortAddress={self.host}",
            f"ssl.keyStore.location={keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.tls.ca}",
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=none",
        ]

    def client_tls(self) -> ssl.SSLContext | None:
        """How a client reaches the TLS port (trusting the CA), or None for a plain one."""
        return None if self.tls is None else ssl.create_default_context(cafile=str(self.tls.ca))

    def stop(self) -> int | None:
        """SIGTERM the server (SIGKILL after STOP_TIMEOUT_MS); returns its exit code."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_MS / 1000)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=STOP_TIMEOUT_MS / 1000)
        return process.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
