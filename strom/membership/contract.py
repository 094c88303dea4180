"""Who is in the cluster, as the coordinator and the tablet servers see it: the live tablet servers, each
replicated bucket's leader and in-sync replicas, and the active coordinator.

The roles program against this contract; two backends keep it: ZooKeeper (:mod:`strom.zk`, any number of
machines) and the embedded store's SQLite file (:mod:`strom.membership.local_membership`, the processes of
``strom server --workers N`` on one machine). The documents are Fluss's (a tablet server's registration,
version 3, or 4 with the memory it reports) so that both backends hold the same bytes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from strom.errors import InvalidConfigError
from strom.ids import TableBucket
from strom.rpc.endpoints import DEFAULT_LISTENER_NAME, Endpoint, format_endpoints, parse_endpoints
from strom.rpc.peers import ServerNode

log = logging.getLogger(__name__)

NO_LEADER = -1
REGISTRATION_VERSION = 3
"""Fluss's TabletServerRegistration version with listeners and an optional rack."""
RESOURCE_REGISTRATION_VERSION = 4
"""Fluss's version that adds the server's resources (``memory_bytes``; strom reports no ``cpu_cores``): written
when the memory is known. Readers of version 3 ignore the field, and a document without it reads as unknown."""
ADDRESS_VERSION = 2
"""Fluss's coordinator address version with listeners."""


@dataclass(frozen=True, slots=True)
class RegisteredServer:
    """A server's registration: its id, every listener's advertised endpoint, its rack and its memory."""

    server_id: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None = None
    register_timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000), compare=False)
    memory_bytes: int | None = None
    """What the tablet server reports (``strom.server.resources``); None: unknown (an older server)."""

    def node(self, internal_listener: str) -> ServerNode | None:
        """The server as the others reach it (its ``internal_listener`` endpoint); None without one."""
        internal = next((e for e in self.endpoints if e.name == internal_listener), None)
        if internal is None:
            return None
        return ServerNode(self.server_id, internal.host, internal.port, self.endpoints, self.rack, self.memory_bytes)


def encode_registration(server: RegisteredServer) -> bytes:
    known_memory = server.memory_bytes is not None and server.memory_bytes > 0
    document: dict[str, Any] = {
        "version": RESOURCE_REGISTRATION_VERSION if known_memory else REGISTRATION_VERSION,
        "listeners": format_endpoints(server.endpoints),
        "register_timestamp": server.register_timestamp_ms,
    }
    if server.rack is not None:
        document["rack"] = server.rack
    if known_memory:
        document["memory_bytes"] = server.memory_bytes
    return json.dumps(document, separators=(",", ":")).encode()


def decode_registration(server_id: int, data: bytes) -> RegisteredServer:
    """Raises ValueError, KeyError, TypeError or InvalidConfigError: not a registration."""
    return registration_from(server_id, json.loads(data))


def registration_from(server_id: int, value: dict[str, Any]) -> RegisteredServer:
    """A registration document: Fluss's versions 1 (``host``/``port``, the ``FLUSS`` listener) and 2+
    (``listeners``), with version 4's ``memory_bytes`` when present and positive (else the memory is unknown).

    Raises:
        ValueError, KeyError, TypeError, InvalidConfigError: not a registration.
    """
    endpoints: tuple[Endpoint, ...]
    if int(value.get("version", 1)) < 2:
        endpoints = (Endpoint(DEFAULT_LISTENER_NAME, str(value["host"]), int(value["port"])),)
    else:
        endpoints = tuple(parse_endpoints(str(value["listeners"]), "a registration's listeners", distinct_ports=False))
    rack = value.get("rack")
    return RegisteredServer(server_id, endpoints, None if rack is None else str(rack),
                            int(value.get("register_timestamp", 0)), _memory_bytes(value.get("memory_bytes")))


def _memory_bytes(value: Any) -> int | None:
    """A registration's memory; one that is absent, not a positive whole number, is unknown (the server
    still counts as registered)."""
    try:
        memory = int(value)
    except (TypeError, ValueError):
        return None
    return memory if memory > 0 else None


@dataclass(frozen=True, slots=True)
class ActiveCoordinator:
    server: RegisteredServer
    epoch: int

    def encode(self) -> bytes:
        """Fluss's coordinator address (version 2) with strom's ``epoch``."""
        document = {"version": ADDRESS_VERSION, "id": str(self.server.server_id),
                    "listeners": format_endpoints(self.server.endpoints), "epoch": self.epoch}
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> ActiveCoordinator:
        """Raises ValueError, KeyError, TypeError or InvalidConfigError: not a coordinator address."""
        value = json.loads(data)
        return cls(registration_from(int(value["id"]), value), int(value.get("epoch", 0)))


class ServerRegistry(Protocol):
    """The live tablet servers. A registration lasts as long as the process that made it (ZooKeeper: its
    session; one machine: the process itself), so a server that stops or dies drops out of :meth:`live`."""

    def register(self, server: RegisteredServer) -> None:
        """Announce ``server``. Raises InvalidConfigError when another live server holds its id,
        StorageError when the backend cannot be reached."""

    def live(self) -> dict[int, ServerNode]:
        """The registered servers by id at their internal listener's endpoint, from a cache (cheap)."""

    def add_listener(self, listener: Callable[[dict[int, ServerNode]], None]) -> None:
        """Call ``listener(live servers)`` (on a backend thread) after every change."""

    def close(self) -> None:
        """Stop; the servers registered here leave at once."""


class CoordinatorDirectory(Protocol):
    """Campaign for (coordinators) or follow (tablet servers) the active coordinator."""

    def campaign(self, server: RegisteredServer, next_epoch: Callable[[], int], stop: threading.Event) -> int | None:
        """Block until this process is the active coordinator (its epoch) or ``stop`` is set (None)."""

    def current(self) -> ServerNode | None:
        """The active coordinator at its internal listener's endpoint, None while there is none."""

    def current_epoch(self) -> int | None: ...

    def wait(self, timeout_s: float) -> ServerNode | None:
        """The active coordinator, waiting up to ``timeout_s`` for one to appear."""

    def close(self) -> None:
        """Stop following; an active coordinator's entry goes with it."""


class FollowedCoordinator:
    """What both backends of a :class:`CoordinatorDirectory` share: the active coordinator as last observed
    (a backend calls :meth:`_observed` on every change it sees), waiting for one, and deposition — the
    coordinator this process won as is gone or replaced, so ``on_deposed`` is called (on the backend's thread).
    """

    def __init__(self, internal_listener: str, on_deposed: Callable[[], None] | None) -> None:
        self._internal_listener = internal_listener
        self._on_deposed = on_deposed
        self._won: ActiveCoordinator | None = None
        self._current: ActiveCoordinator | None = None
        self._changed = threading.Condition()

    def current(self) -> ServerNode | None:
        """The active coordinator at its internal listener's endpoint (from the last observation), None while
        there is none (or it has no such listener)."""
        active = self._current
        return None if active is None else active.server.node(self._internal_listener)

    def current_epoch(self) -> int | None:
        active = self._current
        return None if active is None else active.epoch

    def wait(self, timeout_s: float) -> ServerNode | None:
        """The active coordinator, waiting up to ``timeout_s`` for one to appear."""
        with self._changed:
            self._changed.wait_for(lambda: self._current is not None, timeout_s)
            return self.current()

    def _wait_for_vacancy(self, stop: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until there is no active coordinator; False when there still is one or
        ``stop`` is set."""
        with self._changed:
            self._changed.wait_for(lambda: self._current is None or stop.is_set(), timeout_s)
            return self._current is None and not stop.is_set()

    def _won_as(self, active: ActiveCoordinator) -> None:
        with self._changed:
            self._won = self._current = active

    def _leave(self) -> ActiveCoordinator | None:
        """Stop being the active coordinator without being deposed; what this process had won as, if anything."""
        with self._changed:
            won, self._won = self._won, None
            return won

    def _observed(self, active: ActiveCoordinator | None, where: str) -> None:
        """The backend saw ``active`` (None: no coordinator is active)."""
        with self._changed:
            self._current = active
            deposed = self._won is not None and active != self._won
            if deposed:
                self._won = None
            self._changed.notify_all()
        if deposed:
            log.error("this coordinator is no longer the active one (its %s is gone or taken over)", where)
            if self._on_deposed is not None:
                self._on_deposed()


def notify_live_servers(listeners: list[Callable[[dict[int, ServerNode]], None]], servers: dict[int, ServerNode]) -> None:
    """Call every live-server listener with its own copy of ``servers``; one that fails is logged and the
    others still run (a listener's failure must not stop the backend's watch)."""
    for listener in list(listeners):
        try:
            listener(dict(servers))
        except Exception:
            log.exception("a live-server listener failed")


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    leader: int
    """The leading tablet server, NO_LEADER while none of the ISR is alive."""
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    def with_isr(self, isr: tuple[int, ...]) -> LeaderAndIsr:
        return replace(self, isr=isr)

    def to_json(self) -> bytes:
        document = {"leader": self.leader, "leader_epoch": self.leader_epoch, "replicas": list(self.replicas),
                    "isr": list(self.isr)}
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LeaderAndIsr:
        value = json.loads(raw)
        return cls(int(value["leader"]), int(value["leader_epoch"]), tuple(value["replicas"]), tuple(value["isr"]))


class BucketStates(ABC):
    """Each replicated bucket's :class:`LeaderAndIsr` with a version: the coordinator creates it and rewrites
    it when it elects a leader, the leader rewrites it when a follower joins or leaves the ISR. Every rewrite
    is a compare-and-set on the version, so a leader replaced while it was paused cannot change the ISR any
    more: that is what fences it. Blocking calls, thread-safe.

    A backend supplies the four raw operations; what was read or written last is remembered here for the
    active coordinator (:meth:`remember_leadership`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[TableBucket, LeaderAndIsr] | None = None
        """Each bucket's state as last read or written here, once :meth:`remember_leadership` was called."""

    # ---- the backend's raw operations ----
    @abstractmethod
    def _create(self, bucket: TableBucket, state: LeaderAndIsr) -> bool:
        """Create the bucket's state; False when it exists already (a retried creation keeps it)."""

    @abstractmethod
    def _read(self, bucket: TableBucket) -> tuple[LeaderAndIsr, int] | None:
        """The state and its version, None for a bucket without one."""

    @abstractmethod
    def _read_many(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr]:
        """The states of ``buckets`` that have one."""

    @abstractmethod
    def _write_if(self, bucket: TableBucket, state: LeaderAndIsr, version: int) -> bool:
        """Write ``state`` if the bucket's state is still at ``version``."""

    # ---- remembering (the active coordinator) ----
    def remember_leadership(self) -> None:
        """Keep each bucket's state as last read or written here, so that :meth:`leaderships` answers
        without reading the backend. For the active coordinator alone: it is the only writer of leaders,
        epochs and replicas (a leader changes nothing but the ISR), so what it read or wrote last is their
        current value. Forgets what it knew (a coordinator that just became active)."""
        with self._lock:
            self._known = {}

    def _remember(self, states: dict[TableBucket, LeaderAndIsr]) -> None:
        if self._known is not None:
            with self._lock:
                self._known.update(states)

    def leaderships(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr]:
        """The states of ``buckets`` that have one, their leader, epoch and replicas current (the ISR may
        lag): remembered ones without a backend read, once :meth:`remember_leadership` was called."""
        if self._known is None:
            return self.get_many(buckets)
        with self._lock:
            found = {bucket: state for bucket in buckets if (state := self._known.get(bucket)) is not None}
        missing = [bucket for bucket in buckets if bucket not in found]
        if missing:
            found.update(self.get_many(missing))
        return found

    def remembered(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr] | None:
        """The states of ``buckets`` from memory alone (no backend read: safe on an event loop); None when
        one of them is not remembered, or nothing is."""
        if self._known is None:
            return None
        with self._lock:
            found = {bucket: state for bucket in buckets if (state := self._known.get(bucket)) is not None}
        return found if len(found) == len(buckets) else None

    # ---- reads and writes ----
    def create(self, bucket: TableBucket, state: LeaderAndIsr) -> None:
        """Create the bucket's state (an existing one, from a retried creation, is kept)."""
        if self._create(bucket, state):
            self._remember({bucket: state})

    def get(self, bucket: TableBucket) -> tuple[LeaderAndIsr, int] | None:
        """The state and its version, None for a bucket without one (not replicated by a cluster)."""
        found = self._read(bucket)
        if found is not None:
            self._remember({bucket: found[0]})
        return found

    def get_many(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr]:
        """The states of ``buckets`` that have one, in one round where the backend allows."""
        found = self._read_many(buckets)
        self._remember(found)
        return found

    def compare_and_set(self, bucket: TableBucket, state: LeaderAndIsr, version: int) -> bool:
        """Write ``state`` if the bucket's state is still at ``version``; False when someone changed it first."""
        if not self._write_if(bucket, state, version):
            return False
        self._remember({bucket: state})
        return True


def id_taken(server: RegisteredServer, holder: RegisteredServer | None) -> InvalidConfigError:
    """The error of a start whose id a live server holds (``holder``: its registration, if readable)."""
    at = format_endpoints(holder.endpoints) if holder is not None else "an unknown address"
    return InvalidConfigError(f"tablet-server.id {server.server_id} is already registered by a live tablet server at {at}")


__all__ = [
    "NO_LEADER",
    "ActiveCoordinator",
    "BucketStates",
    "CoordinatorDirectory",
    "FollowedCoordinator",
    "LeaderAndIsr",
    "RegisteredServer",
    "ServerRegistry",
    "decode_registration",
    "encode_registration",
    "id_taken",
    "notify_live_servers",
    "registration_from",
]
