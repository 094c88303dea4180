"""Group commit under many small writers: what happens the moment an fsync ends, on real log files.

The fsyncs run for real; a gate only holds each one in its worker thread until the test lets it finish,
so the tests see the log's state between "fsync done" and the next loop turn without any timing.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from pathlib import Path

import pytest

from strom.errors import LogStorageError
from strom.log.log_tablet import LogTablet
from strom.log.segment import LogSegment
from tests.log.test_log_tablet import DURABLE_EACH_APPEND, append, batch_bytes

pytestmark = pytest.mark.asyncio

ENTER_TIMEOUT_S = 30.0


class FsyncGate:
    """Holds every fsync until :meth:`release`; counts them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered: queue.Queue[threading.Event] = queue.Queue()
        self.count = 0
        self.opened = threading.Event()
        """Once set, fsyncs are no longer held."""
        self.error: OSError | None = None
        """Raised by every fsync released after it is set (a failing disk)."""
        real_fsync = LogSegment.fsync

        def gated_fsync(segment: LogSegment) -> None:
            if not self.opened.is_set():
                release = threading.Event()
                self.entered.put(release)
                while not (release.is_set() or self.opened.wait(0.01)):
                    pass
            if self.error is not None:
                raise self.error
            real_fsync(segment)
            self.count += 1

        monkeypatch.setattr(LogSegment, "fsync", gated_fsync)

    def open(self) -> None:
        """Let every held and future fsync run."""
        self.opened.set()

    async def next_fsync(self) -> threading.Event:
        """Wait until an fsync is running; returns what lets it finish."""
        return await asyncio.to_thread(self.entered.get, True, ENTER_TIMEOUT_S)


async def until(condition: object) -> None:
    """Yield to the loop until ``condition()`` holds (the fsync's completion arrives from its thread)."""
    for _ in range(100_000):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


async def test_waiters_are_answered_in_the_step_that_moves_the_high_watermark_and_the_next_fsync_starts_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tablet = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)  # open's own fsync runs ungated
    gate = FsyncGate(monkeypatch)
    first = append(tablet, batch_bytes([0]))
    first_waiter = tablet.durable(first.next_offset)
    release_first = await gate.next_fsync()
    # appended while the first fsync runs: one following fsync covers them all
    late = [append(tablet, batch_bytes([i])) for i in range(1, 51)]
    late_waiters = [tablet.durable(result.next_offset) for result in late]
    assert not first_waiter.done() and tablet.high_watermark == 0

    release_first.set()
    await until(lambda: tablet.high_watermark >= first.next_offset)
    # the same loop step answered the first waiter and started the late appends' fsync: no waiter task has
    # to wake up first, so the acknowledgement and the next fsync wait for no extra turn of a busy loop
    assert first_waiter.done() and first_waiter.exception() is None
    assert tablet.flush_in_flight
    assert not any(waiter.done() for waiter in late_waiters)
    release_late = await gate.next_fsync()
    release_late.set()
    await asyncio.gather(*late_waiters)
    assert tablet.high_watermark == 51
    assert gate.count == 2, f"{gate.count} fsyncs for 51 appends in two waves"
    tablet.close()


async def test_appends_of_one_loop_turn_share_one_fsync_on_each_of_several_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = [LogTablet.open(tmp_path / f"bucket-{index}", DURABLE_EACH_APPEND) for index in range(3)]
    gate = FsyncGate(monkeypatch)
    waiters = []
    for index in range(60):  # like 60 PutKv requests read in one turn, each touching one of three buckets
        tablet = logs[index % 3]
        waiters.append(tablet.durable(append(tablet, batch_bytes([index])).next_offset))
    for _ in logs:
        (await gate.next_fsync()).set()
    await asyncio.gather(*waiters)
    assert [tablet.high_watermark for tablet in logs] == [20, 20, 20]
    assert gate.count == 3, f"{gate.count} fsyncs for 60 appends on 3 logs"
    for tablet in logs:
        tablet.close()


async def test_a_cancelled_waiter_does_not_disturb_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tablet = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    gate = FsyncGate(monkeypatch)
    results = [append(tablet, batch_bytes([i])) for i in range(3)]
    tasks = [asyncio.ensure_future(tablet.wait_durable(result.next_offset)) for result in results]
    release = await gate.next_fsync()
    tasks[0].cancel()
    release.set()
    await asyncio.gather(*tasks[1:])
    assert tasks[0].cancelled() and tablet.high_watermark == 3
    tablet.close()


async def test_a_failed_fsync_fails_its_waiters_and_those_of_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tablet = LogTablet.open(tmp_path / "log", DURABLE_EACH_APPEND)
    gate = FsyncGate(monkeypatch)
    first = tablet.durable(append(tablet, batch_bytes([1])).next_offset)
    release = await gate.next_fsync()
    second = tablet.durable(append(tablet, batch_bytes([2])).next_offset)
    gate.error = OSError(5, "Input/output error")
    release.set()
    with pytest.raises(LogStorageError):
        await first
    with pytest.raises(LogStorageError):
        await second
    assert tablet.high_watermark == 0 and tablet.failed is not None
    tablet.close()
