"""Real strom server processes for tests: started on a free loopback port, stopped by their own pid."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from strom.security.server_security import main_listener_protocol
from strom.security.tls import uses_tls
from strom.server.local_cluster import answers_rpc
from strom.zk.zookeeper_server import free_port  # the tests' import of it too

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class ServerProcess:
    """``strom server`` in a child process with its own data directory and log file."""

    def __init__(
        self,
        data_dir: Path,
        config: dict[str, str] | None = None,
        port: int | None = None,
        strom_command: list[str] | None = None,
        probe_tls: ssl.SSLContext | None = None,
        env: dict[str, str] | None = None,
        server_args: list[str] | None = None,
    ) -> None:
        """``strom_command``: how to run ``strom`` (default: this interpreter's ``strom.cli.main``);
        ``server_args``: more options of ``strom server`` (``--gateway HOST:PORT``);
        ``probe_tls``: how the readiness probe speaks TLS to a listener that wants a client certificate;
        ``env``: variables added to the server's environment (object-store credentials)."""
        self.probe_tls = probe_tls
        self.env = dict(env or {})
        self.server_args = list(server_args or [])
        self.data_dir = data_dir
        self.strom_command = strom_command or [sys.executable, "-m", "strom.cli.main"]
        self.config = dict(config or {})
        self.port = port or free_port()
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        assert self.process is None or self.process.poll() is not None
        command = [*self.strom_command, "server", *self.server_args, "--bind", self.address, "--data-dir",
                   str(self.data_dir)]
        for key, value in self.config.items():
            command += ["-D", f"{key}={value}"]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                            env={**os.environ, **self.env} if self.env else None)
        try:
            self._wait_ready()
        except BaseException:
            self.kill()  # a probe that fails in a way of its own must not leave the server running
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"strom server exited with {self.process.returncode}:\n{self.log_text()[-4000:]}")
            if self._answers_api_versions():
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"strom server did not listen within {READY_TIMEOUT_S}s:\n{self.log_text()[-4000:]}")

    def _answers_api_versions(self) -> bool:
        """Ready means serving RPCs, not merely listening: the socket is bound before start-up ends."""
        tls = uses_tls(main_listener_protocol(self.config.get("bind.listeners"), self.config.get("security.protocol.map")))
        return answers_rpc(self.address, 2.0, (self.probe_tls or True) if tls else False)

    def stop(self) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("strom server did not stop within the timeout after SIGTERM") from None

    def kill(self) -> None:
        """SIGKILL: the crash the durability tests simulate."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def internal_errors(self) -> list[str]:
        """Lines where the server logged a broken invariant: any of them fails the test that caused it."""
        return [line for line in self.log_text().splitlines() if "AssertionError" in line]


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


class WorkersProcess:
    """``strom server --workers N`` as a child process on free loopback ports; the bootstrap address is
    read from its start-up line, the members' pids from the ``cluster.json`` its supervisor keeps."""

    def __init__(self, data_dir: Path, workers: int, strom_command: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{data_dir.name}-supervisor.log"
        command = [*(strom_command or [sys.executable, "-m", "strom.cli.main"]), "server", "--workers", str(workers),
                   "--bind", "127.0.0.1:0", "--data-dir", str(data_dir), "-D", "kv.snapshot.interval=0s"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S * 2
        while (found := re.search(r"strom listening on (\S+) with", self.log_text())) is None:
            assert self.process.poll() is None, f"exited with {self.process.returncode}:\n{self.log_text()}"
            assert time.monotonic() < deadline, f"not serving within {READY_TIMEOUT_S * 2} s:\n{self.log_text()}"
            time.sleep(0.1)
        self.bootstrap = found.group(1)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def members(self) -> dict[str, int]:
        """Each member's pid by name (``coordinator-1``, ``tablet-server-2``), as the supervisor recorded them."""
        state = json.loads((self.data_dir / "cluster.json").read_text())
        return {f"{m['role']}-{m['server_id']}": m["pid"] for m in state["members"]}

    def kill_member(self, name: str) -> None:
        """kill -9 a member and wait until the supervisor has started it again (a new pid)."""
        old = self.members()[name]
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: self.members()[name] != old, f"{name} started again")
        wait_until(lambda: f"{name} (pid {old}) exited" in self.log_text(), "the restart logged")

    def stop(self) -> int:
        """SIGTERM to the supervisor, which stops every member; returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(STOP_TIMEOUT_S * 2)
