"""``strom server --workers N``: one machine's cores serving as N tablet-server processes behind one
coordinator, on the embedded metadata store (no ZooKeeper).

A Python process serves from one core (its event loop holds the GIL), so one process cannot use a machine's
other cores for requests. This supervisor starts a coordinator on the bootstrap address a client is given
(``--bind``, 127.0.0.1:9123 by default) and N tablet servers on the next N ports (free ones when the
bootstrap port is 0); they share ``<data-dir>/cluster.sqlite`` for metadata and membership
(:mod:`strom.membership.local_membership`), ``<data-dir>/remote`` for remote storage and ``<data-dir>/lake``
as the lake warehouse (unless configured). New tables'
buckets spread over the tablet servers; a client learns where each bucket lives from the coordinator, as
from any Fluss cluster.

The supervisor restarts a member that exits on its own (a crash, kill -9): what it acknowledged is on its
disk, and its restart serves it again under the same id and port. It stops every member on SIGTERM/SIGINT
(tablet servers first); a member whose supervisor is gone (kill -9 of the supervisor) stops by itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from strom.client import Connection
from strom.server.local_cluster import (
    READY_TIMEOUT_S,
    STATE_FILE,
    SUPERVISOR_PID_ENV,
    LocalCluster,
    LocalClusterState,
    Member,
    alive,
)
from strom.server.node import WAREHOUSE_OPTIONS

log = logging.getLogger(__name__)

RESTARTS_MAX = 5
"""A member that exits this often within :data:`RESTART_WINDOW_S` is not restarted again: the supervisor
stops the cluster and exits with an error (a member that cannot start, e.g. a broken disk)."""
RESTART_WINDOW_S = 60.0
WATCH_S = 0.2
SUPERVISOR_CHECK_S = 1.0
ONE_PROCESS_LAYOUT = ("metadata.sqlite", "tablets")
"""What ``strom server`` without ``--workers`` keeps in its data directory."""


def check_layout(data_dir: Path, workers: int) -> None:
    """Refuse a data directory written by the other kind of server: a one-process server's data is not a
    cluster's, and the other way round (their layouts differ; nothing converts one into the other).

    Raises:
        ValueError: with what to do instead.
    """
    one_process = any((data_dir / name).exists() for name in ONE_PROCESS_LAYOUT)
    cluster = LocalClusterState.load(data_dir) if (data_dir / STATE_FILE).exists() else None
    if workers > 1 and one_process:
        raise ValueError(f"{data_dir} holds the data of `strom server` without --workers; --workers {workers} "
                         "keeps a cluster's layout: give it a data directory of its own")
    if cluster is not None and workers == 1:
        raise ValueError(f"{data_dir} holds the data of `strom server --workers N`: start it with --workers again")
    before = 0 if cluster is None else sum(member.role == "tablet-server" for member in cluster.members)
    if workers < before:
        raise ValueError(f"{data_dir} was served by {before} workers, each holding buckets of its own: start it "
                         f"with --workers {before} or more")


class WorkerSupervisor:
    """Runs the coordinator and ``workers`` tablet servers until :meth:`request_stop`; restarts members
    that exit on their own."""

    def __init__(self, data_dir: Path, workers: int, host: str = "127.0.0.1", port: int = 9123,
                 config: Mapping[str, str] | None = None) -> None:
        if workers < 2:
            raise ValueError("a supervisor runs two or more workers; one is `strom server` itself")
        self.data_dir = data_dir.resolve()
        self.workers = workers
        self.port = port
        settings = dict(config or {})
        for option in WAREHOUSE_OPTIONS.values():  # one lake for the cluster, as `strom server` keeps it
            settings.setdefault(option.key, str(self.data_dir / "lake"))
        self.cluster = LocalCluster(self.data_dir, workers, settings, embedded_metadata=True, host=host,
                                    supervised=True)
        self.cluster.state.supervisor_pid = os.getpid()  # `strom cluster stop` goes through this process
        self._stop = threading.Event()
        self._restarts: dict[str, list[float]] = {}
        self.exit_code = 0

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def _ports(self) -> dict[tuple[str, int], int]:
        """The coordinator on the bootstrap port, tablet server i on the i-th port after it (port 0: free ones)."""
        if self.port == 0:
            return {}
        return {("coordinator", 1): self.port,
                **{("tablet-server", i): self.port + i for i in range(1, self.workers + 1)}}

    def start(self) -> WorkerSupervisor:
        """Start every member and return once the coordinator names all the workers to its clients (a new
        table's buckets then spread over all of them)."""
        check_layout(self.data_dir, self.workers)
        self.cluster.start(self._ports())
        try:
            asyncio.run(self._until_every_worker_is_known())
        except BaseException:
            self.stop()
            raise
        return self

    async def _until_every_worker_is_known(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        wanted = set(range(1, self.workers + 1))
        async with await Connection.create(self.bootstrap) as connection:
            admin = connection.get_admin()
            while {node.id for node in await admin.get_server_nodes() if node.server_type == "TabletServer"} < wanted:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the coordinator did not see all {self.workers} workers within "
                                       f"{READY_TIMEOUT_S:.0f} s (logs in {self.data_dir})")
                await asyncio.sleep(WATCH_S)

    def request_stop(self) -> None:
        self._stop.set()

    def _exited(self) -> list[Member]:
        members = []
        for member in self.cluster.state.members:
            process = self.cluster.processes.get(member.pid)
            if process is not None and process.poll() is not None:
                members.append(member)
        return members

    def _restart(self, member: Member) -> bool:
        """Start an exited member again on its port and data; False when it exits too often."""
        name = member.name
        process = self.cluster.processes.pop(member.pid)
        now = time.monotonic()
        recent = [t for t in self._restarts.get(name, []) if now - t < RESTART_WINDOW_S] + [now]
        self._restarts[name] = recent
        if len(recent) > RESTARTS_MAX:
            log.error("%s exited %d times within %.0f s; stopping", name, len(recent), RESTART_WINDOW_S)
            return False
        log.warning("%s (pid %d) exited with %s; starting it again", name, member.pid, process.returncode)
        assert member.server_id is not None
        try:
            self.cluster.start_member(member.role, member.server_id)
        except RuntimeError as exc:  # its process exited again: the next round sees it and counts the restart
            log.error("%s did not start again: %s", name, exc)
        return True

    def supervise(self) -> int:
        """Watch the members until :meth:`request_stop`; then stop them. Returns the exit code."""
        try:
            while not self._stop.wait(WATCH_S):
                for member in self._exited():
                    if not self._restart(member):
                        self.exit_code = 1
                        self._stop.set()
                        break
        finally:
            self.stop()
        return self.exit_code

    def stop(self) -> None:
        self.cluster.stop()


async def watch_supervisor(stop: Callable[[], None]) -> None:
    """In a member of a supervised cluster: call ``stop`` once the supervisor (``$STROM_SUPERVISOR_PID``)
    is gone, so that kill -9 of the supervisor leaves no member behind. Returns at once elsewhere."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if not supervisor:
        return
    pid = int(supervisor)
    while True:  # nothing to wait on but the pid: a poll every second
        if not alive(pid) or os.getppid() != pid:
            break
        await asyncio.sleep(SUPERVISOR_CHECK_S)
    log.error("the supervisor (pid %d) is gone; stopping", pid)
    stop()


def run_workers(data_dir: Path, workers: int, host: str, port: int, config: Mapping[str, str],
                announce: Callable[[str], None]) -> int:
    """``strom server --workers N`` in the foreground until SIGTERM/SIGINT; returns the exit code."""
    supervisor = WorkerSupervisor(data_dir, workers, host, port, config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: supervisor.request_stop())
    supervisor.start()
    announce(f"strom listening on {supervisor.bootstrap} with {workers} tablet-server workers, data in {data_dir}")
    return supervisor.supervise()


__all__ = ["WorkerSupervisor", "check_layout", "run_workers", "watch_supervisor"]
