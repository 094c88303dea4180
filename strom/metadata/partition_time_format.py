"""``table.auto-partition.time-format``: the date-time pattern of auto-partition values, as Fluss accepts
it (a Java ``DateTimeFormatter`` pattern, narrowed so that comparing values as strings compares times).

A pattern lists the time unit's fields from the largest to the smallest, each at its fixed width — year
``yyyy`` (or ``uuuu``), quarter ``Q`` (or ``q``), month ``MM`` (``LL``), day ``dd``, hour ``HH`` — with
literal text between them: any character that is not an ASCII letter, or letters in single quotes (``''``
is a quote). Optional sections (``[`` ``]``) and other fields are refused, and a value the pattern makes
must be a valid partition name (ASCII letters, digits, ``_`` and ``-``, at most 200 characters, no ``__``
prefix). Without the option a unit's pattern is Fluss's default: ``yyyy``, ``yyyyQ``, ``yyyyMM``,
``yyyyMMdd``, ``yyyyMMddHH``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime

from strom.errors import InvalidConfigError
from strom.metadata.table_info import partition_value_problem

YEAR, QUARTER, MONTH, DAY, HOUR = "year", "quarter", "month", "day", "hour"
_FIELDS = {"y": YEAR, "u": YEAR, "Q": QUARTER, "q": QUARTER, "M": MONTH, "L": MONTH, "d": DAY, "H": HOUR}
_WIDTHS = {YEAR: 4, QUARTER: 1, MONTH: 2, DAY: 2, HOUR: 2}
_VALUE_PATTERNS = {YEAR: r"(\d{4})", QUARTER: r"([1-4])", MONTH: r"(0[1-9]|1[0-2])", DAY: r"(0[1-9]|[12]\d|3[01])",
                   HOUR: r"([01]\d|2[0-3])"}
UNIT_FIELDS = {
    "YEAR": (YEAR,), "QUARTER": (YEAR, QUARTER), "MONTH": (YEAR, MONTH), "DAY": (YEAR, MONTH, DAY),
    "HOUR": (YEAR, MONTH, DAY, HOUR),
}
"""The fields each time unit's values hold, largest first."""
DEFAULT_PATTERNS = {"YEAR": "yyyy", "QUARTER": "yyyyQ", "MONTH": "yyyyMM", "DAY": "yyyyMMdd", "HOUR": "yyyyMMddHH"}
_REPRESENTATIVE = datetime(2024, 11, 11, 11)
"""The time whose value a new pattern must make a valid partition name of (Fluss's check)."""

Part = tuple[str, str]
"""("field", name) or ("text", literal)."""


def _tokens(pattern: str) -> list[Part]:
    """The pattern's fields and literal texts (InvalidConfigError with Fluss's message where it refuses)."""
    parts: list[Part] = []
    quoted = False
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "'":
            if index + 1 < len(pattern) and pattern[index + 1] == "'":
                parts.append(("text", "'"))
                index += 2
            else:
                quoted = not quoted
                index += 1
            continue
        if not quoted and char in "[]":
            raise InvalidConfigError(f"Time format '{pattern}' must not contain optional sections ('[' or ']').")
        if quoted or not char.isascii() or not char.isalpha():
            parts.append(("text", char))
            index += 1
            continue
        end = index + 1
        while end < len(pattern) and pattern[end] == char:
            end += 1
        field = _FIELDS.get(char)
        if field is None:
            raise InvalidConfigError(f"Time format '{pattern}' contains unsupported time field '{char}'.")
        if end - index != _WIDTHS[field]:
            raise InvalidConfigError(
                f"Time field '{field}' in format '{pattern}' must have fixed width {_WIDTHS[field]}, but found "
                f"{end - index}."
            )
        parts.append(("field", field))
        index = end
    if quoted:
        raise InvalidConfigError(f"Invalid date-time format pattern '{pattern}': an unclosed quote.")
    return parts


@dataclass(frozen=True)
class PartitionTimeFormat:
    """The values of one time unit under one pattern: formatting a time, recognising a value."""

    pattern: str
    unit: str
    parts: tuple[Part, ...]

    @classmethod
    def of(cls, unit: str, pattern: str | None = None) -> PartitionTimeFormat:
        """The unit's format (``pattern``, or Fluss's default for the unit).

        Raises:
            InvalidConfigError: a pattern Fluss refuses for the unit (see the module docstring).
        """
        text = DEFAULT_PATTERNS[unit] if pattern is None else pattern
        parts = tuple(_tokens(text))
        found = [name for kind, name in parts if kind == "field"]
        expected = list(UNIT_FIELDS[unit])
        if found != expected:
            raise InvalidConfigError(
                f"Time format '{text}' must contain fields {expected} in this order for time unit '{unit}', but "
                f"found {found}."
            )
        time_format = cls(text, unit, parts)
        if pattern is not None:
            value = time_format.format(_REPRESENTATIVE.year, _REPRESENTATIVE.month, _REPRESENTATIVE.day,
                                       _REPRESENTATIVE.hour)
            problem = partition_value_problem(value)
            if problem:
                raise InvalidConfigError(f"Time format '{text}' generates invalid partition value '{value}': {problem}.")
        return time_format

    def format(self, year: int, month: int = 1, day: int = 1, hour: int = 0) -> str:
        values = {YEAR: f"{year:04d}", QUARTER: str((month - 1) // 3 + 1), MONTH: f"{month:02d}", DAY: f"{day:02d}",
                  HOUR: f"{hour:02d}"}
        return "".join(values[name] if kind == "field" else name for kind, name in self.parts)

    def matches(self, value: str) -> bool:
        """Whether ``value`` is a value of this format (a real date where it has a day)."""
        regex = "".join(_VALUE_PATTERNS[name] if kind == "field" else re.escape(name) for kind, name in self.parts)
        found = re.fullmatch(regex, value)
        if found is None:
            return False
        fields = dict(zip((name for kind, name in self.parts if kind == "field"), found.groups(), strict=True))
        if DAY in fields:
            try:
                date(int(fields[YEAR]), int(fields[MONTH]), int(fields[DAY]))
            except ValueError:
                return False
        return True


__all__ = ["DEFAULT_PATTERNS", "UNIT_FIELDS", "PartitionTimeFormat"]
