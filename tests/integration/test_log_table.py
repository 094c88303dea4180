"""Log tables through the official client: every way to append, every way to read (records, Arrow, record
batches, LimitScan), projections, and offsets by position and by time."""

from __future__ import annotations

import time
from typing import Any

import fluss as pyfluss
import pandas as pd
import pyarrow as pa
import pytest

from tests.integration.pyfluss_support import (
    change_types,
    create_table,
    poll_arrow,
    poll_batches,
    poll_records,
)

pytestmark = pytest.mark.timeout(60)

INVALID_TIMESTAMP = 38
FIELDS = [pa.field("id", pa.int32()), pa.field("name", pa.string())]
SCHEMA = pa.schema(FIELDS)
COMPOUND_FIELDS = [
    pa.field("id", pa.int32()),
    pa.field("nested", pa.struct([("seq", pa.int32()), ("label", pa.string())])),
    pa.field("attrs", pa.map_(pa.string(), pa.int32())),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("extra", pa.string()),
]


def id_batch(ids: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(ids, pa.int32()), pa.array([f"n{i}" for i in ids])], schema=SCHEMA)


def wait_for_clock_to_pass(ms: int) -> int:
    """Spin (bounded) until the wall clock is past ``ms``; returns the new time in ms. Timestamps taken
    this way are strictly between the commit times of the appends before and after them."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > ms:
            return now_ms
    raise AssertionError("the wall clock did not move for a second")


@pytest.mark.asyncio
async def test_rows_appended_as_dicts_lists_and_tuples_are_polled_back_in_order(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, bucket_count=1)
    writer = table.new_append().create_writer()
    writer.append({"id": 1, "name": "Alice"})
    writer.append([2, "Bob"])
    writer.append((3, None))
    writer.append({"id": 4})  # an omitted nullable column is null
    await writer.flush()

    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    records = await poll_records(scanner, 4)

    assert [r.row for r in records] == [
        {"id": 1, "name": "Alice"},
        {"id": 2, "name": "Bob"},
        {"id": 3, "name": None},
        {"id": 4, "name": None},
    ]
    assert [r.offset for r in records] == [0, 1, 2, 3]
    assert change_types(records) == ["+A"] * 4
    now_ms = time.time_ns() // 1_000_000
    assert all(now_ms - 60_000 < r.timestamp <= now_ms for r in records)


@pytest.mark.asyncio
async def test_arrow_batches_tables_and_dataframes_are_appended_and_read_back_as_arrow(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, bucket_count=1)
    writer = table.new_append().create_writer()
    writer.write_arrow_batch(id_batch([1, 2, 3]))
    writer.write_arrow(pa.Table.from_batches([id_batch([4, 5]), id_batch([6])]))
    writer.write_pandas(pd.DataFrame({"id": [7, 8], "name": ["n7", "n8"]}))
    await writer.flush()

    scanner = await table.new_scan().create_record_batch_log_scanner()
    scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    arrow = await scanner.to_arrow()

    assert arrow.schema == SCHEMA
    assert arrow.to_pydict() == {"id": list(range(1, 9)), "name": [f"n{i}" for i in range(1, 9)]}

    frame_scanner = await table.new_scan().create_record_batch_log_scanner()
    frame_scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    frame = await frame_scanner.to_pandas()
    assert frame["id"].tolist() == list(range(1, 9))


@pytest.mark.asyncio
async def test_poll_arrow_returns_new_rows_only_and_an_empty_table_when_there_are_none(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, bucket_count=1)
    scanner = await table.new_scan().create_record_batch_log_scanner()
    scanner.subscribe(0, 0)
    writer = table.new_append().create_writer()

    empty = await scanner.poll_arrow(300)
    assert empty.num_rows == 0
    assert empty.schema == SCHEMA

    writer.write_arrow_batch(id_batch([1, 2]))
    writer.write_arrow_batch(id_batch([3, 4]))
    await writer.flush()
    assert (await poll_arrow(scanner, 4)).column("id").to_pylist() == [1, 2, 3, 4]

    await writer.write_arrow_batch(id_batch([5])).wait()
    assert (await poll_arrow(scanner, 1)).column("id").to_pylist() == [5]


@pytest.mark.asyncio
async def test_poll_record_batch_reports_bucket_and_offsets_of_each_batch(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, bucket_count=1)
    writer = table.new_append().create_writer()
    await writer.write_arrow_batch(id_batch([1, 2, 3])).wait()
    await writer.write_arrow_batch(id_batch([4, 5])).wait()
    table_id = table.get_table_info().table_id

    scanner = await table.new_scan().create_record_batch_log_scanner()
    scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    batches = await poll_batches(scanner, 5)

    assert [(b.base_offset, b.last_offset) for b in batches] == [(0, 2), (3, 4)]
    assert all(b.bucket == pyfluss.TableBucket(table_id, 0) for b in batches)
    assert [b.batch.column("id").to_pylist() for b in batches] == [[1, 2, 3], [4, 5]]


@pytest.mark.asyncio
async def test_subscribing_from_an_offset_skips_the_records_before_it(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, bucket_count=1)
    writer = table.new_append().create_writer()
    await writer.write_arrow_batch(id_batch([1, 2, 3])).wait()
    await writer.write_arrow_batch(id_batch([4, 5, 6])).wait()

    records_scanner = await table.new_scan().create_log_scanner()
    records_scanner.subscribe(0, 2)
    records = await poll_records(records_scanner, 4)
    assert [(r.offset, r.row["id"]) for r in records] == [(2, 3), (3, 4), (4, 5), (5, 6)]

    arrow_scanner = await table.new_scan().create_record_batch_log_scanner()
    arrow_scanner.subscribe(0, 4)
    assert (await poll_arrow(arrow_scanner, 2)).column("id").to_pylist() == [5, 6]


@pytest.mark.asyncio
async def test_rows_spread_over_buckets_are_all_read_once(fluss: Any) -> None:
    path, table = await create_table(fluss, FIELDS, bucket_count=3, bucket_keys=["id"])
    writer = table.new_append().create_writer()
    writer.write_arrow_batch(id_batch(list(range(30))))
    await writer.flush()

    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe_buckets(dict.fromkeys(range(3), pyfluss.EARLIEST_OFFSET))
    records = await poll_records(scanner, 30)

    assert sorted(r.row["id"] for r in records) == list(range(30))
    latest = await fluss.get_admin().list_offsets(path, [0, 1, 2], pyfluss.OffsetSpec.latest())
    assert sum(latest.values()) == 30
    assert len([offset for offset in latest.values() if offset > 0]) > 1, latest


@pytest.mark.asyncio
async def test_projection_by_name_and_by_index_returns_only_those_columns_in_that_order(fluss: Any) -> None:
    fields = [pa.field("col_a", pa.int32()), pa.field("col_b", pa.string()), pa.field("col_c", pa.int64())]
    _, table = await create_table(fluss, fields, bucket_count=1)
    writer = table.new_append().create_writer()
    writer.append({"col_a": 1, "col_b": "x", "col_c": 10})
    writer.append({"col_a": 2, "col_b": "y", "col_c": 20})
    await writer.flush()

    by_name = await table.new_scan().project_by_name(["col_b", "col_c"]).create_log_scanner()
    by_name.subscribe(0, pyfluss.EARLIEST_OFFSET)
    assert [r.row for r in await poll_records(by_name, 2)] == [
        {"col_b": "x", "col_c": 10},
        {"col_b": "y", "col_c": 20},
    ]

    by_index = await table.new_scan().project([2, 0]).create_log_scanner()
    by_index.subscribe(0, pyfluss.EARLIEST_OFFSET)
    rows = [r.row for r in await poll_records(by_index, 2)]
    assert rows == [{"col_c": 10, "col_a": 1}, {"col_c": 20, "col_a": 2}]
    assert list(rows[0]) == ["col_c", "col_a"]

    arrow_scanner = await table.new_scan().project_by_name(["col_c"]).create_record_batch_log_scanner()
    arrow_scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    arrow = await arrow_scanner.to_arrow()
    assert arrow.to_pydict() == {"col_c": [10, 20]}


@pytest.mark.asyncio
async def test_projection_selects_and_reorders_row_map_and_array_columns(fluss: Any) -> None:
    _, table = await create_table(fluss, COMPOUND_FIELDS, bucket_count=1)
    writer = table.new_append().create_writer()
    writer.append({"id": 7, "nested": {"seq": 42, "label": "hello"}, "attrs": {"x": 1, "y": 2},
                   "tags": ["alpha", None], "extra": "ignore-me"})
    writer.append({"id": 8, "nested": None, "attrs": {}, "tags": [], "extra": None})
    await writer.flush()

    scanner = await table.new_scan().project_by_name(["tags", "attrs", "nested", "id"]).create_log_scanner()
    scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    rows = [r.row for r in await poll_records(scanner, 2)]
    assert rows == [
        {"tags": ["alpha", None], "attrs": [("x", 1), ("y", 2)], "nested": {"seq": 42, "label": "hello"}, "id": 7},
        {"tags": [], "attrs": [], "nested": None, "id": 8},
    ]

    arrow_scanner = await table.new_scan().project([3, 1]).create_record_batch_log_scanner()
    arrow_scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    arrow = await arrow_scanner.to_arrow()
    assert arrow.schema == pa.schema([COMPOUND_FIELDS[3], COMPOUND_FIELDS[1]])
    assert arrow.to_pylist() == [
        {"tags": ["alpha", None], "nested": {"seq": 42, "label": "hello"}},
        {"tags": [], "nested": None},
    ]


@pytest.mark.asyncio
async def test_projection_works_with_every_compression_codec(fluss: Any) -> None:
    for codec in ("NONE", "LZ4_FRAME", "ZSTD"):
        _, table = await create_table(
            fluss, COMPOUND_FIELDS, bucket_count=1, properties={"table.log.arrow.compression.type": codec}
        )
        writer = table.new_append().create_writer()
        writer.append({"id": 1, "nested": {"seq": 1, "label": "l"}, "attrs": {"k": 1}, "tags": ["t"], "extra": "e"})
        await writer.flush()

        scanner = await table.new_scan().project_by_name(["attrs", "extra"]).create_log_scanner()
        scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
        assert [r.row for r in await poll_records(scanner, 1)] == [{"attrs": [("k", 1)], "extra": "e"}], codec


@pytest.mark.asyncio
async def test_limit_scan_of_a_log_bucket_returns_its_latest_rows(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, bucket_count=1)
    writer = table.new_append().create_writer()
    await writer.write_arrow_batch(id_batch([1, 2])).wait()
    await writer.write_arrow_batch(id_batch([3, 4, 5])).wait()
    bucket = pyfluss.TableBucket(table.get_table_info().table_id, 0)

    scanner = table.new_scan().limit(3).create_bucket_batch_scanner(bucket)
    batch = await scanner.next_batch()
    assert batch is not None
    assert batch.bucket == bucket
    assert batch.batch.column("id").to_pylist() == [3, 4, 5]
    assert batch.base_offset == 2
    assert await scanner.next_batch() is None

    everything = await table.new_scan().limit(50).create_bucket_batch_scanner(bucket).collect_all_batches()
    assert [b.batch.column("id").to_pylist() for b in everything] == [[1, 2, 3, 4, 5]]
    projected = await table.new_scan().project_by_name(["name"]).limit(2).create_bucket_batch_scanner(
        bucket
    ).to_arrow()
    assert projected.to_pydict() == {"name": ["n4", "n5"]}


@pytest.mark.asyncio
async def test_limit_scan_of_an_empty_log_bucket_returns_no_rows(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, bucket_count=1)
    bucket = pyfluss.TableBucket(table.get_table_info().table_id, 0)

    arrow = await table.new_scan().limit(5).create_bucket_batch_scanner(bucket).to_arrow()

    assert arrow.num_rows == 0


@pytest.mark.asyncio
async def test_list_offsets_gives_earliest_latest_and_the_first_offset_at_a_timestamp(fluss: Any) -> None:
    path, table = await create_table(fluss, FIELDS, bucket_count=1)
    admin = fluss.get_admin()
    earliest, latest = pyfluss.OffsetSpec.earliest(), pyfluss.OffsetSpec.latest()
    assert await admin.list_offsets(path, [0], earliest) == {0: 0}
    assert await admin.list_offsets(path, [0], latest) == {0: 0}
    before_ms = time.time_ns() // 1_000_000 - 1
    writer = table.new_append().create_writer()

    marks = []
    for ids in ([1, 2, 3], [4], [5, 6]):
        await writer.write_arrow_batch(id_batch(ids)).wait()
        marks.append(wait_for_clock_to_pass(time.time_ns() // 1_000_000))

    assert await admin.list_offsets(path, [0], latest) == {0: 6}
    assert await admin.list_offsets(path, [0], earliest) == {0: 0}
    by_time = [
        (await admin.list_offsets(path, [0], pyfluss.OffsetSpec.timestamp(ms)))[0] for ms in [before_ms, *marks]
    ]
    # Before every append: the first batch; between appends: the next batch; after all of them: the end.
    assert by_time == [0, 3, 4, 6]


@pytest.mark.asyncio
async def test_list_offsets_for_a_timestamp_ahead_of_the_server_clock_fails_with_code_38(fluss: Any) -> None:
    """Appends still to come could be stamped before a future timestamp, so Fluss has no answer yet."""
    path, table = await create_table(fluss, FIELDS, bucket_count=1)
    await table.new_append().create_writer().write_arrow_batch(id_batch([1])).wait()
    future_ms = time.time_ns() // 1_000_000 + 3_600_000

    with pytest.raises(pyfluss.FlussError) as failure:
        await fluss.get_admin().list_offsets(path, [0], pyfluss.OffsetSpec.timestamp(future_ms))

    assert failure.value.error_code == INVALID_TIMESTAMP


@pytest.mark.asyncio
async def test_subscribing_beyond_the_end_of_the_log_fails_with_an_out_of_range_error(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, bucket_count=1)
    await table.new_append().create_writer().write_arrow_batch(id_batch([1, 2])).wait()
    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe(0, 100)

    with pytest.raises(pyfluss.FlussError, match="out of range"):
        await scanner.poll(2000)


@pytest.mark.asyncio
async def test_list_offsets_answers_for_every_requested_bucket(fluss: Any) -> None:
    path, table = await create_table(fluss, FIELDS, bucket_count=4, bucket_keys=["id"])
    writer = table.new_append().create_writer()
    writer.write_arrow_batch(id_batch(list(range(40))))
    await writer.flush()

    latest = await fluss.get_admin().list_offsets(path, [0, 1, 2, 3], pyfluss.OffsetSpec.latest())
    earliest = await fluss.get_admin().list_offsets(path, [3, 1], pyfluss.OffsetSpec.earliest())

    assert sorted(latest) == [0, 1, 2, 3]
    assert sum(latest.values()) == 40
    assert earliest == {1: 0, 3: 0}
