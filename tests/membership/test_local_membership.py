"""Cluster membership in a shared SQLite file, with real processes as the owners: a registration and the
active coordinator's entry last exactly as long as the process that wrote them; bucket states are
compare-and-set on a version."""

from __future__ import annotations

import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from strom.errors import InvalidConfigError
from strom.ids import TableBucket
from strom.membership import local_membership
from strom.membership.contract import LeaderAndIsr, RegisteredServer
from strom.membership.file_changes import FileChanges
from strom.membership.local_membership import (
    LocalBucketStates,
    LocalCoordinatorDirectory,
    LocalServerRegistry,
    OwnerLiveness,
    _Watcher,
    owner_alive,
    this_process,
)
from strom.rpc.endpoints import Endpoint

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0

HOLDER = """
import sys, threading
from strom.membership.contract import RegisteredServer
from strom.membership.local_membership import LocalCoordinatorDirectory, LocalServerRegistry
from strom.rpc.endpoints import Endpoint
path, role, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
server = RegisteredServer(5 if role == "server" else 0, (Endpoint("FLUSS", "127.0.0.1", port),))
if role == "server":
    LocalServerRegistry(path).register(server)
else:
    LocalCoordinatorDirectory(path).campaign(server, lambda: 7, threading.Event())
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin or kills this process
"""


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.02)


def server(server_id: int, port: int) -> RegisteredServer:
    return RegisteredServer(server_id, (Endpoint("FLUSS", "127.0.0.1", port),))


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "cluster.sqlite")


@pytest.fixture
def holder(path: str) -> Iterator[Callable[[str, int], subprocess.Popen[str]]]:
    """Start another process that registers (``"server"``, id 5) or becomes the active coordinator."""
    started: list[subprocess.Popen[str]] = []

    def start(role: str, port: int) -> subprocess.Popen[str]:
        process = subprocess.Popen([sys.executable, "-c", HOLDER, path, role, str(port)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


@pytest.mark.parametrize("watched", [False, True], ids=["proc", "pidfd"])
def test_an_owner_is_alive_exactly_while_its_process_runs(watched: bool) -> None:
    liveness = OwnerLiveness()
    alive = liveness.alive if watched else owner_alive
    me = this_process()
    assert alive(me)
    pid, _, started = me.partition(":")
    assert not alive(f"{pid}:{int(started) + 1}")  # the same pid, another start time: a reused pid
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    owner = f"{process.pid}:{Path(f'/proc/{process.pid}/stat').read_text().rsplit(')', 1)[1].split()[19]}"
    assert alive(owner)
    process.kill()
    process.wait(10)
    assert not alive(owner)
    assert not alive(owner)  # and stays dead
    assert alive(me)
    assert not alive("not-a-pid:1")
    liveness.close()


def test_owner_liveness_answers_for_many_owners_at_once() -> None:
    liveness = OwnerLiveness()
    processes = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        running, killed = (f"{p.pid}:{Path(f'/proc/{p.pid}/stat').read_text().rsplit(')', 1)[1].split()[19]}"
                           for p in processes)
        assert liveness.all_alive({running, killed, this_process()})
        processes[1].kill()
        processes[1].wait(10)
        assert not liveness.all_alive({running, killed})
        assert liveness.all_alive({running, this_process()})
        liveness.retain(set())  # forgetting every owner closes their pidfds
        assert liveness.all_alive(set())
    finally:
        for process in processes:
            process.kill()
            process.wait(10)
        liveness.close()


@pytest.fixture
def waiting_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Watchers that never poll on a timer: a change is seen through a wake-up (inotify, a pidfd) or not at
    all within a test's time."""
    monkeypatch.setattr(local_membership, "POLL_S", 600.0)
    monkeypatch.setattr(local_membership, "IDLE_POLL_S", 600.0)
    _Watcher.poke()  # a thread already waiting picks up the new timeouts


def test_an_idle_watcher_sleeps_and_a_round_reads_only_the_files_data_version(
        path: str, waiting_only: None) -> None:
    """Every process of a cluster watches all the time, and a round holds its GIL: an idle process runs no
    round at all, and a round that finds nothing new costs one query, for the registry and for the
    coordinator's entry alike. Another connection's write, though, wakes the watchers at once."""
    registry, other = LocalServerRegistry(path), LocalServerRegistry(path)
    active, follower = LocalCoordinatorDirectory(path), LocalCoordinatorDirectory(path)
    try:
        other.register(server(1, 9001))
        assert active.campaign(server(0, 9300), lambda: 5, threading.Event()) == 5
        wait_until(lambda: 1 in registry.live(), "the other connection's registration")
        wait_until(lambda: follower.current_epoch() == 5, "the other connection's coordinator entry")
        time.sleep(0.1)  # the rounds that the writes above woke are over
        statements: list[str] = []
        registry._file._db.set_trace_callback(statements.append)  # the watchers' connections
        follower._file._db.set_trace_callback(statements.append)
        time.sleep(0.35)
        assert statements == []  # nothing changed: no round ran
        registry._poll()
        follower._poll()
        assert statements == ["PRAGMA data_version"] * 2
        other.register(server(1, 9011))  # rewritten in place by another connection, by the same owner
        wait_until(lambda: registry.live()[1].port == 9011, "a registration rewritten in place")
        assert any(statement.startswith("SELECT") for statement in statements)
    finally:
        for closing in (registry, other, follower, active):
            closing.close()


def test_a_killed_owner_wakes_the_watchers(
        path: str, holder: Callable[[str, int], subprocess.Popen[str]], waiting_only: None) -> None:
    """A registration and a coordinator's entry whose process is killed drop out without any timer: the
    pidfd of the process wakes the watchers (kill -9 leaves the file as it was, so no write does)."""
    server_holder, coordinator_holder = holder("server", 9005), holder("coordinator", 9100)
    registry, follower = LocalServerRegistry(path), LocalCoordinatorDirectory(path)
    try:
        wait_until(lambda: 5 in registry.live(), "the other process's registration")
        wait_until(lambda: follower.current_epoch() == 7, "the other process's coordinator entry")
        for process in (server_holder, coordinator_holder):
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
        wait_until(lambda: 5 not in registry.live(), "a killed process's registration drops out")
        wait_until(lambda: follower.current() is None, "a killed coordinator's entry drops out")
    finally:
        registry.close()
        follower.close()


def test_file_changes_wake_for_a_write_to_the_watched_file_only(tmp_path: Path) -> None:
    changes = FileChanges.open()
    assert changes is not None  # Linux
    try:
        assert changes.watch(str(tmp_path / "cluster.sqlite-changed"))
        readable = select.poll()
        readable.register(changes.fileno(), select.POLLIN)
        assert readable.poll(0) == [] and not changes.take()
        (tmp_path / "cluster.sqlite-wal").write_bytes(b"x")
        assert readable.poll(1000) != []  # the directory's event, which take() finds not to be about the file
        assert not changes.take()
        assert readable.poll(0) == []
        (tmp_path / "cluster.sqlite-changed").write_bytes(b"x")  # created
        assert readable.poll(1000) != [] and changes.take()
        with (tmp_path / "cluster.sqlite-changed").open("r+b") as written:  # written in place
            written.write(b"\0")
        assert readable.poll(1000) != [] and changes.take()
    finally:
        changes.close()


def test_the_watchers_of_a_process_share_one_thread_that_ends_with_the_last(path: str) -> None:
    def watch_threads() -> list[threading.Thread]:
        return [thread for thread in threading.enumerate() if thread.name == "membership-watch"]

    registry, directory = LocalServerRegistry(path), LocalCoordinatorDirectory(path)
    try:
        assert len(watch_threads()) == 1
        registry.register(server(1, 9001))
        assert directory.campaign(server(0, 9300), lambda: 4, threading.Event()) == 4
        other = LocalServerRegistry(path)
        assert len(watch_threads()) == 1
        assert other.live()[1].port == 9001
        other.close()
    finally:
        registry.close()
        directory.close()
    wait_until(lambda: not watch_threads(), "the shared thread ends once no watcher is left")
    again = LocalServerRegistry(path)  # and a new watcher starts it again
    try:
        assert len(watch_threads()) == 1
    finally:
        again.close()


def test_registrations_are_seen_by_every_registry_and_leave_on_close(path: str) -> None:
    first, second = LocalServerRegistry(path), LocalServerRegistry(path)
    seen: list[set[int]] = []
    second.add_listener(lambda live: seen.append(set(live)))
    try:
        first.register(server(1, 9001))
        first.register(server(2, 9002))
        wait_until(lambda: set(second.live()) == {1, 2}, "the other registry sees both servers")
        assert second.live()[2].port == 9002
        assert seen[-1] == {1, 2}
        first.close()
        wait_until(lambda: second.live() == {}, "closing a registry removes its registrations")
        assert seen[-1] == set()
    finally:
        first.close()
        second.close()


def test_an_id_held_by_a_live_process_is_refused_until_that_process_dies(
        path: str, holder: Callable[[str, int], subprocess.Popen[str]]) -> None:
    other = holder("server", 9005)
    registry = LocalServerRegistry(path)
    try:
        wait_until(lambda: 5 in registry.live(), "the other process's registration")
        with pytest.raises(InvalidConfigError, match=r"tablet-server.id 5 is already registered .*127.0.0.1:9005"):
            registry.register(server(5, 9105))
        os.kill(other.pid, signal.SIGKILL)  # no goodbye: its row stays, its process is gone
        other.wait(10)
        wait_until(lambda: 5 not in registry.live(), "a killed process's registration drops out")
        registry.register(server(5, 9105))  # the restart takes the id at once: no session to time out
        assert registry.live()[5].port == 9105
    finally:
        registry.close()


def test_a_coordinator_takes_over_once_the_active_one_is_killed(
        path: str, holder: Callable[[str, int], subprocess.Popen[str]]) -> None:
    active = holder("coordinator", 9100)
    follower = LocalCoordinatorDirectory(path)
    standby = LocalCoordinatorDirectory(path)
    stop = threading.Event()
    won: list[int | None] = []
    campaign = threading.Thread(target=lambda: won.append(standby.campaign(server(0, 9200), lambda: 8, stop)))
    try:
        node = follower.wait(WAIT_S)
        assert node is not None and node.port == 9100 and follower.current_epoch() == 7
        campaign.start()
        time.sleep(0.5)
        assert won == []  # a live active coordinator is never displaced
        os.kill(active.pid, signal.SIGKILL)
        active.wait(10)
        campaign.join(WAIT_S)
        assert won == [8]
        wait_until(lambda: (node := follower.current()) is not None and node.port == 9200, "the new active one")
        assert follower.current_epoch() == 8
    finally:
        stop.set()
        if campaign.is_alive():
            campaign.join(WAIT_S)
        follower.close()
        standby.close()


def test_an_active_coordinator_whose_entry_is_taken_over_is_deposed(path: str) -> None:
    deposed = threading.Event()
    directory = LocalCoordinatorDirectory(path, on_deposed=deposed.set)
    try:
        assert directory.campaign(server(0, 9300), lambda: 3, threading.Event()) == 3
        assert not deposed.wait(0.3)
        with sqlite3.connect(path) as db:  # the entry removed behind its back (as an expired ZooKeeper node)
            db.execute("DELETE FROM membership_coordinator")
        assert deposed.wait(WAIT_S)  # by the watcher's safety-net round: only strom's writers wake it
    finally:
        directory.close()


def test_bucket_states_are_compare_and_set_on_their_version(path: str) -> None:
    states, other = LocalBucketStates(path), LocalBucketStates(path)
    bucket, partitioned = TableBucket(1, 0), TableBucket(1, 3, partition_id=9)
    first = LeaderAndIsr(1, 0, (1, 2), (1, 2))
    try:
        states.create(bucket, first)
        states.create(bucket, LeaderAndIsr(2, 5, (2,), (2,)))  # a retried creation keeps the first
        states.create(partitioned, LeaderAndIsr(2, 0, (2,), (2,)))
        assert other.get(bucket) == (first, 0)
        assert other.get(TableBucket(1, 1)) is None
        shrunk = first.with_isr((1,))
        assert other.compare_and_set(bucket, shrunk, 0)
        assert not states.compare_and_set(bucket, first, 0)  # written by someone else since version 0
        assert states.get(bucket) == (shrunk, 1)
        assert other.get_many([bucket, partitioned, TableBucket(2, 0)]) == {
            bucket: shrunk, partitioned: LeaderAndIsr(2, 0, (2,), (2,))}
        states.remember_leadership()
        assert states.remembered([bucket]) is None
        assert states.leaderships([bucket]) == {bucket: shrunk}
        assert states.remembered([bucket]) == {bucket: shrunk}
    finally:
        states.close()
        other.close()
