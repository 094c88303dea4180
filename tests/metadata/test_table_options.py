"""The table options registry: it covers every ``table.*`` option Fluss defines, parses values by Fluss's
rules, checks options against each other with Fluss's messages, and the committed docs page lists it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from strom.coordinator.service import ALTERABLE_TABLE_OPTIONS
from strom.errors import InvalidConfigError, InvalidTableError
from strom.metadata import table_options
from strom.metadata.table_options import TABLE_OPTIONS, Support
from strom.records.schema import Schema

FLUSS_OPTIONS_FILE = Path(__file__).with_name("fluss_table_options.txt")
REPO = Path(__file__).resolve().parents[2]

LOG_SCHEMA = Schema.from_arrow(pa.schema([("id", pa.int32()), ("tags", pa.list_(pa.string()))]))
PK_SCHEMA = Schema.from_arrow(pa.schema([pa.field("id", pa.int32(), nullable=False), ("v", pa.string())]), ["id"])


def fluss_option_keys() -> list[str]:
    lines = FLUSS_OPTIONS_FILE.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def validate(properties: dict[str, str], schema: Schema = PK_SCHEMA, partition_keys: tuple[str, ...] = ()) -> None:
    completed = table_options.with_defaults(properties, has_primary_key=schema.has_primary_key)
    table_options.validate(completed, schema, partition_keys, creating=True)


def test_the_registry_holds_exactly_the_options_fluss_defines() -> None:
    keys = fluss_option_keys()
    assert len(keys) == len(set(keys)) >= 29
    assert sorted(TABLE_OPTIONS) == sorted(keys)


def test_every_option_says_what_strom_does_with_it_and_its_default_parses() -> None:
    for key, option in TABLE_OPTIONS.items():
        assert option.description and option.in_strom, key
        assert option.type_name in ("Integer", "Long", "Boolean", "Duration", "String", "Enum"), key
        if option.default is not None and key != table_options.AUTO_PARTITION_TIME_ZONE:
            option.parse(option.default.replace(" ", ""))


@pytest.mark.parametrize(
    ("key", "raw", "parsed"),
    [
        ("table.log.ttl", "2 h", timedelta(hours=2)),
        ("table.log.ttl", "0ms", timedelta(0)),
        ("table.datalake.freshness", "30s", timedelta(seconds=30)),
        ("table.datalake.enabled", "TRUE", True),
        ("table.datalake.enabled", "False", False),
        ("table.kv.format", "indexed", "INDEXED"),
        ("table.merge-engine", "First_Row", "FIRST_ROW"),
        ("table.replication.factor", "+1", 1),
        ("table.auto-increment.cache-size", "9000000000", 9_000_000_000),
        ("table.statistics.columns", "a, b", "a, b"),
    ],
)
def test_values_parse_by_flusss_rules(key: str, raw: str, parsed: object) -> None:
    assert table_options.parse_value(key, raw) == parsed


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("table.log.ttl", "1000"),  # a duration needs a unit
        ("table.log.ttl", "-1 d"),
        ("table.log.ttl", "7 weeks"),
        ("table.datalake.enabled", "yes"),
        ("table.datalake.enabled", " true"),
        ("table.replication.factor", "1.0"),
        ("table.replication.factor", "3000000000"),  # beyond a 32-bit integer
        ("table.auto-increment.cache-size", "lots"),
        ("table.kv.format", "ROW"),
        ("table.changelog.image", "PARTIAL"),
    ],
)
def test_a_value_that_does_not_parse_gets_flusss_message(key: str, raw: str) -> None:
    with pytest.raises(InvalidConfigError) as failure:
        table_options.parse_value(key, raw)
    assert str(failure.value).startswith(
        f"Invalid value for config '{key}'. Reason: Could not parse value '{raw}' for key '{key}'."
    )


def test_unknown_keys_are_refused_with_flusss_two_messages() -> None:
    with pytest.raises(InvalidConfigError, match=r"^'table\.no\.such' is not a recognized Fluss table property"):
        validate({"table.no.such": "1"})
    with pytest.raises(InvalidConfigError, match=r"^'owner' is not a Fluss table property\. Please use"):
        validate({"owner": "qa"})


def test_defaults_are_filled_in_as_flusss_coordinator_does() -> None:
    assert table_options.with_defaults({}, has_primary_key=False) == {"table.replication.factor": "1"}
    assert table_options.with_defaults({"table.merge-engine": "first_row"}, has_primary_key=True) == {
        "table.replication.factor": "1",
        "table.merge-engine": "first_row",
        "table.delete.behavior": "IGNORE",
        "table.kv.format-version": "2",
    }
    with pytest.raises(InvalidConfigError, match=r"^Unsupported kv format version 3\. The maximum supported version is 2\."):
        table_options.with_defaults({"table.kv.format-version": "3"}, has_primary_key=True)


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"table.replication.factor": "0"}, "'table.replication.factor' must be greater than 0."),
        ({"table.log.arrow.compression.zstd.level": "23"}, "Invalid ZSTD compression level: 23. Expected a value"),
        ({"table.log.tiered.local-segments": "0"}, "'table.log.tiered.local-segments' must be greater than 0."),
        (
            {"table.log.ttl": "1 h", "table.log.local-ttl": "2 h"},
            "'table.log.local-ttl' must be less than or equal to 'table.log.ttl'.",
        ),
        ({"table.log.format": "INDEXED"}, "Currently, Primary Key Table supports ARROW or COMPACTED log format"),
        ({"table.log.format": "COMPACTED"}, "table.log.format=COMPACTED is for log tables"),
        ({"table.statistics.columns": "*"}, "Statistics columns are not supported for primary key tables."),
        (
            {"table.datalake.historical-partition.enabled": "true"},
            "'table.datalake.historical-partition.enabled' has unmet requirements: "
            "'table.auto-partition.enabled' must be set to true",
        ),
        ({"table.auto-partition.enabled": "true"}, "Currently, auto partition is only supported for partitioned"),
    ],
)
def test_options_that_do_not_fit_are_refused_with_flusss_message(properties: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError) as failure:
        validate(properties)
    assert str(failure.value).startswith(message), str(failure.value)


def test_options_that_fit_are_accepted() -> None:
    validate({
        "table.log.ttl": "2 h", "table.log.local-ttl": "1 h", "table.log.tiered.local-segments": "5",
        "table.log.arrow.compression.zstd.level": "9", "table.kv.standby-replica.enabled": "true",
        "table.datalake.auto-compaction": "true", "table.auto-partition.time-unit": "hour",
        "table.auto-partition.num-retention": "3", "table.log.format": "arrow", "table.kv.format": "indexed",
    })
    validate({"table.statistics.columns": "id", "table.log.format": "indexed"}, LOG_SCHEMA)
    validate({"table.log.local-ttl": "30 d", "table.log.ttl": "0 ms"})  # a ttl of 0 keeps the log: no bound


AUTO_SCHEMA = Schema.from_arrow(pa.schema([("id", pa.int32()), ("region", pa.string()), ("day", pa.string())]))


def test_auto_partitioned_tables_are_checked_as_fluss_checks_them() -> None:
    validate({"table.auto-partition.enabled": "true"}, AUTO_SCHEMA, ("day",))
    validate({"table.auto-partition.enabled": "true", "table.auto-partition.key": "day",
              "table.auto-partition.num-precreate": "0", "table.auto-partition.time-zone": "Asia/Shanghai"},
             AUTO_SCHEMA, ("region", "day"))
    validate({"table.auto-partition.enabled": "true", "table.auto-partition.time-unit": "hour",
              "table.auto-partition.time-format": "yyyyMMddHH", "table.auto-partition.time-zone": "+08:00"},
             AUTO_SCHEMA, ("day",))
    validate({"table.auto-partition.enabled": "true", "table.auto-partition.time-format": "yyyy-MM-dd"},
             AUTO_SCHEMA, ("day",))
    validate({"table.auto-partition.enabled": "true", "table.auto-partition.time-unit": "quarter",
              "table.auto-partition.time-format": "yyyy'_q'Q"}, AUTO_SCHEMA, ("day",))
    cases = [
        ({"table.auto-partition.enabled": "true"}, ("region", "day"), InvalidTableError,
         "must set one auto partition key when it has multiple partition keys"),
        ({"table.auto-partition.enabled": "true", "table.auto-partition.key": "id",
          "table.auto-partition.num-precreate": "0"}, ("region", "day"), InvalidTableError,
         r"Your key 'id' is not in key list \['region', 'day'\]"),
        ({"table.auto-partition.enabled": "true", "table.auto-partition.key": "day"}, ("region", "day"),
         InvalidTableError, "auto pre-create is unsupported and this value must be set to 0, but is 2"),
        ({"table.auto-partition.enabled": "true", "table.auto-partition.time-zone": "Mars/Olympus"}, ("day",),
         InvalidConfigError, "not a known time zone"),
        ({"table.auto-partition.enabled": "true", "table.auto-partition.time-format": "MM-yyyy-dd"}, ("day",),
         InvalidConfigError, r"must contain fields \['year', 'month', 'day'\] in this order"),
        ({"table.auto-partition.enabled": "true", "table.auto-partition.time-format": "yyyy-M-dd"}, ("day",),
         InvalidConfigError, "must have fixed width 2, but found 1"),
        ({"table.auto-partition.enabled": "true", "table.auto-partition.time-format": "yyyy[MM]dd"}, ("day",),
         InvalidConfigError, "must not contain optional sections"),
        ({"table.auto-partition.enabled": "true", "table.auto-partition.time-format": "yyyy/MM/dd"}, ("day",),
         InvalidConfigError, "generates invalid partition value '2024/11/11'"),
        ({"table.auto-partition.enabled": "true", "table.auto-partition.time-format": "yyyyMMddmm"}, ("day",),
         InvalidConfigError, "unsupported time field 'm'"),
    ]
    for properties, partition_keys, error, message in cases:
        with pytest.raises(error, match=message):
            validate(properties, AUTO_SCHEMA, partition_keys)


def test_statistics_columns_are_checked_against_the_log_tables_schema() -> None:
    with pytest.raises(InvalidConfigError, match=r"^Column 'nope' specified in statistics collection does not exist"):
        validate({"table.statistics.columns": "id,nope"}, LOG_SCHEMA)
    with pytest.raises(InvalidConfigError, match=r"^Column 'tags' of type .* is not supported for statistics"):
        validate({"table.statistics.columns": "tags"}, LOG_SCHEMA)
    with pytest.raises(InvalidConfigError, match=r"^Statistics columns configuration cannot be empty"):
        validate({"table.statistics.columns": " , "}, LOG_SCHEMA)


def test_reserved_system_column_names_are_refused() -> None:
    with pytest.raises(InvalidTableError, match=r"^__offset, _change_type cannot be used as column names"):
        table_options.check_system_columns(["id", "__offset", "_change_type"])


def test_the_docs_page_lists_every_option_with_type_default_and_support() -> None:
    page = (REPO / "docs" / "table-options.md").read_text()
    generated = table_options.options_markdown(ALTERABLE_TABLE_OPTIONS)
    rows = [line for line in generated.splitlines() if line.startswith("| `")]
    assert len(rows) == len(TABLE_OPTIONS)
    for row in rows:
        assert row in page, f"run `strom config table-docs > docs/table-options.md`: {row[:60]}"
    assert {option.support for option in TABLE_OPTIONS.values()} == set(Support)


FLUSS_ALTERABLE_OPTIONS = {
    "table.datalake.enabled",
    "table.datalake.historical-partition.enabled",
    "table.datalake.freshness",
    "table.datalake.auto-compaction",
    "table.log.ttl",
    "table.log.tiered.local-segments",
    "table.log.local-ttl",
    "table.auto-partition.enabled",
    "table.auto-partition.num-retention",
    "table.auto-partition.num-precreate",
    "table.statistics.columns",
    "table.kv.standby-replica.enabled",
}
"""Fluss's ``FlussConfigUtils.ALTERABLE_TABLE_OPTIONS``."""


def test_alter_table_may_change_the_options_fluss_lets_users_alter_and_the_lake_format() -> None:
    assert FLUSS_ALTERABLE_OPTIONS | {table_options.DATALAKE_FORMAT} == ALTERABLE_TABLE_OPTIONS
    assert TABLE_OPTIONS.keys() >= ALTERABLE_TABLE_OPTIONS
    page = (REPO / "docs" / "table-options.md").read_text()
    changing = page[page.index("## Changing options"):]
    for key in ALTERABLE_TABLE_OPTIONS:
        assert f"- `{key}` ({TABLE_OPTIONS[key].support.value})" in changing, key


HISTORICAL_SCHEMA = Schema.from_arrow(
    pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("day", pa.string(), nullable=False)]), ["id", "day"])
HISTORICAL_READY = {"table.datalake.historical-partition.enabled": "true", "table.auto-partition.enabled": "true",
                    "table.datalake.enabled": "true", "table.datalake.format": "paimon"}


def test_historical_partitions_meeting_flusss_requirements_are_accepted() -> None:
    validate(HISTORICAL_READY, HISTORICAL_SCHEMA, ("day",))
    validate({**HISTORICAL_READY, "table.datalake.historical-partition.enabled": "false", "table.datalake.format": "iceberg"},
             HISTORICAL_SCHEMA, ("day",))


@pytest.mark.parametrize(
    ("changed", "schema", "partition_keys", "unmet"),
    [
        ({"table.auto-partition.enabled": "false"}, HISTORICAL_SCHEMA, ("day",),
         "'table.auto-partition.enabled' must be set to true"),
        ({"table.datalake.enabled": "false"}, HISTORICAL_SCHEMA, ("day",), "'table.datalake.enabled' must be set to true"),
        ({"table.datalake.format": "iceberg"}, HISTORICAL_SCHEMA, ("day",),
         "'table.datalake.format' must be set to 'paimon' (currently 'iceberg')"),
        ({"table.datalake.format": None}, HISTORICAL_SCHEMA, ("day",),
         "'table.datalake.format' must be set to 'paimon' (currently not set)"),
        ({}, Schema.from_arrow(pa.schema([("id", pa.int32()), ("day", pa.string())])), ("day",),
         "the table must define a primary key"),
    ],
)
def test_each_unmet_historical_partition_requirement_is_named(
    changed: dict[str, str | None], schema: Schema, partition_keys: tuple[str, ...], unmet: str,
) -> None:
    properties = {key: value for key, value in {**HISTORICAL_READY, **changed}.items() if value is not None}
    with pytest.raises(InvalidConfigError) as failure:
        validate(properties, schema, partition_keys)
    assert str(failure.value) == f"'table.datalake.historical-partition.enabled' has unmet requirements: {unmet}.", (
        str(failure.value))


def test_every_unmet_historical_partition_requirement_is_listed_at_once() -> None:
    schema = Schema.from_arrow(pa.schema([("id", pa.int32()), ("day", pa.string()), ("hour", pa.string())]))
    with pytest.raises(InvalidConfigError) as failure:
        validate({"table.datalake.historical-partition.enabled": "true"}, schema, ("day", "hour"))
    assert str(failure.value) == (
        "'table.datalake.historical-partition.enabled' has unmet requirements: "
        "'table.auto-partition.enabled' must be set to true; 'table.datalake.enabled' must be set to true; "
        "'table.datalake.format' must be set to 'paimon' (currently not set); the table must define a primary key; "
        "the table must define exactly one partition key (found 2)."
    )
