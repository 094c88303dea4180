"""The operator's console's routes: server-rendered pages under ``/console`` of the gateway.

Pages are Jinja2 templates filled from :mod:`strom.gateway.console.views` (cluster RPCs through the request's
own connection, so ACLs apply) and charted from :mod:`strom.gateway.console.metrics` (the servers' Prometheus
endpoints, scraped by the gateway). No JavaScript and no build step: charts are inline SVG, pages refresh
with a ``<meta>`` tag (``?refresh=N`` seconds, ``0`` to stop).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from prometheus_client import CollectorRegistry

from strom.client import Connection
from strom.errors import AuthenticationError, AuthorizationError, StromError, TableNotExistError
from strom.gateway.connections import basic_credentials
from strom.gateway.console import views
from strom.gateway.console.charts import line_chart
from strom.gateway.console.metrics import (
    DEFAULT_HISTORY_S,
    DEFAULT_INTERVAL_S,
    ENDPOINTS,
    HISTORY,
    INTERVAL,
    MetricsHistory,
    Point,
    parse_endpoints,
)
from strom.ids import TablePath
from strom.records.types import type_to_string
from strom.rpc.auth import Principal
from strom.security.acl import (
    AclBinding,
    AclFilter,
    OperationType,
    Resource,
    ResourceType,
    parse_operation,
    parse_resource_type,
)
from strom.units import parse_duration

log = logging.getLogger(__name__)

PREFIX = "/console"
REFRESH = "gateway.console.refresh"
DEFAULT_REFRESH_S = 10
CONSOLE_KEYS = (ENDPOINTS, INTERVAL, HISTORY, REFRESH)
NAV = (("/", "Overview"), ("/tables", "Tables"), ("/tiering", "Tiering"), ("/snapshots", "Snapshots & leases"),
       ("/remote-log", "Remote log"), ("/rebalance", "Rebalance"), ("/configs", "Configuration"), ("/acls", "ACLs"),
       ("/metrics", "Metrics"))
WRITE_APIS = ("PUT_KV", "PRODUCE_LOG")
READ_APIS = ("LOOKUP", "PREFIX_LOOKUP", "SCAN_KV", "LIMIT_SCAN")
_HERE = Path(__file__).parent

ConnectionFor = Callable[[Request], Awaitable[Connection]]


class Console:
    """The console's state: its templates and the metrics history."""

    def __init__(self, bootstrap: str, options: Mapping[str, str], gateway_registry: CollectorRegistry | None = None
                 ) -> None:
        """``gateway_registry``: the gateway's own metrics, charted beside the servers'."""
        self.bootstrap = bootstrap
        self.refresh_s = int(parse_duration(options.get(REFRESH, f"{DEFAULT_REFRESH_S}s")).total_seconds())
        interval = parse_duration(options.get(INTERVAL, f"{DEFAULT_INTERVAL_S:g}s")).total_seconds()
        history = parse_duration(options.get(HISTORY, f"{DEFAULT_HISTORY_S:g}s")).total_seconds()
        self.metrics = MetricsHistory(parse_endpoints(options.get(ENDPOINTS)), interval, history, gateway_registry)
        self.templates = Environment(loader=FileSystemLoader(_HERE / "templates"),
                                     autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
        self.templates.globals.update(type_name=type_to_string, size=_size, when=_when, duration=_duration)

    def charts(self, *specs: tuple[str, str, dict[str, Any]], servers: bool = True) -> list[Markup] | None:
        """Charts of (title, unit, lines): of the servers' metrics (None when no endpoint of theirs is
        configured), or of the gateway's own (``servers=False``; None when its metrics are off)."""
        if not (self.metrics.endpoints if servers else self.metrics.enabled):
            return None
        return [line_chart(lines, title, unit, chart_id=_slug(title)) for title, unit, lines in specs]

    def traffic_charts(self) -> list[Markup] | None:
        by_api = self.metrics.rate("strom_rpc_api_requests_total", group_by="api")
        return self.charts(
            ("Write requests per second", "/s", {api: by_api[api] for api in WRITE_APIS if api in by_api}),
            ("Lookup and scan requests per second", "/s", {api: by_api[api] for api in READ_APIS if api in by_api}),
            ("Log fetches per second (clients and followers)", "/s",
             {api: by_api[api] for api in ("FETCH_LOG",) if api in by_api}),
        )

    def tiering_charts(self) -> list[Markup] | None:
        return self.charts(
            ("Tiering lag: since the last round (seconds)", "s",
             self.metrics.gauge("strom_lake_tiering_lag_seconds", group_by="table")),
            ("Tiering data lag: since the newest record in the lake (seconds)", "s",
             self.metrics.gauge("strom_lake_tiering_data_lag_seconds", group_by="table")),
        )

    def gateway_charts(self) -> list[Markup] | None:
        requests = self.metrics.rate("fluss_gateway_rest_requests_total", group_by="operation")
        sums = self.metrics.rate("fluss_gateway_rest_request_duration_seconds_sum", group_by="operation")
        counts = self.metrics.rate("fluss_gateway_rest_request_duration_seconds_count", group_by="operation")
        busiest = sorted(requests, key=lambda op: -sum(p.value for p in requests[op]))[:6]
        return self.charts(
            ("This gateway's requests per second, by route", "/s", {op: requests[op] for op in busiest}),
            ("This gateway's mean request time, by route (seconds)", "s",
             {op: _ratio(sums.get(op, []), counts.get(op, [])) for op in busiest}),
            servers=False,
        )

    def all_charts(self) -> list[Markup] | None:
        traffic = self.traffic_charts() or []
        tiering = self.tiering_charts() or []
        gateway = self.gateway_charts() or []
        more = self.charts(
            ("KV write back-pressure (0 to 1)", "", self.metrics.gauge("strom_kv_backpressure_pressure", group_by="table")),
            ("Row cache hits and misses per second", "/s", {
                **self.metrics.rate("strom_kv_row_cache_hits_total"), **self.metrics.rate("strom_kv_row_cache_misses_total")}),
            ("Remote log lag (offsets)", "", self.metrics.gauge("strom_remote_log_lag_offsets", group_by="table")),
            ("Standby lag (records)", "", self.metrics.gauge("strom_kv_standby_lag_records", group_by="table")),
            ("Open buckets", "", self.metrics.gauge("strom_open_buckets")),
        ) or []
        return None if not self.metrics.enabled else traffic + tiering + more + gateway

    def render(self, request: Request, template: str, title: str, current: str, notes: list[str] | None = None,
               status: int = 200, refresh: bool = True, headers: Mapping[str, str] | None = None,
               **context: Any) -> HTMLResponse:
        latest = self.metrics.latest
        page = self.templates.get_template(template).render(
            title=title, prefix=PREFIX, nav=NAV, current=current, page=template.removesuffix(".html"),
            notes=notes or [], user=_user(request), bootstrap=self.bootstrap, refresh=_refresh(request, self.refresh_s)
            if refresh else 0, rendered_at=datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
            metrics_failed=[f"{url} ({why})" for url, why in latest.failed.items()] if latest else [],
            endpoints_configured=bool(self.metrics.endpoints),
            **context,
        )
        return HTMLResponse(page, status_code=status, headers=dict(headers or {}))


def install_console(app: FastAPI, console: Console, connection_for: ConnectionFor) -> None:
    """Serve ``console`` under ``/console`` of ``app``; the caller starts and stops ``console.metrics``."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)

    async def page(request: Request, current: str, title: str, build: Callable[[Connection], Awaitable[Response]]
                   ) -> Response:
        try:
            return await build(await connection_for(request))
        except AuthenticationError as exc:
            return console.render(request, "error.html", "Sign in", current, status=401, refresh=False,
                                  headers={"www-authenticate": 'Basic realm="strom"'}, message=str(exc))
        except AuthorizationError as exc:
            return console.render(request, "error.html", title, current, status=403, refresh=False, message=str(exc))
        except (TableNotExistError, KeyError) as exc:
            return console.render(request, "error.html", title, current, status=404, refresh=False,
                                  message=str(exc).strip("'\""))
        except StromError as exc:
            log.info("console page %s: %s", request.url.path, exc)
            return console.render(request, "error.html", title, current, status=503,
                                  message=f"The cluster did not answer: {type(exc).__name__}: {exc}")

    @router.get("", response_class=RedirectResponse)
    async def root() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/")

    @router.get("/", response_class=HTMLResponse)
    async def overview(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            view = await views.overview(connection)
            return console.render(request, "overview.html", "Cluster overview", "/", view.notes, view=view,
                                  charts=console.traffic_charts())
        return await page(request, "/", "Cluster overview", build)

    @router.get("/tables", response_class=HTMLResponse)
    async def tables(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            notes: list[str] = []
            found = await views.all_tables(connection, notes)
            return console.render(request, "tables.html", "Tables", "/tables", notes, tables=found)
        return await page(request, "/tables", "Tables", build)

    @router.get("/tables/{db}/{name}", response_class=HTMLResponse)
    async def table(request: Request, db: str, name: str, partition: str | None = None) -> Response:
        path = TablePath(db, name)

        async def build(connection: Connection) -> Response:
            view = await views.table_page(connection, path, partition)
            return console.render(request, "table_detail.html", f"Table {path}", "/tables", view.notes, view=view)
        return await page(request, "/tables", f"Table {path}", build)

    @router.get("/tiering", response_class=HTMLResponse)
    async def tiering(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            view = await views.tiering_page(connection)
            return console.render(request, "tiering.html", "Lake tiering", "/tiering", view.notes, view=view,
                                  charts=console.tiering_charts())
        return await page(request, "/tiering", "Lake tiering", build)

    @router.get("/snapshots", response_class=HTMLResponse)
    async def snapshots(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            view = await views.snapshots_page(connection)
            return console.render(request, "snapshots.html", "KV snapshots and leases", "/snapshots", view.notes,
                                  view=view)
        return await page(request, "/snapshots", "KV snapshots and leases", build)

    @router.get("/remote-log", response_class=HTMLResponse)
    async def remote_log(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            view = await views.remote_log_page(connection)
            charts = console.charts(("Remote log lag (offsets)", "",
                                     console.metrics.gauge("strom_remote_log_lag_offsets", group_by="table")))
            return console.render(request, "remote_log.html", "Remote log", "/remote-log", view.notes, view=view,
                                  charts=charts)
        return await page(request, "/remote-log", "Remote log", build)

    @router.get("/rebalance", response_class=HTMLResponse)
    async def rebalance(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            progress, nodes, notes = await views.rebalance_page(connection)
            return console.render(request, "rebalance.html", "Rebalance", "/rebalance", notes, progress=progress,
                                  nodes=nodes)
        return await page(request, "/rebalance", "Rebalance", build)

    @router.get("/configs", response_class=HTMLResponse)
    async def configs(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            entries, notes = await views.configs_page(connection)
            return console.render(request, "configs.html", "Cluster configuration", "/configs", notes,
                                  entries=entries)
        return await page(request, "/configs", "Cluster configuration", build)

    async def acl_page(request: Request, connection: Connection, message: str = "", kind: str = "",
                       status: int = 200) -> Response:
        bindings, notes = await views.acls_page(connection)
        return console.render(
            request, "acls.html", "ACLs", "/acls", notes, status=status, refresh=False, bindings=bindings,
            message=message, message_kind=kind,
            resource_types=[t.name for t in ResourceType if t is not ResourceType.ANY],
            operations=[o.name for o in OperationType if o is not OperationType.ANY],
        )

    @router.get("/acls", response_class=HTMLResponse)
    async def acls(request: Request) -> Response:
        return await page(request, "/acls", "ACLs", lambda connection: acl_page(request, connection))

    @router.post("/acls", response_class=HTMLResponse)
    async def add_acl(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            refused = _cross_site(request)
            if refused:
                return await acl_page(request, connection, refused, "", 403)
            form = await _form(request)
            try:
                binding = AclBinding(_acl_resource(form), Principal.parse(form.get("principal", "")),
                                     form.get("host") or "*", parse_operation(form.get("operation", "")))
                binding.validate()
            except ValueError as exc:
                return await acl_page(request, connection, f"Not added: {exc}", "", 400)
            try:
                await connection.get_admin().create_acls([binding])
            except AuthorizationError as exc:
                return await acl_page(request, connection, f"Not added: {exc}", "", 403)
            return await acl_page(request, connection, f"Added {binding.principal} {binding.operation.name} on "
                                                       f"{binding.resource.type.name} {binding.resource.name}.", "ok")
        return await page(request, "/acls", "ACLs", build)

    @router.post("/acls/remove", response_class=HTMLResponse)
    async def remove_acl(request: Request) -> Response:
        async def build(connection: Connection) -> Response:
            refused = _cross_site(request)
            if refused:
                return await acl_page(request, connection, refused, "", 403)
            form = await _form(request)
            try:
                resource = _acl_resource(form)
                selector = AclFilter(resource.type, resource.name, Principal.parse(form.get("principal", "")),
                                     form.get("host") or "*", parse_operation(form.get("operation", "")))
            except ValueError as exc:
                return await acl_page(request, connection, f"Not removed: {exc}", "", 400)
            try:
                removed = (await connection.get_admin().drop_acls([selector]))[0]
            except AuthorizationError as exc:
                return await acl_page(request, connection, f"Not removed: {exc}", "", 403)
            return await acl_page(request, connection, f"Removed {len(removed)} ACL entries.", "ok")
        return await page(request, "/acls", "ACLs", build)

    @router.get("/metrics", response_class=HTMLResponse)
    async def metrics(request: Request) -> Response:
        return console.render(request, "metrics.html", "Metrics", "/metrics", charts=console.all_charts(),
                              endpoints=console.metrics.endpoints, interval=console.metrics.interval_s)

    app.include_router(router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=_HERE / "static"), name="console-static")


# ---- helpers ----

def _user(request: Request) -> str | None:
    try:
        credentials = basic_credentials(request.headers.get("authorization"))
    except AuthenticationError:
        return None
    return credentials[0] if credentials else None


def _refresh(request: Request, default: int) -> int:
    raw = request.query_params.get("refresh")
    if raw is None:
        return default
    try:
        return max(0, min(3600, int(raw)))
    except ValueError:
        return default


def _cross_site(request: Request) -> str:
    """A form post from another site is refused: the browser would send the user's Basic credentials along
    (cross-site request forgery). Browsers send ``Origin`` on posts; ``Referer`` is the fallback."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source:
        return ""
    found = urlsplit(source).netloc
    if found and found != request.headers.get("host"):
        return f"Refused: the form came from {found}, not from this gateway."
    return ""


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form, parsed without python-multipart (a dependency only this needs)."""
    body = (await request.body()).decode("utf-8", "replace")
    return {key: values[-1].strip() for key, values in parse_qs(body, keep_blank_values=True).items()}


def _acl_resource(form: Mapping[str, str]) -> Resource:
    kind = parse_resource_type(form.get("resource_type", ""))
    if kind is ResourceType.CLUSTER:
        return Resource.cluster()
    name = form.get("resource_name", "")
    if not name:
        raise ValueError(f"a {kind.name} ACL needs a resource name")
    return Resource(kind, name)


def _ratio(numerators: list[Point], denominators: list[Point]) -> list[Point]:
    """Pointwise numerator / denominator (times aligned: both come from the same scrapes), where the
    denominator is not zero."""
    by_time = {p.at: p.value for p in denominators}
    return [Point(p.at, p.value / by_time[p.at]) for p in numerators if by_time.get(p.at)]


def _slug(title: str) -> str:
    return "chart-" + "".join(c if c.isalnum() else "-" for c in title.lower().split(":")[0]).strip("-")


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - the loop returns


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = ["CONSOLE_KEYS", "PREFIX", "Console", "install_console"]
