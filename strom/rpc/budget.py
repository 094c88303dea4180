"""A server-wide bound on the bytes of request frames still being received.

Each connection may buffer one frame up to ``netty.server.max-request-size``; without a shared bound,
many connections that each send most of a large frame (and then stall) hold that much memory each. A
connection whose next frame is large reserves the frame's declared size here once its length is read;
if the reservation does not fit, the connection stops reading (the client's sends block in TCP) until
other connections finish their frames and release what they reserved. A holder of a reservation can
always complete its frame, so waiting connections are never deadlocked, and idle ones are closed by the
idle timeout. Small frames need no reservation: they arrive in a read or two and are bounded by the
socket buffers.
"""

from __future__ import annotations

import collections
from typing import Protocol

SMALL_FRAME_SIZE_BYTES = 1 << 16


class BudgetWaiter(Protocol):
    def retry_reservation(self) -> None: ...


class BufferedRequestBudget:
    """Owned by the event loop."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.reserved_bytes = 0
        self._waiters: collections.OrderedDict[int, BudgetWaiter] = collections.OrderedDict()

    def try_reserve(self, size_bytes: int) -> bool:
        if self.reserved_bytes + size_bytes > self.bytes_max:
            return False
        self.reserved_bytes += size_bytes
        return True

    def release(self, size_bytes: int) -> None:
        self.reserved_bytes -= size_bytes
        assert self.reserved_bytes >= 0
        for key, waiter in list(self._waiters.items()):  # oldest first; each retries once
            if self._waiters.pop(key, None) is not None:
                waiter.retry_reservation()

    def wait(self, key: int, waiter: BudgetWaiter) -> None:
        self._waiters[key] = waiter

    def forget(self, key: int) -> None:
        self._waiters.pop(key, None)

    @property
    def waiter_count(self) -> int:
        return len(self._waiters)
