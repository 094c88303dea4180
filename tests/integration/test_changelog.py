"""The changelog of primary-key tables as the official client reads it: change types, images, offsets and
timestamps, in order."""

from __future__ import annotations

import time
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from tests.integration.pyfluss_support import changelog, create_table, poll_records

pytestmark = pytest.mark.timeout(60)

FIELDS = [pa.field("id", pa.int32()), pa.field("name", pa.string())]


async def write_insert_insert_update_delete(table: Any) -> None:
    writer = table.new_upsert().create_writer()
    await writer.upsert({"id": 1, "name": "alice"}).wait()
    await writer.upsert({"id": 2, "name": "bob"}).wait()
    await writer.upsert({"id": 1, "name": "alice2"}).wait()
    await writer.delete({"id": 2}).wait()


@pytest.mark.asyncio
async def test_insert_update_and_delete_appear_in_order_as_plus_i_minus_u_plus_u_minus_d(fluss: Any) -> None:
    path, table = await create_table(fluss, FIELDS, primary_keys=["id"], bucket_count=1)
    before_ms = time.time_ns() // 1_000_000

    await write_insert_insert_update_delete(table)
    records = await changelog(table, 5)

    assert [r.offset for r in records] == [0, 1, 2, 3, 4]
    assert [r.change_type for r in records] == [
        pyfluss.ChangeType.Insert,
        pyfluss.ChangeType.Insert,
        pyfluss.ChangeType.UpdateBefore,
        pyfluss.ChangeType.UpdateAfter,
        pyfluss.ChangeType.Delete,
    ]
    assert [(r.row["id"], r.row["name"]) for r in records] == [
        (1, "alice"),
        (2, "bob"),
        (1, "alice"),
        (1, "alice2"),
        (2, "bob"),
    ]
    timestamps = [r.timestamp for r in records]
    assert timestamps == sorted(timestamps)
    assert before_ms <= timestamps[0] and timestamps[-1] <= time.time_ns() // 1_000_000
    assert timestamps[2] == timestamps[3], "-U and +U of one write share their batch's commit time"
    assert await fluss.get_admin().list_offsets(path, [0], pyfluss.OffsetSpec.latest()) == {0: 5}


@pytest.mark.asyncio
async def test_reading_the_changelog_from_an_offset_starts_at_that_change(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, primary_keys=["id"], bucket_count=1)
    await write_insert_insert_update_delete(table)

    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe(0, 3)
    records = await poll_records(scanner, 2)

    assert [(r.offset, r.change_type.short_string(), r.row["name"]) for r in records] == [
        (3, "+U", "alice2"),
        (4, "-D", "bob"),
    ]


@pytest.mark.asyncio
async def test_a_live_subscriber_sees_changes_written_after_it_subscribed(fluss: Any) -> None:
    _, table = await create_table(fluss, FIELDS, primary_keys=["id"], bucket_count=1)
    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
    assert len(await scanner.poll(300)) == 0

    writer = table.new_upsert().create_writer()
    await writer.upsert({"id": 1, "name": "first"}).wait()
    assert [(r.offset, r.row["name"]) for r in await poll_records(scanner, 1)] == [(0, "first")]

    await writer.upsert({"id": 1, "name": "second"}).wait()
    records = await poll_records(scanner, 2)
    assert [(r.offset, r.change_type.short_string(), r.row["name"]) for r in records] == [
        (1, "-U", "first"),
        (2, "+U", "second"),
    ]


@pytest.mark.asyncio
async def test_many_changes_in_one_batch_keep_their_order_per_key(fluss: Any) -> None:
    """Writes to the same key inside one client batch are chained: each update's -U is the previous +U."""
    _, table = await create_table(fluss, FIELDS, primary_keys=["id"], bucket_count=1)
    writer = table.new_upsert().create_writer()
    for version in range(5):
        writer.upsert({"id": 1, "name": f"v{version}"})
    writer.delete({"id": 1})
    writer.upsert({"id": 1, "name": "reborn"})
    await writer.flush()

    records = await changelog(table, 11)

    assert [(r.change_type.short_string(), r.row["name"]) for r in records] == [
        ("+I", "v0"),
        ("-U", "v0"), ("+U", "v1"),
        ("-U", "v1"), ("+U", "v2"),
        ("-U", "v2"), ("+U", "v3"),
        ("-U", "v3"), ("+U", "v4"),
        ("-D", "v4"),
        ("+I", "reborn"),
    ]
    assert [r.offset for r in records] == list(range(11))
    assert await table.new_lookup().create_lookuper().lookup({"id": 1}) == {"id": 1, "name": "reborn"}


@pytest.mark.asyncio
async def test_each_bucket_has_its_own_changelog_starting_at_offset_zero(fluss: Any) -> None:
    path, table = await create_table(fluss, FIELDS, primary_keys=["id"], bucket_count=3)
    writer = table.new_upsert().create_writer()
    for key in range(30):
        writer.upsert({"id": key, "name": "x"})
    await writer.flush()
    latest = await fluss.get_admin().list_offsets(path, [0, 1, 2], pyfluss.OffsetSpec.latest())

    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe_buckets(dict.fromkeys(range(3), pyfluss.EARLIEST_OFFSET))
    offsets: dict[int, list[int]] = {0: [], 1: [], 2: []}
    ids: list[int] = []
    deadline = time.monotonic() + 15
    while len(ids) < 30 and time.monotonic() < deadline:
        for bucket, bucket_records in (await scanner.poll(500)).items():
            offsets[bucket.bucket_id].extend(r.offset for r in bucket_records)
            ids.extend(r.row["id"] for r in bucket_records)

    assert sorted(ids) == list(range(30))
    assert sum(latest.values()) == 30
    assert sum(1 for count in latest.values() if count) > 1, latest
    assert offsets == {bucket: list(range(latest[bucket])) for bucket in range(3)}


@pytest.mark.asyncio
async def test_a_wal_changelog_image_has_no_update_before_and_upserts_as_plus_u(fluss: Any) -> None:
    path, table = await create_table(
        fluss, FIELDS, primary_keys=["id"], bucket_count=1, properties={"table.changelog.image": "WAL"}
    )
    await write_insert_insert_update_delete(table)
    records = await changelog(table, 4)
    assert [(r.change_type, r.row["id"], r.row["name"]) for r in records] == [
        (pyfluss.ChangeType.UpdateAfter, 1, "alice"),
        (pyfluss.ChangeType.UpdateAfter, 2, "bob"),
        (pyfluss.ChangeType.UpdateAfter, 1, "alice2"),
        (pyfluss.ChangeType.Delete, 2, "bob"),
    ]
    lookuper = table.new_lookup().create_lookuper()
    assert (await lookuper.lookup({"id": 1}))["name"] == "alice2"
    assert await lookuper.lookup({"id": 2}) is None
    info = await fluss.get_admin().get_table_info(path)
    assert info.get_properties()["table.changelog.image"] == "WAL"


@pytest.mark.asyncio
async def test_an_unknown_changelog_image_is_refused(fluss: Any) -> None:
    with pytest.raises(Exception, match=r"table\.changelog\.image"):
        await create_table(fluss, FIELDS, primary_keys=["id"], properties={"table.changelog.image": "HALF"})
