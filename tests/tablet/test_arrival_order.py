"""PutKv requests keep their arrival order on each bucket while some wait for buckets to open
(strom.tablet.arrival_order).

Each request here is a task that takes its turn and records when it appends; the opening its buckets wait
for is a future the test completes, so every order of events is set by the test and nothing is timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from strom.tablet.arrival_order import ArrivalOrder

pytestmark = pytest.mark.asyncio


async def _put(order: ArrivalOrder, buckets: Sequence[str], opening: asyncio.Future[Any] | None, name: str,
               appended: list[str]) -> None:
    """A PutKv as the tablet service runs it: at once while nothing it touches waits, else in its turn."""
    if not order.must_wait(buckets, opening):
        appended.append(name)
        return
    async with order.turn(buckets, opening):
        appended.append(name)


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_requests_that_wait_for_nothing_append_as_they_arrive() -> None:
    order, appended = ArrivalOrder(), []
    assert not order.must_wait(["a"], None)
    await _put(order, ["a"], None, "first", appended)
    await _put(order, ["a", "b"], None, "second", appended)
    assert appended == ["first", "second"]


async def test_requests_for_a_bucket_that_opens_append_after_the_first_in_arrival_order() -> None:
    loop = asyncio.get_running_loop()
    order, appended = ArrivalOrder(), []
    first_opening, third_opening = loop.create_future(), loop.create_future()
    first = asyncio.ensure_future(_put(order, ["a", "b"], first_opening, "first", appended))
    await _settle()
    assert order.must_wait(["b"], None)  # one waits for "b": the next must queue although "b" is open then
    second = asyncio.ensure_future(_put(order, ["b"], None, "second", appended))
    third = asyncio.ensure_future(_put(order, ["a", "c"], third_opening, "third", appended))
    fourth = asyncio.ensure_future(_put(order, ["c"], None, "fourth", appended))
    third_opening.set_result(None)  # the third's buckets open first: it still waits for the first
    await _settle()
    assert appended == []
    first_opening.set_result(None)
    await asyncio.gather(first, second, third, fourth)
    assert appended.index("first") < appended.index("second")
    assert appended.index("first") < appended.index("third") < appended.index("fourth")
    assert not order.must_wait(["a", "b", "c"], None)  # none waits any more: the next appends as it arrives


async def test_requests_for_other_buckets_append_as_they_arrive_while_one_waits() -> None:
    loop = asyncio.get_running_loop()
    order, appended = ArrivalOrder(), []
    opening = loop.create_future()
    waiting = asyncio.ensure_future(_put(order, ["new-0", "new-1"], opening, "new table", appended))
    await _settle()
    assert not order.must_wait(["hot"], None)
    await _put(order, ["hot"], None, "hot table", appended)
    assert appended == ["hot table"]
    opening.set_result(None)
    await waiting
    assert appended == ["hot table", "new table"]


async def test_a_request_cancelled_in_its_turn_lets_the_next_go_only_after_the_one_before_it() -> None:
    loop = asyncio.get_running_loop()
    order, appended = ArrivalOrder(), []
    first_opening, second_opening = loop.create_future(), loop.create_future()
    first = asyncio.ensure_future(_put(order, ["a"], first_opening, "first", appended))
    second = asyncio.ensure_future(_put(order, ["a"], second_opening, "second", appended))
    third = asyncio.ensure_future(_put(order, ["a"], None, "third", appended))
    await _settle()
    second.cancel()  # its client went away while it waited
    await _settle()
    assert appended == [] and not third.done()  # the first has not had its turn yet
    assert order.must_wait(["a"], None)
    first_opening.set_result(None)
    await asyncio.gather(first, third)
    assert second.cancelled()
    assert appended == ["first", "third"]
    assert not order.must_wait(["a"], None)


async def test_a_request_whose_append_fails_hands_on_its_turn() -> None:
    loop = asyncio.get_running_loop()
    order, appended = ArrivalOrder(), []
    opening = loop.create_future()

    async def failing() -> None:
        async with order.turn(["a"], opening):
            raise RuntimeError("the append failed")

    first = asyncio.ensure_future(failing())
    second = asyncio.ensure_future(_put(order, ["a"], None, "second", appended))
    opening.set_result(None)
    with pytest.raises(RuntimeError):
        await first
    await second
    assert appended == ["second"] and not order.must_wait(["a"], None)
