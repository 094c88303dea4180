"""Connector options, declared once with default and description, parsed into typed values.

Spark hands a Python data source its options as a case-insensitive string map; keys here are lower case
and spelled as Fluss's connectors spell them where an equivalent exists (``bootstrap.servers``,
``scan.startup.mode``, ``scan.kv.snapshot.lease.id``). ``docs/spark.md`` lists the same table.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum

from strom.config import parse_duration
from strom.ids import TablePath
from strom.spark.errors import FlussConnectorError
from strom.table_properties import TABLE_OPTION_PREFIX

LEASE_ID_PREFIX = "spark-"
CLIENT_OPTION_PREFIX = "client."


@dataclass(frozen=True, slots=True)
class ConnectorOption:
    key: str
    default: str | None
    description: str


BOOTSTRAP_SERVERS = ConnectorOption("bootstrap.servers", None, "HOST:PORT[,HOST:PORT…] of the cluster (required).")
TABLE = ConnectorOption(
    "table", None,
    "The table as DATABASE.TABLE (required); DATABASE.TABLE$binlog reads a primary-key table's changes with the "
    "row before and after each (reads only).",
)
BINLOG_SUFFIX = "$binlog"
SCAN_STARTUP_MODE = ConnectorOption(
    "scan.startup.mode", "full",
    "full: a primary-key table's current state, then its changes (a log table from its start); earliest: every "
    "record from the start of the log; latest: only what is written after the query starts (streaming only); "
    "timestamp: the records committed at or after scan.startup.timestamp (a primary-key table's changelog).",
)
SCAN_STARTUP_TIMESTAMP = ConnectorOption(
    "scan.startup.timestamp", None,
    "With scan.startup.mode=timestamp: epoch milliseconds or an ISO-8601 time (UTC unless it names a zone).",
)
SCAN_INCREMENTAL_START = ConnectorOption(
    "scan.incremental.start.timestamp", None,
    "Batch reads: the inclusive start of a time range; the read returns the log records (a primary-key table's "
    "changelog) committed in [start, end). Epoch milliseconds or an ISO-8601 time (UTC unless it names a zone).",
)
SCAN_INCREMENTAL_END = ConnectorOption(
    "scan.incremental.end.timestamp", None,
    "Batch reads: the exclusive end of the time range (default: what is committed when the read is planned).",
)
READ_METADATA_COLUMNS = ConnectorOption(
    "read.metadata-columns", "",
    "Comma-separated metadata columns to add after the table's columns: _log_offset (BIGINT), _commit_timestamp "
    "(TIMESTAMP), _bucket (INT); offset and timestamp are null for rows read from a KV snapshot, a lake or a lookup.",
)
SCAN_MAX_RECORDS_PER_PARTITION = ConnectorOption(
    "scan.maxRecordsPerPartition", None,
    "Log ranges (log tables, time ranges, streaming micro-batches) longer than this many records are split into "
    "several Spark partitions of at most this many records (default: one partition per bucket).",
)
READ_OPTIMIZED = ConnectorOption(
    "read.optimized", "false",
    "Batch reads of primary-key tables: true reads each bucket's latest KV snapshot alone (leased), without "
    "merging the changelog after it: faster, but as stale as the snapshot (up to kv.snapshot.interval).",
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
WRITE_EXACTLY_ONCE = ConnectorOption(
    "write.exactly-once", "false",
    "true: each write task writes under a replayable writer identity (streaming: the query id, micro-batch and "
    "partition; batch: the write and partition), so a retried task or a replayed micro-batch writes nothing "
    "twice. Requires each task to get the same rows in the same order when it runs again (see docs/spark.md).",
)
READ_FILTER_PUSHDOWN = ConnectorOption(
    "read.filter-pushdown", None,
    "Batch reads: true lets Spark push filters (primary-key lookups, partition pruning), which needs "
    "spark.sql.python.filterPushdown.enabled=true in the session. Default: on for the source registered "
    "by strom.spark.register(spark) (which sets that), off for FlussDataSource registered by hand.",
)
PRIMARY_KEY = ConnectorOption(
    "primary.key", None, "Writes that create the table: its primary key, comma-separated column names."
)
BUCKET_NUMBER = ConnectorOption("bucket.num", None, "Writes that create the table: its bucket count.")
BUCKET_KEY = ConnectorOption(
    "bucket.key", None, "Writes that create the table: its bucket key (default: the primary key less partition keys)."
)
PARTITION_KEY = ConnectorOption(
    "partition.key", None, "Writes that create the table: its partition keys, comma-separated (STRING columns)."
)
COMMENT = ConnectorOption("comment", None, "Writes that create the table: its comment.")
AUTO_INCREMENT_FIELDS = ConnectorOption(
    "auto-increment.fields", None,
    "Writes that create a primary-key table: its auto-increment column (one INT or BIGINT non-key column, "
    "filled by the server for every new key; Fluss's Flink option name).",
)
"""Options ``table.<key>`` (other than ``table`` itself) of a write that creates the table become its table
options, e.g. ``table.log.format``, ``table.datalake.enabled``."""
FIELD_PROPERTY_PREFIX = "fields."
"""Options ``fields.<column>.<key>`` of a write that creates the table are passed with the table options too:
the aggregate functions of an aggregation table (``fields.total.agg``), which the server folds into the schema."""
TEST_WAIT_FOR_FILE = ConnectorOption(
    "testing.read.wait-for-file", None,
    "Test aid: read tasks wait (up to 120 s) until this file exists before reading, to act between planning and reading.",
)

TEST_CRASH_AFTER_REQUESTS = ConnectorOption(
    "testing.write.crash-once-after-requests", None,
    "Test aid, 'N:PATH': the first write task to have N requests acknowledged while PATH does not exist creates "
    "PATH and kills its own Python worker (SIGKILL), as a crash after some rows were written.",
)

ALL_OPTIONS = (
    BOOTSTRAP_SERVERS, TABLE, SCAN_STARTUP_MODE, SCAN_STARTUP_TIMESTAMP, SCAN_INCREMENTAL_START, SCAN_INCREMENTAL_END,
    READ_STRATEGY, READ_SOURCE, READ_OPTIMIZED, LEASE_ID, LEASE_DURATION, READ_CHANGE_TYPE_COLUMN, READ_METADATA_COLUMNS,
    SCAN_MAX_RECORDS_PER_PARTITION, MAX_ROWS_PER_TRIGGER, WRITE_CHANGE_TYPE_COLUMN, WRITE_BATCH_ROWS,
    WRITE_EXACTLY_ONCE, PRIMARY_KEY, BUCKET_NUMBER, BUCKET_KEY, PARTITION_KEY, COMMENT, AUTO_INCREMENT_FIELDS,
    READ_FILTER_PUSHDOWN, TEST_WAIT_FOR_FILE, TEST_CRASH_AFTER_REQUESTS,
)

METADATA_LOG_OFFSET = "_log_offset"
METADATA_COMMIT_TIMESTAMP = "_commit_timestamp"
METADATA_BUCKET = "_bucket"
METADATA_COLUMNS = (METADATA_LOG_OFFSET, METADATA_COMMIT_TIMESTAMP, METADATA_BUCKET)


class StartupMode(Enum):
    FULL = "full"
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"


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
    value = raw.get(option.key.lower())
    if value is None:
        if option.default is None:
            raise FlussConnectorError(f"option '{option.key}' is required: {option.description}")
        return option.default
    return str(value)


def _lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in options.items()}


def _optional(raw: Mapping[str, str], option: ConnectorOption) -> str | None:
    value = str(raw.get(option.key.lower()) or "").strip()
    return value or None


def _positive_int(raw: Mapping[str, str], option: ConnectorOption) -> int | None:
    value = _optional(raw, option)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise FlussConnectorError(f"option '{option.key}' must be an integer, got '{value}'") from None
    if number <= 0:
        raise FlussConnectorError(f"option '{option.key}' must be positive, got {number}")
    return number


def _names(raw: Mapping[str, str], option: ConnectorOption) -> tuple[str, ...]:
    return tuple(name.strip() for name in (_optional(raw, option) or "").split(",") if name.strip())


def _boolean(raw: Mapping[str, str], option: ConnectorOption) -> bool:
    value = _get(raw, option).strip().lower()
    if value not in ("true", "false"):
        raise FlussConnectorError(f"option '{option.key}' must be true or false, not '{value}'")
    return value == "true"


def parse_timestamp_ms(option: ConnectorOption, value: str) -> int:
    """Epoch milliseconds from ``value``: an integer (epoch ms) or an ISO-8601 time such as
    ``2026-01-02 10:00:00``, ``2026-01-02T10:00:00.250+02:00`` or ``…Z`` (UTC unless it names a zone).

    Raises:
        FlussConnectorError: neither form, naming ``option``.
    """
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise FlussConnectorError(
            f"option '{option.key}' must be epoch milliseconds or an ISO-8601 time like '2026-01-02 10:00:00', got '{value}'"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class TimeRange:
    """Log records committed in ``[start_ms, end_ms)`` (``end_ms`` None: up to what planning finds)."""

    start_ms: int
    end_ms: int | None
    start_option: ConnectorOption
    end_option: ConnectorOption | None

    def contains(self, timestamp_ms: int) -> bool:
        return timestamp_ms >= self.start_ms and (self.end_ms is None or timestamp_ms < self.end_ms)


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Where the table lives; every reader and writer needs these."""

    bootstrap_servers: str
    table_path: TablePath
    client_config: dict[str, str]
    binlog: bool = False
    """The table was named with the ``$binlog`` suffix: its changes in before/after form (``table_path`` is
    the table itself)."""

    @property
    def table(self) -> str:
        return str(self.table_path) + (BINLOG_SUFFIX if self.binlog else "")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ConnectionOptions:
        raw = _lower_keys(options)
        servers = _get(raw, BOOTSTRAP_SERVERS).strip()
        if not servers:
            raise FlussConnectorError(f"option '{BOOTSTRAP_SERVERS.key}' is empty: {BOOTSTRAP_SERVERS.description}")
        table = _get(raw, TABLE).strip()
        binlog = table.endswith(BINLOG_SUFFIX)
        if binlog:
            table = table.removesuffix(BINLOG_SUFFIX)
        try:
            path = TablePath.parse(table)
        except ValueError:
            raise FlussConnectorError(f"option '{TABLE.key}' must be DATABASE.TABLE, got '{table}'") from None
        client = {key: value for key, value in raw.items() if key.startswith(CLIENT_OPTION_PREFIX)}
        return cls(servers, path, {**client, "bootstrap.servers": servers}, binlog)


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
    startup_timestamp_ms: int | None = None
    """``scan.startup.timestamp`` when ``startup_mode`` is TIMESTAMP."""
    time_range: TimeRange | None = None
    """Batch reads of a time range: ``scan.incremental.*``, or ``scan.startup.mode=timestamp`` (no end)."""
    metadata_columns: tuple[str, ...] = field(default=())
    max_records_per_partition: int | None = None
    read_optimized: bool = False

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
        startup_ms = None
        if startup is StartupMode.TIMESTAMP:
            startup_value = _optional(raw, SCAN_STARTUP_TIMESTAMP)
            if startup_value is None:
                raise FlussConnectorError(
                    f"option '{SCAN_STARTUP_MODE.key}'=timestamp needs option '{SCAN_STARTUP_TIMESTAMP.key}' "
                    "(epoch milliseconds or an ISO-8601 time)"
                )
            startup_ms = parse_timestamp_ms(SCAN_STARTUP_TIMESTAMP, startup_value)
        metadata = _names(raw, READ_METADATA_COLUMNS)
        unknown = [name for name in metadata if name not in METADATA_COLUMNS]
        if unknown or len(set(metadata)) != len(metadata):
            raise FlussConnectorError(
                f"option '{READ_METADATA_COLUMNS.key}' takes distinct names among {', '.join(METADATA_COLUMNS)}, got "
                f"'{','.join(metadata)}'"
            )
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
            startup_timestamp_ms=startup_ms,
            time_range=_time_range(raw, startup, startup_ms),
            metadata_columns=metadata,
            max_records_per_partition=_positive_int(raw, SCAN_MAX_RECORDS_PER_PARTITION),
            read_optimized=_boolean(raw, READ_OPTIMIZED),
        )


def _time_range(raw: Mapping[str, str], startup: StartupMode, startup_ms: int | None) -> TimeRange | None:
    start_value = _optional(raw, SCAN_INCREMENTAL_START)
    end_value = _optional(raw, SCAN_INCREMENTAL_END)
    if start_value is None:
        if end_value is not None:
            raise FlussConnectorError(
                f"option '{SCAN_INCREMENTAL_END.key}' needs option '{SCAN_INCREMENTAL_START.key}' (a time range has a start)"
            )
        if startup_ms is not None:
            return TimeRange(startup_ms, None, SCAN_STARTUP_TIMESTAMP, None)
        return None
    if startup_ms is not None:
        raise FlussConnectorError(
            f"options '{SCAN_INCREMENTAL_START.key}' and '{SCAN_STARTUP_MODE.key}'=timestamp exclude each other; use one"
        )
    start_ms = parse_timestamp_ms(SCAN_INCREMENTAL_START, start_value)
    end_ms = None if end_value is None else parse_timestamp_ms(SCAN_INCREMENTAL_END, end_value)
    if end_ms is not None and end_ms <= start_ms:
        raise FlussConnectorError(
            f"option '{SCAN_INCREMENTAL_END.key}' ({end_value}) must be after '{SCAN_INCREMENTAL_START.key}' ({start_value})"
        )
    return TimeRange(start_ms, end_ms, SCAN_INCREMENTAL_START, SCAN_INCREMENTAL_END if end_ms is not None else None)


@dataclass(frozen=True, slots=True)
class TableCreation:
    """How a write creates its table when it does not exist (options ``primary.key``, ``bucket.num``, …)."""

    primary_key: tuple[str, ...] = ()
    bucket_count: int | None = None
    bucket_key: tuple[str, ...] = ()
    partition_keys: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()
    comment: str | None = None
    auto_increment: tuple[str, ...] = ()

    @property
    def declared(self) -> bool:
        """Whether the write named any of the table's layout: then an existing table must match it."""
        return bool(self.primary_key or self.bucket_count or self.bucket_key or self.partition_keys)

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> TableCreation:
        properties = tuple(
            sorted(
                (key, value) for key, value in raw.items()
                if key.startswith((TABLE_OPTION_PREFIX, FIELD_PROPERTY_PREFIX))
            )
        )
        return cls(
            primary_key=_names(raw, PRIMARY_KEY),
            bucket_count=_positive_int(raw, BUCKET_NUMBER),
            bucket_key=_names(raw, BUCKET_KEY),
            partition_keys=_names(raw, PARTITION_KEY),
            properties=properties,
            comment=_optional(raw, COMMENT),
            auto_increment=_names(raw, AUTO_INCREMENT_FIELDS),
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    change_type_column: str
    batch_rows: int = int(WRITE_BATCH_ROWS.default or 0)
    creation: TableCreation = field(default_factory=TableCreation)
    exactly_once: bool = False
    crash_after_requests: tuple[int, str] | None = None
    """``testing.write.crash-once-after-requests``."""

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
        crash = raw.get(TEST_CRASH_AFTER_REQUESTS.key)
        crash_after = None
        if crash:
            count, _, path = crash.partition(":")
            crash_after = (int(count), path)
        return cls(_get(raw, WRITE_CHANGE_TYPE_COLUMN).strip(), batch_rows, TableCreation.parse(raw),
                   _boolean(raw, WRITE_EXACTLY_ONCE), crash_after)
