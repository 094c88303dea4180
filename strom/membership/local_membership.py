"""Cluster membership of the processes on one machine (``strom server --workers N``) in the embedded
metadata store's SQLite file: a coordinator and N tablet servers, no ZooKeeper.

What ZooKeeper's ephemeral nodes give a cluster, an entry that vanishes with its owner, comes here from the
owner's process identity: a registration and the active coordinator's entry carry the pid and the start
time (``/proc/<pid>/stat``) of the process that wrote them, and an entry whose process is gone counts as
absent. So a process killed with -9 leaves at once, with no session timeout to wait out, and its restart
takes its id again; a pid reused by another program does not keep it alive (its start time differs).

A watcher per object re-reads what it watches after a change, on one thread per process; listeners are
called on that thread after a change, as ZooKeeper's watches call them on kazoo's. The thread sleeps until
something may have changed, woken by the pidfd of an owner that exited or by a write to
:func:`changes_path`, which every writer touches after its commit (inotify; :class:`_Watcher`), and a round
is cheap when nothing did: the file's ``PRAGMA data_version`` says whether another process wrote since the
last read, and one ``poll`` of the owners' pidfds whether one exited. Where inotify or pidfds are missing,
the watchers poll every :data:`POLL_S`.

Every write is one ``BEGIN IMMEDIATE`` transaction (SQLite serialises the processes' writers; a busy file
is waited for up to :data:`BUSY_TIMEOUT_S`), committed with ``synchronous=FULL``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from strom.errors import InvalidConfigError, StorageError
from strom.ids import TableBucket
from strom.membership.contract import (
    ActiveCoordinator,
    BucketStates,
    FollowedCoordinator,
    LeaderAndIsr,
    RegisteredServer,
    decode_registration,
    encode_registration,
    id_taken,
    notify_live_servers,
)
from strom.membership.file_changes import FileChanges
from strom.rpc.endpoints import DEFAULT_LISTENER_NAME
from strom.rpc.peers import ServerNode

log = logging.getLogger(__name__)

POLL_S = 0.1
"""How often a watcher looks for changes and dead owners where it cannot wait for them (no inotify or no
pidfds): then the delay before the cluster sees a process gone."""
IDLE_POLL_S = 1.0
"""How often a watcher looks anyway while it waits for changes: a safety net, never needed to see one."""
ROUND_GAP_S = 0.01
"""The least time between two rounds of a watcher: bounds the rounds' rate while the file changes quickly."""
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS membership_servers (
    server_id INTEGER PRIMARY KEY, registration BLOB NOT NULL, owner TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS membership_coordinator (
    slot INTEGER PRIMARY KEY CHECK (slot = 0), address BLOB NOT NULL, owner TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS membership_bucket_states (
    table_id INTEGER NOT NULL, partition_id INTEGER NOT NULL, bucket INTEGER NOT NULL, state BLOB NOT NULL,
    version INTEGER NOT NULL, PRIMARY KEY (table_id, partition_id, bucket));
"""
_NO_PARTITION = -1  # SQLite keys no NULL: "no partition" is -1 (Fluss never assigns negative ids)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat); None when the
    process is gone. Where /proc is missing, "?" for a process that exists (liveness by pid alone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count fields after the last ")"
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[19]


def this_process() -> str:
    """The owner identity of this process: ``"<pid>:<start time>"``."""
    pid = os.getpid()
    return f"{pid}:{_start_time(pid)}"


def owner_alive(owner: str) -> bool:
    """Whether the process named by an owner identity still runs (the same process, not a reused pid)."""
    pid_text, _, started = owner.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    current = _start_time(pid)
    return current is not None and (current == started or "?" in (current, started))


class OwnerLiveness:
    """Whether owner identities are alive, by pidfd where Linux offers one.

    An owner is checked once against ``/proc`` (:func:`owner_alive`) when it is first seen, and then watched
    through a pidfd of its process, which becomes readable when that process exits; a pid reused later
    cannot fool it. Without pidfds, every check reads ``/proc``. Not thread-safe: its owner serialises calls.
    """

    def __init__(self) -> None:
        self._pidfds: dict[str, int] = {}
        self._dead: set[str] = set()
        self._unwatched: set[str] = set()  # owners without a pidfd, checked through /proc

    def alive(self, owner: str) -> bool:
        if owner in self._dead:
            return False
        if owner in self._pidfds:
            return not self._exited([owner])
        if self._watch(owner):
            return owner in self._pidfds
        self._unwatched.add(owner)
        return owner_alive(owner)  # no pidfd here: /proc (or kill 0) each time

    def fds(self) -> list[int] | None:
        """The pidfds of the owners watched, each readable once its process exits; None when some owner
        has no pidfd (then only polling sees it go)."""
        return None if self._unwatched else list(self._pidfds.values())

    def all_alive(self, owners: set[str]) -> bool:
        """One system call for the owners already watched."""
        watched = [owner for owner in owners if owner in self._pidfds]
        others = [owner for owner in owners if owner not in self._pidfds]
        return all(self.alive(owner) for owner in others) and not self._exited(watched)

    def retain(self, owners: set[str]) -> None:
        """Forget owners no longer named by any row."""
        for owner in [owner for owner in self._pidfds if owner not in owners]:
            os.close(self._pidfds.pop(owner))
        self._dead &= owners
        self._unwatched &= owners

    def close(self) -> None:
        self.retain(set())

    def _watch(self, owner: str) -> bool:
        """Start watching a live owner, or record a dead one; False where pidfds are not available."""
        pidfd_open = getattr(os, "pidfd_open", None)
        pid_text, _, _ = owner.partition(":")
        if pidfd_open is None or not pid_text.isdigit():
            return False
        try:
            pidfd = pidfd_open(int(pid_text))
        except ProcessLookupError:
            self._dead.add(owner)
            return True
        except OSError:  # a kernel before 5.3, or a sandbox without the call
            return False
        # checked after opening: if the owner was alive then, the pidfd is of its process, not of a reuse
        if not owner_alive(owner):
            os.close(pidfd)
            self._dead.add(owner)
        else:
            self._pidfds[owner] = pidfd
        return True

    def _exited(self, owners: list[str]) -> set[str]:
        """The watched owners whose processes have exited (now recorded as dead)."""
        watched = {self._pidfds[owner]: owner for owner in owners if owner in self._pidfds}
        if not watched:
            return set()
        poller = select.poll()
        for pidfd in watched:
            poller.register(pidfd, select.POLLIN)
        exited = {watched[pidfd] for pidfd, _ in poller.poll(0)}
        for owner in exited:
            os.close(self._pidfds.pop(owner))
            self._dead.add(owner)
        return exited


def changes_path(path: str) -> str:
    """The file that every writer of the membership file at ``path`` writes to after each commit: what the
    watchers of other processes wait on (:class:`FileChanges`)."""
    return f"{path}-changed"


class _MembershipFile:
    """One connection to the shared SQLite file, used under a lock (blocking calls)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._changes_fd: int | None = None
        try:
            self._db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the cluster membership in {path}: {exc}") from exc

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StorageError(f"cannot write the cluster membership in {self.path}: {exc}") from exc
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException as exc:
                if self._db.in_transaction:  # a failed COMMIT may have ended it already
                    self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StorageError(f"cannot write the cluster membership in {self.path}: {exc}") from exc
                raise
            self._tell_watchers()

    def _tell_watchers(self) -> None:
        """Wake the other processes' watchers: a write to :func:`changes_path` once the commit is visible."""
        try:
            if self._changes_fd is None:
                self._changes_fd = os.open(changes_path(self.path), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.pwrite(self._changes_fd, b"\0", 0)
        except OSError as exc:  # the others' watchers see the commit at their next round anyway
            log.warning("cannot signal a membership change through %s: %s", changes_path(self.path), exc)

    def query(self, sql: str, *args: object) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StorageError(f"cannot read the cluster membership in {self.path}: {exc}") from exc

    def data_version(self) -> int:
        """Changes when another connection commits to the file (never for this connection's own commits)."""
        return int(self.query("PRAGMA data_version")[0][0])

    def remove_owned(self, sql: str, owner: str, what: str) -> None:
        """Delete what ``owner`` wrote (``sql`` takes the owner as its one parameter), as a ZooKeeper session's
        end would; a failure is logged, the rows counting as gone once their process is."""
        try:
            with self.transaction() as db:
                db.execute(sql, (owner,))
        except StorageError as exc:
            log.warning("could not remove %s (it expires with this process): %s", what, exc)

    def close(self) -> None:
        with self._lock:
            self._db.close()
            if self._changes_fd is not None:
                os.close(self._changes_fd)
                self._changes_fd = None


class _Watcher:
    """Calls ``poll`` whenever the membership may have changed, until stopped; a failing round is logged.

    Every watcher of a process shares one thread (``membership-watch``): each process of a cluster watches
    both the servers and the coordinator, all the time. The thread sleeps in one ``poll`` on what signals a
    change: an inotify descriptor on the file's directory (another process committed) and the pidfds of the
    live owners (one of them exited). So an idle cluster's processes do not wake for it, and a change or a
    dead process is seen at once rather than at the next tick. A round also runs every :data:`IDLE_POLL_S`,
    and every :data:`POLL_S` where inotify or pidfds are missing (each round is cheap when nothing changed:
    :class:`LocalServerRegistry`'s ``_poll``).
    """

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _active: ClassVar[list[_Watcher]] = []
    _thread: ClassVar[threading.Thread | None] = None
    _wake_write: ClassVar[int | None] = None  # a pipe the thread also polls: poke() wakes it

    def __init__(self, name: str, poll: Callable[[], None], path: str,
                 wake_fds: Callable[[], list[int] | None]) -> None:
        self._name = name
        self._poll = poll
        self._path = path
        self._wake_fds = wake_fds
        self._running = threading.Lock()  # held while one of this watcher's rounds runs
        self._stopped = False
        with _Watcher._lock:
            _Watcher._active.append(self)
            if _Watcher._thread is None:
                wake_read, _Watcher._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                _Watcher._thread = threading.Thread(target=_Watcher._run_all, args=(wake_read,),
                                                    name="membership-watch", daemon=True)
                _Watcher._thread.start()
            else:
                _Watcher._poke_locked()  # so the thread waits on this watcher's file and owners too

    @staticmethod
    def poke() -> None:
        """Wake the thread to collect what it waits on again (a watcher's owners changed off its thread)."""
        with _Watcher._lock:
            _Watcher._poke_locked()

    @staticmethod
    def _poke_locked() -> None:
        if _Watcher._wake_write is not None:
            with contextlib.suppress(BlockingIOError):  # full: the thread has wake-ups waiting already
                os.write(_Watcher._wake_write, b"\0")

    @staticmethod
    def _run_all(wake_read: int) -> None:
        """The shared thread: a round for every watcher after each change (at most one per
        :data:`ROUND_GAP_S`); it ends once no watcher is left."""
        changes = FileChanges.open()
        watched: dict[str, bool] = {}  # path -> whether inotify watches it

        def close() -> None:
            os.close(wake_read)
            if changes is not None:
                changes.close()

        try:
            while True:
                with _Watcher._lock:
                    watchers = list(_Watcher._active)
                    if not watchers:  # closed before a new watcher can start the next thread
                        close()
                        os.close(_Watcher._wake_write)  # type: ignore[arg-type]
                        _Watcher._wake_write = None
                        _Watcher._thread = None
                        return
                poller = select.poll()
                poller.register(wake_read, select.POLLIN)
                waiting = changes is not None
                if changes is not None:
                    poller.register(changes.fileno(), select.POLLIN)
                for watcher in watchers:
                    if waiting and watcher._path not in watched:
                        watched[watcher._path] = changes is not None and changes.watch(changes_path(watcher._path))
                    fds = watcher._owner_fds() if waiting and watched[watcher._path] else None
                    if fds is None:
                        waiting = False
                        continue
                    for fd in fds:
                        poller.register(fd, select.POLLIN)
                ready = {fd for fd, _ in poller.poll((IDLE_POLL_S if waiting else POLL_S) * 1000)}
                if wake_read in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_read, 4096)
                if changes is not None and changes.fileno() in ready:
                    changes.take()
                for watcher in watchers:
                    watcher._round()
                if ready:  # woken by a change, which may come in a burst: pause before the next round
                    time.sleep(ROUND_GAP_S)
        except BaseException:
            close()
            raise

    def _owner_fds(self) -> list[int] | None:
        try:
            return self._wake_fds()
        except Exception as exc:  # the round runs anyway; poll meanwhile
            log.info("membership watcher %s: %s", self._name, exc)
            return None

    def _round(self) -> None:
        with self._running:
            if self._stopped:
                return
            try:
                self._poll()
            except Exception as exc:  # the next round tries again
                log.info("membership watcher %s: %s", self._name, exc)

    def stop(self) -> None:
        """No round of this watcher starts after this returns, and one running ends first (unless this is
        called from that round, or it takes longer than five seconds)."""
        with _Watcher._lock:
            if self in _Watcher._active:
                _Watcher._active.remove(self)
            _Watcher._poke_locked()  # the thread ends at once when this was the last watcher
        if threading.current_thread() is _Watcher._thread:
            self._stopped = True
            return
        waited = self._running.acquire(timeout=5)
        self._stopped = True
        if waited:
            self._running.release()


class LocalServerRegistry:
    """The live tablet servers (a :class:`~strom.membership.contract.ServerRegistry`): a row per server with
    Fluss's registration document and its owner process."""

    def __init__(self, path: str, internal_listener: str = DEFAULT_LISTENER_NAME) -> None:
        self._internal_listener = internal_listener
        self._file = _MembershipFile(path)
        self._owner = this_process()
        self._listeners: list[Callable[[dict[int, ServerNode]], None]] = []
        self._live: dict[int, ServerNode] = {}
        self._refresh_lock = threading.Lock()
        self._closed = False
        self._owners = OwnerLiveness()
        self._read_version: int | None = None
        self._live_owners: set[str] = set()
        self._nodes: dict[tuple[int, bytes], ServerNode | None] = {}  # decoded registrations, by their bytes
        self._refresh()
        self._watcher = _Watcher("membership-servers", self._poll, path, self._owner_fds)

    def register(self, server: RegisteredServer) -> None:
        value = encode_registration(server)
        with self._file.transaction() as db:
            row = db.execute("SELECT registration, owner FROM membership_servers WHERE server_id = ?",
                             (server.server_id,)).fetchone()
            if row is not None and row[1] != self._owner and owner_alive(row[1]):
                try:
                    holder: RegisteredServer | None = decode_registration(server.server_id, bytes(row[0]))
                except (ValueError, KeyError, TypeError, InvalidConfigError):
                    holder = None
                raise id_taken(server, holder)
            db.execute("INSERT OR REPLACE INTO membership_servers VALUES (?, ?, ?)",
                       (server.server_id, value, self._owner))
        self._refresh()  # this connection's own commit leaves the data version as it was: read now

    def live(self) -> dict[int, ServerNode]:
        return dict(self._live)

    def add_listener(self, listener: Callable[[dict[int, ServerNode]], None]) -> None:
        self._listeners.append(listener)

    def _poll(self) -> None:
        """Re-read the rows only when another process wrote to the file or an owner counted live exited."""
        with self._refresh_lock:
            unchanged = (not self._closed and self._file.data_version() == self._read_version
                         and self._owners.all_alive(self._live_owners))
        if not unchanged:
            self._refresh()

    def _owner_fds(self) -> list[int] | None:
        with self._refresh_lock:
            return self._owners.fds()

    def _refresh(self) -> None:
        with self._refresh_lock:
            if self._closed:
                return
            self._read_version = self._file.data_version()  # before the read: a later write is seen next poll
            rows = self._file.query("SELECT server_id, registration, owner FROM membership_servers ORDER BY server_id")
            servers: dict[int, ServerNode] = {}
            nodes: dict[tuple[int, bytes], ServerNode | None] = {}
            live_owners: set[str] = set()
            for server_id, registration, owner in rows:
                if not self._owners.alive(owner):
                    continue
                live_owners.add(owner)
                key = (server_id, bytes(registration))
                node = nodes[key] = self._nodes[key] if key in self._nodes else self._decode(*key)
                if node is not None:
                    servers[server_id] = node
            self._owners.retain({owner for _, _, owner in rows})
            owners_changed = live_owners != self._live_owners
            self._nodes, self._live_owners = nodes, live_owners
            changed = servers != self._live
            self._live = servers
        if owners_changed and threading.current_thread() is not _Watcher._thread:
            _Watcher.poke()  # its thread waits on the owners' pidfds: a new one was opened here
        if changed:
            notify_live_servers(self._listeners, servers)

    def _decode(self, server_id: int, registration: bytes) -> ServerNode | None:
        try:
            return decode_registration(server_id, registration).node(self._internal_listener)
        except (ValueError, KeyError, TypeError, InvalidConfigError):
            log.warning("ignoring tablet server registration %s with value %r", server_id, registration)
            return None

    def close(self) -> None:
        with self._refresh_lock:
            if self._closed:
                return
            self._closed = True
        self._watcher.stop()
        self._file.remove_owned("DELETE FROM membership_servers WHERE owner = ?", self._owner,
                                "this process's registrations")  # it leaves at once
        self._file.close()
        self._owners.close()


class LocalCoordinatorDirectory(FollowedCoordinator):
    """The active coordinator (a :class:`~strom.membership.contract.CoordinatorDirectory`): one row, taken
    by the campaigning coordinator when it is absent or its owner is dead."""

    def __init__(self, path: str, internal_listener: str = DEFAULT_LISTENER_NAME,
                 on_deposed: Callable[[], None] | None = None) -> None:
        super().__init__(internal_listener, on_deposed)
        self._file = _MembershipFile(path)
        self._owner = this_process()
        self._closed = False
        self._owners = OwnerLiveness()  # used by the watcher's thread and the first read only
        self._read_version: int | None = None
        self._read_owner: str | None = None  # the entry's owner at the last read (None: no entry)
        self._decoded: tuple[bytes, ActiveCoordinator | None] = (b"", None)  # the last entry and its decoding
        self._refresh()
        self._watcher = _Watcher("membership-coordinator", self._poll, path, self._owners.fds)

    def _poll(self) -> None:
        """Re-read the entry only when another process wrote to the file or the entry's owner exited (this
        process's own campaign records what it won directly)."""
        if self._closed:
            return
        if self._file.data_version() == self._read_version and (
                self._read_owner is None or self._owners.alive(self._read_owner)):
            return
        self._refresh()

    def _read(self) -> ActiveCoordinator | None:
        self._read_version = self._file.data_version()  # before the read: a later write is seen next poll
        rows = self._file.query("SELECT address, owner FROM membership_coordinator WHERE slot = 0")
        self._read_owner = rows[0][1] if rows else None
        self._owners.retain({owner for _, owner in rows})
        if not rows or not self._owners.alive(rows[0][1]):
            return None
        address = bytes(rows[0][0])
        if address != self._decoded[0]:
            try:
                self._decoded = (address, ActiveCoordinator.decode(address))
            except (ValueError, KeyError, TypeError, InvalidConfigError):
                log.warning("ignoring an unreadable coordinator address %r", address)
                self._decoded = (address, None)
        return self._decoded[1]

    def _refresh(self) -> None:
        if not self._closed:
            self._observed(self._read(), "entry")

    def campaign(self, server: RegisteredServer, next_epoch: Callable[[], int], stop: threading.Event) -> int | None:
        while not stop.is_set():
            if not self._wait_for_vacancy(stop, POLL_S * 5):
                continue
            # the epoch first: its counter is in the metadata store, a connection of its own to the same file,
            # which would wait on this transaction's lock (an epoch taken by a lost round is skipped, as on ZooKeeper)
            active = ActiveCoordinator(server, next_epoch())
            try:
                with self._file.transaction() as db:
                    row = db.execute("SELECT owner FROM membership_coordinator WHERE slot = 0").fetchone()
                    if row is not None and owner_alive(row[0]):
                        continue  # another coordinator won this round
                    db.execute("INSERT OR REPLACE INTO membership_coordinator VALUES (0, ?, ?)",
                               (active.encode(), self._owner))
            except StorageError as exc:
                log.warning("campaign for the active coordinator failed, trying again: %s", exc)
                stop.wait(POLL_S)
                continue
            self._won_as(active)
            return active.epoch
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        won = self._leave()  # leaving is not being deposed
        self._watcher.stop()
        if won is not None:
            self._file.remove_owned("DELETE FROM membership_coordinator WHERE slot = 0 AND owner = ?", self._owner,
                                    "the active coordinator's entry")
        self._file.close()
        self._owners.close()


class LocalBucketStates(BucketStates):
    """The bucket states as rows with a version counter; a compare-and-set is one UPDATE on the version."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._file = _MembershipFile(path)

    @staticmethod
    def _key(bucket: TableBucket) -> tuple[int, int, int]:
        partition = _NO_PARTITION if bucket.partition_id is None else bucket.partition_id
        return bucket.table_id, partition, bucket.bucket

    def _create(self, bucket: TableBucket, state: LeaderAndIsr) -> bool:
        with self._file.transaction() as db:
            cursor = db.execute("INSERT OR IGNORE INTO membership_bucket_states VALUES (?, ?, ?, ?, 0)",
                                (*self._key(bucket), state.to_json()))
            return cursor.rowcount == 1

    def _read(self, bucket: TableBucket) -> tuple[LeaderAndIsr, int] | None:
        rows = self._file.query(
            "SELECT state, version FROM membership_bucket_states WHERE table_id = ? AND partition_id = ? AND bucket = ?",
            *self._key(bucket))
        return (LeaderAndIsr.from_json(bytes(rows[0][0])), int(rows[0][1])) if rows else None

    def _read_many(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr]:
        owners = {(b.table_id, _NO_PARTITION if b.partition_id is None else b.partition_id) for b in buckets}
        wanted = {self._key(bucket): bucket for bucket in buckets}
        found: dict[TableBucket, LeaderAndIsr] = {}
        for table_id, partition in owners:
            for bucket_id, state in self._file.query(
                    "SELECT bucket, state FROM membership_bucket_states WHERE table_id = ? AND partition_id = ?",
                    table_id, partition):
                bucket = wanted.get((table_id, partition, bucket_id))
                if bucket is not None:
                    found[bucket] = LeaderAndIsr.from_json(bytes(state))
        return found

    def _write_if(self, bucket: TableBucket, state: LeaderAndIsr, version: int) -> bool:
        with self._file.transaction() as db:
            cursor = db.execute(
                "UPDATE membership_bucket_states SET state = ?, version = version + 1 "
                "WHERE table_id = ? AND partition_id = ? AND bucket = ? AND version = ?",
                (state.to_json(), *self._key(bucket), version))
            return cursor.rowcount == 1

    def close(self) -> None:
        self._file.close()


__all__ = ["LocalBucketStates", "LocalCoordinatorDirectory", "LocalServerRegistry", "OwnerLiveness", "owner_alive", "this_process"]
