"""Connector options, declared once with default and description, parsed into typed values.

Spark hands a Python data source its options as a case-insensitive string map; keys here are lower case
and spelled as Fluss's connectors spell them where an equivalent exists (``bootstrap.servers``,
``scan.startup.mode``, ``scan.kv.snapshot.lease.id``). ``docs/spark.md`` lists the same table.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from strom.config import parse_duration
from strom.ids import TablePath
from strom.spark.errors import FlussConnectorError

LEASE_ID_PREFIX = "spark-"
CLIENT_OPTION_PREFIX = "client."


@dataclass(frozen=True, slots=True)
class ConnectorOption:
    key: str
    default: str | None
    description: str


BOOTSTRAP_SERVERS = ConnectorOption("bootstrap.servers", None, "HOST:PORT[,HOST:PORT…] of the cluster (required).")
TABLE = ConnectorOption("table", None, "The table as DATABASE.TABLE (required).")
SCAN_STARTUP_MODE = ConnectorOption(
    "scan.startup.mode", "full",
    "full: a primary-key table's current state, then its changes (a log table from its start); earliest: every "
    "record from the start of the log; latest: only what is written after the query starts (streaming only).",
)
READ_STRATEGY = ConnectorOption(
    "read.strategy", "snapshot",
    "Batch reads of primary-key tables. snapshot: leased KV snapshot merged with the changelog up to the "
    "offsets fixed at planning; server-scan: the rows the server holds when each task runs (ScanKv).",
)
READ_SOURCE = ConnectorOption(
    "read.source", "union",
    "Batch reads of lake-enabled tables. union: the lake snapshot the coordinator reports, plus the changes "
    "after it from strom (primary-key rows merged by key); lake: the lake snapshot alone (as fresh as the last "
    "tiering round); strom: strom alone, as for tables without a lake.",
)
LEASE_ID = ConnectorOption(
    "scan.kv.snapshot.lease.id", None, "Lease id pinning the snapshots a read uses (default: spark-<uuid> per read)."
)
LEASE_DURATION = ConnectorOption(
    "scan.kv.snapshot.lease.duration", "1h", "How long the snapshots stay pinned if a task never releases them."
)
READ_CHANGE_TYPE_COLUMN = ConnectorOption(
    "read.change-type-column", "_change_type",
    "Name of the STRING column carrying +I/-U/+U/-D on primary-key tables; empty to omit it in batch reads.",
)
MAX_ROWS_PER_TRIGGER = ConnectorOption(
    "scan.max-rows-per-trigger", "500000", "Streaming: at most this many log records per micro-batch (spread over buckets)."
)
WRITE_CHANGE_TYPE_COLUMN = ConnectorOption(
    "write.change-type-column", "_change_type",
    "Input column with +I/+U (upsert), -D (delete) or -U (ignored); used when the DataFrame has it.",
)
WRITE_BATCH_ROWS = ConnectorOption(
    "write.batch-rows", "32768",
    "Rows a write task gathers (from Spark's Arrow batches) into one pipelined request: larger requests "
    "spread the server's per-request cost (changelog sync, request handling) over more rows; much larger "
    "ones leave less overlap between the task preparing a request and the server applying the previous.",
)
READ_FILTER_PUSHDOWN = ConnectorOption(
    "read.filter-pushdown", None,
    "Batch reads: true lets Spark push filters (primary-key lookups, partition pruning), which needs "
    "spark.sql.python.filterPushdown.enabled=true in the session. Default: on for the source registered "
    "by strom.spark.register(spark) (which sets that), off for FlussDataSource registered by hand.",
)
TEST_WAIT_FOR_FILE = ConnectorOption(
    "testing.read.wait-for-file", None,
    "Test aid: read tasks wait (up to 120 s) until this file exists before reading, to act between planning and reading.",
)

ALL_OPTIONS = (
    BOOTSTRAP_SERVERS, TABLE, SCAN_STARTUP_MODE, READ_STRATEGY, READ_SOURCE, LEASE_ID, LEASE_DURATION, READ_CHANGE_TYPE_COLUMN,
    MAX_ROWS_PER_TRIGGER, WRITE_CHANGE_TYPE_COLUMN, WRITE_BATCH_ROWS, READ_FILTER_PUSHDOWN, TEST_WAIT_FOR_FILE,
)


class StartupMode(Enum):
    FULL = "full"
    EARLIEST = "earliest"
    LATEST = "latest"


class ReadStrategy(Enum):
    SNAPSHOT = "snapshot"
    SERVER_SCAN = "server-scan"


class ReadSource(Enum):
    UNION = "union"
    LAKE = "lake"
    STROM = "strom"


def _choice(raw: Mapping[str, str], option: ConnectorOption, enum: type[Enum]) -> Enum:
    value = _get(raw, option).strip().lower()
    for member in enum:
        if member.value == value:
            return member
    allowed = ", ".join(member.value for member in enum)
    raise FlussConnectorError(f"option '{option.key}' must be one of {allowed}, got '{value}'")


def _get(raw: Mapping[str, str], option: ConnectorOption) -> str:
    value = raw.get(option.key)
    if value is None:
        if option.default is None:
            raise FlussConnectorError(f"option '{option.key}' is required: {option.description}")
        return option.default
    return str(value)


def _lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in options.items()}


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Where the table lives; every reader and writer needs these."""

    bootstrap_servers: str
    table_path: TablePath
    client_config: dict[str, str]

    @property
    def table(self) -> str:
        return str(self.table_path)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ConnectionOptions:
        raw = _lower_keys(options)
        servers = _get(raw, BOOTSTRAP_SERVERS).strip()
        if not servers:
            raise FlussConnectorError(f"option '{BOOTSTRAP_SERVERS.key}' is empty: {BOOTSTRAP_SERVERS.description}")
        table = _get(raw, TABLE).strip()
        try:
            path = TablePath.parse(table)
        except ValueError:
            raise FlussConnectorError(f"option '{TABLE.key}' must be DATABASE.TABLE, got '{table}'") from None
        client = {key: value for key, value in raw.items() if key.startswith(CLIENT_OPTION_PREFIX)}
        return cls(servers, path, {**client, "bootstrap.servers": servers})


@dataclass(frozen=True, slots=True)
class ReadOptions:
    startup_mode: StartupMode
    strategy: ReadStrategy
    source: ReadSource
    lease_id: str
    lease_duration_ms: int
    change_type_column: str
    max_rows_per_trigger: int
    wait_for_file: str | None
    filter_pushdown: bool | None = None
    """None: the registered source's default (see ``read.filter-pushdown``)."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        raw = _lower_keys(options)
        try:
            duration_ms = int(parse_duration(_get(raw, LEASE_DURATION)).total_seconds() * 1000)
        except ValueError as exc:
            raise FlussConnectorError(f"option '{LEASE_DURATION.key}': {exc}") from None
        if duration_ms <= 0:
            raise FlussConnectorError(f"option '{LEASE_DURATION.key}' must be positive")
        try:
            max_rows = int(_get(raw, MAX_ROWS_PER_TRIGGER))
        except ValueError:
            raise FlussConnectorError(f"option '{MAX_ROWS_PER_TRIGGER.key}' must be an integer") from None
        if max_rows <= 0:
            raise FlussConnectorError(f"option '{MAX_ROWS_PER_TRIGGER.key}' must be positive")
        lease_id = raw.get(LEASE_ID.key) or f"{LEASE_ID_PREFIX}{uuid.uuid4()}"
        startup = _choice(raw, SCAN_STARTUP_MODE, StartupMode)
        strategy = _choice(raw, READ_STRATEGY, ReadStrategy)
        source = _choice(raw, READ_SOURCE, ReadSource)
        assert isinstance(startup, StartupMode) and isinstance(strategy, ReadStrategy)
        assert isinstance(source, ReadSource)
        pushdown = str(raw.get(READ_FILTER_PUSHDOWN.key) or "").strip().lower()  # unset: the source decides
        if pushdown not in ("true", "false", ""):
            raise FlussConnectorError(f"option '{READ_FILTER_PUSHDOWN.key}' must be true or false, not '{pushdown}'")
        return cls(
            startup_mode=startup,
            strategy=strategy,
            source=source,
            lease_id=lease_id,
            lease_duration_ms=duration_ms,
            change_type_column=_get(raw, READ_CHANGE_TYPE_COLUMN).strip(),
            max_rows_per_trigger=max_rows,
            wait_for_file=raw.get(TEST_WAIT_FOR_FILE.key) or None,
            filter_pushdown=None if not pushdown else pushdown == "true",
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    change_type_column: str
    batch_rows: int = int(WRITE_BATCH_ROWS.default or 0)

    def change_type_column_for(self, table_columns: Collection[str]) -> str | None:
        """The change type column's name, unless unset or a column of the table itself (data, not a type)."""
        if not self.change_type_column or self.change_type_column in table_columns:
            return None
        return self.change_type_column

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        raw = _lower_keys(options)
        try:
            batch_rows = int(_get(raw, WRITE_BATCH_ROWS))
        except ValueError:
            raise FlussConnectorError(f"option '{WRITE_BATCH_ROWS.key}' must be an integer") from None
        if batch_rows <= 0:
            raise FlussConnectorError(f"option '{WRITE_BATCH_ROWS.key}' must be positive")
        return cls(_get(raw, WRITE_CHANGE_TYPE_COLUMN).strip(), batch_rows)
