"""The id assignment of auto-increment columns without a server: which rows get ids, and the Arrow path for
large writes producing exactly the bytes of the per-row path."""

from __future__ import annotations

import asyncio
import datetime
import decimal

import pyarrow as pa

from strom.ids import TablePath
from strom.kv import auto_increment
from strom.kv.auto_increment import AutoIncrementAssigner, AutoIncrementSpec, IdAllocator
from strom.kv.row_format import TableRowFormat
from strom.metadata.off_loop import on_event_loop
from strom.metadata.table_info import TableInfo
from strom.records import row_batches
from strom.records.schema import Schema, TableDescriptor

FIELDS = pa.schema([
    ("user_id", pa.string()), ("price", pa.decimal128(12, 3)), ("uid", pa.int32()),
    ("at", pa.timestamp("us")), ("tags", pa.list_(pa.string())),
])


def assigner(counter: list[int]) -> tuple[AutoIncrementAssigner, TableRowFormat]:
    base = Schema.from_arrow(FIELDS, ["user_id"])
    schema = Schema(base.columns, base.primary_key, auto_increment_columns=("uid",))
    info = TableInfo(1, TablePath("db", "t"), 1, TableDescriptor(schema, bucket_count=1).to_json(), 0, 0)
    spec = AutoIncrementSpec.for_table(info)
    assert spec is not None

    def reserve(_name: str, count: int) -> int:
        counter.append(count)
        return sum(counter[:-1])

    row_format = TableRowFormat(info)
    return AutoIncrementAssigner(spec, IdAllocator(spec, reserve), row_format), row_format


def rows(count: int, row_format: TableRowFormat) -> list[bytes]:
    """Rows as a client encodes them (the auto-increment column null)."""
    at = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901)
    batch = pa.RecordBatch.from_pylist([
        {"user_id": f"u{i}", "price": decimal.Decimal(i * 1000 // 7) / 1000 if i % 3 else None, "uid": None,
         "at": at if i % 2 else None, "tags": [f"t{i}", None] if i % 4 else None}
        for i in range(count)
    ], schema=row_format.arrow_schema)
    return row_batches.encode_batch(batch, row_format.row_type)[0]


def test_only_rows_inserting_their_key_get_ids_in_order() -> None:
    chosen, row_format = assigner([])
    values = rows(4, row_format)
    keys = [b"a", b"b", b"a", b"c"]
    existing = [None, b"stored", None, None]
    assigned = chosen.assign(keys, [values[0], values[1], values[2], None], existing)
    decoded = [None if row is None else row_format.decode_stored(b"\0\0" + row)[2] for row in assigned]
    assert decoded == [1, None, None, None], "b exists, the second a is an update, c is a delete"


def test_the_arrow_path_writes_the_same_bytes_as_the_per_row_path() -> None:
    count = auto_increment.VECTORIZED_ROWS_MIN * 4
    vectorized, _format = assigner([])
    per_row, _unused = assigner([])
    values = rows(count, _format)
    keys = [f"k{i}".encode() for i in range(count)]
    fast = vectorized.assign(keys, values, [None] * count)
    slow: list[bytes | None] = []
    for key, value in zip(keys, values, strict=True):  # one row per call: below the Arrow path's minimum
        slow += per_row.assign([key], [value], [None])
    assert fast == slow


def test_the_next_segment_is_reserved_ahead_off_the_event_loop() -> None:
    """A reservation is a metadata store round trip: made on a store thread before the ids run out, so the
    event loop assigning them never waits on it; segments are used in reservation order."""
    spec = AutoIncrementSpec(1, "id", "t/id", cache_size=10, max_value=2**31 - 1)
    reservations: list[tuple[int, bool]] = []
    reserved = 0

    def reserve(_name: str, count: int) -> int:
        nonlocal reserved
        start, reserved = reserved, reserved + count
        reservations.append((start, on_event_loop()))
        return start

    async def assign() -> list[int]:
        allocator = IdAllocator(spec, reserve)
        ids = []
        for _ in range(35):
            ids.append(allocator.next_id())
            await asyncio.sleep(0.01)  # the loop serves others meanwhile; the reservation ahead completes
        return ids

    ids = asyncio.run(assign())
    assert ids == list(range(1, 36))
    assert [start for start, _ in reservations] == [0, 10, 20, 30]  # each made half a segment before needed
    assert not any(on_loop for _, on_loop in reservations)
