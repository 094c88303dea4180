"""The cluster a nemesis run attacks: ZooKeeper, two coordinators and N tablet servers as real processes, each
tablet server behind a proxy for everything that reaches it and a proxy of its own to ZooKeeper."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from strom.membership.contract import LeaderAndIsr
from strom.server.local_cluster import LocalCluster, Member, alive
from strom.zk.bucket_state import ZooKeeperBucketStates
from strom.zk.metadata_store import connect_kazoo, parse_location
from tests.disk_support import BALLAST_NAME, fill
from tests.nemesis.proxy import FaultyProxy
from tests.server_process import free_port

CONFIG = {
    "zookeeper.client.session-timeout": "4s",
    "log.replica.max-silence-time": "2s",
    "log.replica.max-lag-time": "6s",
    "kv.snapshot.interval": "0s",
    "server.data-disk.check-interval": "1s",  # a filled disk's write protection lifts within a second of room
}
"""Short bounds, so a fault runs its course (ISR shrink, session expiry, election) within seconds."""
DISK_SIZE = "192m"


class NemesisCluster(LocalCluster):
    """A LocalCluster whose tablet servers the nemesis can cut off, slow down, pause, kill and restart."""

    def __init__(self, data_dir: Path, tablet_servers: int = 3, coordinators: int = 2,
                 config: dict[str, str] | None = None) -> None:
        super().__init__(data_dir, tablet_servers, {**CONFIG, **(config or {})}, coordinators=coordinators)
        self.server_proxies: dict[int, FaultyProxy] = {}
        self.zookeeper_proxies: dict[int, FaultyProxy] = {}
        self.disks: dict[int, Path] = {}
        """Each tablet server's data directory, a small tmpfs of its own that the nemesis fills (where
        mounting is allowed: as root)."""
        self._states_client: Any = None

    def start_member(self, role: str, server_id: int, port: int | None = None) -> Member:
        if role == "tablet-server" and server_id not in self.server_proxies:
            port = port or free_port()
            zk_host, _, zk_rest = self.zookeeper_address.partition(":")
            zk_port, slash, root = zk_rest.partition("/")
            self.server_proxies[server_id] = served = FaultyProxy("127.0.0.1", port, candidates=self.pids)
            self.zookeeper_proxies[server_id] = zookeeper = FaultyProxy(zk_host, int(zk_port))
            self._mount_disk(server_id)
            self.member_config[f"tablet-server-{server_id}"] = {
                "advertised.listeners": f"FLUSS://{served.address}",
                "zookeeper.address": f"{zookeeper.address}{slash}{root}",
            }
        return super().start_member(role, server_id, port)

    def _mount_disk(self, server_id: int) -> None:
        directory = self.data_dir / f"tablet-server-{server_id}"
        directory.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(directory)],
                                 capture_output=True, check=False)
        if mounted.returncode == 0:
            self.disks[server_id] = directory

    def fill_disk(self, server_id: int) -> Path | None:
        """Fill the server's disk with a ballast file (None: it has no disk of its own)."""
        directory = self.disks.get(server_id)
        if directory is None:
            return None
        return fill(directory)

    # ---- processes ----
    def pids(self) -> list[int]:
        """Every member's process (a proxy tells their connections apart by these)."""
        return [m.pid for m in self.state.members]

    def pid(self, role: str, server_id: int | None) -> int:
        return self.member(role, server_id).pid

    def tablet_server_ids(self) -> list[int]:
        return sorted(m.server_id for m in self.state.members if m.role == "tablet-server" and m.server_id)

    def signal(self, role: str, server_id: int | None, sig: int) -> None:
        member = self.member(role, server_id)
        if alive(member.pid):
            os.kill(member.pid, sig)

    def is_running(self, role: str, server_id: int | None) -> bool:
        """Whether the member's process runs (a child that exited is a zombie until reaped: asked by poll)."""
        pid = self.member(role, server_id).pid
        process = self.processes.get(pid)
        return process.poll() is None if process is not None else alive(pid)

    def supervise_coordinators(self) -> list[str]:
        """Restart every coordinator that exited on its own, as the supervisor the docs ask for would (a
        coordinator deposed while it was cut off from ZooKeeper stops with exit code 1); returns what it did."""
        restarted = []
        for index in range(1, self.coordinator_count + 1):
            if not self.is_running("coordinator", index):
                code = self.processes[self.member("coordinator", index).pid].poll() \
                    if self.member("coordinator", index).pid in self.processes else None
                self.start_member("coordinator", index)
                restarted.append(f"supervisor restarted coordinator {index} (it had exited with {code})")
        return restarted

    def kill(self, role: str, server_id: int | None) -> None:
        self.signal_member(self.member(role, server_id), signal.SIGKILL)

    def restart(self, role: str, server_id: int) -> None:
        if not self.is_running(role, server_id):
            self.start_member(role, server_id)

    def active_coordinator(self) -> int | None:
        """The coordinator whose address ZooKeeper publishes as the active one."""
        _, root = parse_location(self.zookeeper_address)
        data, _ = self._zookeeper_client().get(f"{root}/coordinators/active")
        address = data.decode()
        for member in self.state.members:
            if member.role == "coordinator" and member.address.rpartition(":")[2] in address:
                return member.server_id
        return None

    def wait_registered(self, timeout_s: float) -> None:
        """Until every tablet server is registered in ZooKeeper (a server answers RPCs just before it
        registers: a table created in between would find too few servers for its replicas)."""
        _, root = parse_location(self.zookeeper_address)
        deadline = time.monotonic() + timeout_s
        while len(self._zookeeper_client().get_children(f"{root}/tabletservers/ids")) < self.tablet_server_count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {self.tablet_server_count} tablet servers registered")
            time.sleep(0.1)

    # ---- bucket states ----
    def _zookeeper_client(self) -> Any:
        if self._states_client is None:
            hosts, _ = parse_location(self.zookeeper_address)
            self._states_client = connect_kazoo(hosts, 30_000)
        return self._states_client

    def bucket_states(self) -> ZooKeeperBucketStates:
        _, root = parse_location(self.zookeeper_address)
        return ZooKeeperBucketStates(self._zookeeper_client(), root)

    def wait_settled(self, buckets: list[Any], timeout_s: float) -> dict[Any, LeaderAndIsr]:
        """Until every bucket has a live leader and all its replicas in the ISR; returns the states (the
        last seen ones when ``timeout_s`` runs out: the checker reports what is still wrong)."""
        states = self.bucket_states()
        deadline = time.monotonic() + timeout_s
        while True:
            found = states.get_many(buckets)
            live = {sid for sid in self.tablet_server_ids() if self.is_running("tablet-server", sid)}
            if all(s.leader in live and set(s.isr) == set(s.replicas) for s in found.values()) \
                    and len(found) == len(buckets):
                return found
            if time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def heal_all(self) -> None:
        for directory in self.disks.values():
            (directory / BALLAST_NAME).unlink(missing_ok=True)
        for proxy in (*self.server_proxies.values(), *self.zookeeper_proxies.values()):
            proxy.heal()
        for member in self.state.members:
            if alive(member.pid):
                os.kill(member.pid, signal.SIGCONT)

    def stop(self) -> dict[str, int | None]:
        self.heal_all()
        try:
            return super().stop()
        finally:
            if self._states_client is not None:
                self._states_client.stop()
                self._states_client.close()
            for proxy in (*self.server_proxies.values(), *self.zookeeper_proxies.values()):
                proxy.close()

    def unmount_disks(self) -> None:
        """After the checkers read the replicas' logs: the tmpfs mounts go, and their data with them."""
        for directory in self.disks.values():
            subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)
        self.disks = {}
