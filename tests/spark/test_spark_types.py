"""Every Fluss type read through Spark (its Spark type and values), and written back through Spark."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from strom.records.types import (
    ArrayType,
    BigIntType,
    BinaryType,
    BooleanType,
    BytesType,
    CharType,
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
from tests.spark.support import Fluss
from tests.spark.test_spark_batch_read import load
from tests.spark.test_spark_write import save

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]

UTC = dt.UTC
COLUMNS = [
    ("id", IntType()),
    ("b", BooleanType()),
    ("ti", TinyIntType()),
    ("si", SmallIntType()),
    ("bi", BigIntType()),
    ("f", FloatType()),
    ("d", DoubleType()),
    ("c", CharType(3)),
    ("s", StringType()),
    ("dec", DecimalType(10, 2)),
    ("wide", DecimalType(38, 5)),
    ("day", DateType()),
    ("t0", TimeType(0)),
    ("t3", TimeType(3)),
    ("t9", TimeType(9)),
    ("ts3", TimestampType(3)),
    ("ts9", TimestampType(9)),
    ("ltz", TimestampLtzType(6)),
    ("raw", BytesType()),
    ("fixed", BinaryType(4)),
    ("ints", ArrayType(IntType())),
    ("times", ArrayType(TimeType(3))),
    ("tags", MapType(StringType(), BigIntType())),
    ("point", RowType.of(("x", IntType()), ("at", TimeType(6)))),
]
SPARK_TYPES = (
    "id:int,b:boolean,ti:tinyint,si:smallint,bi:bigint,f:float,d:double,c:string,s:string,dec:decimal(10,2),"
    "wide:decimal(38,5),day:date,t0:string,t3:string,t9:string,ts3:timestamp_ntz,ts9:timestamp_ntz,ltz:timestamp,"
    "raw:binary,fixed:binary,ints:array<int>,times:array<string>,tags:map<string,bigint>,"
    "point:struct<x:int,at:string>"
)
ROW = {
    "id": 1, "b": True, "ti": -8, "si": 300, "bi": 2**40, "f": 1.5, "d": 2.25, "c": "abc", "s": "héllo",
    "dec": Decimal("12345678.91"), "wide": Decimal("123456789012345678901234567890.12345"),
    "day": dt.date(2024, 2, 29), "t0": dt.time(1, 2, 3), "t3": dt.time(1, 2, 3, 456000),
    "t9": dt.time(23, 59, 59, 999999), "ts3": dt.datetime(2024, 1, 2, 3, 4, 5, 678000),
    "ts9": dt.datetime(2024, 1, 2, 3, 4, 5, 678901), "ltz": dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
    "raw": b"\x00\x01bytes", "fixed": b"abcd", "ints": [1, None, 3], "times": [dt.time(0, 0, 1, 5000)],
    "tags": [("a", 1), ("b", None)], "point": {"x": 7, "at": dt.time(12, 30, 0, 500000)},
}
EMPTY = {"id": 2} | {name: None for name, _type in COLUMNS[1:]}
EXPECTED = {
    "id": 1, "b": True, "ti": -8, "si": 300, "bi": 2**40, "f": 1.5, "d": 2.25, "c": "abc", "s": "héllo",
    "dec": Decimal("12345678.91"), "wide": Decimal("123456789012345678901234567890.12345"),
    "day": dt.date(2024, 2, 29), "t0": "01:02:03", "t3": "01:02:03.456", "t9": "23:59:59.999999000",
    "ts3": dt.datetime(2024, 1, 2, 3, 4, 5, 678000), "ts9": dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
    "ltz": dt.datetime(2024, 1, 2, 3, 4, 5, 6), "raw": bytearray(b"\x00\x01bytes"), "fixed": bytearray(b"abcd"),
    "ints": [1, None, 3], "times": ["00:00:01.005"], "tags": {"a": 1, "b": None}, "point": {"x": 7, "at": "12:30:00.500000"},
}


def as_plain(row: Any) -> dict[str, Any]:
    values = row.asDict(recursive=True)
    if values["ltz"] is not None:  # Spark hands TIMESTAMP values out as naive local times
        values["ltz"] = values["ltz"].astimezone(UTC).replace(tzinfo=None)
    return values


def test_every_type_reads_as_its_spark_type_and_writes_back(spark: Any, cluster: Fluss) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    source = cluster.create_table(COLUMNS, bucket_count=1)
    cluster.append(source, [ROW, EMPTY])

    frame = load(spark, cluster, source)
    assert frame.schema.simpleString() == f"struct<{SPARK_TYPES}>"
    rows = sorted((as_plain(r) for r in frame.collect()), key=lambda r: r["id"])
    assert rows == [EXPECTED, EMPTY]

    target = cluster.create_table(COLUMNS, bucket_count=1)
    save(frame, cluster, target)
    copied = sorted((as_plain(r) for r in load(spark, cluster, target).collect()), key=lambda r: r["id"])
    assert copied == rows
