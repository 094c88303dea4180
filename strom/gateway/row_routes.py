"""Row routes: upserts, deletes, appends, key and prefix lookups (strom's choice of routes, in FIP-49's style).

Each runs on the gateway's cached handle of the table (:mod:`strom.gateway.tables`): its lookupers are
shared, a writer is the request's alone, and a write answers only once the cluster acknowledged its rows.
Bodies are parsed here rather than by FastAPI so that the content type decides (JSON or Arrow IPC) and
a value that does not convert is refused naming its column.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pyarrow as pa
from fastapi import APIRouter, Request, Response
from starlette.exceptions import HTTPException

from strom.client import Table
from strom.gateway.errors import LimitExceededError
from strom.gateway.options import (
    LOOKUP_MAX_KEYS,
    PREFIX_LOOKUP_MAX_PREFIXES,
    PREFIX_LOOKUP_MAX_ROWS_PER_PREFIX,
    WRITE_MAX_ROWS,
)
from strom.gateway.state import gateway_state
from strom.gateway.tables import CachedTable
from strom.gateway.values import ValueConversionError, keys_to_python, rows_to_arrow, to_json

router = APIRouter(tags=["rows"])

ARROW_STREAM = "application/vnd.apache.arrow.stream"
PREFIX_LOOKUPS_IN_FLIGHT = 32


def _body_schema(key: str) -> dict[str, Any]:
    item = {"type": "object"} if key == "rows" else {"oneOf": [{"type": "object"}, {"type": "array"}]}
    schema = {"type": "object", "required": [key], "properties": {key: {"type": "array", "items": item}}}
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if key == "rows":
        content[ARROW_STREAM] = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": content}}


_LOOKUP_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {
        **_body_schema("keys")["requestBody"]["content"],
        ARROW_STREAM: {"schema": {"type": "string", "format": "binary", "description": "the key columns"}},
    }},
    "responses": {"200": {"content": {
        "application/json": {"schema": {"type": "object", "properties": {"rows": {"type": "array"}}}},
        ARROW_STREAM: {"schema": {"type": "string", "format": "binary",
                                  "description": "the rows of the keys that exist, in key order"}},
    }}},
}

_PREFIX_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["columns", "keys"], "properties": {
        "columns": {"type": "array", "items": {"type": "string"},
                    "description": "the partition and bucket key columns the prefixes name"},
        "keys": {"type": "array", "description": "at most gateway.rest.prefix-lookup.max-prefixes (16) prefixes",
                 "items": {"oneOf": [{"type": "object"}, {"type": "array"}]}},
    },
}}}}}


@router.post("/v1/databases/{db}/tables/{name}/rows:upsert", openapi_extra=_body_schema("rows"))
async def upsert_rows(request: Request, db: str, name: str) -> dict[str, Any]:
    async def use(entry: CachedTable) -> dict[str, Any]:
        data = await _rows(request, entry.table)
        async with entry.upsert_writer() as writer:
            if data.num_rows:
                await writer.upsert_batch(data)
        return {"written": data.num_rows}

    return await gateway_state(request).on_table(request, db, name, use, idempotent=False)


@router.post("/v1/databases/{db}/tables/{name}/rows:delete", openapi_extra=_body_schema("keys"))
async def delete_rows(request: Request, db: str, name: str) -> dict[str, Any]:
    limits = gateway_state(request).limits

    async def use(entry: CachedTable) -> dict[str, Any]:
        keys = await _keys(request, entry.table)
        _at_most(len(keys), limits.write_max_rows, "keys to delete", WRITE_MAX_ROWS)
        async with entry.upsert_writer() as writer:
            for key in keys:
                writer.delete(key)
            await writer.flush()  # the writer is this request's alone: only its deletes are waited for
        return {"deleted": len(keys)}

    return await gateway_state(request).on_table(request, db, name, use, idempotent=False)


@router.post("/v1/databases/{db}/tables/{name}/rows:append", openapi_extra=_body_schema("rows"))
async def append_rows(request: Request, db: str, name: str) -> dict[str, Any]:
    async def use(entry: CachedTable) -> dict[str, Any]:
        data = await _rows(request, entry.table)
        async with entry.append_writer() as writer:
            if data.num_rows:
                await writer.write_arrow_batch(data)
        return {"written": data.num_rows}

    return await gateway_state(request).on_table(request, db, name, use, idempotent=False)


@router.post("/v1/databases/{db}/tables/{name}/lookup", openapi_extra=_LOOKUP_BODY)
async def lookup_rows(request: Request, db: str, name: str) -> Any:
    """JSON keys in, ``{"rows": [row or null, ...]}`` out, in key order. An Arrow IPC body (the key columns)
    or ``Accept: application/vnd.apache.arrow.stream`` is answered with an Arrow IPC stream: the rows of the
    keys that exist, in key order, without a Python object per row."""
    limits = gateway_state(request).limits
    arrow_answer = ARROW_STREAM in request.headers.get("accept", "")

    async def use(entry: CachedTable) -> Any:
        layout = entry.table.layout
        if _content_type(request) == ARROW_STREAM:
            keys = _key_table(await _arrow_body(request), layout)
            _at_most(keys.num_rows, limits.lookup_max_keys, "keys", LOOKUP_MAX_KEYS)
            found = await entry.lookuper().lookup_arrow(keys)
        else:
            listed = await _keys(request, entry.table)
            _at_most(len(listed), limits.lookup_max_keys, "keys", LOOKUP_MAX_KEYS)
            if not arrow_answer:
                rows = await entry.lookuper().lookup_many(listed) if listed else []
                return {"rows": [None if row is None else _row(row) for row in rows]}
            key_schema = pa.schema([layout.arrow_schema.field(column) for column in layout.primary_key])
            found = await entry.lookuper().lookup_arrow(pa.Table.from_pylist(listed, schema=key_schema))
        return Response(_ipc_stream(found), media_type=ARROW_STREAM)

    return await gateway_state(request).on_table(request, db, name, use, idempotent=True)


@router.post("/v1/databases/{db}/tables/{name}/prefix-lookup", openapi_extra=_PREFIX_BODY)
async def prefix_lookup(request: Request, db: str, name: str) -> dict[str, Any]:
    columns, keys = _fields(await _json_body(request), "columns", "keys")
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
        raise ValueConversionError("'columns' must be a non-empty array of column names")
    limits = gateway_state(request).limits
    if isinstance(keys, list):
        _at_most(len(keys), limits.prefix_lookup_max_prefixes, "prefixes", PREFIX_LOOKUP_MAX_PREFIXES)

    async def use(entry: CachedTable) -> dict[str, Any]:
        unknown = [column for column in columns if column not in entry.table.layout.column_names]
        if unknown:
            raise ValueConversionError(f"the table has no columns {unknown}")
        lookuper = entry.prefix_lookuper(columns)
        prefixes = keys_to_python(entry.table.layout.arrow_schema, columns, keys)
        in_flight = asyncio.Semaphore(PREFIX_LOOKUPS_IN_FLIGHT)

        async def one(prefix: dict[str, Any]) -> list[dict[str, Any]]:
            async with in_flight:
                found = await lookuper.lookup(prefix)
            if len(found) > limits.prefix_lookup_max_rows_per_prefix:
                raise LimitExceededError(
                    f"prefix {prefix} matches {len(found)} rows, more than one prefix answers "
                    f"({PREFIX_LOOKUP_MAX_ROWS_PER_PREFIX}={limits.prefix_lookup_max_rows_per_prefix})")
            return [_row(row) for row in found]

        return {"rows": list(await asyncio.gather(*(one(prefix) for prefix in prefixes)))}

    return await gateway_state(request).on_table(request, db, name, use, idempotent=True)


# ---- bodies ----

def _row(row: dict[str, Any]) -> dict[str, Any]:
    return {column: to_json(value) for column, value in row.items()}


async def _json_body(request: Request) -> Any:
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type not in ("application/json", ""):
        raise HTTPException(415, f"content type {content_type!r} is not supported here; send application/json")
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HTTPException(400, f"malformed JSON: {exc}") from None


def _fields(body: Any, *keys: str) -> list[Any]:
    """The values of exactly ``keys`` in a JSON object body."""
    if not isinstance(body, dict) or any(key not in body for key in keys):
        raise ValueConversionError(f"the body must be a JSON object with {', '.join(repr(k) for k in keys)}")
    extra = sorted(set(body) - set(keys))
    if extra:
        raise ValueConversionError(f"unknown fields {extra}")
    return [body[key] for key in keys]


async def _rows(request: Request, found: Table) -> pa.Table:
    """The request's rows as an Arrow table of the table's schema: JSON ``{"rows": [...]}`` or an Arrow
    IPC stream."""
    content_type = _content_type(request)
    if content_type == ARROW_STREAM:
        data = await _arrow_body(request)
        unknown = sorted(set(data.schema.names) - set(found.layout.column_names))
        if unknown:
            raise ValueConversionError(f"the table has no columns {unknown}")
        _at_most(data.num_rows, gateway_state(request).limits.write_max_rows, "rows", WRITE_MAX_ROWS)
        return data
    if content_type not in ("application/json", ""):
        raise HTTPException(415, f"content type {content_type!r} is not supported; send application/json or "
                                 f"{ARROW_STREAM}")
    (rows,) = _fields(await _json_body(request), "rows")
    if isinstance(rows, list):  # refused before converting a single value
        _at_most(len(rows), gateway_state(request).limits.write_max_rows, "rows", WRITE_MAX_ROWS)
    return rows_to_arrow(found.layout.arrow_schema, rows)


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def _arrow_body(request: Request) -> pa.Table:
    try:
        return pa.ipc.open_stream(await request.body()).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise ValueConversionError(f"the body is not an Arrow IPC stream: {exc}") from None


def _key_table(keys: pa.Table, layout: Any) -> pa.Table:
    """An Arrow body of lookup keys: exactly the primary-key columns, by name."""
    wanted = list(layout.primary_key or [])
    if not wanted:
        raise ValueConversionError(f"table {layout.info.path} has no primary key")
    if sorted(keys.schema.names) != sorted(wanted):
        raise ValueConversionError(f"the Arrow keys must have exactly the key columns {wanted}, not {keys.schema.names}")
    return keys.select(wanted)


def _ipc_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return sink.getvalue().to_pybytes()


def _at_most(count: int, limit: int, what: str, key: str) -> None:
    if count > limit:
        raise LimitExceededError(f"{count} {what} are more than one request takes ({key}={limit})")


async def _keys(request: Request, found: Table) -> list[dict[str, Any]]:
    layout = found.layout
    if not layout.primary_key:
        raise ValueConversionError(f"table {layout.info.path} has no primary key")
    (keys,) = _fields(await _json_body(request), "keys")
    return keys_to_python(layout.arrow_schema, layout.primary_key, keys)
