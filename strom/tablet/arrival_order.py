"""PutKv requests keep their arrival order on each bucket while some wait for buckets to open.

A PutKv request appends its batches to the buckets' logs in the same loop turn it arrives in, so the
requests of a connection reach each bucket's log in the order they were sent: a writer's batches to a
bucket carry consecutive sequence numbers, and one that overtook the batch before it would be refused as
out of order. A request whose buckets are opening (``ReplicaManager.open_soon``), or whose old values are read
on a writer thread (``KvTablet.read_ahead``), waits for them instead, leaving the event loop to the server's
other clients; from then on, every PutKv that arrives for one of its buckets waits for its turn behind it,
until none waits there. Requests for other buckets go on as they arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Sequence
from contextlib import asynccontextmanager
from typing import Any


class ArrivalOrder:
    """The PutKv requests that wait, in the order they arrived, per bucket. Owned by the event loop."""

    def __init__(self) -> None:
        self._last: dict[Hashable, asyncio.Future[None]] = {}
        """Each bucket's last waiting request, done once it has appended (or failed): the next one's turn."""

    def must_wait(self, buckets: Sequence[Hashable], opening: asyncio.Future[Any] | None) -> bool:
        """Whether a request for ``buckets`` must take its turn (:meth:`turn`): its buckets are opening, or
        a request for one of them waits."""
        return opening is not None or (bool(self._last) and any(bucket in self._last for bucket in buckets))

    @asynccontextmanager
    async def turn(self, buckets: Sequence[Hashable], opening: asyncio.Future[Any] | None) -> AsyncIterator[None]:
        """Wait until ``opening`` is done and every request for one of ``buckets`` that arrived before this
        one has had its turn; the body appends, and the next request's turn comes when it ends. A request
        cancelled while it waits hands its turn on only once those before it have had theirs."""
        previous = list({id(turn): turn for bucket in buckets if (turn := self._last.get(bucket)) is not None}.values())
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for bucket in buckets:
            self._last[bucket] = mine
        try:
            for turn in previous:
                await asyncio.shield(turn)
            if opening is not None:
                await opening
            yield
        finally:
            waiting = [turn for turn in previous if not turn.done()]
            if waiting:  # only a cancelled request ends before the ones it waited for
                asyncio.gather(*waiting).add_done_callback(lambda _done: self._hand_on(mine, buckets))
            else:
                self._hand_on(mine, buckets)

    def _hand_on(self, turn: asyncio.Future[None], buckets: Sequence[Hashable]) -> None:
        if not turn.done():
            turn.set_result(None)
        for bucket in buckets:
            if self._last.get(bucket) is turn:
                del self._last[bucket]  # none waits there: the next request appends as it arrives
