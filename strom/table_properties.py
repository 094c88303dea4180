"""The names of Apache Fluss's table options (the ``table.*`` keys of a table's properties), their value
syntax, and typed reads of a table's properties: the one module that spells a table option.

Every floor reads table options, so they live on the bottom one; what strom does with each option, its
documentation and the checks at table creation are :mod:`strom.metadata.table_options`, built on the names
and parsers here. A table's options were checked when it was created, so :class:`TableProperties` parses
what it reads with the same rules and reports a value that no longer parses as a configuration error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TypeVar

from strom.errors import InvalidConfigError
from strom.units import parse_duration

T = TypeVar("T")

TABLE_OPTION_PREFIX = "table."
DATALAKE_OPTION_PREFIX = "table.datalake."
"""Options of the lake format: ``table.datalake.<format>.<key>`` goes to the lake table as ``<key>``."""

REPLICATION_FACTOR = "table.replication.factor"
LOG_FORMAT = "table.log.format"
ARROW_COMPRESSION_TYPE = "table.log.arrow.compression.type"
ZSTD_LEVEL = "table.log.arrow.compression.zstd.level"
KV_FORMAT = "table.kv.format"
KV_FORMAT_VERSION = "table.kv.format-version"
STANDBY_REPLICA = "table.kv.standby-replica.enabled"
AUTO_PARTITION_ENABLED = "table.auto-partition.enabled"
AUTO_PARTITION_KEY = "table.auto-partition.key"
AUTO_PARTITION_TIME_UNIT = "table.auto-partition.time-unit"
AUTO_PARTITION_TIME_FORMAT = "table.auto-partition.time-format"
AUTO_PARTITION_TIME_ZONE = "table.auto-partition.time-zone"
AUTO_PARTITION_PRECREATE = "table.auto-partition.num-precreate"
AUTO_PARTITION_RETENTION = "table.auto-partition.num-retention"
LOG_TTL = "table.log.ttl"
TIERED_LOCAL_SEGMENTS = "table.log.tiered.local-segments"
LOG_LOCAL_TTL = "table.log.local-ttl"
DATALAKE_ENABLED = "table.datalake.enabled"
DATALAKE_HISTORICAL_PARTITION = "table.datalake.historical-partition.enabled"
HISTORICAL_PARTITION_VALUE = "__historical__"
"""The partition value of the system partition that routes lookups of expired partitions to the lake."""
DATALAKE_FORMAT = "table.datalake.format"
DATALAKE_FRESHNESS = "table.datalake.freshness"
DATALAKE_AUTO_COMPACTION = "table.datalake.auto-compaction"
DATALAKE_AUTO_EXPIRE_SNAPSHOT = "table.datalake.auto-expire-snapshot"
MERGE_ENGINE = "table.merge-engine"
VERSION_COLUMN = "table.merge-engine.versioned.ver-column"
DELETE_BEHAVIOR = "table.delete.behavior"
AUTO_INCREMENT_CACHE_SIZE = "table.auto-increment.cache-size"
CHANGELOG_IMAGE = "table.changelog.image"
STATISTICS_COLUMNS = "table.statistics.columns"

DEFAULT_REPLICATION_FACTOR = 1
"""What a table gets when it does not set ``table.replication.factor`` (Fluss's ``default.replication.factor``)."""
DEFAULT_LOG_FORMAT = "ARROW"
DEFAULT_KV_FORMAT = "COMPACTED"
DEFAULT_ARROW_COMPRESSION = "ZSTD"
DEFAULT_ZSTD_LEVEL = 3
"""Fluss's default ``table.log.arrow.compression.zstd.level``."""
DEFAULT_CHANGELOG_IMAGE = "FULL"
DEFAULT_TIERED_LOCAL_SEGMENTS = 2

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


# ---- value parsers: Fluss's rules (Java's Integer/Long.parseInt, case-insensitive booleans and enums,
# durations with a unit); each raises ValueError saying what it expected ----

_INTEGER = re.compile(r"^[+-]?\d+$")
_DURATION_START = re.compile(r"^\s*\d+\s*\D")


def integer_parser(minimum: int, maximum: int, kind: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not _INTEGER.match(text) or not minimum <= int(text) <= maximum:
            raise ValueError(f"Expected {kind}.")
        return int(text)

    return parse


parse_int = integer_parser(INT_MIN, INT_MAX, "a 32-bit integer")
parse_long = integer_parser(LONG_MIN, LONG_MAX, "a 64-bit integer")


def parse_bool(text: str) -> bool:
    upper = text.upper()
    if upper not in ("TRUE", "FALSE"):
        raise ValueError("Expected either true or false (case insensitive).")
    return upper == "TRUE"


def parse_table_duration(text: str) -> timedelta:
    """A whole number and a time unit (``500 ms``, ``10 min``, ``7d``): unlike strom's server options, Fluss
    takes no bare number (and so no negative value) for a table's duration."""
    if not _DURATION_START.match(text):
        raise ValueError("Expected a whole number with a time unit, e.g. 500 ms, 10 min, 2 h, 7 d.")
    return parse_duration(text)


def parse_string(text: str) -> str:
    return text


def enum_parser(*choices: str) -> Callable[[str], str]:
    """An enum constant, case-insensitive (Fluss compares upper-cased); returns the upper-case name."""

    def parse(text: str) -> str:
        if text.upper() not in choices:
            raise ValueError(f"Expected one of: [{', '.join(choices)}]")
        return text.upper()

    return parse


class TableProperties:
    """Typed reads of one table's properties, each with Fluss's default where the option has one."""

    __slots__ = ("_raw",)

    def __init__(self, properties: Mapping[str, str]) -> None:
        self._raw = properties

    def text(self, key: str) -> str | None:
        """The option's text without surrounding blanks; None when unset or blank."""
        value = self._raw.get(key)
        return value.strip() or None if value is not None else None

    def parsed(self, key: str, parse: Callable[[str], T], default: T) -> T:
        """The option parsed with ``parse``, ``default`` when unset.

        Raises:
            InvalidConfigError: a value that does not parse.
        """
        text = self.text(key)
        if text is None:
            return default
        try:
            return parse(text)
        except ValueError as exc:
            raise InvalidConfigError(f"Invalid value {text!r} of table option {key!r}: {exc}") from None

    def flag(self, key: str, default: bool = False) -> bool:
        return self.parsed(key, parse_bool, default)

    def upper(self, key: str, default: str) -> str:
        return self.parsed(key, str.upper, default)

    def duration_ms(self, key: str) -> int | None:
        """A duration option in milliseconds; None when unset (the server's default applies)."""
        found = self.parsed(key, parse_table_duration, None)
        return None if found is None else int(found / timedelta(milliseconds=1))

    # ---- the options strom reads ----
    @property
    def replication_factor(self) -> int:
        return self.parsed(REPLICATION_FACTOR, parse_int, DEFAULT_REPLICATION_FACTOR)

    @property
    def log_format(self) -> str:
        return self.upper(LOG_FORMAT, DEFAULT_LOG_FORMAT)

    @property
    def kv_format(self) -> str:
        return self.upper(KV_FORMAT, DEFAULT_KV_FORMAT)

    @property
    def arrow_compression(self) -> str:
        return self.upper(ARROW_COMPRESSION_TYPE, DEFAULT_ARROW_COMPRESSION)

    @property
    def arrow_compression_zstd_level(self) -> int:
        return self.parsed(ZSTD_LEVEL, parse_int, DEFAULT_ZSTD_LEVEL)

    @property
    def changelog_image(self) -> str:
        return self.upper(CHANGELOG_IMAGE, DEFAULT_CHANGELOG_IMAGE)

    @property
    def log_ttl_ms(self) -> int | None:
        return self.duration_ms(LOG_TTL)

    @property
    def log_local_ttl_ms(self) -> int | None:
        """How long segments copied to remote storage stay local (None: unset, ``table.log.ttl`` applies)."""
        return self.duration_ms(LOG_LOCAL_TTL)

    @property
    def tiered_local_segments(self) -> int:
        return self.parsed(TIERED_LOCAL_SEGMENTS, parse_int, DEFAULT_TIERED_LOCAL_SEGMENTS)

    @property
    def datalake_historical_partition(self) -> bool:
        """Lookups of expired partitions are answered from the lake (``table.datalake.historical-partition.enabled``)."""
        return self.flag(DATALAKE_HISTORICAL_PARTITION)

    @property
    def standby_replica(self) -> bool:
        """Followers keep the table's RocksDB warm (``table.kv.standby-replica.enabled``; off if unset)."""
        return self.flag(STANDBY_REPLICA)

    @property
    def datalake_enabled(self) -> bool:
        return self.flag(DATALAKE_ENABLED)

    @property
    def datalake_format(self) -> str | None:
        """The lake format, lower-case (``delta``, ``iceberg``); None when unset."""
        return self.parsed(DATALAKE_FORMAT, str.lower, None)

    @property
    def datalake_freshness_ms(self) -> int | None:
        return self.duration_ms(DATALAKE_FRESHNESS)

    @property
    def datalake_auto_expire_snapshot(self) -> bool:
        return self.flag(DATALAKE_AUTO_EXPIRE_SNAPSHOT)

    @property
    def auto_partition_enabled(self) -> bool:
        return self.flag(AUTO_PARTITION_ENABLED)


def table_option_key(name: str) -> str:
    """``table.<name>``: the table option a server option of the same name sets the default of."""
    return TABLE_OPTION_PREFIX + name


def datalake_option_prefix(lake_format: str) -> str:
    """``table.datalake.<format>.``: the prefix of the options handed to the lake table."""
    return f"{DATALAKE_OPTION_PREFIX}{lake_format}."


__all__ = [name for name in dir() if name.isupper() or name in {
    "TableProperties", "datalake_option_prefix", "enum_parser", "integer_parser", "parse_bool", "parse_int",
    "parse_long", "parse_string", "parse_table_duration", "table_option_key"}]
