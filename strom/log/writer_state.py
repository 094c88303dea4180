"""Idempotent-writer bookkeeping of one bucket: which batch sequences each writer id already wrote.

A client retrying a batch whose acknowledgement was lost sends the same ``(writer_id, batch_sequence)``
again; the bucket must answer DUPLICATE_SEQUENCE (which the client treats as success) instead of writing
it twice. The state is derived from the batch headers in the log, so it is rebuilt on restart by replaying
them (:meth:`WriterStateManager.observe`) and needs no file of its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from strom.errors import DuplicateSequenceError, OutOfOrderSequenceError

if TYPE_CHECKING:
    from strom.records.log_batch import LogBatchHeader

NO_WRITER_ID = -1
BATCHES_RETAINED_PER_WRITER = 5  # the client keeps at most 5 batches in flight per bucket
INT32_MAX = 0x7FFFFFFF


@dataclass(slots=True)
class _WriterEntry:
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=BATCHES_RETAINED_PER_WRITER))
    """``(batch_sequence, base_offset, next_offset)`` of the writer's latest batches, oldest first."""
    last_timestamp_ms: int = 0

    @property
    def last_sequence(self) -> int:
        return self.batches[-1][0] if self.batches else -1


class WriterStateManager:
    """Per-bucket writer state. Not thread-safe: the bucket's owner serialises calls."""

    def __init__(self, expiration_ms: int) -> None:
        assert expiration_ms > 0
        self._expiration_ms = expiration_ms
        self._writers: dict[int, _WriterEntry] = {}

    def check(self, writer_id: int, batch_sequence: int) -> None:
        """Validate an incoming batch before it is appended.

        Raises DuplicateSequenceError if the writer already wrote this sequence (the batch must not be
        appended again), OutOfOrderSequenceError if it skips ahead.
        """
        if writer_id == NO_WRITER_ID:
            return
        entry = self._writers.get(writer_id)
        last = entry.last_sequence if entry else -1
        if entry is not None:
            for sequence, base_offset, _next in entry.batches:
                if sequence == batch_sequence:
                    raise DuplicateSequenceError(
                        f"writer {writer_id} already wrote batch {batch_sequence} at offset {base_offset}"
                    )
        in_sequence = batch_sequence == last + 1 or (batch_sequence == 0 and last == INT32_MAX)
        if not in_sequence:
            raise OutOfOrderSequenceError(
                f"writer {writer_id}: batch sequence {batch_sequence} does not follow {last}"
            )

    def observe(self, writer_id: int, batch_sequence: int, base_offset: int, next_offset: int, timestamp_ms: int) -> None:
        """Record a batch that is now in the log (on append, and when replaying the log on open)."""
        if writer_id == NO_WRITER_ID:
            return
        entry = self._writers.get(writer_id)
        if entry is None:
            entry = self._writers[writer_id] = _WriterEntry()
        entry.batches.append((batch_sequence, base_offset, next_offset))
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)

    def observe_header(self, header: LogBatchHeader) -> None:
        self.observe(header.writer_id, header.batch_sequence, header.base_offset, header.next_offset, header.commit_timestamp)

    def expire(self, now_ms: int) -> int:
        """Forget writers idle longer than the expiration time; returns how many were removed."""
        expired = [wid for wid, entry in self._writers.items() if now_ms - entry.last_timestamp_ms > self._expiration_ms]
        for writer_id in expired:
            del self._writers[writer_id]
        return len(expired)

    @property
    def writer_count(self) -> int:
        return len(self._writers)
