"""The gateway's own options, named as Apache Fluss's gateway names them where it has the same option
(``fluss-gateway``'s configuration at Fluss's HEAD), with its defaults.

They come as ``-D KEY=VALUE`` of ``strom gateway`` (or the mapping given to ``create_app``), beside
``client.*`` options for the gateway's cluster connections; :func:`take_gateway_options` takes them out of
that mapping. strom's names from before Fluss decided its own are still accepted (each logged once as
deprecated), so existing command lines keep working.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import TypeVar

from strom.units import parse_duration, parse_memory_size

log = logging.getLogger(__name__)
T = TypeVar("T")

LISTEN = "gateway.rest.listen"
MAX_REQUEST_BYTES = "gateway.rest.write.max-request-bytes"
WRITE_MAX_ROWS = "gateway.rest.write.max-rows"
LOOKUP_MAX_KEYS = "gateway.rest.lookup.max-keys"
PREFIX_LOOKUP_MAX_PREFIXES = "gateway.rest.prefix-lookup.max-prefixes"
PREFIX_LOOKUP_MAX_ROWS_PER_PREFIX = "gateway.rest.prefix-lookup.max-rows-per-prefix"
MAX_USER_CONNECTIONS = "gateway.max-user-connections"
TOKEN_FILE = "gateway.auth.token-file"
TABLE_CACHE_SIZE = "gateway.table-cache.size"
TABLE_CACHE_TTL = "gateway.table-cache.ttl"
METRICS_ENABLED = "gateway.metrics.enabled"
METRICS_LISTEN = "gateway.metrics.exporter.prometheus.listen"

DEFAULT_LISTEN = "127.0.0.1:8080"
"""Fluss's gateway's default listen address."""

DEPRECATED = {"gateway.max-body-size": MAX_REQUEST_BYTES}
"""strom's earlier names → Fluss's."""


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """What one request may ask for; beyond it the answer is 413 (body) or 400 ``limit_exceeded``."""

    max_request_bytes: int = 32 * 1024 * 1024
    write_max_rows: int = 10_000
    """Rows of one upsert or append, keys of one delete."""
    lookup_max_keys: int = 128
    prefix_lookup_max_prefixes: int = 16
    prefix_lookup_max_rows_per_prefix: int = 1_000


@dataclass(frozen=True, slots=True)
class GatewayOptions:
    listen: tuple[str, int] | None = None
    """``gateway.rest.listen``; ``strom gateway --bind`` wins over it."""
    limits: GatewayLimits = GatewayLimits()
    max_user_connections: int = 64
    token_file: str | None = None
    table_cache_size: int = 256
    table_cache_ttl_s: float = 5.0
    metrics_enabled: bool = True
    metrics_listen: tuple[str, int] | None = None
    """A listener of the metrics' own (Fluss's default is 127.0.0.1:9095; strom's, none: ``GET /metrics`` of
    the gateway serves them, so gateways side by side need no ports planned)."""


def take_gateway_options(options: MutableMapping[str, str]) -> GatewayOptions:
    """Take the gateway's keys out of ``options`` (what remains configures the cluster connections).

    Raises:
        ValueError: a value that does not parse or is not positive, naming its key.
    """
    for old, new in DEPRECATED.items():
        if old in options:
            log.warning("-D %s is deprecated: use %s, Fluss's name", old, new)
            options.setdefault(new, options.pop(old))
    defaults = GatewayOptions()
    limits = GatewayLimits(
        _take(options, MAX_REQUEST_BYTES, parse_memory_size, defaults.limits.max_request_bytes),
        _take(options, WRITE_MAX_ROWS, int, defaults.limits.write_max_rows),
        _take(options, LOOKUP_MAX_KEYS, int, defaults.limits.lookup_max_keys),
        _take(options, PREFIX_LOOKUP_MAX_PREFIXES, int, defaults.limits.prefix_lookup_max_prefixes),
        _take(options, PREFIX_LOOKUP_MAX_ROWS_PER_PREFIX, int, defaults.limits.prefix_lookup_max_rows_per_prefix),
    )
    for key, value in ((MAX_REQUEST_BYTES, limits.max_request_bytes), (WRITE_MAX_ROWS, limits.write_max_rows),
                       (LOOKUP_MAX_KEYS, limits.lookup_max_keys), (PREFIX_LOOKUP_MAX_PREFIXES,
                       limits.prefix_lookup_max_prefixes), (PREFIX_LOOKUP_MAX_ROWS_PER_PREFIX,
                       limits.prefix_lookup_max_rows_per_prefix)):
        if value <= 0:
            raise ValueError(f"-D {key}={value}: must be greater than zero")
    return GatewayOptions(
        listen=_take(options, LISTEN, parse_address, None),
        limits=limits,
        max_user_connections=_take(options, MAX_USER_CONNECTIONS, int, defaults.max_user_connections),
        token_file=options.pop(TOKEN_FILE, None),
        table_cache_size=_take(options, TABLE_CACHE_SIZE, int, defaults.table_cache_size),
        table_cache_ttl_s=_take(options, TABLE_CACHE_TTL, lambda v: parse_duration(v).total_seconds(),
                                defaults.table_cache_ttl_s),
        metrics_enabled=_take(options, METRICS_ENABLED, _boolean, defaults.metrics_enabled),
        metrics_listen=_take(options, METRICS_LISTEN, parse_address, None),
    )


def _boolean(text: str) -> bool:
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise ValueError("expected true or false")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) as (host, port). Raises ValueError."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _take(options: MutableMapping[str, str], key: str, parse: Callable[[str], T], default: T) -> T:
    if key not in options:
        return default
    value = options.pop(key)
    try:
        return parse(value)
    except ValueError as exc:
        raise ValueError(f"-D {key}={value!r}: {exc}") from None


__all__ = ["DEFAULT_LISTEN", "DEPRECATED", "LISTEN", "GatewayLimits", "GatewayOptions", "parse_address",
           "take_gateway_options"]
