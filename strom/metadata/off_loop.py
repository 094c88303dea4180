"""Metadata store calls made from an event loop run on worker threads of their own.

A store call blocks for one or a few ZooKeeper round trips (or an SQLite commit): on an event loop it
would stall every other request the process serves while ZooKeeper is slow. Coroutines await
:func:`off_loop` instead; the loop keeps serving (GetMetadata from memory, fetches, heartbeats) meanwhile.

The threads are the process's own pool, not asyncio's default executor, so file and socket work handed to
that executor is never queued behind a slow ZooKeeper, nor the other way round.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

STORE_THREADS = 8
"""Store calls in flight at once per process: a ZooKeeper call waits on the network, not on a core."""

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _store_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="metadata-store")
        return _executor


async def off_loop(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call(*args, **kwargs)`` on a store thread; its result, or its exception, comes back to the caller."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_store_executor(), functools.partial(call, *args, **kwargs))


def submit(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
    """``call(*args, **kwargs)`` started on a store thread now, for code that is not a coroutine and wants
    its result later (ahead of need: by then it is usually there)."""
    return _store_executor().submit(call, *args, **kwargs)


def on_event_loop() -> bool:
    """Whether the calling thread is running an event loop (where a store call must not block)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


__all__ = ["STORE_THREADS", "off_loop", "on_event_loop", "submit"]
