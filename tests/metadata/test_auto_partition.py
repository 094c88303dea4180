"""Auto-partitioning's time rules: partition values per time unit and zone, retention, hand-made partitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from strom.errors import InvalidConfigError, PartitionSpecInvalidError
from strom.metadata.auto_partition import (
    AutoPartitionStrategy,
    AutoPartitionTimeUnit,
    is_partition_time,
    parse_time_zone,
    partition_time,
)

Unit = AutoPartitionTimeUnit


def ms(text: str, zone: str = "UTC") -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp() * 1000)


@pytest.mark.parametrize(("unit", "offset", "expected"), [
    (Unit.HOUR, 0, "2025123123"), (Unit.HOUR, 1, "2026010100"), (Unit.HOUR, -24, "2025123023"),
    (Unit.DAY, 0, "20251231"), (Unit.DAY, 1, "20260101"), (Unit.DAY, -366, "20241230"),
    (Unit.MONTH, 0, "202512"), (Unit.MONTH, 1, "202601"), (Unit.MONTH, -12, "202412"), (Unit.MONTH, -13, "202411"),
    (Unit.QUARTER, 0, "20254"), (Unit.QUARTER, 1, "20261"), (Unit.QUARTER, -4, "20244"), (Unit.QUARTER, -5, "20243"),
    (Unit.YEAR, 0, "2025"), (Unit.YEAR, 2, "2027"),
])
def test_partition_values_step_by_their_unit_across_year_ends(unit: Unit, offset: int, expected: str) -> None:
    assert partition_time(ms("2025-12-31T23:30:00"), offset, unit, UTC) == expected
    assert is_partition_time(expected, unit)


def test_the_time_zone_decides_which_day_it_is() -> None:
    now = ms("2025-05-08T20:00:00")  # UTC: already the 9th in Shanghai, still the 8th in New York
    assert partition_time(now, 0, Unit.DAY, ZoneInfo("Asia/Shanghai")) == "20250509"
    assert partition_time(now, 0, Unit.DAY, ZoneInfo("America/New_York")) == "20250508"
    assert partition_time(now, 0, Unit.HOUR, parse_time_zone("+08:00")) == "2025050904"
    assert partition_time(now, 0, Unit.HOUR, parse_time_zone("UTC-3")) == "2025050817"


def test_hours_are_exact_durations_across_a_dst_change() -> None:
    """Berlin skips 02:00 on 2025-03-30: one hour after 01:30 local is 03:30 local."""
    berlin = ZoneInfo("Europe/Berlin")
    now = ms("2025-03-30T01:30:00", "Europe/Berlin")
    assert [partition_time(now, offset, Unit.HOUR, berlin) for offset in range(3)] == [
        "2025033001", "2025033003", "2025033004"]
    assert partition_time(now, 1, Unit.DAY, berlin) == "20250331"


def test_time_zone_names_as_java_reads_them() -> None:
    assert parse_time_zone("UTC") is UTC and parse_time_zone("Z") is UTC
    assert parse_time_zone("GMT+05:30") == timezone(timedelta(hours=5, minutes=30))
    assert parse_time_zone("-0800") == timezone(timedelta(hours=-8))
    assert parse_time_zone("Asia/Shanghai") == ZoneInfo("Asia/Shanghai")
    for bad in ("Mars/Olympus", "+19:00", "", "../etc/passwd"):
        with pytest.raises(InvalidConfigError, match=r"time zone|offset out of range"):
            parse_time_zone(bad)


@pytest.mark.parametrize(("value", "unit", "ok"), [
    ("20250229", Unit.DAY, False), ("20240229", Unit.DAY, True), ("2025011", Unit.DAY, False),
    ("2025-01-01", Unit.DAY, False), ("2025010124", Unit.HOUR, False), ("2025013123", Unit.HOUR, True),
    ("202513", Unit.MONTH, False), ("20255", Unit.QUARTER, False), ("20250", Unit.QUARTER, False),
    ("25", Unit.YEAR, False), ("2025", Unit.YEAR, True),
])
def test_partition_values_must_have_the_units_form(value: str, unit: Unit, ok: bool) -> None:
    assert is_partition_time(value, unit) is ok


def strategy(**options: str) -> AutoPartitionStrategy:
    properties = {"table.auto-partition.enabled": "true", "table.auto-partition.time-zone": "UTC"}
    properties.update({f"table.auto-partition.{key.replace('_', '-')}": value for key, value in options.items()})
    return AutoPartitionStrategy.of(properties, ["day"])


def test_precreation_and_retention_bounds() -> None:
    now = ms("2025-05-08T12:00:00")
    day = strategy(num_precreate="3", num_retention="2")
    assert day.precreated(now) == ["20250508", "20250509", "20250510"]
    assert day.earliest_retained(now) == "20250506"
    assert strategy(num_retention="-1").earliest_retained(now) is None
    assert strategy(num_precreate="0").precreated(now) == [] == strategy(num_precreate="-1").precreated(now)


def test_a_hand_made_partition_must_fit_the_unit_and_not_be_expired() -> None:
    now = ms("2025-05-08T12:00:00")
    day = strategy(num_retention="2")
    day.check_new_partition({"day": "20250506"}, now)
    day.check_new_partition({"day": "20300101"}, now)  # far ahead is fine
    with pytest.raises(PartitionSpecInvalidError, match=r"'20250505' is out-of-date\. The earliest retained partition is '20250506'"):
        day.check_new_partition({"day": "20250505"}, now)
    with pytest.raises(PartitionSpecInvalidError, match="does not match the expected format 'yyyyMMdd'"):
        day.check_new_partition({"day": "today"}, now)
    strategy(num_retention="-1").check_new_partition({"day": "19700101"}, now)  # nothing expires
    AutoPartitionStrategy.of({}, ["day"]).check_new_partition({"day": "anything"}, now)  # not auto-partitioned


@pytest.mark.parametrize(("unit", "pattern", "offset", "expected"), [
    (Unit.DAY, "yyyy-MM-dd", 1, "2026-01-01"), (Unit.HOUR, "yyyy-MM-dd_HH", 0, "2025-12-31_23"),
    (Unit.MONTH, "yyyy-MM", -1, "2025-11"), (Unit.QUARTER, "yyyy'q'Q", 1, "2026q1"), (Unit.YEAR, "uuuu", 0, "2025"),
    (Unit.DAY, "'d'yyyyMMdd", 0, "d20251231"), (Unit.DAY, "yyyy''MM''dd", 0, "2025'12'31"),
])
def test_a_time_format_names_the_partitions_in_its_pattern(unit: Unit, pattern: str, offset: int, expected: str) -> None:
    from strom.metadata.partition_time_format import PartitionTimeFormat

    if "'" in expected:  # a quote in a value is no partition name: the pattern is refused at creation
        with pytest.raises(InvalidConfigError, match="generates invalid partition value"):
            PartitionTimeFormat.of(unit.name, pattern)
        return
    time_format = PartitionTimeFormat.of(unit.name, pattern)
    value = partition_time(ms("2025-12-31T23:30:00"), offset, unit, UTC, time_format)
    assert value == expected and time_format.matches(value)
    day = AutoPartitionStrategy.of({"table.auto-partition.enabled": "true", "table.auto-partition.time-unit": unit.name,
                                    "table.auto-partition.time-format": pattern, "table.auto-partition.time-zone": "UTC"},
                                   ["p"])
    assert day.partition_time(ms("2025-12-31T23:30:00"), offset) == expected


def test_values_of_a_time_format_sort_as_their_times_and_hand_made_ones_must_fit_it() -> None:
    """Fields largest first at fixed widths: comparing values as strings compares times, which retention
    relies on; a hand-made partition must have the format's shape (a real date), and the format keeps
    checking them when auto-partitioning is off, as in Fluss."""
    now = ms("2025-05-08T12:00:00")
    props = {"table.auto-partition.enabled": "true", "table.auto-partition.time-format": "yyyy-MM-dd",
             "table.auto-partition.num-retention": "2", "table.auto-partition.time-zone": "UTC"}
    day = AutoPartitionStrategy.of(props, ["day"])
    values = [day.partition_time(now, offset) for offset in range(-40, 40, 7)]
    assert values == sorted(values) and day.earliest_retained(now) == "2025-05-06"
    day.check_new_partition({"day": "2025-05-07"}, now)
    for wrong in ("20250507", "2025-02-30", "2025-5-07"):
        with pytest.raises(PartitionSpecInvalidError, match="does not match the expected format 'yyyy-MM-dd'"):
            day.check_new_partition({"day": wrong}, now)
    off = AutoPartitionStrategy.of({"table.auto-partition.time-format": "yyyy-MM-dd"}, ["day"])
    off.check_new_partition({"day": "1999-01-01"}, now)  # no retention without auto-partitioning
    with pytest.raises(PartitionSpecInvalidError):
        off.check_new_partition({"day": "19990101"}, now)
