"""A StromServer on its own event loop in a thread of the test process: for tests that move the server's
clock by hand while blocking clients (Spark jobs, whose workers connect over loopback) use it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from strom.clock import Clock
from strom.config import Configuration
from strom.server.node import StromServer

T = TypeVar("T")
CALL_TIMEOUT_S = 120.0


class ServerThread:
    """``with ServerThread(...) as server:`` starts the server and stops it (and its loop) at the end."""

    def __init__(self, data_dir: Path, config: dict[str, str], clock: Clock) -> None:
        self.server = StromServer(data_dir, "127.0.0.1", 0, Configuration(config), clock=clock)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="strom-server", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the server's loop and wait for its result."""
        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(CALL_TIMEOUT_S)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self.call(self.server.start)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.call(self.server.stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CALL_TIMEOUT_S)
            self._loop.close()
