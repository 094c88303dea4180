"""Keys of tables whose lake format is Iceberg: the bytes Fluss's IcebergKeyEncoder writes, and buckets that
are exactly what Iceberg's own ``bucket[N]`` transform computes (pyiceberg's, an independent implementation)."""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg import types as iceberg
from pyiceberg.transforms import BucketTransform

from strom.errors import InvalidTableError
from strom.records import keys
from strom.records.iceberg_key import IcebergKeyEncoder
from strom.records.types import (
    BigIntType,
    BinaryType,
    BooleanType,
    BytesType,
    DataField,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntType,
    RowType,
    StringType,
    TimestampLtzType,
    TimestampType,
    TimeType,
)

LONG = struct.Struct("<q")


def _encoder(t: DataType) -> IcebergKeyEncoder:
    return IcebergKeyEncoder(RowType([DataField("v", t)]), [0])


@pytest.mark.parametrize(
    ("data_type", "value", "expected"),
    [
        (IntType(), 42, LONG.pack(42)),  # INT widens to a long
        (IntType(), -1, LONG.pack(-1)),
        (BigIntType(), 123456789012345, LONG.pack(123456789012345)),
        (DateType(), 19_000, LONG.pack(19_000)),
        (TimeType(3), 1_000, LONG.pack(1_000_000)),  # millis of the day -> micros
        (TimestampType(6), 1_000_500, LONG.pack(1_000_500)),  # micros stay micros
        (TimestampType(3), 2_000, LONG.pack(2_000_000)),
        (TimestampType(9), 1_000_500_999, LONG.pack(1_000_500)),  # nanos below a micro are dropped
        (DoubleType(), 1.5, struct.pack("<d", 1.5)),
        (StringType(), "hello", b"hello"),  # no length prefix
        (BytesType(), b"\x01\x02\x03", b"\x01\x02\x03"),
        (DecimalType(10, 2), decimal.Decimal("14.20"), (1420).to_bytes(2, "big", signed=True)),
        (DecimalType(10, 2), decimal.Decimal("-1.28"), (-128).to_bytes(1, "big", signed=True)),
    ],
)
def test_key_bytes_follow_iceberg_single_value_hashing(data_type: DataType, value: object, expected: bytes) -> None:
    assert _encoder(data_type).encode([value]) == expected


@pytest.mark.parametrize("data_type", [BooleanType(), TimestampLtzType(3)])
def test_types_iceberg_cannot_key_by_are_refused(data_type: DataType) -> None:
    with pytest.raises(InvalidTableError, match="cannot be the key"):
        _encoder(data_type)


def test_exactly_one_key_column() -> None:
    row_type = RowType([DataField("a", IntType()), DataField("b", StringType())])
    with pytest.raises(InvalidTableError, match="exactly one key column"):
        IcebergKeyEncoder(row_type, [0, 1])


def test_the_table_property_picks_the_encoding_and_the_bucket_function() -> None:
    row_type = RowType([DataField("id", BigIntType())])
    assert keys.key_lake_format({"table.datalake.format": "ICEBERG"}) == "iceberg"
    assert keys.key_lake_format({"table.datalake.format": "delta"}) is None
    assert keys.key_lake_format({}) is None
    assert isinstance(keys.key_encoder(row_type, [0], "iceberg"), IcebergKeyEncoder)
    assert keys.key_encoder(row_type, [0], None).encode([1]) != LONG.pack(1)  # CompactedRow's varint
    assert keys.bucket_function("iceberg") is not keys.bucket_function(None)


BUCKETS = st.integers(1, 1024)
EPOCH = datetime.date(1970, 1, 1)


def _iceberg_bucket(iceberg_type: iceberg.PrimitiveType, value: object, buckets: int) -> int:
    return BucketTransform(buckets).transform(iceberg_type)(value)  # type: ignore[no-any-return]


def _strom_bucket(data_type: DataType, value: object, buckets: int) -> int:
    return keys.bucket_function("iceberg")(_encoder(data_type).encode([value]), buckets)


@settings(max_examples=300)
@given(value=st.integers(-(2**31), 2**31 - 1), buckets=BUCKETS)
def test_int_buckets_match_iceberg(value: int, buckets: int) -> None:
    assert _strom_bucket(IntType(), value, buckets) == _iceberg_bucket(iceberg.IntegerType(), value, buckets)


@settings(max_examples=300)
@given(value=st.integers(-(2**63), 2**63 - 1), buckets=BUCKETS)
def test_bigint_buckets_match_iceberg(value: int, buckets: int) -> None:
    assert _strom_bucket(BigIntType(), value, buckets) == _iceberg_bucket(iceberg.LongType(), value, buckets)


@settings(max_examples=300)
@given(value=st.text(min_size=1), buckets=BUCKETS)
def test_string_buckets_match_iceberg(value: str, buckets: int) -> None:
    assert _strom_bucket(StringType(), value, buckets) == _iceberg_bucket(iceberg.StringType(), value, buckets)


@settings(max_examples=200)
@given(value=st.binary(min_size=1), buckets=BUCKETS)
def test_binary_buckets_match_iceberg(value: bytes, buckets: int) -> None:
    assert _strom_bucket(BytesType(), value, buckets) == _iceberg_bucket(iceberg.BinaryType(), value, buckets)
    fixed = BinaryType(len(value))
    assert _strom_bucket(fixed, value, buckets) == _iceberg_bucket(iceberg.FixedType(len(value)), value, buckets)


@settings(max_examples=200)
@given(days=st.integers(-700_000, 2_900_000), buckets=BUCKETS)
def test_date_buckets_match_iceberg(days: int, buckets: int) -> None:
    assert _strom_bucket(DateType(), days, buckets) == _iceberg_bucket(iceberg.DateType(), days, buckets)


@settings(max_examples=200)
@given(millis=st.integers(0, 86_399_999), buckets=BUCKETS)
def test_time_buckets_match_iceberg(millis: int, buckets: int) -> None:
    micros = millis * 1000
    assert _strom_bucket(TimeType(3), millis, buckets) == _iceberg_bucket(iceberg.TimeType(), micros, buckets)


@settings(max_examples=200)
@given(micros=st.integers(-(2**52), 2**52), buckets=BUCKETS)
def test_timestamp_buckets_match_iceberg(micros: int, buckets: int) -> None:
    expected = _iceberg_bucket(iceberg.TimestampType(), micros, buckets)
    assert _strom_bucket(TimestampType(6), micros, buckets) == expected


@settings(max_examples=300)
@given(
    unscaled=st.integers(-(10**18) + 1, 10**18 - 1) | st.integers(-(10**37) + 1, 10**37 - 1),
    scale=st.integers(0, 10),
    buckets=BUCKETS,
)
def test_decimal_buckets_match_iceberg(unscaled: int, scale: int, buckets: int) -> None:
    precision = 38 if abs(unscaled) >= 10**18 else 18
    value = decimal.Decimal(unscaled).scaleb(-scale, decimal.Context(prec=60))  # exact: no rounding
    expected = _iceberg_bucket(iceberg.DecimalType(precision, scale), value, buckets)
    assert _strom_bucket(DecimalType(precision, scale), value, buckets) == expected
