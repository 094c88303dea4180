"""The client's side of Fluss's KV back-pressure: a bucket whose PutKv answer carried ``pressure`` p is
paused for ``max-throttle · p²`` (``client.writer.kv-backpressure.max-throttle``, 3 s by default), and one
that refused a write with StorageBackpressure (72) for the whole ``max-throttle``, as Fluss's writer does.

strom's writers send a chunk's buckets together and chunks in order, so a paused bucket holds back the chunks
that carry it (and with them the other buckets of those chunks) rather than only itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from strom.ids import TableBucket

MAX_THROTTLE_KEY = "client.writer.kv-backpressure.max-throttle"
MAX_THROTTLE_DEFAULT = "3s"


class BucketThrottle:
    """Until when each bucket's writes wait; shared by the writers of one connection."""

    def __init__(self, max_throttle_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_throttle_s = max_throttle_s
        self._clock = clock
        self._until: dict[TableBucket, float] = {}
        self.latest: dict[TableBucket, float] = {}
        """The pressure each bucket's latest answer carried (1.0: a refusal)."""
        self.paused_s = 0.0
        """Time writers spent waiting on paused buckets (for tests and benchmarks)."""

    def report(self, bucket: TableBucket, pressure: float) -> None:
        """A put's answer for ``bucket`` carried ``pressure`` (0 or absent: none); 1 or more is a refusal."""
        self.latest[bucket] = pressure
        if pressure <= 0:
            self._until.pop(bucket, None)
            return
        delay = self.max_throttle_s if pressure >= 1 else self.max_throttle_s * pressure * pressure
        if delay > 0:
            self._until[bucket] = self._clock() + delay
        else:
            self._until.pop(bucket, None)

    def refused(self, bucket: TableBucket) -> None:
        """``bucket`` refused a write with StorageBackpressure: pause it for the whole ``max-throttle``."""
        self.report(bucket, 1.0)

    def remaining_s(self, buckets: Iterable[TableBucket]) -> float:
        """How long the latest-paused of ``buckets`` still waits (0: none is paused)."""
        now = self._clock()
        longest = 0.0
        for bucket in buckets:
            until = self._until.get(bucket)
            if until is None:
                continue
            if until <= now:
                del self._until[bucket]
            else:
                longest = max(longest, until - now)
        return longest

    async def wait(self, buckets: Iterable[TableBucket]) -> None:
        """Return once none of ``buckets`` is paused."""
        targets = list(buckets)
        while (delay := self.remaining_s(targets)) > 0:
            self.paused_s += delay
            await asyncio.sleep(delay)


__all__ = ["MAX_THROTTLE_DEFAULT", "MAX_THROTTLE_KEY", "BucketThrottle"]
