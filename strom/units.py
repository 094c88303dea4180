"""Fluss's syntax for durations (``10 min``) and memory sizes (``64mb``), shared by the server's options and
the tables' (Flink's ``TimeUtils`` and ``MemorySize`` labels)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

_DURATION = re.compile(r"^\s*(-?\d+)\s*([a-zµ]+)?\s*$", re.IGNORECASE)
_DURATION_UNITS_US = {
    # Fluss's (Flink's TimeUtils) labels: singular and plural forms of each unit
    1_000 * 86_400_000: ("d", "day", "days"),
    1_000 * 3_600_000: ("h", "hour", "hours"),
    1_000 * 60_000: ("m", "min", "mins", "minute", "minutes"),
    1_000 * 1_000: ("s", "sec", "secs", "second", "seconds"),
    1_000: ("ms", "milli", "millis", "millisecond", "milliseconds"),
    1: ("µs", "us", "micro", "micros", "microsecond", "microseconds"),
}
_DURATION_US = {label: size for size, labels in _DURATION_UNITS_US.items() for label in labels}
_DURATION_NANO_LABELS = ("ns", "nano", "nanos", "nanosecond", "nanoseconds")
_MEMORY = re.compile(r"^\s*(\d+)\s*([a-z]+)?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {
    # Fluss's (Flink's MemorySize) labels
    1: ("b", "bytes"),
    1 << 10: ("k", "kb", "kib", "kibibytes"),
    1 << 20: ("m", "mb", "mib", "mebibytes"),
    1 << 30: ("g", "gb", "gib", "gibibytes"),
    1 << 40: ("t", "tb", "tib", "tebibytes"),
}
_MEMORY_BYTES = {label: size for size, labels in _MEMORY_UNITS.items() for label in labels}


def parse_duration(value: Any) -> timedelta:
    """Fluss duration syntax: ``500ms``, ``1s``, ``10 min``, ``2 hours``, ``7d``; a bare number is milliseconds.

    A negative value (``-1``) is accepted: options document what ``<= 0`` means for them.

    Raises:
        ValueError: not a whole number with a known unit.
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int):
        return timedelta(milliseconds=value)
    match = _DURATION.match(str(value))
    unit = match.group(2).lower() if match and match.group(2) else "ms"
    if not match or (unit not in _DURATION_US and unit not in _DURATION_NANO_LABELS):
        raise ValueError(f"not a duration: {value!r} (examples: 500ms, 1s, 10 min, 2h, 7d)")
    if unit in _DURATION_NANO_LABELS:
        return timedelta(microseconds=int(match.group(1)) / 1000)
    return timedelta(microseconds=int(match.group(1)) * _DURATION_US[unit])


def parse_memory_size(value: Any) -> int:
    """Fluss memory syntax: ``100mb``, ``8 kb``, ``1g``; a bare number is bytes.

    Raises:
        ValueError: not a non-negative whole number with a known unit.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a memory size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a memory size cannot be negative: {value}")
        return value
    match = _MEMORY.match(str(value))
    unit = match.group(2).lower() if match and match.group(2) else "b"
    if not match or unit not in _MEMORY_BYTES:
        raise ValueError(f"not a memory size: {value!r} (examples: 64kb, 100mb, 1gb)")
    return int(match.group(1)) * _MEMORY_BYTES[unit]


__all__ = ["parse_duration", "parse_memory_size"]
