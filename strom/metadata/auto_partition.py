"""Auto-partitioning rules: a table's strategy from its options, and the time value of its partitions.

Fluss's ``table.auto-partition.*`` options. A partitioned table with ``enabled`` has one time-valued
partition key (the only key, or the one ``key`` names); the coordinator creates the partitions of the
current time unit and the next ``num-precreate - 1`` ones and drops those whose time value sorts below the
unit ``num-retention`` units back (``AutoPartitionManager``). Values are formatted in the table's
``time-zone`` as Fluss formats them: ``yyyy`` (YEAR), ``yyyyQ`` (QUARTER: year and quarter digit, e.g.
``20253``), ``yyyyMM``, ``yyyyMMdd``, ``yyyyMMddHH``. These strings sort as the times they name, which is
what retention compares.

Pure functions of a clock reading, so tests drive them on a manual clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from enum import Enum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from strom.errors import InvalidConfigError, InvalidTableError, PartitionSpecInvalidError
from strom.metadata.partition_time_format import PartitionTimeFormat
from strom.table_properties import (
    AUTO_PARTITION_ENABLED,
    AUTO_PARTITION_KEY,
    AUTO_PARTITION_PRECREATE,
    AUTO_PARTITION_RETENTION,
    AUTO_PARTITION_TIME_FORMAT,
    AUTO_PARTITION_TIME_UNIT,
    AUTO_PARTITION_TIME_ZONE,
    TableProperties,
    parse_int,
)

ENABLED = AUTO_PARTITION_ENABLED
KEY = AUTO_PARTITION_KEY
TIME_UNIT = AUTO_PARTITION_TIME_UNIT
TIME_ZONE = AUTO_PARTITION_TIME_ZONE
TIME_FORMAT = AUTO_PARTITION_TIME_FORMAT
NUM_PRECREATE = AUTO_PARTITION_PRECREATE
NUM_RETENTION = AUTO_PARTITION_RETENTION
DEFAULT_NUM_PRECREATE = 2
DEFAULT_NUM_RETENTION = 7


class AutoPartitionTimeUnit(Enum):
    YEAR = "yyyy"
    QUARTER = "yyyyQ"
    MONTH = "yyyyMM"
    DAY = "yyyyMMdd"
    HOUR = "yyyyMMddHH"

    @property
    def pattern(self) -> str:
        """Fluss's date-time pattern of this unit's partition values."""
        return self.value


_VALUE_SHAPES = {
    AutoPartitionTimeUnit.YEAR: re.compile(r"\d{4}"),
    AutoPartitionTimeUnit.QUARTER: re.compile(r"\d{4}[1-4]"),
    AutoPartitionTimeUnit.MONTH: re.compile(r"\d{4}(0[1-9]|1[0-2])"),
    AutoPartitionTimeUnit.DAY: re.compile(r"\d{8}"),
    AutoPartitionTimeUnit.HOUR: re.compile(r"\d{8}([01]\d|2[0-3])"),
}
_OFFSET_ZONE = re.compile(r"(?:UTC|GMT)?([+-])(\d{1,2})(?::?(\d{2}))?")


def parse_time_zone(name: str) -> tzinfo:
    """A Java ``ZoneId`` name: a region (``Asia/Shanghai``), ``UTC``/``Z``/``GMT``, or a fixed offset
    (``+08:00``, ``UTC+8``, ``GMT-03:30``).

    Raises:
        InvalidConfigError: an unknown zone.
    """
    text = name.strip()
    if text.upper() in ("UTC", "Z", "GMT", "UT"):
        return UTC
    offset = _OFFSET_ZONE.fullmatch(text)
    if offset is not None:
        sign, hours, minutes = offset.group(1), int(offset.group(2)), int(offset.group(3) or 0)
        if hours > 18 or minutes > 59:
            raise InvalidConfigError(f"'{TIME_ZONE}' has an offset out of range: {name!r}.")
        delta = timedelta(hours=hours, minutes=minutes)
        return timezone(-delta if sign == "-" else delta)
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidConfigError(f"'{TIME_ZONE}' is not a known time zone: {name!r}.") from None


def server_time_zone() -> tzinfo:
    """The zone of a table without ``time-zone``: this server's local zone (Fluss: the JVM's default)."""
    local = datetime.now().astimezone().tzinfo
    assert local is not None
    return local


@dataclass(frozen=True, slots=True)
class AutoPartitionStrategy:
    enabled: bool
    time_unit: AutoPartitionTimeUnit
    time_key: str | None
    """The partition key holding the time value (None when not enabled)."""
    num_precreate: int
    num_retention: int
    """Units kept behind the current one; negative: never drop."""
    time_zone: tzinfo
    time_format: PartitionTimeFormat | None = None
    """``table.auto-partition.time-format`` (None: the unit's default pattern)."""

    @property
    def values(self) -> PartitionTimeFormat:
        """The format of this table's partition time values."""
        return self.time_format if self.time_format is not None else PartitionTimeFormat.of(self.time_unit.name)

    @classmethod
    def of(cls, properties: Mapping[str, str], partition_keys: Sequence[str]) -> AutoPartitionStrategy:
        """The strategy of a table's (already parsed and type-checked) options, checked as Fluss checks a
        new table.

        Raises:
            InvalidConfigError: auto-partitioning on an unpartitioned table, an unknown time zone.
            InvalidTableError: several partition keys without a valid ``key``, or with pre-creation.
        """
        options = TableProperties(properties)
        enabled = options.auto_partition_enabled
        unit = AutoPartitionTimeUnit[options.upper(TIME_UNIT, AutoPartitionTimeUnit.DAY.name)]
        precreate = options.parsed(NUM_PRECREATE, parse_int, DEFAULT_NUM_PRECREATE)
        retention = options.parsed(NUM_RETENTION, parse_int, DEFAULT_NUM_RETENTION)
        zone_name = properties.get(TIME_ZONE)
        zone = parse_time_zone(zone_name) if zone_name is not None else server_time_zone()
        key = properties.get(KEY)
        pattern = properties.get(TIME_FORMAT)
        time_format = PartitionTimeFormat.of(unit.name, pattern) if pattern is not None else None
        if not enabled:
            time_key = (key if key and key in partition_keys else partition_keys[0]) if partition_keys else None
            return cls(False, unit, time_key if time_format is not None else None, precreate, retention, zone,
                       time_format)
        if not partition_keys:
            raise InvalidConfigError(
                "Currently, auto partition is only supported for partitioned table, please set table property "
                f"'{ENABLED}' to false."
            )
        if len(partition_keys) > 1:
            if key is None or not key.strip():
                raise InvalidTableError(
                    "Currently, auto partitioned table must set one auto partition key when it has multiple "
                    f"partition keys. Please set table property '{KEY}'."
                )
            if key not in partition_keys:
                raise InvalidTableError(
                    "The specified key for auto partitioned table is not a partition key. "
                    f"Your key '{key}' is not in key list {list(partition_keys)}"
                )
            if precreate > 0:
                raise InvalidTableError(
                    "For a partitioned table with multiple partition keys, auto pre-create is unsupported and "
                    f"this value must be set to 0, but is {precreate}"
                )
            time_key = key
        else:
            if key is not None and key.strip() and key != partition_keys[0]:
                raise InvalidTableError(
                    "The specified key for auto partitioned table is not a partition key. "
                    f"Your key '{key}' is not in key list {list(partition_keys)}"
                )
            time_key = partition_keys[0]
        return cls(True, unit, time_key, precreate, retention, zone, time_format)

    def partition_time(self, now_ms: int, offset: int = 0) -> str:
        return partition_time(now_ms, offset, self.time_unit, self.time_zone, self.values)

    def precreated(self, now_ms: int) -> list[str]:
        """Time values of the partitions a check at ``now_ms`` makes sure exist, current unit first."""
        return [self.partition_time(now_ms, offset) for offset in range(self.num_precreate)]  # none if negative

    def earliest_retained(self, now_ms: int) -> str | None:
        """The lowest time value kept at ``now_ms`` (lower ones expire); None: nothing expires."""
        if self.num_retention < 0:
            return None
        return self.partition_time(now_ms, -self.num_retention)

    def check_new_partition(self, spec: Mapping[str, str], now_ms: int) -> None:
        """What Fluss checks of a partition created by hand on an auto-partitioned table (or one with a
        ``time-format``, kept when auto-partitioning is off): its time value has the table's format and, while
        auto-partitioning, is not already expired.

        Raises:
            PartitionSpecInvalidError: either is not so (Fluss's InvalidPartitionException, code 43).
        """
        if self.time_key is None or not (self.enabled or self.time_format is not None):
            return
        value = spec.get(self.time_key)
        if value is None or not self.values.matches(value):
            raise PartitionSpecInvalidError(
                f"Partition value '{value}' does not match the expected format '{self.values.pattern}' "
                f"for auto-partition time unit '{self.time_unit.name}'."
            )
        if not self.enabled:
            return
        earliest = self.earliest_retained(now_ms)
        if earliest is not None and value < earliest:
            raise PartitionSpecInvalidError(
                f"Partition value '{value}' is out-of-date. The earliest retained partition is '{earliest}'."
            )


def partition_time(now_ms: int, offset: int, unit: AutoPartitionTimeUnit, zone: tzinfo,
                   time_format: PartitionTimeFormat | None = None) -> str:
    """The partition value ``offset`` units from the one holding ``now_ms``, in ``zone`` (in the unit's
    default pattern unless ``time_format`` is given).

    Hours are exact durations (a DST change skips or repeats a local hour, as in Fluss); days, months,
    quarters and years step the local calendar.
    """
    values = time_format if time_format is not None else PartitionTimeFormat.of(unit.name)
    instant = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    if unit is AutoPartitionTimeUnit.HOUR:
        moment = (instant + timedelta(hours=offset)).astimezone(zone)
        return values.format(moment.year, moment.month, moment.day, moment.hour)
    local = instant.astimezone(zone)
    if unit is AutoPartitionTimeUnit.DAY:
        day = local.date() + timedelta(days=offset)
        return values.format(day.year, day.month, day.day)
    if unit is AutoPartitionTimeUnit.YEAR:
        return values.format(local.year + offset)
    months = local.year * 12 + (local.month - 1) + offset * (3 if unit is AutoPartitionTimeUnit.QUARTER else 1)
    year, month = divmod(months, 12)
    if unit is AutoPartitionTimeUnit.QUARTER:
        month -= month % 3  # the quarter's first month
    return values.format(year, month + 1)


def is_partition_time(value: str, unit: AutoPartitionTimeUnit) -> bool:
    """Whether ``value`` is a partition value of ``unit`` (a real date for DAY and HOUR)."""
    if _VALUE_SHAPES[unit].fullmatch(value) is None:
        return False
    if unit in (AutoPartitionTimeUnit.DAY, AutoPartitionTimeUnit.HOUR):
        try:
            date(int(value[:4]), int(value[4:6]), int(value[6:8]))
        except ValueError:
            return False
    return True


__all__ = [
    "AutoPartitionStrategy",
    "AutoPartitionTimeUnit",
    "is_partition_time",
    "parse_time_zone",
    "partition_time",
]
