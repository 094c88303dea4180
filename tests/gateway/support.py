"""How the tests talk to a gateway: the app in this process (its lifespan run, httpx over ASGI), or a
gateway process waited for until it is ready."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from fastapi import FastAPI


@asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of ``app``, between its start-up and its shutdown."""
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client


def wait_ready(base_url: str, alive: Callable[[], bool], log: Callable[[], str], timeout_s: float = 30.0) -> None:
    """Poll ``base_url``/ready until a gateway answers 200, failing with ``log()`` once its process is gone
    (``alive()`` false) or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        assert alive(), f"the gateway's process is gone:\n{log()[-3000:]}"
        assert time.monotonic() < deadline, f"the gateway did not become ready within {timeout_s} s:\n{log()[-3000:]}"
        time.sleep(0.1)
