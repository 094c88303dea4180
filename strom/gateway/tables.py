"""Table handles kept between requests, per (connection, table): the Table, its lookupers, idle writers.

Without them every row request opened the table (a metadata request) and built a new writer, whose first
write asked the cluster for a writer id (an InitWriter request), before doing its own work.

A writer is never shared by requests running at once. Its chunks are pipelined under one writer id, so a
batch that fails for good leaves later batches of the same bucket out of order (they would fail with
another request's cause), and ``flush`` waits for, and raises the errors of, everything the writer sent.
So a request checks out an idle writer (or makes one) and has it alone; the writer goes back to the idle
list only when the request's rows were all acknowledged. A failed request's writer is dropped: the next
request starts afresh under a new writer id. Lookupers hold no per-request state and are shared.

An entry is used without asking the cluster while the connection's own metadata names the same table
(id, schema, modification time) and it was checked against the cluster within ``ttl_s``; changes made
through the gateway invalidate it at once (:meth:`TableCache.invalidate`), and a request that fails because
the handle is stale (:data:`STALE_ERRORS`) drops it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar

from strom.client import Connection, Table
from strom.client.lookup import Lookuper, PrefixLookuper
from strom.client.writer import AppendWriter, UpsertWriter
from strom.errors import SchemaNotExistError, TableNotExistError, UnknownTableOrBucketError
from strom.ids import TablePath
from strom.metadata.table_info import TableInfo

DEFAULT_MAX_TABLES = 256
DEFAULT_TTL_S = 5.0
IDLE_WRITERS_MAX = 8
"""Idle writers kept per table and kind: as many as requests commonly write it at once."""
WRITER_IDLE_MAX_S = 300.0
"""An idle writer older than this is dropped, well before a server forgets its writer id
(``server.writer-id.expiration-time``, 7 days by default), after which its next sequence would be refused
as out of order."""
PREFIX_LOOKUPERS_MAX = 8

STALE_ERRORS = (TableNotExistError, SchemaNotExistError, UnknownTableOrBucketError)
"""What a request on a handle of a dropped, re-created or altered table fails with."""

_W = TypeVar("_W", UpsertWriter, AppendWriter)


def _same(a: TableInfo, b: TableInfo) -> bool:
    return (a.table_id, a.schema_id, a.modified_ms) == (b.table_id, b.schema_id, b.modified_ms)


class CachedTable:
    """One table as one connection sees it, and what requests on it reuse."""

    def __init__(self, table: Table, now: float) -> None:
        self.table = table
        self.validated_at = now
        self.live = True
        """False once invalidated or evicted: writers checked out of it are not kept."""
        self._lookuper: Lookuper | None = None
        self._prefix_lookupers: dict[tuple[str, ...], PrefixLookuper] = {}
        self._idle_upserts: list[tuple[float, UpsertWriter]] = []
        self._idle_appends: list[tuple[float, AppendWriter]] = []

    @property
    def info(self) -> TableInfo:
        return self.table.table_info

    def lookuper(self) -> Lookuper:
        """Raises ValueError for a table without a primary key."""
        if self._lookuper is None:
            lookuper = self.table.new_lookup().create_lookuper()
            assert isinstance(lookuper, Lookuper)
            self._lookuper = lookuper
        return self._lookuper

    def prefix_lookuper(self, columns: Sequence[str]) -> PrefixLookuper:
        """Raises ValueError unless ``columns`` are the table's partition and bucket key columns."""
        key = tuple(columns)
        found = self._prefix_lookupers.get(key)
        if found is None:
            made = self.table.new_lookup().lookup_by(columns).create_lookuper()
            assert isinstance(made, PrefixLookuper)
            found = made
            if len(self._prefix_lookupers) < PREFIX_LOOKUPERS_MAX:
                self._prefix_lookupers[key] = found
        return found

    def upsert_writer(self) -> AbstractAsyncContextManager[UpsertWriter]:
        """``async with entry.upsert_writer() as writer``: a writer this request has alone."""
        return _checkout(self, self._idle_upserts, lambda: self.table.new_upsert().create_writer())

    def append_writer(self) -> AbstractAsyncContextManager[AppendWriter]:
        return _checkout(self, self._idle_appends, lambda: self.table.new_append().create_writer())


@asynccontextmanager
async def _checkout(entry: CachedTable, idle: list[tuple[float, _W]], make: Callable[[], _W]) -> AsyncIterator[_W]:
    now = time.monotonic()
    writer: _W | None = None
    while idle and writer is None:
        returned, candidate = idle.pop()
        if now - returned <= WRITER_IDLE_MAX_S:
            writer = candidate
    if writer is None:
        writer = make()
    yield writer  # a request that raised does not come back here: its writer is dropped
    if entry.live and len(idle) < IDLE_WRITERS_MAX:
        idle.append((time.monotonic(), writer))


class TableCache:
    """A bounded LRU of :class:`CachedTable` by (connection, table path)."""

    def __init__(self, max_tables: int = DEFAULT_MAX_TABLES, ttl_s: float = DEFAULT_TTL_S) -> None:
        """``max_tables`` 0 turns the cache off: every request opens the table and new writers, as before."""
        self._max_tables = max(0, max_tables)
        self._ttl_s = ttl_s
        self._entries: OrderedDict[tuple[Connection, TablePath], CachedTable] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, connection: Connection, path: TablePath, *, refresh: bool = False) -> tuple[CachedTable, bool]:
        """The table's entry, and whether it was checked against the cluster for this call (then a stale
        handle is not the cause of a failure). Raises TableNotExistError."""
        key = (connection, path)
        entry = self._entries.get(key)
        if (
            entry is not None and not refresh and time.monotonic() - entry.validated_at <= self._ttl_s
            and _same(await connection.metadata.table(path), entry.info)  # no request: the connection's own view
        ):
            self._entries.move_to_end(key)
            return entry, False
        try:
            table = await connection.get_table(path)
        except TableNotExistError:
            self._drop(key)
            raise
        return self.observe(connection, table), True

    def observe(self, connection: Connection, table: Table) -> CachedTable:
        """Keep ``table``, fresh from the cluster: the entry stays (writers and all) if it names the same
        table, or is replaced."""
        key = (connection, table.table_path)
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and _same(entry.info, table.table_info):
            entry.validated_at = now
        else:
            self._drop(key)
            entry = CachedTable(table, now)
            if not self._max_tables:
                entry.live = False
                return entry
            self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_tables:
            _key, evicted = self._entries.popitem(last=False)
            evicted.live = False
        return entry

    def invalidate(self, path: TablePath | None = None, *, database: str | None = None) -> None:
        """Forget ``path`` (or every table of ``database``) for every connection: changed through the
        gateway, or found stale."""
        for key in [k for k in self._entries if k[1] == path or k[1].database_name == database]:
            self._drop(key)

    def forget_connection(self, connection: Connection) -> None:
        for key in [k for k in self._entries if k[0] is connection]:
            self._drop(key)

    def _drop(self, key: tuple[Connection, TablePath]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.live = False
