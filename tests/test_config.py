"""Configuration: Fluss's duration and memory syntax, validation that names the key, the generated docs."""

from __future__ import annotations

from datetime import timedelta

import pytest

from strom.config import (
    ALL_OPTIONS,
    CONNECTION_MAX_IDLE_TIME,
    KV_ROCKSDB_BLOOM_FILTER_BITS_PER_KEY,
    KV_SNAPSHOT_INTERVAL,
    LOG_FLUSH_INTERVAL_MESSAGES,
    LOG_SEGMENT_FILE_SIZE,
    MAX_REQUEST_SIZE,
    METRICS_PORT,
    TABLE_LOG_TTL,
    Configuration,
    options_markdown,
    parse_duration,
    parse_memory_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500", timedelta(milliseconds=500)),
        ("500ms", timedelta(milliseconds=500)),
        ("500 milliseconds", timedelta(milliseconds=500)),
        ("1s", timedelta(seconds=1)),
        ("30 sec", timedelta(seconds=30)),
        ("30 seconds", timedelta(seconds=30)),
        ("10 min", timedelta(minutes=10)),
        ("10m", timedelta(minutes=10)),
        ("1 minute", timedelta(minutes=1)),
        ("2h", timedelta(hours=2)),
        ("2 hours", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1 day", timedelta(days=1)),
        ("250us", timedelta(microseconds=250)),
        ("3000ns", timedelta(microseconds=3)),
        ("  5 MIN  ", timedelta(minutes=5)),
        ("0s", timedelta(0)),
        ("-1", timedelta(milliseconds=-1)),
    ],
)
def test_durations_parse_in_every_unit_fluss_accepts(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_a_bare_integer_duration_is_milliseconds_and_a_timedelta_passes_through() -> None:
    assert parse_duration(1500) == timedelta(milliseconds=1500)
    assert parse_duration(timedelta(hours=1)) == timedelta(hours=1)


@pytest.mark.parametrize("text", ["", "ms", "1.5s", "10 fortnights", "1 s s", "ten minutes", True])
def test_malformed_durations_are_value_errors(text: object) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123", 123),
        ("64 bytes", 64),
        ("8kb", 8 << 10),
        ("8 KiB", 8 << 10),
        ("8k", 8 << 10),
        ("100mb", 100 << 20),
        ("100 mebibytes", 100 << 20),
        ("1g", 1 << 30),
        ("2 gb", 2 << 30),
        ("1tb", 1 << 40),
    ],
)
def test_memory_sizes_parse_in_every_unit_fluss_accepts(text: str, expected: int) -> None:
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["", "mb", "1.5mb", "-1", "12 parsecs", False, -5])
def test_malformed_memory_sizes_are_value_errors(text: object) -> None:
    with pytest.raises(ValueError):
        parse_memory_size(text)


def test_defaults_apply_until_a_value_is_set() -> None:
    config = Configuration()
    assert config.get(LOG_FLUSH_INTERVAL_MESSAGES) == 1
    assert config.get(MAX_REQUEST_SIZE) == 100 << 20
    assert config.get_ms(CONNECTION_MAX_IDLE_TIME) == 600_000
    custom = config.with_values({"netty.connection.max-idle-time": "2 hours", "log.segment.file-size": "64mb"})
    assert custom.get_ms(CONNECTION_MAX_IDLE_TIME) == 7_200_000
    assert custom.get(LOG_SEGMENT_FILE_SIZE) == 64 << 20
    assert config.get_ms(CONNECTION_MAX_IDLE_TIME) == 600_000  # with_values copies


def test_integers_from_yaml_or_strings_are_accepted() -> None:
    config = Configuration({"log.flush.interval-messages": " 10 ", "metrics.reporter.prometheus.port": 9250})
    assert config.get(LOG_FLUSH_INTERVAL_MESSAGES) == 10
    assert config.get(METRICS_PORT) == 9250


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("netty.connection.max-idle-time", "ten minutes", "not a duration"),
        ("log.segment.file-size", "huge", "not a memory size"),
        ("log.flush.interval-messages", "1.5", "not an integer"),
        ("log.flush.interval-messages", True, "not an integer"),
        ("log.flush.interval-messages", 2.5, "not an integer"),
        ("log.flush.interval-messages", "0", "below the minimum of 1"),
        ("server.max-inflight-requests-per-connection", "-3", "below the minimum of 1"),
        ("netty.server.max-request-size", "8 bytes", "below the minimum"),
        ("metrics.reporter.prometheus.port", "70000", "above the maximum of 65535"),
        ("default.bucket.number", "0", "below the minimum of 1"),
        ("kv.rocksdb.bloom-filter.bits-per-key", "many", "not a number"),
        ("kv.rocksdb.bloom-filter.bits-per-key", True, "not a number"),
        ("kv.rocksdb.bloom-filter.bits-per-key", "0.5", "below the minimum of 1.0"),
        ("kv.rocksdb.writebuffer.count", "1", "below the minimum of 2"),
        ("kv.rocksdb.compression.per.level", "LZ4,GZIP", "not a list of NO, SNAPPY, LZ4, ZSTD"),
        ("kv.rocksdb.compression.per.level", "", "not a list of"),
        ("kv.rocksdb.log.level", "LOUD", "not one of"),
        ("kv.rocksdb.compaction.style", "TIERED", "not one of"),
        ("kv.rocksdb.files.open", "-2", "below the minimum of -1"),
        ("kv.rocksdb.shared-rate-limiter.bytes-per-sec", "0", "below the minimum of 1"),
    ],
)
def test_a_bad_value_is_a_value_error_naming_the_key(key: str, value: object, problem: str) -> None:
    with pytest.raises(ValueError, match=f"invalid value for {key}: .*{problem}"):
        Configuration({key: value})


def test_the_kv_rocksdb_keys_have_flusss_names_and_defaults() -> None:
    defaults = {key: option.default for key, option in ALL_OPTIONS.items() if key.startswith("kv.rocksdb.")}
    assert defaults == {
        "kv.rocksdb.binding": "auto",  # strom's own
        "kv.rocksdb.mmap-reads": True,  # strom's own
        "kv.rocksdb.block.cache-size": 8 << 20,
        "kv.rocksdb.block.blocksize": 4 << 10,
        "kv.rocksdb.writebuffer.size": 64 << 20,
        "kv.rocksdb.writebuffer.count": 2,
        "kv.rocksdb.use-bloom-filter": True,
        "kv.rocksdb.bloom-filter.bits-per-key": 10.0,
        "kv.rocksdb.bloom-filter.block-based-mode": False,
        "kv.rocksdb.thread.num": 2,
        "kv.rocksdb.files.open": -1,
        "kv.rocksdb.log.max-file-size": 25 << 20,
        "kv.rocksdb.log.file-num": 4,
        "kv.rocksdb.log.dir": None,
        "kv.rocksdb.log.level": "info_level",
        "kv.rocksdb.write-batch-size": 2 << 20,
        "kv.rocksdb.shared-rate-limiter.bytes-per-sec": (1 << 63) - 1,
        "kv.rocksdb.compaction.style": "level",
        "kv.rocksdb.compaction.level.use-dynamic-size": False,
        "kv.rocksdb.compression.per.level": ("lz4", "lz4", "lz4", "lz4", "lz4", "zstd", "zstd"),
        "kv.rocksdb.compaction.level.target-file-size-base": 64 << 20,
        "kv.rocksdb.compaction.level.max-size-level-base": 256 << 20,
        "kv.rocksdb.writebuffer.number-to-merge": 1,
        "kv.rocksdb.block.metadata-blocksize": 4 << 10,
        "kv.rocksdb.block.cache-index-and-filter-blocks": False,
        "kv.rocksdb.block.cache-index-and-filter-blocks-with-high-priority": False,
        "kv.rocksdb.block.pin-l0-filter-and-index-blocks-in-cache": False,
        "kv.rocksdb.block.pin-top-level-index-and-filter": False,
    }
    # Fluss's spellings: upper-case enums, a comma-separated (or YAML) list
    config = Configuration({"kv.rocksdb.log.level": "HEADER_LEVEL", "kv.rocksdb.compaction.style": "UNIVERSAL",
                            "kv.rocksdb.compression.per.level": ["NO", "Zstd"]})
    assert config.get(ALL_OPTIONS["kv.rocksdb.log.level"]) == "header_level"
    assert config.get(ALL_OPTIONS["kv.rocksdb.compaction.style"]) == "universal"
    assert config.get(ALL_OPTIONS["kv.rocksdb.compression.per.level"]) == ("no", "zstd")
    # Fluss's FIFO would drop current rows of a primary-key table: refused with the reason
    with pytest.raises(ValueError, match="losing current rows"):
        Configuration({"kv.rocksdb.compaction.style": "FIFO"})


def test_floats_from_yaml_or_strings_are_accepted() -> None:
    config = Configuration({"kv.rocksdb.bloom-filter.bits-per-key": " 12.5 "})
    assert config.get(KV_ROCKSDB_BLOOM_FILTER_BITS_PER_KEY) == 12.5
    assert Configuration({"kv.rocksdb.bloom-filter.bits-per-key": 16}).get(KV_ROCKSDB_BLOOM_FILTER_BITS_PER_KEY) == 16.0


def test_unknown_keys_pass_through_unvalidated() -> None:
    config = Configuration({"table.custom.thing": "anything", "client.id": 3})
    assert config.to_dict() == {"table.custom.thing": "anything", "client.id": 3}


def test_negative_durations_stay_expressible_for_options_where_they_disable_something() -> None:
    config = Configuration({"table.log.ttl": "-1", "kv.snapshot.interval": "0s"})
    assert config.get(TABLE_LOG_TTL) <= timedelta(0)
    assert config.get(KV_SNAPSHOT_INTERVAL) == timedelta(0)


def test_every_default_is_valid_for_its_own_option() -> None:
    for key, option in ALL_OPTIONS.items():
        if option.default is not None:
            assert option.parse(option.default) == option.default, key


def test_the_generated_docs_list_every_option_once_with_type_and_default() -> None:
    page = options_markdown()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert len(rows) == len(ALL_OPTIONS)
    for key, option in ALL_OPTIONS.items():
        (row,) = [r for r in rows if r.startswith(f"| `{key}` |")]
        assert f"| {option.type_name} |" in row, row
        assert option.description in row, row
    assert "| `netty.server.max-request-size` | MemorySize | 100 mb |" in page
    assert "| `netty.connection.max-idle-time` | Duration | 10 min |" in page
    assert "| `table.log.ttl` | Duration | 7 d |" in page
    assert "| `log.flush.interval-messages` | Integer | 1 |" in page
    assert "| `advertised.host` | String | (none) |" in page
    assert [r.split("`")[1] for r in rows] == sorted(ALL_OPTIONS)


def test_the_committed_configuration_page_is_the_generated_one() -> None:
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    assert page.read_text() == options_markdown(), "run `strom config docs > docs/configuration.md`"


def test_dynamic_values_lie_over_the_initial_ones_and_tell_listeners_once_per_change() -> None:
    from strom.config import KV_SNAPSHOT_INTERVAL, DynamicConfig

    dynamic = DynamicConfig(Configuration({"kv.snapshot.interval": "0s", "bind.listeners": "x"}))
    seen: list[timedelta] = []
    dynamic.on_change(lambda config: seen.append(config.get(KV_SNAPSHOT_INTERVAL)))
    dynamic.on_change(lambda config: 1 / 0)  # a failing listener does not stop the others
    assert dynamic.set_dynamic({"kv.snapshot.interval": "2 min"})
    assert not dynamic.set_dynamic({"kv.snapshot.interval": "2 min"})
    assert dynamic.current.get(KV_SNAPSHOT_INTERVAL) == timedelta(minutes=2)
    assert dynamic.current.to_dict()["bind.listeners"] == "x"
    assert dynamic.set_dynamic({})
    assert seen == [timedelta(minutes=2), timedelta(0)]
    with pytest.raises(ValueError, match="not a dynamic option"):
        dynamic.set_dynamic({"bind.listeners": "y"})
    with pytest.raises(ValueError):
        dynamic.set_dynamic({"kv.snapshot.interval": "soon"})
    assert dynamic.dynamic == {} and len(seen) == 2, "a refused change changes nothing"
    payload = DynamicConfig.encode({"b": "2", "a": "1"})
    assert payload == b'{"a":"1","b":"2"}' and DynamicConfig.decode(payload) == {"a": "1", "b": "2"}
    assert DynamicConfig.decode(None) == {}


@pytest.mark.parametrize("name", ["hudi", "HUDI"])
def test_a_lake_format_fluss_has_and_strom_does_not_is_refused_with_the_reason(name: str) -> None:
    with pytest.raises(ValueError) as refused:
        Configuration({"datalake.format": name})
    message = str(refused.value)
    assert "is not one of delta, iceberg, lance, paimon" in message and "docs/lake.md" in message
    assert "only reads them" in message


def test_an_unknown_lake_format_is_refused_without_a_reason_it_does_not_have() -> None:
    with pytest.raises(ValueError, match=r"'orc' is not one of delta, iceberg, lance, paimon$"):
        Configuration({"datalake.format": "orc"})


def test_the_zookeeper_location_takes_its_root_from_the_address_else_from_zookeeper_path_root() -> None:
    from strom.config import zookeeper_location

    assert zookeeper_location(Configuration({})) is None
    assert zookeeper_location(Configuration({"zookeeper.address": "zk:2181"})) == "zk:2181/fluss"
    assert zookeeper_location(Configuration({"zookeeper.address": "a:1,b:2", "zookeeper.path.root": "/x/y/"})) == "a:1,b:2/x/y"
    assert zookeeper_location(Configuration({"zookeeper.address": "zk:2181/own", "zookeeper.path.root": "/x"})) == "zk:2181/own"
