"""Time as a collaborator: components take a Clock so tests can move time by hand."""

from __future__ import annotations

import time


class Clock:
    """Wall-clock epoch milliseconds (for timestamps and expiries visible to clients)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock(Clock):
    """A clock that only moves when a test advances it."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, *, ms: int) -> None:
        assert ms >= 0
        self._now_ms += ms


SYSTEM_CLOCK = Clock()
