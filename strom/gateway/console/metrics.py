"""The console's memory of the cluster's Prometheus metrics: a few minutes of samples, so pages can chart
rates and lags over time without a Prometheus server.

strom processes serve their metrics on ``metrics.reporter.prometheus.port`` (one endpoint per process of a
cluster). The gateway is told which endpoints to scrape (``gateway.console.metrics-endpoints``), scrapes
them every ``gateway.console.metrics-interval`` and keeps ``gateway.console.metrics-history`` of samples
per series, summed over the endpoints. Counters are charted as per-second rates between two scrapes. The
gateway's own ``fluss_gateway_*`` families are sampled from its registry at the same times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

ENDPOINTS = "gateway.console.metrics-endpoints"
INTERVAL = "gateway.console.metrics-interval"
HISTORY = "gateway.console.metrics-history"
DEFAULT_INTERVAL_S = 5.0
LOCAL_PREFIX = "fluss_gateway_"
DEFAULT_HISTORY_S = 1800.0
SCRAPE_TIMEOUT_S = 5.0

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
"""A sample's name and its labels (sorted), the ``instance`` label excluded: series are summed over endpoints."""


@dataclass(slots=True)
class Scrape:
    """One round over every endpoint: the summed value of each series, and which endpoints answered."""

    at: float
    values: dict[SeriesKey, float]
    reached: int
    failed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Point:
    at: float
    value: float


class MetricsHistory:
    """Scrapes ``endpoints`` (``host:port`` or URLs) on a task of its own; bounded by ``history_s``."""

    def __init__(self, endpoints: Sequence[str], interval_s: float = DEFAULT_INTERVAL_S,
                 history_s: float = DEFAULT_HISTORY_S, local: CollectorRegistry | None = None) -> None:
        self.endpoints = [_url(e) for e in endpoints if e.strip()]
        self._local = local
        self.interval_s = max(0.2, interval_s)
        self._scrapes: deque[Scrape] = deque(maxlen=max(2, int(history_s / self.interval_s) + 1))
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints) or self._local is not None

    @property
    def latest(self) -> Scrape | None:
        return self._scrapes[-1] if self._scrapes else None

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._client = httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S)
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.scrape_once()
            except Exception:  # a bug here must not end the console's charts for good
                log.exception("scraping the metrics endpoints failed")
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def scrape_once(self) -> Scrape:
        """Scrape every endpoint now and remember the round."""
        client = self._client or httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S)
        try:
            answers = await asyncio.gather(*(client.get(url) for url in self.endpoints), return_exceptions=True)
        finally:
            if client is not self._client:
                await client.aclose()
        values: dict[SeriesKey, float] = {}
        scrape = Scrape(time.time(), values, 0)
        for url, answer in zip(self.endpoints, answers, strict=True):
            if isinstance(answer, BaseException):
                scrape.failed[url] = f"{type(answer).__name__}: {answer}"
                continue
            if answer.status_code != 200:
                scrape.failed[url] = f"HTTP {answer.status_code}"
                continue
            scrape.reached += 1
            for family in text_string_to_metric_families(answer.text):
                for sample in family.samples:
                    labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "instance"))
                    key = (sample.name, labels)
                    values[key] = values.get(key, 0.0) + float(sample.value)
        if self._local is not None:
            for family in self._local.collect():
                if family.name.startswith(LOCAL_PREFIX):
                    for sample in family.samples:
                        values[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
        self._scrapes.append(scrape)
        return scrape

    def gauge(self, name: str, group_by: str | None = None, **match: str) -> dict[str, list[Point]]:
        """Over time, the sum of ``name``'s series whose labels include ``match``, one line per value of the
        ``group_by`` label (one line, keyed ``name``, without it)."""
        lines: dict[str, list[Point]] = {}
        for scrape in self._scrapes:
            for line, value in _grouped(scrape.values, name, group_by, match).items():
                lines.setdefault(line, []).append(Point(scrape.at, value))
        return lines

    def rate(self, name: str, group_by: str | None = None, **match: str) -> dict[str, list[Point]]:
        """Per-second increase of the counter ``name`` between consecutive scrapes (a counter that went
        down, a restarted process, counts from zero)."""
        lines: dict[str, list[Point]] = {}
        previous: dict[str, float] | None = None
        previous_at = 0.0
        for scrape in self._scrapes:
            current = _grouped(scrape.values, name, group_by, match)
            if previous is not None and scrape.at > previous_at:
                for line, value in current.items():
                    before = previous.get(line, 0.0)
                    increase = value - before if value >= before else value
                    lines.setdefault(line, []).append(Point(scrape.at, increase / (scrape.at - previous_at)))
            previous, previous_at = current, scrape.at
        return lines


def _grouped(values: dict[SeriesKey, float], name: str, group_by: str | None,
             match: dict[str, str]) -> dict[str, float]:
    grouped: dict[str, float] = {}
    for (sample, labels), value in values.items():
        if sample != name:
            continue
        label_map = dict(labels)
        if any(label_map.get(k) != v for k, v in match.items()):
            continue
        line = label_map.get(group_by, "") if group_by else name
        grouped[line] = grouped.get(line, 0.0) + value
    return grouped


def _url(endpoint: str) -> str:
    endpoint = endpoint.strip()
    if "://" not in endpoint:
        endpoint = f"http://{endpoint}"
    return endpoint if endpoint.rstrip("/").endswith("/metrics") else endpoint.rstrip("/") + "/metrics"


def parse_endpoints(text: str | Iterable[str] | None) -> list[str]:
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip() for item in items if item.strip()]


__all__ = ["ENDPOINTS", "HISTORY", "INTERVAL", "MetricsHistory", "Point", "Scrape", "parse_endpoints"]
