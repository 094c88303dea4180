"""The client's reaction to KV back-pressure, as Fluss's writer reacts: pause a bucket for
``max-throttle · p²`` after an answer carrying pressure p, for the whole ``max-throttle`` after a refusal,
and not at all once an answer carries none."""

from __future__ import annotations

import asyncio

import pytest

from strom.client.backpressure import BucketThrottle
from strom.ids import TableBucket

HOT = TableBucket(1, 0)
COLD = TableBucket(1, 1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pressured_bucket_waits_max_throttle_times_pressure_squared() -> None:
    clock = Clock()
    throttle = BucketThrottle(3.0, clock)
    throttle.report(HOT, 0.5)
    assert throttle.remaining_s([HOT]) == pytest.approx(0.75)
    assert throttle.remaining_s([COLD]) == 0.0
    assert throttle.remaining_s([COLD, HOT]) == pytest.approx(0.75)  # a chunk waits for its slowest bucket
    clock.now += 0.5
    assert throttle.remaining_s([HOT]) == pytest.approx(0.25)
    clock.now += 0.3
    assert throttle.remaining_s([HOT]) == 0.0


def test_a_refusal_pauses_for_the_whole_max_throttle_and_no_pressure_resumes_at_once() -> None:
    clock = Clock()
    throttle = BucketThrottle(3.0, clock)
    throttle.refused(HOT)
    assert throttle.latest[HOT] == 1.0
    assert throttle.remaining_s([HOT]) == pytest.approx(3.0)
    throttle.report(HOT, 0.0)  # the next answer carried none
    assert throttle.remaining_s([HOT]) == 0.0
    throttle.report(HOT, 0.001)  # too small to wait for: 3 s x 1e-6
    assert throttle.remaining_s([HOT]) == pytest.approx(3e-6)


@pytest.mark.asyncio
async def test_wait_sleeps_until_no_bucket_is_paused() -> None:
    throttle = BucketThrottle(0.2)
    throttle.report(HOT, 0.5)  # 0.05 s
    await asyncio.wait_for(throttle.wait([HOT, COLD]), 5)
    assert throttle.remaining_s([HOT]) == 0.0
    assert throttle.paused_s > 0.0
