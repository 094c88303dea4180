"""The gateway's own Prometheus metrics: FIP-49's families, as Apache Fluss's gateway declares them at HEAD.

* ``fluss_gateway_rest_requests_total{cluster, method, operation, code}``: completed requests; ``operation``
  is the matched route template (``/v1/databases/{db}/tables/{name}/lookup``), ``unmatched`` for a path no
  route takes, ``code`` the HTTP status, ``cluster`` ``default`` for routes that reach the cluster and
  ``none`` for those that do not (health, readiness, the OpenAPI document, the console's static files).
* ``fluss_gateway_rest_request_duration_seconds{cluster, method, operation}``: a histogram with FIP-49's
  buckets (1 ms to 60 s).
* ``process_*``: the process's CPU, memory and file descriptors (prometheus-client's process collector).

Each gateway has a registry of its own (several apps may live in one process, as in the tests). It is
served at ``GET /metrics`` of the gateway, and on a listener of its own where
``gateway.metrics.exporter.prometheus.listen`` names one.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, disable_created_metrics
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CLUSTER = "default"
"""strom's gateway fronts one cluster: Fluss's id of the default one."""
CLUSTER_FREE = ("/health", "/ready", "/metrics", "/v1/openapi.json", "/v1/docs", "/console/static")


class GatewayMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # FIP-49 declares no *_created series (and strom's server exports none)
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.requests = Counter(
            "fluss_gateway_rest_requests", "Completed REST requests: the matched route template, the HTTP status "
            "and whether it reached the cluster.", ["cluster", "method", "operation", "code"], registry=self.registry)
        self.duration = Histogram(
            "fluss_gateway_rest_request_duration_seconds", "REST request duration.", ["cluster", "method", "operation"],
            buckets=DURATION_BUCKETS, registry=self.registry)

    def observe(self, method: str, operation: str, status: int, seconds: float) -> None:
        cluster = "none" if operation.startswith(CLUSTER_FREE) or operation == "unmatched" else CLUSTER
        self.requests.labels(cluster, method, operation, str(status)).inc()
        self.duration.labels(cluster, method, operation).observe(seconds)


class MetricsMiddleware:
    """Counts and times every HTTP request by its route template (known once the router matched it)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            self.metrics.observe(scope["method"], _operation(scope), status, time.perf_counter() - started)


def _operation(scope: Scope) -> str:
    """The route template that served the request: never the raw path (its names would make the label set
    unbounded)."""
    route = scope.get("route")
    template = getattr(route, "path", None)
    if isinstance(template, str):
        return template
    root = scope.get("root_path", "")
    path = str(scope.get("path", ""))
    if path.startswith(f"{root}/console/static/"):  # a mounted app: no route object
        return "/console/static/{file}"
    return "unmatched"


__all__ = ["DURATION_BUCKETS", "GatewayMetrics", "MetricsMiddleware"]
