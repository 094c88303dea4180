"""Seeded random Fluss types and values (internal representation) for property tests."""

from __future__ import annotations

import random
import struct
from decimal import Context, Decimal
from typing import Any

from strom.records.types import (
    ArrayType,
    BigIntType,
    BinaryType,
    BooleanType,
    BytesType,
    CharType,
    DataField,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntType,
    MapType,
    RowType,
    SmallIntType,
    StringType,
    TimestampLtzType,
    TimestampType,
    TimeType,
    TinyIntType,
)

# Characters of 1, 2, 3 and 4 UTF-8 bytes, so string byte lengths cross the 7-byte inline limit
# at odd places.
_ALPHABET = "abcXYZ019 _-éßΩ漢字€😀"
_DECIMAL_PRECISIONS = (1, 5, 18, 19, 38)
_TIMESTAMP_PRECISIONS = (0, 3, 6, 9, 1, 4, 7)
_WIDE = Context(prec=100)
_UNIT_RANGE = {0: 1 << 33, 3: 1 << 43, 6: 1 << 53, 9: 1 << 62}


def leaf_types(rng: random.Random) -> list[DataType]:
    p = rng.choice(_DECIMAL_PRECISIONS)
    return [
        BooleanType(),
        TinyIntType(),
        SmallIntType(),
        IntType(),
        BigIntType(),
        FloatType(),
        DoubleType(),
        CharType(rng.randint(1, 10)),
        StringType(),
        DecimalType(p, rng.randint(0, p)),
        DateType(),
        TimeType(rng.randint(0, 9)),
        TimestampType(rng.choice(_TIMESTAMP_PRECISIONS)),
        TimestampLtzType(rng.choice(_TIMESTAMP_PRECISIONS)),
        BytesType(),
        BinaryType(rng.randint(1, 12)),
    ]


def random_type(rng: random.Random, depth: int = 0, depth_max: int = 3) -> DataType:
    nullable = rng.random() < 0.7
    if depth < depth_max and rng.random() < 0.35:
        kind = rng.choice(("array", "map", "row"))
        if kind == "array":
            return ArrayType(random_type(rng, depth + 1, depth_max), nullable=nullable)
        if kind == "map":
            key = random_type(rng, depth + 1, depth_max)
            return MapType(key, random_type(rng, depth + 1, depth_max), nullable=nullable)
        return random_row_type(rng, depth + 1, depth_max, nullable=nullable)
    return rng.choice(leaf_types(rng)).copy(nullable)


def random_row_type(
    rng: random.Random, depth: int = 0, depth_max: int = 3, nullable: bool = True, fields_max: int = 8
) -> RowType:
    count = rng.randint(1, fields_max)
    fields = tuple(DataField(f"f{i}", random_type(rng, depth, depth_max)) for i in range(count))
    return RowType(fields, nullable=nullable)


def _float32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(length))


def _timestamp(rng: random.Random, precision: int) -> int:
    if precision == 0:
        bound = _UNIT_RANGE[0]
    elif precision <= 3:
        bound = _UNIT_RANGE[3]
    elif precision <= 6:
        bound = _UNIT_RANGE[6]
    else:
        bound = _UNIT_RANGE[9]
    return rng.choice((0, -1, 1, rng.randrange(-bound, bound), rng.randrange(-1000, 1000)))


def _time(rng: random.Random, precision: int) -> int:
    millis = rng.randrange(0, 86_400_000)
    if precision == 0:
        return millis // 1000
    if precision <= 3:
        return millis
    if precision <= 6:
        return millis * 1000
    return millis * 1_000_000


def random_value(rng: random.Random, t: DataType, null_rate: float = 0.2) -> Any:
    """A value of ``t`` in the codecs' internal representation; None only if nullable."""
    if t.nullable and rng.random() < null_rate:
        return None
    if isinstance(t, BooleanType):
        return rng.random() < 0.5
    if isinstance(t, TinyIntType):
        return rng.choice((-128, 127, 0, rng.randint(-128, 127)))
    if isinstance(t, SmallIntType):
        return rng.choice((-32768, 32767, rng.randint(-32768, 32767)))
    if isinstance(t, IntType):
        return rng.choice((-(2**31), 2**31 - 1, -1, 0, 127, 128, rng.randint(-(2**31), 2**31 - 1)))
    if isinstance(t, BigIntType):
        return rng.choice((-(2**63), 2**63 - 1, -1, 0, 300, rng.randint(-(2**63), 2**63 - 1)))
    if isinstance(t, FloatType):
        return _float32(rng.uniform(-1e30, 1e30) * rng.choice((1.0, 1e-30)))
    if isinstance(t, DoubleType):
        return rng.choice((0.0, -1.5, rng.uniform(-1e300, 1e300), rng.random()))
    if isinstance(t, CharType):
        return "".join(rng.choice("abcxyz") for _ in range(rng.randint(0, t.length)))
    if isinstance(t, StringType):
        return _text(rng, rng.randint(0, 20))
    if isinstance(t, DecimalType):
        bound = 10**t.precision
        unscaled = rng.choice((bound - 1, -(bound - 1), 0, rng.randrange(-bound + 1, bound)))
        return Decimal(unscaled).scaleb(-t.scale, _WIDE)
    if isinstance(t, DateType):
        return rng.randint(-200_000, 200_000)
    if isinstance(t, TimeType):
        return _time(rng, t.precision)
    if isinstance(t, (TimestampType, TimestampLtzType)):
        return _timestamp(rng, t.precision)
    if isinstance(t, BytesType):
        return rng.randbytes(rng.randint(0, 20))
    if isinstance(t, BinaryType):
        return rng.randbytes(t.length)
    if isinstance(t, ArrayType):
        return [random_value(rng, t.element, null_rate) for _ in range(rng.randint(0, 5))]
    if isinstance(t, MapType):
        return [
            (random_value(rng, t.key, 0), random_value(rng, t.value, null_rate))
            for _ in range(rng.randint(0, 4))
        ]
    if isinstance(t, RowType):
        return {f.name: random_value(rng, f.type, null_rate) for f in t.fields}
    raise TypeError(t)


def random_row(rng: random.Random, row_type: RowType, null_rate: float = 0.2) -> tuple[Any, ...]:
    return tuple(random_value(rng, f.type, null_rate) for f in row_type.fields)
