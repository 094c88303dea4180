"""Primary-key tables through the official client: upsert, lookup, delete, partial updates, prefix lookup
and the bounded LimitScan."""

from __future__ import annotations

from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from tests.integration.pyfluss_support import change_types, changelog, create_table, lookup_many

pytestmark = pytest.mark.timeout(60)

DELETION_DISABLED = 57
USER_FIELDS = [
    pa.field("id", pa.int32()),
    pa.field("name", pa.string()),
    pa.field("age", pa.int64()),
    pa.field("score", pa.int64()),
]


@pytest.mark.asyncio
async def test_upserted_rows_are_found_updated_and_deleted_by_key(fluss: Any) -> None:
    _, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"], bucket_count=3)
    writer = table.new_upsert().create_writer()
    rows = {i: {"id": i, "name": f"user {i}", "age": 20 + i, "score": i * 100} for i in range(1, 21)}
    for row in rows.values():
        writer.upsert(row)
    await writer.flush()
    lookuper = table.new_lookup().create_lookuper()

    assert await lookup_many(table, [{"id": key} for key in rows]) == list(rows.values())
    assert await lookuper.lookup({"id": 999}) is None
    assert await lookuper.lookup([999]) is None

    await writer.upsert({"id": 1, "name": "renamed", "age": 99, "score": None}).wait()
    await writer.delete({"id": 2}).wait()
    await writer.delete([3]).wait()

    assert await lookuper.lookup({"id": 1}) == {"id": 1, "name": "renamed", "age": 99, "score": None}
    assert await lookuper.lookup({"id": 2}) is None
    assert await lookuper.lookup((3,)) is None
    assert await lookuper.lookup({"id": 4}) == rows[4]


@pytest.mark.asyncio
async def test_deleting_a_missing_key_changes_nothing(fluss: Any) -> None:
    _, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"], bucket_count=1)
    writer = table.new_upsert().create_writer()
    await writer.upsert({"id": 1, "name": "a", "age": 1, "score": 1}).wait()

    await writer.delete({"id": 42}).wait()

    lookuper = table.new_lookup().create_lookuper()
    assert await lookuper.lookup({"id": 42}) is None
    assert await lookuper.lookup({"id": 1}) == {"id": 1, "name": "a", "age": 1, "score": 1}
    await writer.upsert({"id": 2, "name": "b", "age": 2, "score": 2}).wait()
    records = await changelog(table, 2)
    assert change_types(records) == ["+I", "+I"]
    assert [r.row["id"] for r in records] == [1, 2]


@pytest.mark.asyncio
async def test_partial_update_by_name_changes_only_the_target_columns(fluss: Any) -> None:
    _, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"])
    await table.new_upsert().create_writer().upsert({"id": 1, "name": "Verso", "age": 32, "score": 6942}).wait()

    partial = table.new_upsert().partial_update_by_name(["id", "score"]).create_writer()
    await partial.upsert({"id": 1, "score": 420}).wait()

    lookuper = table.new_lookup().create_lookuper()
    assert await lookuper.lookup({"id": 1}) == {"id": 1, "name": "Verso", "age": 32, "score": 420}


@pytest.mark.asyncio
async def test_partial_update_by_index_changes_only_the_target_columns(fluss: Any) -> None:
    _, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"])
    await table.new_upsert().create_writer().upsert({"id": 1, "name": "Verso", "age": 32, "score": 6942}).wait()

    partial = table.new_upsert().partial_update_by_index([0, 1]).create_writer()
    await partial.upsert([1, "Verso Renamed"]).wait()

    lookuper = table.new_lookup().create_lookuper()
    assert await lookuper.lookup({"id": 1}) == {"id": 1, "name": "Verso Renamed", "age": 32, "score": 6942}


@pytest.mark.asyncio
async def test_a_partial_update_of_a_new_key_inserts_it_with_the_other_columns_null(fluss: Any) -> None:
    _, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"], bucket_count=1)

    partial = table.new_upsert().partial_update_by_name(["id", "age"]).create_writer()
    await partial.upsert({"id": 7, "age": 70}).wait()

    lookuper = table.new_lookup().create_lookuper()
    assert await lookuper.lookup({"id": 7}) == {"id": 7, "name": None, "age": 70, "score": None}
    records = await changelog(table, 1)
    assert change_types(records) == ["+I"]
    assert records[0].row == {"id": 7, "name": None, "age": 70, "score": None}


@pytest.mark.asyncio
async def test_a_partial_delete_nulls_the_target_columns_and_deletes_the_row_once_nothing_is_left(
    fluss: Any,
) -> None:
    _, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"], bucket_count=1)
    await table.new_upsert().create_writer().upsert({"id": 1, "name": "n", "age": 5, "score": 9}).wait()
    lookuper = table.new_lookup().create_lookuper()

    await table.new_upsert().partial_update_by_name(["id", "score"]).create_writer().delete({"id": 1}).wait()
    assert await lookuper.lookup({"id": 1}) == {"id": 1, "name": "n", "age": 5, "score": None}

    await table.new_upsert().partial_update_by_name(["id", "name", "age"]).create_writer().delete({"id": 1}).wait()
    assert await lookuper.lookup({"id": 1}) is None

    records = await changelog(table, 4)
    assert change_types(records) == ["+I", "-U", "+U", "-D"]
    assert [r.row for r in records] == [
        {"id": 1, "name": "n", "age": 5, "score": 9},
        {"id": 1, "name": "n", "age": 5, "score": 9},
        {"id": 1, "name": "n", "age": 5, "score": None},
        {"id": 1, "name": "n", "age": 5, "score": None},
    ]


@pytest.mark.asyncio
async def test_partial_updates_keep_the_untouched_row_map_and_array_columns(fluss: Any) -> None:
    fields = [
        pa.field("id", pa.int32()),
        pa.field("name", pa.string()),
        pa.field("nested", pa.struct([("seq", pa.int32()), ("label", pa.string())])),
        pa.field("attrs", pa.map_(pa.string(), pa.int32())),
        pa.field("tags", pa.list_(pa.string())),
    ]
    _, table = await create_table(fluss, fields, primary_keys=["id"])
    full = {"id": 1, "name": "Verso", "nested": {"seq": 10, "label": "alpha"}, "attrs": {"a": 1}, "tags": ["x"]}
    await table.new_upsert().create_writer().upsert(full).wait()
    lookuper = table.new_lookup().create_lookuper()

    await table.new_upsert().partial_update_by_name(["id", "name"]).create_writer().upsert(
        {"id": 1, "name": "Renamed"}
    ).wait()
    assert await lookuper.lookup({"id": 1}) == {
        "id": 1, "name": "Renamed", "nested": {"seq": 10, "label": "alpha"}, "attrs": [("a", 1)], "tags": ["x"]
    }

    await table.new_upsert().partial_update_by_index([0, 2, 4]).create_writer().upsert(
        [1, {"seq": 99, "label": "a label longer than seven bytes"}, ["gamma", None]]
    ).wait()
    assert await lookuper.lookup({"id": 1}) == {
        "id": 1,
        "name": "Renamed",
        "nested": {"seq": 99, "label": "a label longer than seven bytes"},
        "attrs": [("a", 1)],
        "tags": ["gamma", None],
    }


@pytest.mark.asyncio
async def test_partial_updates_address_columns_by_position_when_the_key_is_not_first(fluss: Any) -> None:
    fields = [
        pa.field("note", pa.string()),
        pa.field("tenant", pa.string()),
        pa.field("count", pa.int64()),
        pa.field("item", pa.int32()),
        pa.field("tags", pa.list_(pa.string())),
    ]
    _, table = await create_table(fluss, fields, primary_keys=["tenant", "item"], bucket_count=2)
    await table.new_upsert().create_writer().upsert(
        {"note": "n", "tenant": "acme", "count": 1, "item": 7, "tags": ["a"]}
    ).wait()

    await table.new_upsert().partial_update_by_index([1, 2, 3]).create_writer().upsert(["acme", 2, 7]).wait()
    await table.new_upsert().partial_update_by_name(["item", "tenant", "note"]).create_writer().upsert(
        {"item": 7, "tenant": "acme", "note": "a note longer than seven bytes"}
    ).wait()
    await table.new_upsert().partial_update_by_name(["tenant", "item", "count"]).create_writer().upsert(
        {"tenant": "acme", "item": 8, "count": 80}
    ).wait()

    assert await lookup_many(table, [{"tenant": "acme", "item": 7}, {"tenant": "acme", "item": 8}]) == [
        {"note": "a note longer than seven bytes", "tenant": "acme", "count": 2, "item": 7, "tags": ["a"]},
        {"note": None, "tenant": "acme", "count": 80, "item": 8, "tags": None},
    ]


@pytest.mark.asyncio
async def test_prefix_lookup_on_a_bucket_key_subset_of_a_composite_key_finds_every_match(fluss: Any) -> None:
    fields = [
        pa.field("region", pa.string()),
        pa.field("score", pa.int64()),
        pa.field("user_id", pa.int32()),
        pa.field("event_id", pa.int64()),
    ]
    _, table = await create_table(
        fluss, fields, primary_keys=["region", "user_id", "event_id"], bucket_count=3, bucket_keys=["region", "user_id"]
    )
    writer = table.new_upsert().create_writer()
    data = [("US", 1, 1, 100), ("US", 1, 2, 200), ("US", 2, 1, 300), ("EU", 1, 1, 150), ("US", 1, 3, 400)]
    for region, user_id, event_id, score in data:
        writer.upsert({"region": region, "user_id": user_id, "event_id": event_id, "score": score})
    await writer.flush()
    await writer.delete({"region": "US", "user_id": 1, "event_id": 3}).wait()

    prefix = table.new_lookup().lookup_by(["region", "user_id"]).create_lookuper()
    rows = await prefix.lookup({"region": "US", "user_id": 1})
    assert sorted((r["event_id"], r["score"]) for r in rows) == [(1, 100), (2, 200)]
    assert [r["score"] for r in await prefix.lookup(["US", 2])] == [300]
    assert [r["region"] for r in await prefix.lookup(("EU", 1))] == ["EU"]
    assert await prefix.lookup({"region": "APAC", "user_id": 1}) == []
    point = table.new_lookup().create_lookuper()
    assert await point.lookup({"region": "US", "user_id": 1, "event_id": 2}) == {
        "region": "US", "score": 200, "user_id": 1, "event_id": 2
    }


@pytest.mark.asyncio
async def test_limit_scan_of_a_primary_key_bucket_returns_at_most_limit_current_rows(fluss: Any) -> None:
    _, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"], bucket_count=1)
    writer = table.new_upsert().create_writer()
    for i in range(10):
        writer.upsert({"id": i, "name": f"n{i}", "age": i, "score": i})
    await writer.flush()
    await writer.upsert({"id": 0, "name": "updated", "age": 0, "score": 0}).wait()
    await writer.delete({"id": 9}).wait()
    current = {i: {"id": i, "name": f"n{i}", "age": i, "score": i} for i in range(1, 9)}
    current[0] = {"id": 0, "name": "updated", "age": 0, "score": 0}
    bucket = pyfluss.TableBucket(table.get_table_info().table_id, 0)

    scanner = table.new_scan().limit(3).create_bucket_batch_scanner(bucket)
    first = await scanner.next_batch()
    assert first is not None
    assert first.bucket == bucket
    rows = first.batch.to_pylist()
    assert len(rows) == 3
    assert all(current[row["id"]] == row for row in rows)
    assert await scanner.next_batch() is None

    everything = await table.new_scan().limit(100).create_bucket_batch_scanner(bucket).to_arrow()
    assert sorted(everything.to_pylist(), key=lambda r: r["id"]) == [current[i] for i in sorted(current)]

    projected = await table.new_scan().project_by_name(["id", "score"]).limit(100).create_bucket_batch_scanner(
        bucket
    ).to_arrow()
    assert projected.column_names == ["id", "score"]
    assert sorted(projected.column("id").to_pylist()) == sorted(current)


@pytest.mark.asyncio
async def test_limit_scan_of_an_empty_primary_key_bucket_returns_no_rows(fluss: Any) -> None:
    _, table = await create_table(fluss, USER_FIELDS, primary_keys=["id"], bucket_count=2)
    bucket = pyfluss.TableBucket(table.get_table_info().table_id, 1)

    arrow = await table.new_scan().limit(5).create_bucket_batch_scanner(bucket).to_arrow()

    assert arrow.num_rows == 0
    assert arrow.column_names == ["id", "name", "age", "score"]


@pytest.mark.asyncio
async def test_deletes_are_ignored_or_refused_with_code_57_as_the_table_says(fluss: Any) -> None:
    row = {"id": 1, "name": "kept", "age": 1, "score": 1}
    _, ignoring = await create_table(
        fluss, USER_FIELDS, primary_keys=["id"], bucket_count=1, properties={"table.delete.behavior": "IGNORE"}
    )
    _, refusing = await create_table(
        fluss, USER_FIELDS, primary_keys=["id"], bucket_count=1, properties={"table.delete.behavior": "DISABLE"}
    )
    for table in (ignoring, refusing):
        await table.new_upsert().create_writer().upsert(row).wait()

    await ignoring.new_upsert().create_writer().delete({"id": 1}).wait()
    refusing_writer = refusing.new_upsert().create_writer()
    with pytest.raises(pyfluss.FlussError) as failure:
        await refusing_writer.delete({"id": 1}).wait()
    # The refused batch does not wedge the writer: its next batch is accepted.
    await refusing_writer.upsert({"id": 2, "name": "next", "age": 2, "score": 2}).wait()

    assert failure.value.error_code == DELETION_DISABLED
    assert await lookup_many(ignoring, [{"id": 1}]) == [row]
    assert await lookup_many(refusing, [{"id": 1}, {"id": 2}]) == [row, {"id": 2, "name": "next", "age": 2, "score": 2}]
    assert change_types(await changelog(ignoring, 1)) == ["+I"]
    assert change_types(await changelog(refusing, 2)) == ["+I", "+I"]
