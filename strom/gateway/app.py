"""The REST gateway (Fluss FIP-49's shape): a stateless HTTP front of a strom cluster, itself a strom client.

``create_app`` builds the FastAPI application; ``strom gateway`` serves it with uvicorn. The routes FIP-49
fixes at Fluss's HEAD (``/health``, ``/ready``, ``/v1/openapi.json``, the error envelope) follow it; the
catalog, row and log routes (``catalog_routes``, ``row_routes``, ``log_routes``) are strom's choice in the
same style (docs/gateway.md lists them). What the routes share is the :class:`GatewayState` on
``app.state.gateway``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest, start_http_server
from starlette.exceptions import HTTPException

from strom.errors import AuthenticationError, StromError
from strom.gateway import catalog_routes, log_routes, row_routes
from strom.gateway.console import CONSOLE_KEYS, Console, install_console
from strom.gateway.errors import ErrorEnvelope, classify, code_for_status, envelope, request_id
from strom.gateway.metrics import GatewayMetrics, MetricsMiddleware
from strom.gateway.middleware import BodyTooLargeError, GatewayMiddleware
from strom.gateway.options import take_gateway_options
from strom.gateway.state import GatewayState
from strom.gateway.tables import TableCache
from strom.gateway.tokens import BearerTokenError, BearerTokens

log = logging.getLogger(__name__)


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope, "description": description}
    for status, description in (
        (400, "Malformed request or invalid argument"), (401, "Wrong or missing credentials"),
        (403, "The user may not do this"), (404, "Unknown route, database, table, schema or partition"),
        (405, "Wrong method for this route"), (409, "Already exists, or not empty"),
        (413, "Request body above the configured limit"), (415, "Unsupported content type"),
        (500, "Gateway failure"), (502, "The cluster answered an error the gateway does not map"),
        (503, "Gateway starting or stopping, or the cluster unavailable"), (504, "Request deadline exceeded"),
    )
}

__all__ = ["GatewayState", "create_app"]


def create_app(bootstrap: str, client_config: Mapping[str, str] | None = None) -> FastAPI:
    """The gateway for the cluster at ``bootstrap``.

    ``client_config`` holds strom client options (``client.*``, used by every connection) and the gateway's
    own (:mod:`strom.gateway.options`: Fluss's ``gateway.rest.*`` limits, the user connections, bearer
    tokens, the table cache) and the console's ``gateway.console.*`` (:mod:`strom.gateway.console`).

    Raises:
        ValueError: a gateway option that does not parse, or a malformed token file (TokenFileError).
    """
    options = dict(client_config or {})
    gateway = take_gateway_options(options)
    tokens = BearerTokens.load(gateway.token_file) if gateway.token_file else BearerTokens.none()
    console_options = {key: options.pop(key) for key in CONSOLE_KEYS if key in options}
    options["bootstrap.servers"] = bootstrap
    state = GatewayState(options, gateway.max_user_connections, tokens,
                         TableCache(gateway.table_cache_size, gateway.table_cache_ttl_s), gateway.limits)
    metrics = GatewayMetrics() if gateway.metrics_enabled else None
    console = Console(bootstrap, console_options, None if metrics is None else metrics.registry)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            await state.connections.anonymous()
        except AuthenticationError:
            log.info("the cluster requires credentials: anonymous gateway requests will be refused")
        except StromError as exc:  # the cluster is not up yet: the first request tries again
            log.warning("cannot reach the cluster at %s yet: %s", bootstrap, exc)
        listener = None
        if metrics is not None and gateway.metrics_listen is not None:
            host, port = gateway.metrics_listen
            listener, _thread = start_http_server(port, host, registry=metrics.registry)
        console.metrics.start()
        state.ready = True
        try:
            yield
        finally:
            state.ready = False
            await console.metrics.stop()
            if listener is not None:
                listener.shutdown()
                listener.server_close()
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
    app.add_middleware(GatewayMiddleware, max_body_size=gateway.limits.max_request_bytes)
    if metrics is not None:
        app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: refused bodies are counted too

        @app.get("/metrics", include_in_schema=False)
        async def prometheus_metrics() -> Response:
            return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
    _install_error_handlers(app)

    @app.get("/health", tags=["health"], summary="Liveness and uptime, always 200 while the process answers")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "uptime_ms": int((time.monotonic() - state.started_at) * 1000)}

    @app.get("/ready", tags=["health"], summary="200 while the gateway accepts traffic, 503 starting or stopping")
    async def ready(request: Request) -> Response:
        if not state.ready:
            return envelope(request_id(request), 503, "unavailable", "the gateway is starting or shutting down")
        return JSONResponse({"status": "ready"})

    for module in (catalog_routes, row_routes, log_routes):
        app.include_router(module.router)
    install_console(app, console, state.connection_for)
    return app


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
        headers = {"www-authenticate": _challenge(request, exc)} if status == 401 else None
        return envelope(request_id(request), status, code, message, headers)

    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(BodyTooLargeError, on_too_large)
    app.add_exception_handler(Exception, on_error)
    # raised by strom's client, mapped in strom.gateway.errors
    app.add_exception_handler(StromError, on_error)
    app.add_exception_handler(ValueError, on_error)


def _challenge(request: Request, exc: Exception) -> str:
    """``WWW-Authenticate`` of a 401: Bearer for a request that brought a token (RFC 6750), else Basic (and
    Bearer too where the gateway takes tokens)."""
    if request.headers.get("authorization", "").partition(" ")[0].lower() == "bearer":
        return 'Bearer realm="strom", error="invalid_token"' if isinstance(exc, BearerTokenError) else 'Bearer realm="strom"'
    state: GatewayState = request.app.state.gateway
    return 'Basic realm="strom", Bearer realm="strom"' if state.tokens.enabled else 'Basic realm="strom"'


def _validation_message(exc: RequestValidationError) -> str:
    problems = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            return f"malformed JSON: {error.get('ctx', {}).get('error', error.get('msg'))}"
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        problems.append(f"{location or 'body'}: {error.get('msg')}")
    return "; ".join(problems) or "invalid request"
