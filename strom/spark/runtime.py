"""Running strom's async client from Spark's synchronous reader, writer and planner calls.

Spark calls a Python data source from plain functions and generators, one task at a time per Python worker
process (workers are reused across tasks). Each process therefore owns one event loop, created on first use
and driven with ``run_until_complete`` from the calling thread; nothing runs on it between calls. A task
opens its own :class:`~strom.client.Connection` and closes it when done, so a server restart between tasks
never leaves a worker holding a dead connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from strom.client import Connection
from strom.spark.errors import translated
from strom.spark.options import ConnectionOptions

T = TypeVar("T")

_local = threading.local()


def _loop() -> asyncio.AbstractEventLoop:
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion on this thread's loop (which must not be running)."""
    loop = _loop()
    assert not loop.is_running(), "strom.spark.runtime.run() must not be called from inside the loop"
    return loop.run_until_complete(coroutine)


def iterate(iterator: AsyncIterator[T]) -> Iterator[T]:
    """A synchronous view of an async iterator; closing it (or abandoning it) closes the source."""
    try:
        while True:
            try:
                item = run(_next(iterator))
            except StopAsyncIteration:
                return
            yield item
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            run(close())


async def _next(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()


@contextmanager
def connected(options: ConnectionOptions) -> Iterator[Connection]:
    """A connection for the length of the block; the client's errors become FlussConnectorErrors."""
    with translated(options.bootstrap_servers, options.table):
        connection = run(Connection.create(options.client_config))
    try:
        with translated(options.bootstrap_servers, options.table):
            yield connection
    finally:
        run(connection.close())


def call(options: ConnectionOptions, action: Callable[[Connection], Awaitable[T]]) -> T:
    """Connect, run ``action(connection)``, close: one short exchange with the cluster."""

    async def main() -> T:
        return await action(connection)

    with connected(options) as connection:
        return run(main())
