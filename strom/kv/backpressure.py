"""How much write debt a primary-key bucket carries, as Fluss's cooperative KV back-pressure reads it.

A bucket answers each PutKv with a ``pressure`` in [0, 1): 0 while its RocksDB keeps up, rising as level-0
files pile up ahead of compaction (Fluss's signal), so a client slows that bucket's writes down *before*
RocksDB stalls them itself. Past a hard budget a write is refused with StorageBackpressure (72, retriable):
the level-0 files, the memtables, and the pre-write buffer (changelog rows not in RocksDB yet, which grows
while the high watermark waits for a follower) would reach RocksDB's slowdown trigger.

Fluss's formulas (``kv.backpressure.l0-slowdown-trigger`` T, RocksDB's level-0 slowdown trigger R = 20):
pressure = min(L0 - T, R - T - 1) / (R - T) once L0 >= T; refuse when
L0 + ceil(pending bytes / memtable size) + memtable count >= R. strom adds two signals Fluss does not read,
each a ramp to just below 1: RocksDB's own estimate of pending compaction bytes against its soft limit, and
the pre-write buffer against that same budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

ROCKSDB_L0_SLOWDOWN_TRIGGER = 20
"""RocksDB's ``level0_slowdown_writes_trigger``, which neither Fluss nor strom changes."""
ROCKSDB_SOFT_PENDING_COMPACTION_BYTES = 64 << 30
"""RocksDB's ``soft_pending_compaction_bytes_limit``: past it RocksDB slows writes down itself."""
PRESSURE_MAX = 0.999
"""The highest pressure sent: 1.0 would read as a refusal to Fluss's client."""
L0_SAMPLE_INTERVAL_S = 0.1
"""RocksDB's counters are read at most this often per bucket (a property read takes a mutex)."""
L0_FILES = "rocksdb.num-files-at-level0"
PENDING_COMPACTION_BYTES = "rocksdb.estimate-pending-compaction-bytes"


def l0_pressure(l0_files: int, start: int, slowdown: int = ROCKSDB_L0_SLOWDOWN_TRIGGER) -> float:
    """Fluss's level-0 ramp: 0 below ``start`` files, then steps of 1 / (slowdown - start), at most
    (slowdown - start - 1) / (slowdown - start). 0 when ``start`` leaves no room below ``slowdown``."""
    window = slowdown - start
    if window <= 0 or l0_files < start:
        return 0.0
    return min(l0_files - start, window - 1) / window


def ramp(value: float, start: float, end: float) -> float:
    """0 up to ``start``, rising linearly to just below 1 at ``end``."""
    if value <= start or end <= start:
        return 0.0
    return min((value - start) / (end - start), PRESSURE_MAX)


@dataclass(frozen=True, slots=True)
class BackpressureConfig:
    """A bucket's thresholds: Fluss's trigger and the RocksDB memtable options the budget counts in."""

    l0_slowdown_trigger: int = 8
    """``kv.backpressure.l0-slowdown-trigger``."""
    write_buffer_size_bytes: int = 64 << 20
    """``kv.rocksdb.writebuffer.size``: one memtable, the unit the pre-write buffer is counted in."""
    write_buffer_count: int = 2
    """``kv.rocksdb.writebuffer.count``."""

    @property
    def proactive(self) -> bool:
        """Whether the level-0 ramp is on (a trigger at or above RocksDB's leaves it no room)."""
        return self.l0_slowdown_trigger < ROCKSDB_L0_SLOWDOWN_TRIGGER


class BucketBackpressure:
    """One bucket's debt, from its RocksDB's counters (sampled) and its pre-write buffer's size (given)."""

    def __init__(self, read_property: Callable[[str], str | None], config: BackpressureConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read_property
        self.config = config
        self._clock = clock
        self._sampled_at = -math.inf
        self.l0_files = 0
        self.pending_compaction_bytes = 0
        self.last_pressure = 0.0
        """The signal the latest answered put carried."""
        self.rejections = 0
        """Puts refused for the budget (StorageBackpressure), since the bucket opened."""

    def _int(self, name: str) -> int:
        try:
            value = self._read(name)
        except Exception:  # a closed or failing database reads as no debt: its writes fail on their own
            return 0
        try:
            return int(value) if value is not None else 0
        except ValueError:
            return 0

    def sample(self) -> None:
        """Re-read RocksDB's counters unless they were read within the last ``L0_SAMPLE_INTERVAL_S``."""
        now = self._clock()
        if now - self._sampled_at < L0_SAMPLE_INTERVAL_S:
            return
        self._sampled_at = now
        self.l0_files = self._int(L0_FILES)
        self.pending_compaction_bytes = self._int(PENDING_COMPACTION_BYTES)

    def _memtables_for(self, buffered_bytes: int) -> int:
        return math.ceil(buffered_bytes / self.config.write_buffer_size_bytes)

    def over_budget(self, buffered_bytes: int) -> bool:
        """Whether taking a write that leaves ``buffered_bytes`` in the pre-write buffer would bring the
        level-0 files, memtables and buffer to RocksDB's slowdown trigger (Fluss's admission rule)."""
        self.sample()
        used = self.l0_files + self._memtables_for(buffered_bytes) + self.config.write_buffer_count
        return used >= ROCKSDB_L0_SLOWDOWN_TRIGGER

    def budget_bytes(self) -> int:
        """Pre-write buffer bytes the budget leaves at the current level-0 count."""
        free = ROCKSDB_L0_SLOWDOWN_TRIGGER - self.config.write_buffer_count - self.l0_files - 1
        return max(free, 0) * self.config.write_buffer_size_bytes

    def pressure(self, buffered_bytes: int) -> float:
        """The signal for a write answered now, with ``buffered_bytes`` in the pre-write buffer."""
        self.sample()
        config = self.config
        level0 = l0_pressure(self.l0_files, config.l0_slowdown_trigger) if config.proactive else 0.0
        compaction = ramp(self.pending_compaction_bytes, ROCKSDB_SOFT_PENDING_COMPACTION_BYTES / 4,
                          ROCKSDB_SOFT_PENDING_COMPACTION_BYTES)
        # the buffer's ramp starts once it holds more than the memtables can take, ends at the budget
        buffer = ramp(buffered_bytes, config.write_buffer_size_bytes * config.write_buffer_count,
                      self.budget_bytes())
        self.last_pressure = min(max(level0, compaction, buffer), PRESSURE_MAX)
        return self.last_pressure


__all__ = [
    "L0_FILES",
    "PRESSURE_MAX",
    "ROCKSDB_L0_SLOWDOWN_TRIGGER",
    "BackpressureConfig",
    "BucketBackpressure",
    "l0_pressure",
    "ramp",
]
