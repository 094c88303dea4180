"""The REST gateway (Fluss FIP-49's shape): a stateless HTTP front of a strom cluster, itself a strom client.

``create_app`` builds the FastAPI application; ``strom gateway`` serves it with uvicorn. The routes FIP-49
fixes at Fluss's HEAD (``/health``, ``/ready``, ``/v1/openapi.json``, the error envelope) follow it; the
catalog, write and lookup routes are strom's choice in the same style (docs/gateway.md lists them).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pyarrow as pa
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from strom.client import Column, Connection, DatabaseDescriptor, Schema, Table, TableDescriptor
from strom.errors import AuthenticationError, StromError
from strom.gateway.connections import GatewayConnections, basic_credentials
from strom.gateway.errors import ErrorEnvelope, classify, code_for_status, envelope, request_id
from strom.gateway.middleware import BodyTooLargeError, GatewayMiddleware
from strom.gateway.values import ValueConversionError, keys_to_python, parse_type, rows_to_arrow, to_json
from strom.ids import TablePath
from strom.records.types import data_type_to_json, type_to_string
from strom.units import parse_memory_size

log = logging.getLogger(__name__)

MAX_BODY_SIZE = "gateway.max-body-size"
MAX_USER_CONNECTIONS = "gateway.max-user-connections"
DEFAULT_MAX_BODY_SIZE = 16 * 1024 * 1024
DEFAULT_MAX_USER_CONNECTIONS = 64
ARROW_STREAM = "application/vnd.apache.arrow.stream"

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope, "description": description}
    for status, description in (
        (400, "Malformed request or invalid argument"), (401, "Wrong or missing credentials"),
        (403, "The user may not do this"), (404, "Unknown route, database, table or partition"),
        (405, "Wrong method for this route"), (409, "Already exists, or not empty"),
        (413, "Request body above the configured limit"), (415, "Unsupported content type"),
        (500, "Gateway failure"), (502, "The cluster answered an error the gateway does not map"),
        (503, "Gateway starting or stopping, or the cluster unavailable"), (504, "Request deadline exceeded"),
    )
}


# ---- request bodies ----

class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateDatabase(_Body):
    name: str = Field(min_length=1)
    ignore_if_exists: bool = False
    comment: str | None = None
    properties: dict[str, str] = Field(default_factory=dict, description="custom properties")


class ColumnSpec(_Body):
    name: str = Field(min_length=1)
    type: str | dict[str, Any] = Field(description="a Fluss type name (INT, DECIMAL(10, 2), ...) or type object")
    comment: str | None = None


class CreateTable(_Body):
    name: str = Field(min_length=1)
    columns: list[ColumnSpec] = Field(min_length=1)
    primary_key: list[str] | None = None
    partition_keys: list[str] = Field(default_factory=list)
    bucket_keys: list[str] = Field(default_factory=list)
    bucket_count: int | None = Field(default=None, ge=1)
    properties: dict[str, str] = Field(default_factory=dict, description="table options (table.*)")
    custom_properties: dict[str, str] = Field(default_factory=dict)
    comment: str | None = None
    ignore_if_exists: bool = False


class CreatePartition(_Body):
    spec: dict[str, str] = Field(description="partition column → value")
    ignore_if_exists: bool = False


def _rows_body(key: str) -> dict[str, Any]:
    item = {"type": "object"} if key == "rows" else {"oneOf": [{"type": "object"}, {"type": "array"}]}
    schema = {"type": "object", "required": [key], "properties": {key: {"type": "array", "items": item}}}
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if key == "rows":
        content[ARROW_STREAM] = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": content}}


# ---- the application ----

class GatewayState:
    def __init__(self, client_config: Mapping[str, str], max_user_connections: int) -> None:
        self.connections = GatewayConnections(client_config, max_user_connections)
        self.started_at = time.monotonic()
        self.ready = False


def _size(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, int):
        return value
    return parse_memory_size(str(value))


def create_app(bootstrap: str, client_config: Mapping[str, str] | None = None) -> FastAPI:
    """The gateway for the cluster at ``bootstrap``.

    ``client_config`` holds strom client options (``client.*``, used by every connection) and the gateway's
    own: ``gateway.max-body-size`` (default 16 MiB) and ``gateway.max-user-connections`` (default 64).
    """
    options = dict(client_config or {})
    max_body = _size(options.pop(MAX_BODY_SIZE, None), DEFAULT_MAX_BODY_SIZE)
    max_users = int(options.pop(MAX_USER_CONNECTIONS, DEFAULT_MAX_USER_CONNECTIONS))
    options["bootstrap.servers"] = bootstrap
    state = GatewayState(options, max_users)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            await state.connections.anonymous()
        except AuthenticationError:
            log.info("the cluster requires credentials: anonymous gateway requests will be refused")
        except StromError as exc:  # the cluster is not up yet: the first request tries again
            log.warning("cannot reach the cluster at %s yet: %s", bootstrap, exc)
        state.ready = True
        try:
            yield
        finally:
            state.ready = False
            await state.connections.close()

    app = FastAPI(
        title="strom gateway",
        summary="A stateless REST gateway for strom (Apache Fluss FIP-49)",
        version="1",
        openapi_url="/v1/openapi.json",
        docs_url="/v1/docs",
        redoc_url=None,
        lifespan=lifespan,
        responses=_ERRORS,
    )
    app.state.gateway = state
    app.add_middleware(GatewayMiddleware, max_body_size=max_body)
    _install_error_handlers(app)

    async def connection(request: Request) -> Connection:
        credentials = basic_credentials(request.headers.get("authorization"))
        if credentials is None:
            return await state.connections.anonymous()
        return await state.connections.for_user(*credentials)

    async def table(request: Request, db: str, name: str) -> Table:
        return await (await connection(request)).get_table(TablePath(db, name))

    # ---- health ----
    @app.get("/health", tags=["health"], summary="Liveness and uptime, always 200 while the process answers")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "uptime_ms": int((time.monotonic() - state.started_at) * 1000)}

    @app.get("/ready", tags=["health"], summary="200 while the gateway accepts traffic, 503 starting or stopping")
    async def ready(request: Request) -> Response:
        if not state.ready:
            return envelope(request_id(request), 503, "unavailable", "the gateway is starting or shutting down")
        return JSONResponse({"status": "ready"})

    # ---- databases ----
    @app.get("/v1/databases", tags=["catalog"])
    async def list_databases(request: Request) -> dict[str, Any]:
        return {"databases": await (await connection(request)).get_admin().list_databases()}

    @app.post("/v1/databases", tags=["catalog"], status_code=201)
    async def create_database(request: Request, body: CreateDatabase) -> dict[str, Any]:
        admin = (await connection(request)).get_admin()
        descriptor = DatabaseDescriptor(body.comment, body.properties)
        await admin.create_database(body.name, descriptor, ignore_if_exists=body.ignore_if_exists)
        return await _database(admin, body.name)

    @app.get("/v1/databases/{db}", tags=["catalog"])
    async def get_database(request: Request, db: str) -> dict[str, Any]:
        return await _database((await connection(request)).get_admin(), db)

    @app.delete("/v1/databases/{db}", tags=["catalog"], status_code=204)
    async def drop_database(
        request: Request, db: str, cascade: bool = Query(False), ignore_if_not_exists: bool = Query(False)
    ) -> Response:
        admin = (await connection(request)).get_admin()
        await admin.drop_database(db, ignore_if_not_exists=ignore_if_not_exists, cascade=cascade)
        return Response(status_code=204)

    # ---- tables ----
    @app.get("/v1/databases/{db}/tables", tags=["catalog"])
    async def list_tables(request: Request, db: str) -> dict[str, Any]:
        return {"tables": await (await connection(request)).get_admin().list_tables(db)}

    @app.post("/v1/databases/{db}/tables", tags=["catalog"], status_code=201)
    async def create_table(request: Request, db: str, body: CreateTable) -> dict[str, Any]:
        descriptor = _descriptor(body)
        conn = await connection(request)
        path = TablePath(db, body.name)
        await conn.get_admin().create_table(path, descriptor, ignore_if_exists=body.ignore_if_exists)
        return _table_info(await conn.get_table(path))

    @app.get("/v1/databases/{db}/tables/{name}", tags=["catalog"])
    async def get_table(request: Request, db: str, name: str) -> dict[str, Any]:
        return _table_info(await table(request, db, name))

    @app.delete("/v1/databases/{db}/tables/{name}", tags=["catalog"], status_code=204)
    async def drop_table(request: Request, db: str, name: str, ignore_if_not_exists: bool = Query(False)) -> Response:
        admin = (await connection(request)).get_admin()
        await admin.drop_table(TablePath(db, name), ignore_if_not_exists=ignore_if_not_exists)
        return Response(status_code=204)

    # ---- partitions ----
    @app.get("/v1/databases/{db}/tables/{name}/partitions", tags=["catalog"])
    async def list_partitions(request: Request, db: str, name: str) -> dict[str, Any]:
        infos = await (await connection(request)).get_admin().list_partition_infos(TablePath(db, name))
        return {"partitions": [_partition(info) for info in infos]}

    @app.post("/v1/databases/{db}/tables/{name}/partitions", tags=["catalog"], status_code=201)
    async def create_partition(request: Request, db: str, name: str, body: CreatePartition) -> dict[str, Any]:
        admin = (await connection(request)).get_admin()
        await admin.create_partition(TablePath(db, name), body.spec, ignore_if_exists=body.ignore_if_exists)
        return {"spec": body.spec}

    @app.delete("/v1/databases/{db}/tables/{name}/partitions/{partition}", tags=["catalog"], status_code=204)
    async def drop_partition(
        request: Request, db: str, name: str, partition: str, ignore_if_not_exists: bool = Query(False)
    ) -> Response:
        found = await table(request, db, name)
        keys = found.layout.partition_keys
        if not keys:
            raise ValueError(f"table {db}.{name} is not partitioned")
        values = partition.split("$")
        if len(values) != len(keys):
            raise ValueError(f"partition {partition!r} must name one value per partition key {keys}, joined by '$'")
        admin = (await connection(request)).get_admin()
        spec = dict(zip(keys, values, strict=True))
        await admin.drop_partition(found.table_path, spec, ignore_if_not_exists=ignore_if_not_exists)
        return Response(status_code=204)

    # ---- rows ----
    @app.post("/v1/databases/{db}/tables/{name}/rows:upsert", tags=["rows"], openapi_extra=_rows_body("rows"))
    async def upsert_rows(request: Request, db: str, name: str) -> dict[str, Any]:
        found = await table(request, db, name)
        data = await _rows(request, found)
        writer = found.new_upsert().create_writer()
        if data.num_rows:
            await writer.upsert_batch(data)
        return {"written": data.num_rows}

    @app.post("/v1/databases/{db}/tables/{name}/rows:delete", tags=["rows"], openapi_extra=_rows_body("keys"))
    async def delete_rows(request: Request, db: str, name: str) -> dict[str, Any]:
        found = await table(request, db, name)
        keys = await _keys(request, found)
        writer = found.new_upsert().create_writer()
        for key in keys:
            writer.delete(key)
        await writer.flush()
        return {"deleted": len(keys)}

    @app.post("/v1/databases/{db}/tables/{name}/rows:append", tags=["rows"], openapi_extra=_rows_body("rows"))
    async def append_rows(request: Request, db: str, name: str) -> dict[str, Any]:
        found = await table(request, db, name)
        data = await _rows(request, found)
        writer = found.new_append().create_writer()
        if data.num_rows:
            await writer.write_arrow_batch(data)
        return {"written": data.num_rows}

    @app.post("/v1/databases/{db}/tables/{name}/lookup", tags=["rows"], openapi_extra=_rows_body("keys"))
    async def lookup_rows(request: Request, db: str, name: str) -> dict[str, Any]:
        found = await table(request, db, name)
        keys = await _keys(request, found)
        lookuper = found.new_lookup().create_lookuper()
        rows = await lookuper.lookup_many(keys) if keys else []  # type: ignore[union-attr]
        return {"rows": [None if row is None else {k: to_json(v) for k, v in row.items()} for row in rows]}

    return app


# ---- helpers ----

def _install_error_handlers(app: FastAPI) -> None:
    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        status = exc.status_code
        if status == 404:
            message = f"no route {request.url.path}" if exc.detail == "Not Found" else str(exc.detail)
        elif status == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return envelope(request_id(request), status, code_for_status(status), message, exc.headers)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return envelope(request_id(request), 400, "invalid_argument", _validation_message(exc))

    async def on_too_large(request: Request, exc: Exception) -> Response:
        return envelope(request_id(request), 413, "limit_exceeded", str(exc), {"connection": "close"})

    async def on_error(request: Request, exc: Exception) -> Response:
        status, code = classify(exc)
        if code == "internal":
            log.exception("gateway request %s %s failed", request.method, request.url.path, exc_info=exc)
            message = f"internal error ({type(exc).__name__})"
        else:
            message = str(exc)
        headers = {"www-authenticate": 'Basic realm="strom"'} if status == 401 else None
        return envelope(request_id(request), status, code, message, headers)

    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(BodyTooLargeError, on_too_large)
    app.add_exception_handler(Exception, on_error)
    # raised by strom's client, mapped in strom.gateway.errors
    app.add_exception_handler(StromError, on_error)
    app.add_exception_handler(ValueError, on_error)


def _validation_message(exc: RequestValidationError) -> str:
    problems = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            return f"malformed JSON: {error.get('ctx', {}).get('error', error.get('msg'))}"
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        problems.append(f"{location or 'body'}: {error.get('msg')}")
    return "; ".join(problems) or "invalid request"


async def _json_body(request: Request) -> Any:
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type not in ("application/json", ""):
        raise HTTPException(415, f"content type {content_type!r} is not supported here; send application/json")
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HTTPException(400, f"malformed JSON: {exc}") from None


def _field(body: Any, key: str) -> Any:
    if not isinstance(body, dict) or key not in body:
        raise ValueConversionError(f"the body must be a JSON object with {key!r}")
    extra = sorted(set(body) - {key})
    if extra:
        raise ValueConversionError(f"unknown fields {extra}")
    return body[key]


async def _rows(request: Request, found: Table) -> pa.Table:
    """The request's rows as an Arrow table of the table's schema: JSON ``{"rows": [...]}`` or an Arrow
    IPC stream."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == ARROW_STREAM:
        raw = await request.body()
        try:
            data = pa.ipc.open_stream(raw).read_all()
        except (pa.ArrowException, OSError) as exc:
            raise ValueConversionError(f"the body is not an Arrow IPC stream: {exc}") from None
        unknown = sorted(set(data.schema.names) - set(found.layout.column_names))
        if unknown:
            raise ValueConversionError(f"the table has no columns {unknown}")
        return data
    if content_type not in ("application/json", ""):
        raise HTTPException(415, f"content type {content_type!r} is not supported; send application/json or "
                                 f"{ARROW_STREAM}")
    return rows_to_arrow(found.layout.arrow_schema, _field(await _json_body(request), "rows"))


async def _keys(request: Request, found: Table) -> list[dict[str, Any]]:
    layout = found.layout
    if not layout.primary_key:
        raise ValueConversionError(f"table {layout.info.path} has no primary key")
    return keys_to_python(layout.arrow_schema, layout.primary_key, _field(await _json_body(request), "keys"))


def _descriptor(body: CreateTable) -> TableDescriptor:
    columns = tuple(Column(c.name, parse_type(c.type), c.comment) for c in body.columns)
    schema = Schema(columns, None if body.primary_key is None else tuple(body.primary_key))
    return TableDescriptor(
        schema, tuple(body.partition_keys), tuple(body.bucket_keys), body.bucket_count, body.properties,
        body.custom_properties, body.comment,
    )


async def _database(admin: Any, name: str) -> dict[str, Any]:
    info = await admin.get_database_info(name)
    return {
        "name": name,
        "comment": info.descriptor.comment,
        "properties": dict(info.descriptor.custom_properties),
        "created_ms": info.created_time,
        "modified_ms": info.modified_time,
    }


def _table_info(found: Table) -> dict[str, Any]:
    info = found.layout.info
    descriptor = info.descriptor
    return {
        "database": info.path.database_name,
        "name": info.path.table_name,
        "table_id": info.table_id,
        "schema_id": info.schema_id,
        "columns": [
            {"name": c.name, "type": type_to_string(c.data_type), "data_type": data_type_to_json(c.data_type),
             **({"comment": c.comment} if c.comment is not None else {})}
            for c in descriptor.schema.columns
        ],
        "primary_key": None if descriptor.schema.primary_key is None else list(descriptor.schema.primary_key),
        "partition_keys": list(descriptor.partition_keys),
        "bucket_keys": list(descriptor.bucket_keys),
        "bucket_count": descriptor.bucket_count,
        "properties": dict(descriptor.properties),
        "custom_properties": dict(descriptor.custom_properties),
        "comment": descriptor.comment,
        "created_ms": info.created_ms,
        "modified_ms": info.modified_ms,
    }


def _partition(info: Any) -> dict[str, Any]:
    return {"id": info.partition_id, "name": info.partition_name, "spec": dict(info.spec)}
