"""Every table option Apache Fluss defines (the ``table.*`` keys of a table's properties), and what strom does
with each.

A table's ``properties`` hold only these options; anything else a user wants to keep with a table goes in
its ``custom_properties``. The coordinator checks a new table's properties here, as Fluss's
``TableDescriptorValidation`` does: an unknown key is refused, each value must parse as its option's type,
and the options that constrain each other are checked together. Every refusal is an
:class:`~strom.errors.InvalidConfigError` (39) or :class:`~strom.errors.InvalidTableError` (15) with the
message Fluss gives, so a client sees the same error from strom as from Fluss.

Each option says how far strom supports it (:class:`Support`): implemented (and by which module),
accepted without effect (an option about a Fluss subsystem strom does not have, where ignoring it loses
nothing), or implemented with some values refused at creation (where silently ignoring the value would
surprise a user). ``docs/table-options.md`` is generated from this module (``strom config table-docs``).

Merge engines and delete behaviour are checked by :mod:`strom.kv.merge.options`, the auto-increment cache
size by :mod:`strom.kv.auto_increment` and the lake format against the cluster's by the coordinator; this
module parses their values first, like every other option's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from strom.errors import InvalidConfigError, InvalidTableError
from strom.metadata import auto_partition
from strom.records.batch_statistics import STATISTICS_TYPE_ROOTS, named_columns
from strom.records.schema import Schema
from strom.table_properties import (
    ARROW_COMPRESSION_TYPE,
    AUTO_INCREMENT_CACHE_SIZE,
    AUTO_PARTITION_ENABLED,
    AUTO_PARTITION_KEY,
    AUTO_PARTITION_PRECREATE,
    AUTO_PARTITION_RETENTION,
    AUTO_PARTITION_TIME_FORMAT,
    AUTO_PARTITION_TIME_UNIT,
    AUTO_PARTITION_TIME_ZONE,
    CHANGELOG_IMAGE,
    DATALAKE_AUTO_COMPACTION,
    DATALAKE_AUTO_EXPIRE_SNAPSHOT,
    DATALAKE_ENABLED,
    DATALAKE_FORMAT,
    DATALAKE_FRESHNESS,
    DATALAKE_HISTORICAL_PARTITION,
    DEFAULT_REPLICATION_FACTOR,
    DELETE_BEHAVIOR,
    KV_FORMAT,
    KV_FORMAT_VERSION,
    LOG_FORMAT,
    LOG_LOCAL_TTL,
    LOG_TTL,
    MERGE_ENGINE,
    REPLICATION_FACTOR,
    STANDBY_REPLICA,
    STATISTICS_COLUMNS,
    TABLE_OPTION_PREFIX,
    TIERED_LOCAL_SEGMENTS,
    VERSION_COLUMN,
    ZSTD_LEVEL,
    enum_parser,
    parse_bool,
    parse_int,
    parse_long,
    parse_string,
    parse_table_duration,
)

CURRENT_KV_FORMAT_VERSION = 2
"""The kv format version Fluss gives new primary-key tables. Version 2 encodes a primary key with Fluss's
own encoder when the bucket key differs from it; strom's tables behave as version 2 (and as version 1 too:
the only lake key encoding strom has, Iceberg's, needs a single-column key, so bucket key = primary key)."""



class Support(enum.Enum):
    """How far strom supports a table option."""

    IMPLEMENTED = "implemented"
    PARTIAL = "partly: some values refused"
    NO_EFFECT = "accepted, no effect"


@dataclass(frozen=True, slots=True)
class TableOption:
    """One ``table.*`` option: Fluss's key, type, default and meaning, and what strom does with it."""

    key: str
    type_name: str
    default: str | None
    """Fluss's default as text; None: no default (unset means something the description says)."""
    description: str
    """What the option means in Fluss."""
    support: Support
    in_strom: str
    """What strom does with it: the module that reads it, why it has no effect, or which values are refused."""
    parse: Callable[[str], Any]
    """Text -> value, Fluss's parsing rules; ValueError with the expected form."""


def _option(
    key: str, type_name: str, default: str | None, description: str, support: Support, in_strom: str,
    parse: Callable[[str], Any],
) -> TableOption:
    return TableOption(key, type_name, default, description, support, in_strom, parse)


_LOG_FORMATS = ("ARROW", "INDEXED", "COMPACTED")
_KV_FORMATS = ("COMPACTED", "INDEXED")
_TIME_UNITS = ("YEAR", "QUARTER", "MONTH", "DAY", "HOUR")
_LAKE_FORMATS = ("PAIMON", "LANCE", "ICEBERG", "HUDI", "DELTA")

TABLE_OPTIONS: Mapping[str, TableOption] = {option.key: option for option in (
    _option(
        REPLICATION_FACTOR, "Integer", None,
        "How many replicas each bucket's log has; set from the cluster's default when unset, and it must "
        "not exceed the number of tablet servers.",
        Support.IMPLEMENTED,
        "The coordinator fills in 1 when unset (strom's default) and refuses a value above the number of "
        "tablet servers (InvalidReplicationFactorException, 17); a single-process server has one.",
        parse_int,
    ),
    _option(
        LOG_FORMAT, "Enum", "ARROW",
        "Record format of the log: ARROW, INDEXED or COMPACTED. A primary-key table with COMPACTED kv "
        "rows may use ARROW or COMPACTED.",
        Support.PARTIAL,
        "ARROW for every table, INDEXED and COMPACTED for log tables (`strom.records.row_log`). A "
        "primary-key table's changelog in another format than ARROW is refused: strom writes it as ARROW.",
        enum_parser(*_LOG_FORMATS),
    ),
    _option(
        ARROW_COMPRESSION_TYPE, "Enum", "ZSTD",
        "Body compression of ARROW log batches: NONE, LZ4_FRAME or ZSTD.",
        Support.IMPLEMENTED,
        "The server compresses a primary-key table's changelog with it (`strom.kv.row_format`), strom's "
        "client its appends (`strom.client.table`).",
        enum_parser("NONE", "LZ4_FRAME", "ZSTD"),
    ),
    _option(
        ZSTD_LEVEL, "Integer", "3",
        "ZSTD level (1 to 22) of ARROW log batches compressed with ZSTD.",
        Support.IMPLEMENTED,
        "The level of the changelog's and strom's client's ZSTD frames (`strom.records.arrow_compression`). "
        "It trades CPU for size; every reader decompresses any level.",
        parse_int,
    ),
    _option(
        KV_FORMAT, "Enum", "COMPACTED",
        "Row format of a primary-key table's stored values: COMPACTED or INDEXED.",
        Support.IMPLEMENTED,
        "`strom.kv.row_format` (stored rows), `strom.client.table` (rows strom's client writes).",
        enum_parser(*_KV_FORMATS),
    ),
    _option(
        KV_FORMAT_VERSION, "Integer", None,
        "How keys are encoded when a lake format is set (1: the lake's encoder for every key; 2: Fluss's "
        "own encoder for a primary key that differs from the bucket key). New primary-key tables get the "
        "current version, 2; a higher one is refused.",
        Support.IMPLEMENTED,
        "Filled in as 2 for new primary-key tables, a value above 2 refused (Fluss's message). strom "
        "encodes keys as version 2, which for every key layout strom allows is also version 1 "
        "(`strom.records.keys`).",
        parse_int,
    ),
    _option(
        STANDBY_REPLICA, "Boolean", None,
        "Whether followers of a primary-key table keep recent KV snapshots for a fast leader change; Fluss "
        "sets it for new primary-key tables.",
        Support.IMPLEMENTED,
        "Every follower of the table keeps its RocksDB warm, applying the changelog it replicates as it "
        "becomes committed, and leads with it after a failover: no snapshot download, no replay from the "
        "last snapshot (docs/cluster.md, \"Standby replicas\"). Set at creation or by AlterTable (followers "
        "open or drop the state at once). Fluss names one follower the standby and, at its HEAD, does not "
        "keep its state yet; strom keeps every follower warm, so whichever the election picks serves at "
        "once. Off unless set: strom does not fill it in for new primary-key tables, as a warm follower "
        "costs each write's apply again on every follower.",
        parse_bool,
    ),
    _option(
        AUTO_PARTITION_ENABLED, "Boolean", "false",
        "Whether the coordinator creates partitions ahead of time and drops expired ones for a partitioned "
        "table (by a time-valued partition key).",
        Support.IMPLEMENTED,
        "`strom.coordinator.auto_partitions`: at creation, when enabled by AlterTable and every "
        "`auto-partition.check.interval` the coordinator creates the current and upcoming partitions and "
        "drops expired ones (their local data, KV snapshots and remote log files; a lake copy stays, read "
        "by Spark's union read). Partitions created by hand must have the time unit's format and not be "
        "expired (InvalidPartitionException). docs/auto-partitioning.md.",
        parse_bool,
    ),
    _option(
        AUTO_PARTITION_KEY, "String", None,
        "Which partition key is the time dimension of an auto-partitioned table with several partition keys.",
        Support.IMPLEMENTED,
        "Required with several partition keys (which then pre-create nothing: `num-precreate` must be 0); "
        "expiry compares that key's value.",
        parse_string,
    ),
    _option(
        AUTO_PARTITION_TIME_UNIT, "Enum", "DAY",
        "Granularity of auto-created partitions: YEAR, QUARTER, MONTH, DAY or HOUR.",
        Support.IMPLEMENTED,
        "Partition values yyyy, yyyyQ, yyyyMM, yyyyMMdd, yyyyMMddHH (`strom.metadata.auto_partition`).",
        enum_parser(*_TIME_UNITS),
    ),
    _option(
        AUTO_PARTITION_TIME_FORMAT, "String", None,
        "Date-time pattern of auto-created partition values (by default from the time unit, e.g. yyyyMMdd); "
        "Fluss also checks manually created partitions against it.",
        Support.IMPLEMENTED,
        "Fluss's rules: the unit's fields largest first at fixed widths (`yyyy-MM-dd` for DAY; `MM-yyyy`, "
        "`yyyy-M-dd` refused), literal text between them, values valid partition names; kept (and checked "
        "against) when auto-partitioning is off (`strom.metadata.partition_time_format`).",
        parse_string,
    ),
    _option(
        AUTO_PARTITION_TIME_ZONE, "String", "the server's time zone",
        "Time zone in which auto-created partitions are computed.",
        Support.IMPLEMENTED,
        "A region (Asia/Shanghai), UTC, or a fixed offset (+08:00); unset, the coordinator's local zone.",
        parse_string,
    ),
    _option(
        AUTO_PARTITION_PRECREATE, "Integer", "2",
        "How many future partitions each auto-partition check creates.",
        Support.IMPLEMENTED,
        "The current unit's partition and the next num-precreate - 1 (so 2: today and tomorrow).",
        parse_int,
    ),
    _option(
        AUTO_PARTITION_RETENTION, "Integer", "7",
        "How many past partitions an auto-partitioned table keeps.",
        Support.IMPLEMENTED,
        "Partitions whose time value sorts below the unit num-retention units back are dropped; a negative "
        "value keeps every partition.",
        parse_int,
    ),
    _option(
        LOG_TTL, "Duration", "7 d",
        "Log segments older than this are deleted; 0 ms keeps them.",
        Support.IMPLEMENTED,
        "Log retention (`strom.tablet.kv_snapshot_scheduler`): a primary-key table's changelog is kept "
        "from its oldest KV snapshot on. Unset, the server's `table.log.ttl` applies (default 7 d). Read "
        "at every retention check, so a value set by AlterTable applies from the next check on.",
        parse_table_duration,
    ),
    _option(
        TIERED_LOCAL_SEGMENTS, "Integer", "2",
        "With remote log tiering, how many log segments stay on local disk (more than 0).",
        Support.IMPLEMENTED,
        "Segments copied to remote storage are deleted locally but for the last N (a primary-key table's "
        "changelog also stays local from its oldest KV snapshot on, which recovery replays).",
        parse_int,
    ),
    _option(
        LOG_LOCAL_TTL, "Duration", None,
        "With remote log tiering, how long segments stay on local disk (unset: `table.log.ttl`); when both "
        "are positive it must not exceed `table.log.ttl`.",
        Support.IMPLEMENTED,
        "With remote log storage on (`remote.data.dir`), a segment copied there is deleted locally once "
        "older than this, whatever `table.log.tiered.local-segments` keeps (strom/tablet/remote_log_manager.py).",
        parse_table_duration,
    ),
    _option(
        DATALAKE_ENABLED, "Boolean", "false",
        "Whether the table is tiered into the lake.",
        Support.IMPLEMENTED,
        "The coordinator's lake tiering manager schedules the table (`strom.coordinator.lake_tiering`); see "
        "[tiering.md](tiering.md).",
        parse_bool,
    ),
    _option(
        DATALAKE_HISTORICAL_PARTITION, "Boolean", "false",
        "Lookups of expired partitions read the lake (auto-partitioned Paimon primary-key tables with one "
        "partition key only).",
        Support.IMPLEMENTED,
        "true needs Fluss's requirements (auto-partitioning, the lake enabled, `table.datalake.format` "
        "paimon, a primary key, one partition key), else it is refused at creation and by AlterTable with the "
        "list of unmet ones (InvalidConfigException, 39). The coordinator then keeps the system partition "
        "`__historical__` (the table's buckets and replication factor; it counts against "
        "`kv.leader-replica.memory-reserved` and `max.partition.num`): created with the table or when "
        "AlterTable turns the option on, dropped when it turns it off, re-made by the auto-partition check "
        "if missing; retention never drops it, CreatePartition and DropPartition of it are refused "
        "(InvalidPartitionException, 43), ListPartitionInfos hides it and GetMetadata resolves it "
        "(`strom.coordinator.service`). Lookups of expired partitions go to its buckets, whose tablet servers "
        "answer them from the Paimon lake table; see [auto-partitioning.md](auto-partitioning.md#the-historical-partition).",
        parse_bool,
    ),
    _option(
        DATALAKE_FORMAT, "Enum", None,
        "The lake format (Fluss: paimon, iceberg, hudi, lance), which also decides how keys are encoded and "
        "bucketed; unset, the cluster's `datalake.format`.",
        Support.PARTIAL,
        "Only the cluster's `datalake.format` (delta, iceberg, lance or paimon, strom's formats) is accepted; Iceberg "
        "and Paimon clusters set it on every new table (`strom.records.keys`, `strom.lake.format`).",
        enum_parser(*_LAKE_FORMATS),
    ),
    _option(
        DATALAKE_FRESHNESS, "Duration", "3 min",
        "How far the lake copy may lag behind the table; the tiering service schedules rounds by it.",
        Support.IMPLEMENTED,
        "`strom.coordinator.lake_tiering` (round schedule), `strom.tiering.driver`. Unset, the server's "
        "`table.datalake.freshness` applies.",
        parse_table_duration,
    ),
    _option(
        DATALAKE_AUTO_COMPACTION, "Boolean", "false",
        "Whether the tiering service compacts the lake table's files when it writes.",
        Support.NO_EFFECT,
        "Accepted, no effect: strom's tiering never compacts lake files; the lake table stays correct, "
        "only with more small files.",
        parse_bool,
    ),
    _option(
        DATALAKE_AUTO_EXPIRE_SNAPSHOT, "Boolean", "false",
        "Whether the tiering service expires old lake snapshots after it commits.",
        Support.IMPLEMENTED,
        "Iceberg lakes expire snapshots after each commit (`strom.lake.iceberg`); a Delta lake keeps its "
        "versions (no effect there).",
        parse_bool,
    ),
    _option(
        MERGE_ENGINE, "Enum", None,
        "How a primary-key table merges writes of one key: FIRST_ROW, VERSIONED or AGGREGATION (unset: the "
        "last write wins).",
        Support.IMPLEMENTED, "`strom.kv.merge`; see [merge-engines.md](merge-engines.md).",
        enum_parser("FIRST_ROW", "VERSIONED", "AGGREGATION"),
    ),
    _option(
        VERSION_COLUMN, "String", None,
        "The version column (INT, BIGINT, TIMESTAMP or TIMESTAMP_LTZ) of the VERSIONED merge engine.",
        Support.IMPLEMENTED, "`strom.kv.merge`; see [merge-engines.md](merge-engines.md).", parse_string,
    ),
    _option(
        DELETE_BEHAVIOR, "Enum", "ALLOW",
        "What a delete of a primary-key table does: ALLOW, IGNORE or DISABLE (IGNORE by default with a "
        "merge engine).",
        Support.IMPLEMENTED,
        "`strom.kv.merge`; set to IGNORE on new tables with a merge engine that leave it unset, as Fluss does.",
        enum_parser("ALLOW", "IGNORE", "DISABLE"),
    ),
    _option(
        AUTO_INCREMENT_CACHE_SIZE, "Long", "100000",
        "How many auto-increment ids a bucket reserves at a time.",
        Support.IMPLEMENTED,
        "`strom.kv.auto_increment` (which also refuses a value below 1); see [auto-increment.md](auto-increment.md).",
        parse_long,
    ),
    _option(
        CHANGELOG_IMAGE, "Enum", "FULL",
        "Changelog of a primary-key table: FULL (update-before and update-after) or WAL (no update-before).",
        Support.IMPLEMENTED, "`strom.kv.kv_tablet`.", enum_parser("FULL", "WAL"),
    ),
    _option(
        STATISTICS_COLUMNS, "String", None,
        "Columns whose min/max statistics log batches carry (`*` or a comma-separated list); log tables "
        "only.",
        Support.IMPLEMENTED,
        "Checked as Fluss does, at creation and by AlterTable against the table's current columns "
        "(refused for primary-key tables; listed columns must exist and have a supported type). strom's "
        "client, like the Java client, then appends V1 batches carrying the columns' min, max and null "
        "counts; the server stores and serves them as written (docs/log-formats.md).",
        parse_string,
    ),
)}
"""Every ``table.*`` option of Fluss, by key."""


def invalid_value(key: str, raw: str, reason: str = "") -> InvalidConfigError:
    """Fluss's error for a value that does not parse as its option's type (``reason``: what was expected)."""
    message = f"Invalid value for config '{key}'. Reason: Could not parse value '{raw}' for key '{key}'."
    return InvalidConfigError(f"{message} {reason}" if reason else message)


def parse_value(key: str, raw: str) -> Any:
    """The value of a known option.

    Raises:
        InvalidConfigError: it does not parse as the option's type.
    """
    try:
        return TABLE_OPTIONS[key].parse(raw)
    except ValueError as exc:
        raise invalid_value(key, raw, str(exc)) from None


def with_defaults(
    properties: Mapping[str, str], *, has_primary_key: bool, replication_factor: int = DEFAULT_REPLICATION_FACTOR,
) -> dict[str, str]:
    """A new table's properties with the options Fluss's coordinator fills in when they are unset: the
    replication factor (the server's ``default.replication.factor``), a primary-key table's kv format
    version, and IGNORE deletes with a merge engine.

    Raises:
        InvalidConfigError: a kv format version this server does not know.
    """
    completed = dict(properties)
    completed.setdefault(REPLICATION_FACTOR, str(replication_factor))
    if has_primary_key:
        if MERGE_ENGINE in completed and DELETE_BEHAVIOR not in completed:
            parse_value(MERGE_ENGINE, completed[MERGE_ENGINE])
            completed[DELETE_BEHAVIOR] = "IGNORE"
        raw_version = completed.setdefault(KV_FORMAT_VERSION, str(CURRENT_KV_FORMAT_VERSION))
        version = parse_value(KV_FORMAT_VERSION, raw_version)
        if version > CURRENT_KV_FORMAT_VERSION:
            raise InvalidConfigError(
                f"Unsupported kv format version {version}. "
                f"The maximum supported version is {CURRENT_KV_FORMAT_VERSION}."
            )
    return completed


def validate(
    properties: Mapping[str, str], schema: Schema, partition_keys: Collection[str], *, creating: bool
) -> None:
    """Check a table's ``table.*`` properties as Fluss does: known keys (new tables only: a stored table
    also holds the lake options the coordinator copied in), values of their type, and the rules between
    options. Merge engine, delete behaviour, auto-increment and lake format are checked elsewhere (module
    doc).

    Raises:
        InvalidConfigError: Fluss's message for an unknown key, a value that does not parse, or options
            that do not fit together; or strom's for a value strom refuses (see each option's ``in_strom``).
        InvalidTableError: Fluss's errors that are about the table rather than one option.
    """
    if creating:
        for key in properties:
            if key in TABLE_OPTIONS:
                continue
            if key.startswith(TABLE_OPTION_PREFIX):
                raise InvalidConfigError(
                    f"'{key}' is not a recognized Fluss table property in the current cluster version. "
                    "You may be using an older Fluss cluster that does not support this property."
                )
            raise InvalidConfigError(
                f"'{key}' is not a Fluss table property. Please use '.customProperty(..)' to set custom properties."
            )
    values = {key: parse_value(key, raw) for key, raw in properties.items() if key in TABLE_OPTIONS}
    has_primary_key = schema.has_primary_key

    if creating and REPLICATION_FACTOR not in values:
        raise InvalidConfigError(f"Missing required table property '{REPLICATION_FACTOR}'.")
    if values.get(REPLICATION_FACTOR, 1) <= 0:
        raise InvalidConfigError(f"'{REPLICATION_FACTOR}' must be greater than 0.")

    log_format = values.get(LOG_FORMAT, "ARROW")
    kv_format = values.get(KV_FORMAT, "COMPACTED")
    if has_primary_key and kv_format == "COMPACTED" and log_format not in ("ARROW", "COMPACTED"):
        raise InvalidConfigError(
            "Currently, Primary Key Table supports ARROW or COMPACTED log format when kv format is COMPACTED."
        )
    if has_primary_key and log_format != "ARROW":
        raise InvalidConfigError(
            f"{LOG_FORMAT}={log_format} is for log tables; strom writes a primary-key table's changelog as ARROW."
        )

    if ZSTD_LEVEL in values and not 1 <= values[ZSTD_LEVEL] <= 22:
        raise InvalidConfigError(
            f"Invalid ZSTD compression level: {values[ZSTD_LEVEL]}. Expected a value between 1 and 22."
        )

    if values.get(TIERED_LOCAL_SEGMENTS, 2) <= 0:
        raise InvalidConfigError(f"'{TIERED_LOCAL_SEGMENTS}' must be greater than 0.")
    local_ttl: timedelta | None = values.get(LOG_LOCAL_TTL)
    log_ttl: timedelta = values.get(LOG_TTL, timedelta(days=7))
    if local_ttl is not None and local_ttl > timedelta(0) and log_ttl > timedelta(0) and local_ttl > log_ttl:
        raise InvalidConfigError(f"'{LOG_LOCAL_TTL}' must be less than or equal to '{LOG_TTL}'.")

    if values.get(DATALAKE_HISTORICAL_PARTITION, False):
        _check_historical_partition(values, has_primary_key, len(partition_keys))
    _check_auto_partition(properties, partition_keys)
    _check_statistics(properties.get(STATISTICS_COLUMNS), schema)


def _check_historical_partition(values: Mapping[str, Any], has_primary_key: bool, partition_key_count: int) -> None:
    unmet = []
    if not values.get(AUTO_PARTITION_ENABLED, False):
        unmet.append(f"'{AUTO_PARTITION_ENABLED}' must be set to true")
    if not values.get(DATALAKE_ENABLED, False):
        unmet.append(f"'{DATALAKE_ENABLED}' must be set to true")
    lake_format = values.get(DATALAKE_FORMAT)
    if lake_format is None:
        unmet.append(f"'{DATALAKE_FORMAT}' must be set to 'paimon' (currently not set)")
    elif lake_format != "PAIMON":
        unmet.append(f"'{DATALAKE_FORMAT}' must be set to 'paimon' (currently '{lake_format.lower()}')")
    if not has_primary_key:
        unmet.append("the table must define a primary key")
    if partition_key_count != 1:
        unmet.append(f"the table must define exactly one partition key (found {partition_key_count})")
    if unmet:
        raise InvalidConfigError(f"'{DATALAKE_HISTORICAL_PARTITION}' has unmet requirements: {'; '.join(unmet)}.")


def _check_auto_partition(properties: Mapping[str, str], partition_keys: Collection[str]) -> None:
    """Fluss's checks of the auto-partition options (a ``time-format`` that fits the time unit included)."""
    auto_partition.AutoPartitionStrategy.of(properties, list(partition_keys))


def _check_statistics(raw: str | None, schema: Schema) -> None:
    if raw is None:
        return
    if schema.has_primary_key:
        raise InvalidConfigError(
            "Statistics columns are not supported for primary key tables. "
            f"Please remove the '{STATISTICS_COLUMNS}' property."
        )
    names = named_columns(raw)
    if names is None:  # every supported column
        return
    if not names:
        raise InvalidConfigError(
            "Statistics columns configuration cannot be empty. Use '*' to collect statistics for all "
            "supported columns, or remove the property to disable statistics collection."
        )
    types = {column.name: column.data_type for column in schema.columns}
    for name in names:
        if name not in types:
            raise InvalidConfigError(
                f"Column '{name}' specified in statistics collection does not exist in table schema"
            )
        if types[name].type_root not in STATISTICS_TYPE_ROOTS:
            raise InvalidConfigError(
                f"Column '{name}' of type '{types[name]}' is not supported for statistics collection. "
                "Supported types are: BOOLEAN, TINYINT, SMALLINT, INTEGER, BIGINT, FLOAT, DOUBLE, STRING, "
                "CHAR, DECIMAL, DATE, TIME, TIMESTAMP, and TIMESTAMP_LTZ."
            )


SYSTEM_COLUMNS = ("__offset", "__timestamp", "__bucket", "_change_type", "_log_offset", "_commit_timestamp")
"""Column names Fluss reserves for its system columns (lake tables, changelog and binlog views)."""


def check_system_columns(column_names: Collection[str]) -> None:
    """Raises InvalidTableError (Fluss's message) if a column takes a reserved system column's name."""
    reserved = [name for name in column_names if name in SYSTEM_COLUMNS]
    if reserved:
        raise InvalidTableError(
            f"{', '.join(reserved)} cannot be used as column names, because they are reserved system columns "
            "in Fluss. Please use other names for these columns. The reserved system columns are: "
            f"{', '.join(SYSTEM_COLUMNS)}"
        )


def options_markdown(alterable: Collection[str]) -> str:
    """The table options reference page (``docs/table-options.md``); ``alterable``: the options AlterTable
    may change (the coordinator's list)."""
    lines = [
        "# Table options",
        "",
        "Generated from `strom/metadata/table_options.py` by `strom config table-docs`.",
        "",
        "A table's properties hold Fluss's `table.*` options, set when the table is created (pyfluss: "
        "`TableDescriptor(..., properties={...})`; Spark: `table.*` write options). Anything else belongs "
        "in its custom properties (pyfluss: `custom_properties={...}`), which the server keeps without "
        "reading them. As in Fluss, the coordinator refuses a new table whose properties hold",
        "",
        "- a key outside `table.`: InvalidConfigException (39), \"'KEY' is not a Fluss table property. "
        "Please use '.customProperty(..)' to set custom properties.\" (strom makes one exception: SQL-style "
        "`fields.<column>.agg` aggregation options are moved into the schema, see "
        "[merge-engines.md](merge-engines.md));",
        "- a `table.*` key Fluss does not define: InvalidConfigException (39), \"'KEY' is not a recognized "
        "Fluss table property in the current cluster version. …\";",
        "- a value that does not parse as the option's type: InvalidConfigException (39), \"Invalid value "
        "for config 'KEY'. Reason: Could not parse value 'VALUE' for key 'KEY'.\" followed by what was "
        "expected. Booleans are `true`/`false` and enums their names, both in any case; durations need a "
        "unit (`500 ms`, `10 min`, `7 d`); integers are 32-bit and `Long`s 64-bit;",
        "- options that do not fit together, with Fluss's message (e.g. a ZSTD level outside 1 to 22, a "
        "`table.log.local-ttl` above `table.log.ttl`, a merge engine on a log table).",
        "",
        "The coordinator fills in what Fluss's coordinator fills in when unset: `table.replication.factor` "
        "(1), and for primary-key tables `table.kv.format-version` (2) and, with a merge engine, "
        "`table.delete.behavior` (IGNORE). Columns may not take the names Fluss reserves for system columns "
        f"({', '.join(f'`{name}`' for name in SYSTEM_COLUMNS)}): InvalidTableException (15).",
        "",
        "strom's support: *implemented* options work as in Fluss; *accepted, no effect* options are about a "
        "Fluss subsystem strom does not have, are checked as Fluss checks them and change nothing; "
        "*partly: some values refused* options refuse the values strom cannot honour with "
        "InvalidConfigException (39), at creation and, for the options it may change, by AlterTable.",
        "",
        "| key | type | default | strom | what it does in strom |",
        "|---|---|---|---|---|",
    ]
    for key in sorted(TABLE_OPTIONS):
        option = TABLE_OPTIONS[key]
        default = "(none)" if option.default is None else option.default
        lines.append(
            f"| `{key}` | {option.type_name} | {default} | {option.support.value} | "
            f"{option.description} **strom:** {option.in_strom} |"
        )
    lines += [
        "",
        "## Changing options",
        "",
        "AlterTable (strom's `Admin.alter_table`, Fluss's Java client and SQL; pyfluss has no call for it) "
        "may set or reset these options (Fluss's alterable options, plus `table.datalake.format`, which may only name the cluster's format) "
        "and any custom property; other `table.*` options are fixed at creation (InvalidAlterTableException, "
        "56):",
        "",
        *[
            f"- `{key}` ({TABLE_OPTIONS[key].support.value})" if key in TABLE_OPTIONS else f"- `{key}`"
            for key in sorted(alterable)
        ],
        "",
        "The table's properties after the change are checked as a new table's are, so a bad value is "
        "refused with the same error as at creation and the table stays as it was (e.g. "
        "`table.datalake.historical-partition.enabled` = true with unmet requirements, or a "
        "`table.datalake.format` other than the cluster's), and `table.statistics.columns` is checked "
        "against the table's current columns. Turning `table.datalake.historical-partition.enabled` on "
        "creates the table's `__historical__` partition before the option is stored (refused with "
        "InsufficientKvLeaderReplicaCapacityException, 71, when its buckets do not fit), turning it off "
        "drops it. The hosted buckets serve the changed table at once: `table.log.ttl` "
        "applies from the next log retention check, lake changes reschedule tiering (see "
        "[lake-tiering-coordinator.md](lake-tiering-coordinator.md)); the *accepted, no effect* options "
        "are stored and shown by GetTableInfo, and change nothing.",
        "",
    ]
    return "\n".join(lines)
