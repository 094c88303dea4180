"""What a server grants connections before they have logged in: how many, from where, how much memory, and how
many failed logins a source address may make (after Kafka's ``max.connections``,
``max.connections.per.ip`` and ``connection.failed.authentication.delay.ms``).

One :class:`ConnectionAdmission` serves every listener of a process, so the limits hold for the server as a
whole. A connection over a limit is closed as soon as it is accepted, before it reads anything. Failed logins
are counted per source address in a sliding window: each one delays the next answer to that address more
(doubling from the base delay, capped), and past a number of them the address is blocked (its new
connections closed at once) for a while; each of these is logged at most once per window. Every method runs
on the event loop.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

UNLIMITED = 0
LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    connections_max: int = UNLIMITED
    """``max.connections``: open connections in the whole server (0: no limit)."""
    connections_per_address_max: int = UNLIMITED
    """``max.connections.per.ip`` (0: no limit)."""
    per_address_overrides: Mapping[str, int] = field(default_factory=dict)
    """``max.connections.per.ip.overrides``: a limit of its own for some addresses."""
    unauthenticated_bytes_max: int = UNLIMITED
    """Bytes of partial frames that connections which have not logged in may hold, all together."""
    failed_logins_max: int = UNLIMITED
    """Failed logins one address may make within ``failed_login_window_s`` before it is blocked."""
    failed_login_window_s: float = 60.0
    block_s: float = 60.0
    failed_login_delay_s: float = 0.1
    """The answer to a failed login waits this long, doubled for each earlier failure of the address in the
    window, up to ``failed_login_delay_max_s``."""
    failed_login_delay_max_s: float = 5.0


class ConnectionAdmission:
    """Connection counts, unauthenticated memory and failed logins of one server process."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self._open: dict[str, int] = defaultdict(int)
        self._total = 0
        self.unauthenticated_bytes = 0
        self._failures: dict[str, deque[float]] = {}
        self._blocked_until: dict[str, float] = {}
        self._last_logged: dict[str, float] = {}
        self.refused = 0

    # ---- connections ----
    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; returns why it is refused instead (it is not counted)."""
        limits = self.limits
        reason = None
        if self._blocked_until.get(address, 0.0) > time.monotonic():
            reason = f"{address} is blocked after {limits.failed_logins_max} failed logins"
        elif limits.connections_max and self._total >= limits.connections_max:
            reason = f"the server holds max.connections={limits.connections_max} connections"
        elif (most := limits.per_address_overrides.get(address, limits.connections_per_address_max)) \
                and self._open[address] >= most:
            reason = f"{address} holds max.connections.per.ip={most} connections"
        elif limits.unauthenticated_bytes_max and self.unauthenticated_bytes >= limits.unauthenticated_bytes_max:
            reason = (f"connections that have not logged in hold {self.unauthenticated_bytes} bytes, the most the "
                      "server keeps for them")
        if reason is not None:
            self.refused += 1
            self._log_once("refused", "refusing a connection: %s", reason)
            return reason
        self._open[address] += 1
        self._total += 1
        return None

    def release(self, address: str) -> None:
        self._total -= 1
        self._open[address] -= 1
        if not self._open[address]:
            del self._open[address]

    def hold_unauthenticated(self, change_bytes: int) -> bool:
        """Account for a change in the bytes a connection that has not logged in buffers; False when an
        increase does not fit (the caller closes that connection and gives its bytes back)."""
        self.unauthenticated_bytes += change_bytes
        most = self.limits.unauthenticated_bytes_max
        if change_bytes > 0 and most and self.unauthenticated_bytes > most:
            self._log_once("memory", "closing a connection that has not logged in: such connections would hold "
                                     "%d bytes, more than the %d the server keeps for them",
                           self.unauthenticated_bytes, most)
            return False
        return True

    # ---- failed logins ----
    def login_failed(self, address: str) -> float:
        """Record a failed login from ``address``; returns how long its answer waits."""
        limits = self.limits
        now = time.monotonic()
        recent = self._failures.setdefault(address, deque())
        while recent and recent[0] < now - limits.failed_login_window_s:
            recent.popleft()
        recent.append(now)
        if limits.failed_logins_max and len(recent) >= limits.failed_logins_max:
            self._blocked_until[address] = now + limits.block_s
            self._log_once(f"block {address}", "blocking %s for %.0f s: %d failed logins within %.0f s", address,
                           limits.block_s, len(recent), limits.failed_login_window_s)
        self._forget_old(now)
        return min(limits.failed_login_delay_s * 2 ** (len(recent) - 1), limits.failed_login_delay_max_s)

    def _forget_old(self, now: float) -> None:
        if len(self._failures) > 1024:  # many addresses: keep only those with failures in the window
            window = self.limits.failed_login_window_s
            self._failures = {a: d for a, d in self._failures.items() if d and d[-1] >= now - window}
            self._blocked_until = {a: t for a, t in self._blocked_until.items() if t > now}
            self._last_logged = {w: t for w, t in self._last_logged.items() if t >= now - LOG_INTERVAL_S}

    def _log_once(self, what: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_logged.get(what, -LOG_INTERVAL_S) >= LOG_INTERVAL_S:
            self._last_logged[what] = now
            log.warning(message, *args)


__all__ = ["AdmissionLimits", "ConnectionAdmission"]
