"""How the gateway tests talk to a gateway: the app in this process, its lifespan run, httpx over ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI


@asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of ``app``, between its start-up and its shutdown."""
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client
