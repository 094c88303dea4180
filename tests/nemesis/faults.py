"""The nemesis: a fault schedule drawn from a seed, and how each fault is done and undone.

Every fault is begun, held for its duration and then ended (healed, resumed, restarted), one after the
other with a quiet gap between them, so the same seed replays the same schedule. Durations straddle the
cluster's bounds: pauses and partitions shorter than the ISR silence bound (2 s), between it and the
ZooKeeper session (4 s), and longer than the session.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass

from tests.nemesis.cluster import NemesisCluster

KINDS = (
    "kill",              # SIGKILL a tablet server, restart it
    "pause",             # SIGSTOP / SIGCONT a tablet server
    "shutdown",          # SIGTERM (controlled shutdown), restart
    "kill-coordinator",  # SIGKILL the active coordinator, restart it
    "pause-zookeeper",   # SIGSTOP / SIGCONT ZooKeeper
    "partition",         # a tablet server cut off from everyone: servers, clients, ZooKeeper
    "split",             # a tablet server and the other servers cut off from each other; all reach ZooKeeper
    "partition-zookeeper",  # a tablet server cut off from ZooKeeper alone
    "isolate-clients",   # nobody reaches a tablet server; it still reaches ZooKeeper and its leaders
    "slow",              # a tablet server's traffic delayed
    "disk-full",         # a tablet server's disk full (a small tmpfs), then freed
    "pause-follower-then-kill-leader",  # the sequence that once lost acknowledged appends
    "double-failure",    # a leader killed, restarted behind its successor, which is killed before it caught up
)
DURATIONS_S = (0.5, 1.5, 3.0, 6.0)
"""Below the silence bound, between it and the session, past the session (twice)."""


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: int | None
    duration_s: float

    def __str__(self) -> str:
        target = "" if self.target is None else f" server {self.target}"
        return f"+{self.at_s:5.1f}s {self.kind}{target} for {self.duration_s:.1f}s"


def schedule(seed: int, count: int, tablet_servers: list[int]) -> list[Fault]:
    """``count`` faults drawn from ``seed``."""
    rng = random.Random(seed)
    faults, at = [], 2.0
    for _ in range(count):
        kind = rng.choice(KINDS)
        target = None if kind in ("kill-coordinator", "pause-zookeeper") else rng.choice(tablet_servers)
        duration = rng.choice(DURATIONS_S)
        if kind == "pause-zookeeper":
            duration = min(duration, 3.0)  # past the session every server would be expired at once
        faults.append(Fault(round(at, 1), kind, target, duration))
        at += duration + rng.uniform(1.0, 4.0)
    return faults


class Nemesis:
    """Does the faults of a schedule to a cluster; ``done`` lists them as they happened."""

    def __init__(self, cluster: NemesisCluster, leader_of: object) -> None:
        """``leader_of(follower) -> int | None``: the leader of a bucket ``follower`` replicates."""
        self.cluster = cluster
        self._leader_of = leader_of
        self.done: list[str] = []

    def run(self, faults: list[Fault], started: float, should_stop: object) -> None:
        for fault in faults:
            while time.monotonic() - started < fault.at_s:
                if should_stop():  # type: ignore[operator]
                    return
                time.sleep(0.05)
            self.done.append(f"{time.monotonic() - started:6.1f}s {fault}")
            self.apply(fault)
            self.done += [f"{time.monotonic() - started:6.1f}s   {event}" for event in self.cluster.supervise_coordinators()]

    def apply(self, fault: Fault) -> None:
        c, sid, hold = self.cluster, fault.target, fault.duration_s
        if fault.kind == "kill":
            c.kill("tablet-server", sid)
            time.sleep(hold)
            c.restart("tablet-server", sid)  # type: ignore[arg-type]
        elif fault.kind == "pause":
            c.signal("tablet-server", sid, signal.SIGSTOP)
            time.sleep(hold)
            c.signal("tablet-server", sid, signal.SIGCONT)
        elif fault.kind == "shutdown":
            c.signal_member(c.member("tablet-server", sid), signal.SIGTERM)
            time.sleep(hold)
            c.restart("tablet-server", sid)  # type: ignore[arg-type]
        elif fault.kind == "kill-coordinator":
            active = c.active_coordinator()
            if active is not None:
                c.kill("coordinator", active)
                time.sleep(hold)
                c.restart("coordinator", active)
        elif fault.kind == "pause-zookeeper":
            c.signal("zookeeper", None, signal.SIGSTOP)
            time.sleep(hold)
            c.signal("zookeeper", None, signal.SIGCONT)
        elif fault.kind in ("partition", "partition-zookeeper", "isolate-clients", "split"):
            assert sid is not None
            others = [s for s in c.tablet_server_ids() if s != sid]
            if fault.kind in ("partition", "isolate-clients"):
                c.server_proxies[sid].cut()  # nobody reaches it
            if fault.kind in ("partition", "partition-zookeeper"):
                c.zookeeper_proxies[sid].cut()
            if fault.kind in ("partition", "split"):
                for other in others:  # it reaches no other server ...
                    c.server_proxies[other].block([c.pid("tablet-server", sid)])
            if fault.kind == "split":  # ... and they do not reach it
                c.server_proxies[sid].block([c.pid("tablet-server", other) for other in others])
            time.sleep(hold)
            for proxy in (*c.server_proxies.values(), *c.zookeeper_proxies.values()):
                proxy.heal()
        elif fault.kind == "slow":
            c.server_proxies[sid].slow(0.2, loss=0.1)  # type: ignore[index]
            time.sleep(hold)
            c.server_proxies[sid].heal()  # type: ignore[index]
        elif fault.kind == "disk-full":
            ballast = c.fill_disk(sid)  # type: ignore[arg-type]
            time.sleep(hold)
            if ballast is not None:
                ballast.unlink(missing_ok=True)
        elif fault.kind == "pause-follower-then-kill-leader":
            self._pause_follower_then_kill_leader(sid, hold)  # type: ignore[arg-type]
        elif fault.kind == "double-failure":
            self._double_failure(sid, hold)  # type: ignore[arg-type]
        else:
            raise ValueError(fault.kind)

    def _double_failure(self, first: int, hold: float) -> None:
        """Kafka's KIP-101 case: kill ``first`` (leading some buckets; writes go on under their new leaders),
        restart it — it follows now, holding a log that may differ from its new leader's above what it knew
        was committed — and before it can have caught up, kill the leader of one of its buckets, so that
        ``first`` may lead again from that log; restart the second after ``hold``."""
        c = self.cluster
        c.kill("tablet-server", first)
        time.sleep(2.5)  # past the election: the buckets it led have new leaders, and acknowledge on
        c.restart("tablet-server", first)
        time.sleep(min(hold, 1.0) / 2)  # well before it can have fetched everything back
        second = self._leader_of(first)  # type: ignore[operator]
        if second is not None and second != first:
            c.kill("tablet-server", second)
            time.sleep(hold)
            c.restart("tablet-server", second)

    def _pause_follower_then_kill_leader(self, follower: int, hold: float) -> None:
        """Pause ``follower`` until the leaders drop it from their ISRs (writes go on, acknowledged without
        it), kill a leader of one of its buckets, resume the follower, restart the leader after ``hold``."""
        c = self.cluster
        c.signal("tablet-server", follower, signal.SIGSTOP)
        time.sleep(3.0)  # past the silence bound: acknowledged by the others alone from here on
        leader = self._leader_of(follower)  # type: ignore[operator]
        if leader is not None:
            c.kill("tablet-server", leader)
        c.signal("tablet-server", follower, signal.SIGCONT)
        time.sleep(hold)
        if leader is not None:
            c.restart("tablet-server", leader)
