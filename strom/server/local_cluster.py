"""A cluster on this machine for development and tests (``strom cluster start|stop|status``): a throw-away
ZooKeeper, one coordinator and N tablet servers, each a process with its own data directory under one
``--data-dir``, all on free loopback ports and sharing ``<data-dir>/remote`` as remote storage. With
``embedded_metadata`` there is no ZooKeeper: the processes share the SQLite file ``<data-dir>/cluster.sqlite``
for metadata and membership (what ``strom server --workers N`` runs, :mod:`strom.server.workers`).

What was started is written to ``<data-dir>/cluster.json`` (pids, addresses), so ``stop`` and ``status``
work from another shell; ``stop`` signals only those pids. Every member reads its settings from
``<data-dir>/cluster.yaml`` (readable by its owner only): the ``-D`` settings given at start, ZooKeeper's
address, and ``security.internal.secret``, generated unless one was given, so that even a development
cluster obeys no plain client's control requests. A member restarted later gets the same settings.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from strom.config import (
    METADATA_SQLITE_PATH,
    SECURITY_INTERNAL_ALLOW_UNAUTHENTICATED,
    SECURITY_INTERNAL_SECRET,
    TABLET_SERVER_RACK,
    ZOOKEEPER_AUTH_DIGEST,
    ZOOKEEPER_SSL_CLIENT_ENABLE,
    ZOOKEEPER_SSL_TRUSTSTORE,
    Configuration,
)
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.security.authenticator import PLAIN_LOGIN_MODULE, parse_plain_jaas_users
from strom.security.certificates import ClusterCertificates, write_secret_file
from strom.security.server_security import main_listener_protocol, parse_protocol_map
from strom.security.tls import uses_tls
from strom.zk.login import ZooKeeperLogin
from strom.zk.zookeeper_server import ZooKeeperServer, free_port

ADMIN = "admin"
"""The super user of a ``secure`` local cluster."""
MAIN_LISTENER = "FLUSS"
PYFLUSS_LISTENER = "PYFLUSS"
"""The SASL listener without TLS that ``sasl_listener`` adds for pyfluss (which has no TLS)."""
TLS_DIR = "tls"
"""Where a ``secure`` cluster's generated CA and server certificate go, under its data directory."""
STATE_FILE = "cluster.json"
CONFIG_FILE = "cluster.yaml"
EMBEDDED_METADATA_FILE = "cluster.sqlite"
"""The metadata and membership the processes of an ``embedded_metadata`` cluster share."""
SUPERVISOR_PID_ENV = "STROM_SUPERVISOR_PID"
"""Set in a member's environment when a supervisor runs it: the member stops when that process is gone."""
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass
class Member:
    """One process of the local cluster."""

    role: str  # "zookeeper", "coordinator" or "tablet-server"
    pid: int
    address: str
    server_id: int | None = None
    log: str = ""
    listeners: dict[str, str] = field(default_factory=dict)
    """Its listeners beside the main one (``address``), by name: ``{"PYFLUSS": "127.0.0.1:41234"}``."""

    @property
    def name(self) -> str:
        """``tablet-server-2``, ``coordinator-1``, ``zookeeper``: its directory's and log's name."""
        return self.role if self.server_id is None else f"{self.role}-{self.server_id}"


@dataclass
class LocalClusterState:
    data_dir: str
    members: list[Member] = field(default_factory=list)
    secure: bool = False
    sasl_listener: bool = False
    embedded_metadata: bool = False
    supervisor_pid: int | None = None
    """The process that restarts the members (``strom server --workers N``): a stop goes through it."""

    @property
    def zookeeper(self) -> str:
        return next(m.address for m in self.members if m.role == "zookeeper")

    @property
    def coordinators(self) -> list[str]:
        return [m.address for m in self.members if m.role == "coordinator"]

    def save(self) -> None:
        """Written whole and renamed into place: `cluster status` and `cluster stop` (and a supervisor
        restarting a member) may read it at any moment, and must never see it half written."""
        path = Path(self.data_dir) / STATE_FILE
        temporary = path.with_name(f".{STATE_FILE}.{uuid.uuid4().hex}.tmp")
        temporary.write_text(json.dumps(asdict(self), indent=2))
        os.replace(temporary, path)

    @classmethod
    def load(cls, data_dir: Path) -> LocalClusterState | None:
        path = data_dir / STATE_FILE
        if not path.exists():
            return None
        document = json.loads(path.read_text())
        return cls(document["data_dir"], [Member(**member) for member in document["members"]],
                   document.get("secure", False), document.get("sasl_listener", False),
                   document.get("embedded_metadata", False), document.get("supervisor_pid"))


def answers_rpc(address: str, timeout_s: float = 2.0, tls: bool | ssl.SSLContext = False) -> bool:
    """Whether a strom process serves RPCs at ``address`` (it answers ApiVersions). Over TLS when ``tls``:
    with that context, or (``True``) checking no certificate, as this asks only whether it serves."""
    host, _, port = address.rpartition(":")
    request = pb.ApiVersionsRequest(client_software_name="strom-cluster", client_software_version="0")
    frame = framing.encode_request(int(ApiKey.API_VERSIONS), 0, 0, request.SerializeToString())
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as plain:
            context = tls if isinstance(tls, ssl.SSLContext) else _unverified_tls() if tls else None
            sock = context.wrap_socket(plain, server_hostname=host) if context is not None else plain
            sock.sendall(frame)
            header = sock.recv(framing.LENGTH_SIZE_BYTES + framing.RESPONSE_HEADER_SIZE_BYTES)
    except OSError:
        return False
    return len(header) > framing.LENGTH_SIZE_BYTES and header[framing.LENGTH_SIZE_BYTES] == framing.RESPONSE_SUCCESS


def _unverified_tls() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalCluster:
    """Start and stop a local cluster. ``detached``: the processes outlive this one (the CLI)."""

    def __init__(
        self,
        data_dir: Path,
        tablet_servers: int = 3,
        config: dict[str, str] | None = None,
        *,
        coordinators: int = 1,
        detached: bool = False,
        secure: bool = False,
        sasl_listener: bool = False,
        racks: Sequence[str] = (),
        member_config: Mapping[str, Mapping[str, str]] | None = None,
        embedded_metadata: bool = False,
        host: str = "127.0.0.1",
        supervised: bool = False,
    ) -> None:
        """``coordinators``: one active, the others standbys that take over when it is gone. ``secure``:
        clients must log in (SASL/PLAIN) over TLS (SASL_SSL, with a generated private CA unless
        ``security.ssl.certificate`` is given), the servers log in to each other over TLS too, ACLs are
        enforced, ZooKeeper speaks only TLS and requires a login, and the super user ``admin`` gets a generated password
        (:meth:`admin_password`). ``sasl_listener`` (with ``secure``): every server also listens with SASL
        but without TLS, for pyfluss, on a port of its own (:meth:`pyfluss_config`). ``racks``: tablet server i's ``tablet-server.rack`` is
        ``racks[i - 1]`` (none given: no racks). ``member_config``: settings for one member alone, by its name
        (``tablet-server-2``), over the common ones (a fault-injection harness routes a member's traffic
        through proxies this way). ``embedded_metadata``: no ZooKeeper, the members share an SQLite file
        (one machine only). ``host``: the address the members listen on. ``supervised``: the members stop
        when this process is gone (its pid in their environment)."""
        if racks and len(racks) != tablet_servers:
            raise ValueError(f"{len(racks)} racks for {tablet_servers} tablet servers")
        self.racks = tuple(racks)
        self.member_config = {name: dict(values) for name, values in (member_config or {}).items()}
        self.secure = secure
        if sasl_listener and not secure:
            raise ValueError("a SASL listener without TLS goes with a secure cluster (a plain one is open anyway)")
        if sasl_listener and config and "bind.listeners" in config:
            raise ValueError("give either a SASL listener or your own bind.listeners")
        self.sasl_listener = sasl_listener
        if embedded_metadata and (secure or coordinators != 1):
            raise ValueError("a cluster on the embedded metadata store has one coordinator and no secure mode")
        if tablet_servers < 1 or coordinators < 1:
            raise ValueError("a cluster needs at least one coordinator and one tablet server")
        self.coordinator_count = coordinators
        self.data_dir = data_dir.resolve()
        self.tablet_server_count = tablet_servers
        self.config = dict(config or {})
        self.detached = detached
        self.embedded_metadata = embedded_metadata
        self.host = host
        self.supervised = supervised
        self.state = LocalClusterState(str(self.data_dir), secure=secure, sasl_listener=sasl_listener,
                                       embedded_metadata=embedded_metadata)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._zookeeper: ZooKeeperServer | None = None

    @property
    def zookeeper_address(self) -> str:
        return self.state.zookeeper

    @property
    def bootstrap(self) -> str:
        """The coordinators' addresses: what clients are given as ``bootstrap.servers``."""
        return ",".join(self.state.coordinators)

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_FILE

    def common_config(self) -> dict[str, str]:
        """Every member's settings: ZooKeeper, shared remote storage, the start's ``-D`` settings and the
        servers' shared secret (generated unless given, or unless the insecure mode was asked for)."""
        config = {
            **({METADATA_SQLITE_PATH.key: str(self.data_dir / EMBEDDED_METADATA_FILE)} if self.embedded_metadata
               else {"zookeeper.address": self.zookeeper_address}),
            "remote.data.dir": str(self.data_dir / "remote"),
            **self.config,
        }
        insecure = str(config.get(SECURITY_INTERNAL_ALLOW_UNAUTHENTICATED.key, "")).lower() == "true"
        if not config.get(SECURITY_INTERNAL_SECRET.key) and not insecure:
            config[SECURITY_INTERNAL_SECRET.key] = secrets.token_urlsafe(32)
        if self.secure:  # the start's own settings win, but admin stays a super user
            protocols = f"{MAIN_LISTENER}:SASL_SSL" + (f",{PYFLUSS_LISTENER}:SASL" if self.sasl_listener else "")
            secured = {
                "security.protocol.map": protocols,
                "security.sasl.enabled.mechanisms": "PLAIN",
                "security.sasl.plain.jaas.config":
                    f'{PLAIN_LOGIN_MODULE} required user_{ADMIN}="{secrets.token_urlsafe(16)}";',
                "authorizer.enabled": "true",
            }
            config = {**secured, **config}
            # ZooKeeper closed to strangers: every node strom creates is its identity's alone
            config.setdefault(ZOOKEEPER_AUTH_DIGEST.key, f"strom:{secrets.token_urlsafe(24)}")
            # and reached over TLS only, its certificate from the cluster's CA
            config[ZOOKEEPER_SSL_CLIENT_ENABLE.key] = "true"
            config[ZOOKEEPER_SSL_TRUSTSTORE.key] = str(self.certificates.ca)
            config["super.users"] = ";".join(filter(None, [f"User:{ADMIN}", self.config.get("super.users")]))
            if self.sasl_listener:
                config["internal.listener.name"] = MAIN_LISTENER
            protocols_used = parse_protocol_map(config["security.protocol.map"]).values()
            if any(uses_tls(protocol) for protocol in protocols_used) and not config.get("security.ssl.certificate"):
                config.update(self.certificates.server_config())
        return config

    @property
    def certificates(self) -> ClusterCertificates:
        """Where a ``secure`` cluster's generated CA and server certificate are (made at :meth:`start`)."""
        return ClusterCertificates(self.data_dir / TLS_DIR)

    def client_config(self, user: str = ADMIN, password: str | None = None) -> dict[str, str]:
        """The options of a strom client (or Spark's ``fluss`` source) of this cluster: its bootstrap servers
        and, on a secure cluster, TLS trusting the cluster's CA and a login as ``user`` (``admin`` and its
        generated password unless given)."""
        config = {"bootstrap.servers": self.bootstrap}
        if not self.secure:
            return config
        tls = self.uses_tls()
        config.update({
            "client.security.protocol": "SASL_SSL" if tls else "SASL",
            "client.security.sasl.mechanism": "PLAIN",
            "client.security.sasl.username": user,
            "client.security.sasl.password": self.admin_password() if password is None else password,
        })
        if tls:
            config["client.security.ssl.truststore"] = self.settings()["security.ssl.truststore"]
        return config

    @property
    def pyfluss_bootstrap(self) -> str:
        """The coordinators' SASL listeners without TLS (``sasl_listener``), else their main ones."""
        coordinators = [m for m in self.state.members if m.role == "coordinator"]
        return ",".join(m.listeners.get(PYFLUSS_LISTENER, m.address) for m in coordinators)

    def zookeeper_login(self) -> ZooKeeperLogin:
        """How a client reaches this cluster's ZooKeeper as strom's servers do (its digest identity, and
        TLS on a secure cluster)."""
        return ZooKeeperLogin.from_config(Configuration(self.settings()))

    def pyfluss_config(self, user: str = ADMIN, password: str | None = None) -> dict[str, str]:
        """pyfluss's options (its names, without ``client.``) for this cluster: on a secure cluster, a login
        as ``user`` on the SASL listener without TLS."""
        config = {"bootstrap.servers": self.pyfluss_bootstrap}
        if self.secure:
            config.update({
                "security.protocol": "sasl", "security.sasl.mechanism": "PLAIN", "security.sasl.username": user,
                "security.sasl.password": self.admin_password() if password is None else password,
            })
        return config

    def admin_password(self) -> str:
        """The generated password of the super user ``admin`` of a ``secure`` cluster."""
        jaas = self.settings()["security.sasl.plain.jaas.config"]
        return parse_plain_jaas_users(jaas)[ADMIN]

    def _write_config(self, config: Mapping[str, str]) -> None:
        """``cluster.yaml``, created readable by its owner only (it holds the servers' secret)."""
        write_secret_file(self.config_path, yaml.safe_dump(dict(config), sort_keys=True).encode())

    def start(self, ports: Mapping[tuple[str, int], int] | None = None) -> LocalCluster:
        """Start every member; ``ports``: a member's port by ``(role, server id)`` (free ones otherwise)."""
        ports = ports or {}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        existing = LocalClusterState.load(self.data_dir)
        if existing is not None and any(alive(m.pid) for m in existing.members):
            raise RuntimeError(f"a cluster already runs from {self.data_dir}: `strom cluster stop` it first")
        try:
            if self.secure and not self.certificates.exists():
                ClusterCertificates.create(self.certificates.directory)
            if not self.embedded_metadata:
                zookeeper = self._zookeeper = ZooKeeperServer(
                    self.data_dir / "zookeeper", detached=self.detached, require_auth=self.secure,
                    tls=self.certificates if self.secure else None).start()
                assert zookeeper.pid is not None
                self.state.members.append(
                    Member("zookeeper", zookeeper.pid, zookeeper.address, log=str(zookeeper.log_path)))
            self.state.save()
            self._write_config(self.common_config())
            for index in range(1, self.coordinator_count + 1):
                self.start_member("coordinator", index, ports.get(("coordinator", index)))
            for server_id in range(1, self.tablet_server_count + 1):
                self.start_member("tablet-server", server_id, ports.get(("tablet-server", server_id)))
        except BaseException:
            self.stop()
            raise
        return self

    def start_member(self, role: str, server_id: int, port: int | None = None) -> Member:
        """Start (or restart, on its old port and data) coordinator ``server_id`` (1, 2, ...) or tablet server
        ``server_id``."""
        name = f"{role}-{server_id}"
        previous = next((m for m in self.state.members if m.role == role and m.server_id == server_id), None)
        if port is None and previous is not None:
            port = int(previous.address.rpartition(":")[2])
        address = f"{self.host}:{port or free_port()}"
        command = [sys.executable, "-m", "strom.cli.main", role, "--bind", address,
                   "--data-dir", str(self.data_dir / name), "--config", str(self.config_path)]
        listeners: dict[str, str] = {}
        if self.sasl_listener:
            old = previous.listeners.get(PYFLUSS_LISTENER) if previous is not None else None
            listeners[PYFLUSS_LISTENER] = old or f"127.0.0.1:{free_port()}"
            command += ["-D", f"bind.listeners={MAIN_LISTENER}://{address},"
                              f"{PYFLUSS_LISTENER}://{listeners[PYFLUSS_LISTENER]}"]
        if role == "tablet-server":
            command += ["--server-id", str(server_id)]
            if self.racks:
                command += ["-D", f"{TABLET_SERVER_RACK.key}={self.racks[server_id - 1]}"]
        for key, value in self.member_config.get(name, {}).items():
            command += ["-D", f"{key}={value}"]
        log_path = self.data_dir / f"{name}.log"
        environment = {**os.environ, SUPERVISOR_PID_ENV: str(os.getpid())} if self.supervised else None
        with log_path.open("ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=self.detached, env=environment)
        member = Member(role, process.pid, address, server_id, str(log_path), listeners)
        if previous is not None:
            self.state.members.remove(previous)
        self.state.members.append(member)
        self.processes[process.pid] = process
        self.state.save()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not answers_rpc(address, 1.0, self.uses_tls()):
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not serve within {READY_TIMEOUT_S:.0f} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        return member

    def member(self, role: str, server_id: int | None = None) -> Member:
        return next(m for m in self.state.members if m.role == role and m.server_id == server_id)

    def signal_member(self, member: Member, sig: int = signal.SIGTERM) -> int | None:
        """Send ``sig`` and, for SIGTERM/SIGKILL, wait for the exit; returns the exit code if known."""
        if not alive(member.pid):
            return None
        os.kill(member.pid, sig)
        if sig not in (signal.SIGTERM, signal.SIGKILL):
            return None
        process = self.processes.get(member.pid)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            if process is not None:
                code = process.poll()
                if code is not None:
                    return code
            elif not alive(member.pid):
                return None
            time.sleep(0.05)
        os.kill(member.pid, signal.SIGKILL)
        return process.wait(STOP_TIMEOUT_S) if process is not None else None

    def stop(self) -> dict[str, int | None]:
        """Stop every member, tablet servers first and ZooKeeper last; returns the exit codes by name. A
        supervised cluster is stopped through its supervisor (which would start a member stopped behind its
        back again): SIGTERM to it, and a wait until it and every member are gone."""
        supervisor = self.state.supervisor_pid
        if supervisor is not None and supervisor != os.getpid() and alive(supervisor):
            return self._stop_through_supervisor(supervisor)
        order = {"tablet-server": 0, "coordinator": 1, "zookeeper": 2}
        codes: dict[str, int | None] = {}
        for member in sorted(self.state.members, key=lambda m: order[m.role]):
            name = member.name
            if member.role == "zookeeper" and self._zookeeper is not None:
                codes[name] = self._zookeeper.stop()  # our child: stop() also reaps it
            else:
                codes[name] = self.signal_member(member)
        return codes

    def _stop_through_supervisor(self, supervisor: int) -> dict[str, int | None]:
        os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S * 2
        pids = [supervisor, *(m.pid for m in self.state.members)]
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in pids if alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return dict.fromkeys(m.name for m in self.state.members)

    @classmethod
    def attach(cls, data_dir: Path) -> LocalCluster | None:
        """The cluster a ``start`` (maybe another process's) left in ``data_dir``."""
        state = LocalClusterState.load(data_dir.resolve())
        if state is None:
            return None
        cluster = cls(Path(state.data_dir), max(1, sum(m.role == "tablet-server" for m in state.members)),
                      coordinators=max(1, sum(m.role == "coordinator" for m in state.members)),
                      secure=state.secure, sasl_listener=state.sasl_listener,
                      embedded_metadata=state.embedded_metadata)
        cluster.state = state
        return cluster

    def status(self) -> list[tuple[Member, bool]]:
        """Each member and whether it is up (its process lives and, but for ZooKeeper, it serves RPCs)."""
        return [
            (m, alive(m.pid) and (m.role == "zookeeper" or answers_rpc(m.address, 1.0, self.uses_tls())))
            for m in self.state.members
        ]


    def uses_tls(self) -> bool:
        """Whether the members listen with TLS (``security.protocol.map`` says SSL or SASL_SSL)."""
        settings = self.settings() if self.config_path.exists() else self.config
        return uses_tls(main_listener_protocol(settings.get("bind.listeners"), settings.get("security.protocol.map")))

    def settings(self) -> dict[str, str]:
        """What every member was started with (``cluster.yaml``)."""
        return {str(k): str(v) for k, v in (yaml.safe_load(self.config_path.read_text()) or {}).items()}


__all__ = ["LocalCluster", "LocalClusterState", "Member", "alive", "answers_rpc"]
