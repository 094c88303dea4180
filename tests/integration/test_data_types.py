"""Every Fluss data type round-trips through a real server: upsert → lookup, the primary-key changelog, and
append → poll on a log table.

Python shapes the official client uses: MAP is written as a dict and read back as a list of ``(key,
value)`` tuples, ROW as a dict, ARRAY as a list; TIME is whole milliseconds; TIMESTAMP comes back as a
naive datetime and TIMESTAMP_LTZ as a UTC-aware one, both at microsecond resolution (nanoseconds are only
visible on the Arrow read path); DECIMAL as ``decimal.Decimal``. The row writer sends at most microseconds,
and for a TIMESTAMP before 1970 only whole milliseconds, so nanoseconds reach the server only as Arrow.
CHAR(n) cannot be declared from a pyarrow schema, so that table is created with strom's own RPC client and
then used through pyfluss.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.pyfluss_support import DATABASE, change_types, changelog, create_table, poll_records

pytestmark = pytest.mark.timeout(60)

SEQ_LABEL = pa.struct([("seq", pa.int32()), ("label", pa.string())])
NESTED_ROW = pa.struct(
    [
        ("a", pa.int32()),
        ("inner", pa.struct([("b", pa.string()), ("c", pa.list_(pa.int32()))])),
        ("tags", pa.map_(pa.string(), pa.int64())),
    ]
)

SCALAR_FIELDS = [
    pa.field("f_bool", pa.bool_()),
    pa.field("f_tinyint", pa.int8()),
    pa.field("f_smallint", pa.int16()),
    pa.field("f_int", pa.int32()),
    pa.field("f_bigint", pa.int64()),
    pa.field("f_float", pa.float32()),
    pa.field("f_double", pa.float64()),
    pa.field("f_string", pa.string()),
    pa.field("f_string_short", pa.string()),
    pa.field("f_decimal_compact", pa.decimal128(18, 4)),
    pa.field("f_decimal_wide", pa.decimal128(38, 10)),
    pa.field("f_decimal_19", pa.decimal128(19, 0)),
    pa.field("f_date", pa.date32()),
    pa.field("f_time0", pa.time32("s")),
    pa.field("f_time3", pa.time32("ms")),
    pa.field("f_time6", pa.time64("us")),
    pa.field("f_time9", pa.time64("ns")),
    pa.field("f_ts0", pa.timestamp("s")),
    pa.field("f_ts3", pa.timestamp("ms")),
    pa.field("f_ts6", pa.timestamp("us")),
    pa.field("f_ts9", pa.timestamp("ns")),
    pa.field("f_ltz0", pa.timestamp("s", tz="UTC")),
    pa.field("f_ltz3", pa.timestamp("ms", tz="UTC")),
    pa.field("f_ltz6", pa.timestamp("us", tz="UTC")),
    pa.field("f_ltz9", pa.timestamp("ns", tz="UTC")),
    pa.field("f_bytes", pa.binary()),
    pa.field("f_binary", pa.binary(4)),
]
COMPLEX_FIELDS = [
    pa.field("a_int", pa.list_(pa.int32())),
    pa.field("a_string", pa.list_(pa.string())),
    pa.field("a_nested", pa.list_(pa.list_(pa.int32()))),
    pa.field("a_row", pa.list_(SEQ_LABEL)),
    pa.field("a_decimal_wide", pa.list_(pa.decimal128(25, 3))),
    pa.field("a_ts9", pa.list_(pa.timestamp("ns"))),
    pa.field("a_float", pa.list_(pa.float32())),
    pa.field("a_double", pa.list_(pa.float64())),
    pa.field("m_string_int", pa.map_(pa.string(), pa.int32())),
    pa.field("m_int_array", pa.map_(pa.int32(), pa.list_(pa.int32()))),
    pa.field("r_nested", NESTED_ROW),
]
ALL_FIELDS = [pa.field("id", pa.int32()), *SCALAR_FIELDS, *COMPLEX_FIELDS]
COLUMNS = [f.name for f in ALL_FIELDS if f.name != "id"]

# Values as written and, where the client reads them back in another shape, as read back.
FULL_WRITTEN: dict[str, Any] = {
    "f_bool": True,
    "f_tinyint": -128,
    "f_smallint": 32767,
    "f_int": -2147483648,
    "f_bigint": 9223372036854775807,
    "f_float": 1.5,
    "f_double": -2.718281828459045,
    "f_string": "héllo wörld ✓ 漢字 😀, longer than seven bytes",
    "f_string_short": "1234567",
    "f_decimal_compact": Decimal("-99999999999999.9999"),
    "f_decimal_wide": Decimal("-1234567890123456789012345678.0123456789"),
    "f_decimal_19": Decimal("-9999999999999999999"),
    "f_date": date(1969, 7, 20),
    "f_time0": time(23, 59, 59),
    "f_time3": time(12, 34, 56, 789000),
    "f_time6": time(0, 0, 0, 1000),
    "f_time9": time(1, 2, 3, 4000),
    "f_ts0": datetime(1969, 12, 31, 23, 59, 59),
    "f_ts3": datetime(1900, 1, 1, 0, 0, 0, 1000),
    "f_ts6": datetime(1969, 12, 31, 23, 59, 59, 999000),
    "f_ts9": datetime(2001, 2, 3, 4, 5, 6, 789123),
    "f_ltz0": datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC),
    "f_ltz3": datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
    "f_ltz6": datetime(1950, 6, 15, 12, 0, 0, 1, tzinfo=UTC),
    "f_ltz9": datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "f_bytes": bytes(range(256)),
    "f_binary": b"\x00\x01\xfe\xff",
    "a_int": [1, None, -3],
    "a_string": ["", "1234567", "12345678", "漢字", "😀x", None],
    "a_nested": [[1, 2], [], None, [None]],
    "a_row": [{"seq": 1, "label": "open"}, None, {"seq": -2, "label": "a label longer than 7"}],
    "a_decimal_wide": [Decimal("-1234567890123456789012.345"), None, Decimal("0.001")],
    "a_ts9": [datetime(1969, 12, 31, 23, 59, 59, 999000), datetime(2024, 2, 29, 12, 0, 0, 1), None],
    "a_float": [float("inf"), float("-inf"), float("nan"), 3.4028234663852886e38, None],
    "a_double": [float("nan"), float("inf"), 5e-324, None],
    "m_string_int": {"a": 1, "b": None, "a much longer key": -7},
    "m_int_array": {1: [1, 2], 2: [], 3: None},
    "r_nested": {"a": 42, "inner": {"b": "inside", "c": [7, None]}, "tags": {"x": 1}},
}
FULL_READ: dict[str, Any] = {
    **FULL_WRITTEN,
    "m_string_int": [("a", 1), ("b", None), ("a much longer key", -7)],
    "m_int_array": [(1, [1, 2]), (2, []), (3, None)],
    "r_nested": {"a": 42, "inner": {"b": "inside", "c": [7, None]}, "tags": [("x", 1)]},
}
EDGE_WRITTEN: dict[str, Any] = {
    "f_bool": False,
    "f_tinyint": 127,
    "f_smallint": -32768,
    "f_int": 0,
    "f_bigint": -9223372036854775808,
    "f_float": float("nan"),
    "f_double": float("-inf"),
    "f_string": "",
    "f_string_short": "ab",
    "f_decimal_compact": Decimal("0.0001"),
    "f_decimal_wide": Decimal("9999999999999999999999999999.9999999999"),
    "f_decimal_19": Decimal("1"),
    "f_date": date(1970, 1, 1),
    "f_time0": time(0, 0, 0),
    "f_time3": time(23, 59, 59, 999000),
    "f_time6": time(12, 0, 0),
    "f_time9": time(23, 59, 59, 999000),
    "f_ts0": datetime(1970, 1, 1),
    "f_ts3": datetime(2262, 4, 11, 23, 47, 16, 854000),
    "f_ts6": datetime(1677, 9, 21, 0, 12, 43, 145000),
    "f_ts9": datetime(1970, 1, 1, 0, 0, 0, 1),
    "f_ltz0": datetime(1901, 12, 13, 20, 45, 52, tzinfo=UTC),
    "f_ltz3": datetime(1970, 1, 1, tzinfo=UTC),
    "f_ltz6": datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "f_ltz9": datetime(1901, 12, 13, 20, 45, 52, 123457, tzinfo=UTC),
    "f_bytes": b"",
    "f_binary": b"abcd",
    "a_int": [],
    "a_string": [],
    "a_nested": [],
    "a_row": [],
    "a_decimal_wide": [],
    "a_ts9": [],
    "a_float": [],
    "a_double": [None],
    "m_string_int": {},
    "m_int_array": {},
    "r_nested": {"a": None, "inner": None, "tags": None},
}
EDGE_READ: dict[str, Any] = {  # f_float is NaN: compare through canonical()
    **EDGE_WRITTEN,
    "m_string_int": [],
    "m_int_array": [],
}


def canonical(value: Any) -> Any:
    """A comparable form: NaN becomes a marker (NaN != NaN), tuples and lists compare alike."""
    if isinstance(value, float) and math.isnan(value):
        return "<NaN>"
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


def assert_row(actual: dict[str, Any] | None, row_id: int, expected: dict[str, Any] | None) -> None:
    assert actual is not None, f"row {row_id} is missing"
    assert actual["id"] == row_id
    for column in COLUMNS:
        want = None if expected is None else expected[column]
        assert canonical(actual[column]) == canonical(want), f"row {row_id}, column {column}"


async def upsert_type_rows(table: Any) -> None:
    writer = table.new_upsert().create_writer()
    await writer.upsert({"id": 1, **FULL_WRITTEN}).wait()
    await writer.upsert({"id": 2, **EDGE_WRITTEN}).wait()
    await writer.upsert({"id": 3, **dict.fromkeys(COLUMNS)}).wait()


@pytest.mark.asyncio
async def test_every_type_round_trips_through_upsert_and_lookup(fluss: Any) -> None:
    _, table = await create_table(fluss, ALL_FIELDS, primary_keys=["id"], bucket_count=1)
    await upsert_type_rows(table)

    lookuper = table.new_lookup().create_lookuper()
    assert_row(await lookuper.lookup({"id": 1}), 1, FULL_READ)
    assert_row(await lookuper.lookup({"id": 2}), 2, EDGE_READ)
    assert_row(await lookuper.lookup({"id": 3}), 3, None)
    assert await lookuper.lookup({"id": 4}) is None


@pytest.mark.asyncio
async def test_every_type_round_trips_through_the_changelog_including_update_and_delete_images(
    fluss: Any,
) -> None:
    _, table = await create_table(fluss, ALL_FIELDS, primary_keys=["id"], bucket_count=1)
    await upsert_type_rows(table)
    writer = table.new_upsert().create_writer()
    await writer.upsert({"id": 1, **EDGE_WRITTEN}).wait()
    await writer.delete({"id": 2}).wait()

    records = await changelog(table, 6)

    assert [r.offset for r in records] == [0, 1, 2, 3, 4, 5]
    assert change_types(records) == ["+I", "+I", "+I", "-U", "+U", "-D"]
    for record, (row_id, expected) in zip(
        records, [(1, FULL_READ), (2, EDGE_READ), (3, None), (1, FULL_READ), (1, EDGE_READ), (2, EDGE_READ)],
        strict=True,
    ):
        assert_row(record.row, row_id, expected)


@pytest.mark.asyncio
async def test_every_type_round_trips_through_a_log_table_on_both_read_paths(fluss: Any) -> None:
    _, table = await create_table(fluss, ALL_FIELDS, bucket_count=1)
    writer = table.new_append().create_writer()
    writer.append({"id": 1, **FULL_WRITTEN})
    writer.append({"id": 2, **EDGE_WRITTEN})
    writer.append({"id": 3, **dict.fromkeys(COLUMNS)})
    await writer.flush()

    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    records = await poll_records(scanner, 3)
    assert [r.offset for r in records] == [0, 1, 2]
    assert change_types(records) == ["+A", "+A", "+A"]
    for record, expected in zip(records, [FULL_READ, EDGE_READ, None], strict=True):
        assert_row(record.row, record.row["id"], expected)

    batch_scanner = await table.new_scan().create_record_batch_log_scanner()
    batch_scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    arrow = await batch_scanner.to_arrow()
    assert arrow.schema == pa.schema(ALL_FIELDS)
    rows = arrow.to_pylist()
    assert [row["id"] for row in rows] == [1, 2, 3]
    for column in COLUMNS:
        assert canonical(rows[0][column]) == canonical(FULL_READ[column]), column
        assert canonical(rows[1][column]) == canonical(EDGE_READ[column]), column
        assert rows[2][column] is None, column


@pytest.mark.asyncio
async def test_nanosecond_values_written_as_arrow_keep_their_nanoseconds_in_a_log_table(fluss: Any) -> None:
    """The row writer accepts at most microseconds, so nanoseconds reach the server only as Arrow."""
    fields = [
        pa.field("id", pa.int32()),
        pa.field("ts9", pa.timestamp("ns")),
        pa.field("ltz9", pa.timestamp("ns", tz="UTC")),
        pa.field("time9", pa.time64("ns")),
        pa.field("a_ts9", pa.list_(pa.timestamp("ns"))),
    ]
    _, table = await create_table(fluss, fields, bucket_count=1)
    nanos = [-1, 1, -86_400_000_000_123, 1_700_000_000_123_456_789]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([1, 2, 3, 4], pa.int32()),
            pa.array(nanos, pa.timestamp("ns")),
            pa.array(nanos, pa.timestamp("ns", tz="UTC")),
            pa.array([0, 1_000_000, 86_399_999_000_000, None], pa.time64("ns")),
            pa.array([[nanos[0], None], [], None, [nanos[3]]], pa.list_(pa.timestamp("ns"))),
        ],
        schema=pa.schema(fields),
    )
    writer = table.new_append().create_writer()
    await writer.write_arrow_batch(batch).wait()

    scanner = await table.new_scan().create_record_batch_log_scanner()
    scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    arrow = await scanner.to_arrow()
    assert arrow.equals(pa.Table.from_batches([batch]))

    record_scanner = await table.new_scan().create_log_scanner()
    record_scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    records = await poll_records(record_scanner, 4)
    # The record path reads them back at microsecond resolution, rounded towards the past.
    assert [r.row["ts9"] for r in records] == [
        datetime(1969, 12, 31, 23, 59, 59, 999999),
        datetime(1970, 1, 1),
        datetime(1969, 12, 30, 23, 59, 59, 999999),
        datetime(2023, 11, 14, 22, 13, 20, 123456),
    ]


async def create_table_from_json(address: str, name: str, columns: list[dict[str, Any]]) -> pyfluss.TablePath:
    """CreateTable with a hand-written descriptor, for types pyarrow cannot express (CHAR(n))."""
    document = {
        "version": 1,
        "schema": {
            "version": 1,
            "columns": [dict(column, id=index) for index, column in enumerate(columns)],
            "primary_key": ["id"],
            "highest_field_id": len(columns) - 1,
        },
        "partition_key": [],
        "bucket_key": ["id"],
        "bucket_count": 1,
        "properties": {},
        "custom_properties": {},
    }
    host, _, port = address.rpartition(":")
    connection = await RpcConnection.connect(host, int(port))
    try:
        request = pb.CreateTableRequest(table_json=json.dumps(document).encode(), ignore_if_exists=False)
        request.table_path.database_name = DATABASE
        request.table_path.table_name = name
        await connection.request(ApiKey.CREATE_TABLE, request)
    finally:
        await connection.close()
    return pyfluss.TablePath(DATABASE, name)


@pytest.mark.asyncio
async def test_char_columns_round_trip_through_lookup_and_the_changelog(server: Any, fluss: Any) -> None:
    path = await create_table_from_json(
        server.address,
        unique_name("chars"),
        [
            {"name": "id", "data_type": {"type": "INTEGER", "nullable": False}},
            {"name": "code", "data_type": {"type": "CHAR", "length": 5}},
            {"name": "codes", "data_type": {"type": "ARRAY", "element_type": {"type": "CHAR", "length": 3}}},
        ],
    )
    info = await fluss.get_admin().get_table_info(path)
    assert info.get_schema().get_column_types() == ["int NOT NULL", "char(5)", "array<char(3)>"]

    table = await fluss.get_table(path)
    writer = table.new_upsert().create_writer()
    await writer.upsert({"id": 1, "code": "ABCDE", "codes": ["x", "yz", None]}).wait()
    await writer.upsert({"id": 2, "code": None, "codes": None}).wait()

    lookuper = table.new_lookup().create_lookuper()
    assert await lookuper.lookup({"id": 1}) == {"id": 1, "code": "ABCDE", "codes": ["x", "yz", None]}
    assert await lookuper.lookup({"id": 2}) == {"id": 2, "code": None, "codes": None}
    records = await changelog(table, 2)
    assert [r.row for r in records] == [
        {"id": 1, "code": "ABCDE", "codes": ["x", "yz", None]},
        {"id": 2, "code": None, "codes": None},
    ]
