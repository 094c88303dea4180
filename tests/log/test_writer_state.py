"""Idempotent-writer bookkeeping: duplicates, gaps, sequence wraparound and expiry."""

from __future__ import annotations

import pytest

from strom.errors import DuplicateSequenceError, OutOfOrderSequenceError
from strom.log.writer_state import BATCHES_RETAINED_PER_WRITER, INT32_MAX, NO_WRITER_ID, WriterStateManager
from strom.records.log_batch import REPLAYABLE_WRITER_ID_MIN, RUN_SEQUENCE_SPAN

T0_MS = 1_700_000_000_000


def write(state: WriterStateManager, writer_id: int, sequence: int, offset: int, now_ms: int = T0_MS) -> None:
    """Check then record a one-record batch at ``offset``, as an append does."""
    state.check(writer_id, sequence)
    state.observe(writer_id, sequence, offset, offset + 1, now_ms)


def test_a_new_writer_must_start_at_sequence_zero() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 1)
    state.check(1, 0)


def test_each_of_the_last_five_batches_is_a_duplicate() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    for sequence in range(8):
        write(state, 1, sequence, offset=sequence)
    for sequence in range(8 - BATCHES_RETAINED_PER_WRITER, 8):
        with pytest.raises(DuplicateSequenceError, match=f"at offset {sequence}"):
            state.check(1, sequence)
    state.check(1, 8)


def test_a_batch_older_than_the_retained_window_is_out_of_order() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    for sequence in range(8):
        write(state, 1, sequence, offset=sequence)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 8 - BATCHES_RETAINED_PER_WRITER - 1)


@pytest.mark.parametrize("sequence", [4, 10, -5])
def test_a_gap_or_a_step_back_is_out_of_order(sequence: int) -> None:
    state = WriterStateManager(expiration_ms=60_000)
    for index in range(3):
        write(state, 1, index, offset=index)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, sequence)


def test_writers_are_tracked_independently() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    write(state, 1, 0, offset=0)
    write(state, 2, 0, offset=1)
    write(state, 1, 1, offset=2)
    with pytest.raises(DuplicateSequenceError):
        state.check(2, 0)
    state.check(2, 1)
    state.check(1, 2)
    assert state.writer_count == 2


def test_batches_without_a_writer_id_are_never_checked_or_tracked() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    for offset in range(3):
        write(state, NO_WRITER_ID, -1, offset=offset)
    assert state.writer_count == 0


def test_the_sequence_wraps_from_int32_max_to_zero() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    state.observe(1, INT32_MAX - 1, 0, 1, T0_MS)  # as rebuilt from the log
    write(state, 1, INT32_MAX, offset=1)
    write(state, 1, 0, offset=2)
    write(state, 1, 1, offset=3)
    for sequence in (INT32_MAX - 1, INT32_MAX, 0, 1):
        with pytest.raises(DuplicateSequenceError):
            state.check(1, sequence)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 3)
    state.check(1, 2)


def test_wraparound_only_follows_int32_max() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    state.observe(1, INT32_MAX - 1, 0, 1, T0_MS)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 0)


def test_writers_idle_longer_than_the_expiration_are_forgotten() -> None:
    state = WriterStateManager(expiration_ms=10_000)
    write(state, 1, 0, offset=0, now_ms=T0_MS)
    write(state, 2, 0, offset=1, now_ms=T0_MS + 5_000)

    assert state.expire(T0_MS + 10_000) == 0  # exactly at the limit: kept
    assert state.expire(T0_MS + 10_001) == 1
    assert state.writer_count == 1
    state.check(1, 0)  # writer 1 starts afresh: its old batch is no longer a duplicate
    with pytest.raises(DuplicateSequenceError):
        state.check(2, 0)

    write(state, 2, 1, offset=2, now_ms=T0_MS + 14_000)  # activity pushes the expiry forward
    assert state.expire(T0_MS + 20_000) == 0
    assert state.expire(T0_MS + 24_001) == 1
    assert state.writer_count == 0


REPLAYABLE = REPLAYABLE_WRITER_ID_MIN + 12345


def test_a_replayable_writer_s_every_earlier_batch_is_a_duplicate_however_far_back() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    for sequence in range(20):
        write(state, REPLAYABLE, sequence, offset=sequence)
    for sequence in range(20):
        with pytest.raises(DuplicateSequenceError):
            state.check(REPLAYABLE, sequence)
    state.check(REPLAYABLE, 20)
    assert state.batch_next_offset(REPLAYABLE, 19) == 20
    assert state.batch_next_offset(REPLAYABLE, 0) == 20 - BATCHES_RETAINED_PER_WRITER  # a bound: before the window


def test_a_replayable_writer_starts_runs_at_multiples_of_the_span_and_follows_within_one() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(REPLAYABLE, 1)  # a first batch starts a run
    state.check(REPLAYABLE, 3 * RUN_SEQUENCE_SPAN)  # a first batch may start at any run
    write(state, REPLAYABLE, RUN_SEQUENCE_SPAN, offset=0)
    write(state, REPLAYABLE, RUN_SEQUENCE_SPAN + 1, offset=1)
    with pytest.raises(OutOfOrderSequenceError, match="neither follows"):
        state.check(REPLAYABLE, RUN_SEQUENCE_SPAN + 3)  # a lost batch within a run is still caught
    write(state, REPLAYABLE, 5 * RUN_SEQUENCE_SPAN, offset=2)  # the next run may skip runs (other buckets' only)
    with pytest.raises(DuplicateSequenceError):
        state.check(REPLAYABLE, 2 * RUN_SEQUENCE_SPAN)  # an earlier run replayed: already written
    with pytest.raises(OutOfOrderSequenceError):
        state.check(REPLAYABLE_WRITER_ID_MIN - 1, RUN_SEQUENCE_SPAN)  # an ordinary writer has no runs


def test_a_replayable_writer_s_state_survives_a_restart() -> None:
    state = WriterStateManager(expiration_ms=60_000)
    for sequence in range(10):
        write(state, REPLAYABLE, RUN_SEQUENCE_SPAN + sequence, offset=sequence)
    restored, _ = WriterStateManager.from_bytes(state.to_bytes(10), 60_000)
    with pytest.raises(DuplicateSequenceError):
        restored.check(REPLAYABLE, RUN_SEQUENCE_SPAN)
    restored.check(REPLAYABLE, RUN_SEQUENCE_SPAN + 10)
