"""Idempotent-writer bookkeeping of one bucket: which batch sequences each writer id already wrote.

A client retrying a batch whose acknowledgement was lost sends the same ``(writer_id, batch_sequence)``
again; the bucket must answer DUPLICATE_SEQUENCE (which the client treats as success) instead of writing
it twice. The state is derived from the batch headers in the log, so it is rebuilt on restart by replaying
them (:meth:`WriterStateManager.observe`); before segments are deleted (retention, or once copied to remote
storage) the log saves the state as of its end (:meth:`WriterStateManager.to_bytes`), so a writer whose
batches were all in deleted segments is still known after a restart.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from strom.errors import DuplicateSequenceError, OutOfOrderSequenceError
from strom.records.log_batch import REPLAYABLE_WRITER_ID_MIN, RUN_SEQUENCE_SPAN

if TYPE_CHECKING:
    from strom.records.log_batch import LogBatchHeader

NO_WRITER_ID = -1
BATCHES_RETAINED_PER_WRITER = 5  # the client keeps at most 5 batches in flight per bucket
INT32_MAX = 0x7FFFFFFF


def is_replayable_writer(writer_id: int) -> bool:
    """A replayable writer (``log_batch.REPLAYABLE_WRITER_ID_MIN``): any sequence at or below its last one is a
    duplicate — acknowledged, not written — however far back it is, and it may start a new run (the next
    micro-batch) at any multiple of RUN_SEQUENCE_SPAN above its last sequence. Within a run, sequences
    follow one another as for any writer, so a lost batch is still caught as out of order."""
    return writer_id >= REPLAYABLE_WRITER_ID_MIN


def follows(last_sequence: int, batch_sequence: int) -> bool:
    """Whether ``batch_sequence`` is the one after ``last_sequence`` (-1: none yet); wraps at INT32_MAX."""
    return batch_sequence == last_sequence + 1 or (batch_sequence == 0 and last_sequence == INT32_MAX)


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
        if is_replayable_writer(writer_id):
            if batch_sequence <= last:
                raise DuplicateSequenceError(f"replayable writer {writer_id} already wrote batch {batch_sequence}")
            if batch_sequence != last + 1 and batch_sequence % RUN_SEQUENCE_SPAN:
                raise OutOfOrderSequenceError(
                    f"writer {writer_id}: batch sequence {batch_sequence} neither follows {last} nor starts a run"
                )
            return
        if entry is not None:
            for sequence, base_offset, _next in entry.batches:
                if sequence == batch_sequence:
                    raise DuplicateSequenceError(
                        f"writer {writer_id} already wrote batch {batch_sequence} at offset {base_offset}"
                    )
        if not follows(last, batch_sequence):
            raise OutOfOrderSequenceError(
                f"writer {writer_id}: batch sequence {batch_sequence} does not follow {last}"
            )

    def check_append(self, batches: Sequence[tuple[int, int]]) -> None:
        """Validate the ``(writer_id, batch_sequence)`` of every batch of one append, in order.

        The first batch of each writer is checked against the state (:meth:`check`); each later batch of
        the same writer must follow the one before it in the append. A duplicate is only reported when it
        is the append's only batch: the client treats DUPLICATE_SEQUENCE as success for the whole bucket
        request, so any other batch sent with a retried one would be lost. That case, like any gap,
        raises OutOfOrderSequenceError. Nothing is recorded; :meth:`observe` does that after the append.
        """
        previous: dict[int, int] = {}
        for writer_id, sequence in batches:
            if writer_id == NO_WRITER_ID:
                continue
            last = previous.get(writer_id)
            if last is None:
                try:
                    self.check(writer_id, sequence)
                except DuplicateSequenceError as exc:
                    if len(batches) == 1:
                        raise
                    raise OutOfOrderSequenceError(
                        f"writer {writer_id}: batch {sequence} was already written but arrived with "
                        f"{len(batches) - 1} other batches; retry it alone"
                    ) from exc
            elif not follows(last, sequence):
                raise OutOfOrderSequenceError(
                    f"writer {writer_id}: batch sequence {sequence} does not follow {last} in the same request"
                )
            previous[writer_id] = sequence

    def batch_next_offset(self, writer_id: int, batch_sequence: int) -> int | None:
        """The exclusive end offset of a retained batch of ``writer_id`` (None if not retained); for a
        replayable writer's older batch, a bound: it ended at or before the oldest retained batch began."""
        entry = self._writers.get(writer_id)
        if entry is not None:
            for sequence, _base_offset, next_offset in entry.batches:
                if sequence == batch_sequence:
                    return next_offset
            if is_replayable_writer(writer_id) and entry.batches and batch_sequence < entry.batches[0][0]:
                return entry.batches[0][1]
        return None

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

    def to_bytes(self, end_offset: int) -> bytes:
        """The state as of ``end_offset`` (every batch below it observed): what survives the deletion of the
        segments that held a writer's batches."""
        writers = [
            {"writer_id": writer_id, "last_timestamp_ms": entry.last_timestamp_ms,
             "batches": [list(batch) for batch in entry.batches]}
            for writer_id, entry in self._writers.items()
        ]
        return json.dumps({"version": 1, "end_offset": end_offset, "writers": writers}).encode()

    @classmethod
    def from_bytes(cls, data: bytes, expiration_ms: int) -> tuple[WriterStateManager, int]:
        """A state written by :meth:`to_bytes` and the offset it covers up to.

        Raises:
            ValueError, KeyError, TypeError: not such a document.
        """
        value = json.loads(data)
        manager = cls(expiration_ms)
        for writer in value["writers"]:
            entry = manager._writers[int(writer["writer_id"])] = _WriterEntry()
            entry.last_timestamp_ms = int(writer["last_timestamp_ms"])
            entry.batches.extend((int(a), int(b), int(c)) for a, b, c in writer["batches"])
        return manager, int(value["end_offset"])
