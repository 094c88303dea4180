"""What every route of one gateway shares (``app.state.gateway``): its cluster connections, bearer tokens,
table cache and readiness."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from starlette.requests import HTTPConnection

from strom.client import Connection, Table
from strom.gateway.connections import GatewayConnections, request_credentials
from strom.gateway.options import GatewayLimits
from strom.gateway.tables import STALE_ERRORS, CachedTable, TableCache
from strom.gateway.tokens import BearerTokens
from strom.gateway.values import ValueConversionError
from strom.ids import TablePath

T = TypeVar("T")


class GatewayState:
    def __init__(
        self, client_config: Mapping[str, str], max_user_connections: int, tokens: BearerTokens | None = None,
        tables: TableCache | None = None, limits: GatewayLimits | None = None,
    ) -> None:
        self.limits = limits if limits is not None else GatewayLimits()
        self.tables = tables if tables is not None else TableCache()
        self.connections = GatewayConnections(client_config, max_user_connections, self.tables.forget_connection)
        self.tokens = tokens if tokens is not None else BearerTokens.none()
        self.started_at = time.monotonic()
        self.ready = False

    async def connection_for(self, request: HTTPConnection) -> Connection:
        """The strom connection a request runs on: the shared one without credentials, else the user's own
        (Basic credentials, or the login a bearer token stands for).

        Raises:
            AuthenticationError: malformed or wrong credentials, or an unknown bearer token.
        """
        credentials = request_credentials(request.headers.get("authorization"), self.tokens)
        if credentials is None:
            return await self.connections.anonymous()
        return await self.connections.for_user(*credentials)

    async def table_for(self, request: HTTPConnection, db: str, name: str) -> Table:
        """The request's (cached) handle on a table. Raises TableNotExistError."""
        entry, _checked = await self.tables.get(await self.connection_for(request), TablePath(db, name))
        return entry.table

    async def on_table(
        self, request: HTTPConnection, db: str, name: str, use: Callable[[CachedTable], Awaitable[T]], *,
        idempotent: bool,
    ) -> T:
        """``use`` the request's cached entry of a table, and once more on a fresh one where the cached one
        was stale: when ``use`` fails converting the body (a column added since: nothing was sent yet), or
        when it is ``idempotent`` (a read) and fails with a stale handle's error. A write that failed so is
        not sent again (part of it may be written); its entry is dropped and the error answered."""
        connection = await self.connection_for(request)
        path = TablePath(db, name)
        entry, checked = await self.tables.get(connection, path)
        try:
            return await use(entry)
        except ValueConversionError:
            if checked:
                raise
            fresh, _ = await self.tables.get(connection, path, refresh=True)
            if fresh is entry:
                raise
        except STALE_ERRORS:
            self.tables.invalidate(path)
            if checked or not idempotent:
                raise
            fresh, _ = await self.tables.get(connection, path)
        return await use(fresh)


def gateway_state(request: HTTPConnection) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state
