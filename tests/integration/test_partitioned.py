"""Partitioned tables through the official client: the partition catalog, writes and reads per partition,
offsets per partition, and what a missing partition looks like to readers."""

from __future__ import annotations

import time
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from tests.integration.pyfluss_support import change_types, create_table, lookup_many, poll_records
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

PARTITION_NOT_EXISTS = 36
PARTITION_ALREADY_EXISTS = 42
PARTITION_SPEC_INVALID = 43

EVENT_FIELDS = [
    pa.field("id", pa.int32()),
    pa.field("name", pa.string()),
    pa.field("dt", pa.string()),
    pa.field("region", pa.string()),
]
USER_FIELDS = [
    pa.field("region", pa.string()),
    pa.field("user_id", pa.int32()),
    pa.field("name", pa.string()),
    pa.field("score", pa.int64()),
]


async def raises_code(code: int, call: Any) -> None:
    with pytest.raises(pyfluss.FlussError) as failure:
        await call
    assert failure.value.error_code == code, str(failure.value)


async def partition_ids(admin: Any, path: pyfluss.TablePath) -> dict[str, int]:
    return {p.partition_name: p.partition_id for p in await admin.list_partition_infos(path)}


async def user_table(fluss: Any, regions: list[str]) -> tuple[pyfluss.TablePath, Any]:
    path, _ = await create_table(
        fluss, USER_FIELDS, primary_keys=["region", "user_id"], partition_keys=["region"], bucket_count=2
    )
    for region in regions:
        await fluss.get_admin().create_partition(path, {"region": region})
    return path, await fluss.get_table(path)


@pytest.mark.asyncio
async def test_partitions_are_created_listed_filtered_and_dropped(fluss: Any) -> None:
    admin = fluss.get_admin()
    path, _ = await create_table(
        fluss, EVENT_FIELDS, primary_keys=["id", "dt", "region"], partition_keys=["dt", "region"], bucket_count=3,
        bucket_keys=["id"],
    )
    info = await admin.get_table_info(path)
    assert info.is_partitioned()
    assert info.get_partition_keys() == ["dt", "region"]
    assert await admin.list_partition_infos(path) == []

    await admin.create_partition(path, {"dt": "2024-01-15", "region": "EMEA"}, ignore_if_exists=False)
    await admin.create_partition(path, {"region": "APAC", "dt": "2024-01-15"})
    await admin.create_partition(path, {"dt": "2024-01-16", "region": "EMEA"})

    ids = await partition_ids(admin, path)
    assert sorted(ids) == ["2024-01-15$APAC", "2024-01-15$EMEA", "2024-01-16$EMEA"]
    assert len(set(ids.values())) == 3
    emea = await admin.list_partition_infos(path, {"region": "EMEA"})
    assert sorted(p.partition_name for p in emea) == ["2024-01-15$EMEA", "2024-01-16$EMEA"]
    day = await admin.list_partition_infos(path, {"dt": "2024-01-15", "region": "APAC"})
    assert [p.partition_name for p in day] == ["2024-01-15$APAC"]
    assert await admin.list_partition_infos(path, {"dt": "1999-01-01"}) == []

    await admin.drop_partition(path, {"dt": "2024-01-15", "region": "EMEA"}, ignore_if_not_exists=False)
    assert sorted(await partition_ids(admin, path)) == ["2024-01-15$APAC", "2024-01-16$EMEA"]


@pytest.mark.asyncio
async def test_partition_errors_carry_their_fluss_codes(fluss: Any) -> None:
    admin = fluss.get_admin()
    path, _ = await create_table(fluss, EVENT_FIELDS, partition_keys=["region"])
    await admin.create_partition(path, {"region": "US"})
    first_id = (await partition_ids(admin, path))["US"]

    await raises_code(PARTITION_ALREADY_EXISTS, admin.create_partition(path, {"region": "US"}, ignore_if_exists=False))
    await admin.create_partition(path, {"region": "US"}, ignore_if_exists=True)
    assert await partition_ids(admin, path) == {"US": first_id}

    await raises_code(PARTITION_NOT_EXISTS, admin.drop_partition(path, {"region": "EU"}, ignore_if_not_exists=False))
    await admin.drop_partition(path, {"region": "EU"}, ignore_if_not_exists=True)
    await raises_code(PARTITION_SPEC_INVALID, admin.create_partition(path, {"country": "US"}))
    await raises_code(
        PARTITION_NOT_EXISTS, admin.list_partition_offsets(path, "EU", [0], pyfluss.OffsetSpec.latest())
    )


@pytest.mark.asyncio
async def test_rows_are_written_and_looked_up_per_partition(fluss: Any) -> None:
    _, table = await user_table(fluss, ["US", "EU", "APAC"])
    writer = table.new_upsert().create_writer()
    data = [("US", 1, "Gustave", 100), ("US", 2, "Lune", 200), ("EU", 1, "Sciel", 150), ("APAC", 1, "Noco", 300)]
    for region, user_id, name, score in data:
        writer.upsert({"region": region, "user_id": user_id, "name": name, "score": score})
    await writer.flush()

    keys = [{"region": region, "user_id": user_id} for region, user_id, _, _ in data]
    assert await lookup_many(table, keys) == [
        {"region": r, "user_id": u, "name": n, "score": s} for r, u, n, s in data
    ]

    await writer.upsert({"region": "US", "user_id": 1, "name": "Gustave II", "score": 999}).wait()
    await writer.delete({"region": "EU", "user_id": 1}).wait()
    assert await lookup_many(
        table,
        [{"region": "US", "user_id": 1}, {"region": "EU", "user_id": 1}, {"region": "APAC", "user_id": 1}],
    ) == [
        {"region": "US", "user_id": 1, "name": "Gustave II", "score": 999},
        None,
        {"region": "APAC", "user_id": 1, "name": "Noco", "score": 300},
    ]


@pytest.mark.asyncio
async def test_reads_of_a_missing_partition_find_nothing(fluss: Any) -> None:
    path, table = await create_table(
        fluss,
        [pa.field("region", pa.string()), pa.field("user_id", pa.int32()), pa.field("event_id", pa.int64())],
        primary_keys=["region", "user_id", "event_id"],
        partition_keys=["region"],
        bucket_count=2,
        bucket_keys=["user_id"],
    )
    await fluss.get_admin().create_partition(path, {"region": "US"})
    writer = table.new_upsert().create_writer()
    writer.upsert({"region": "US", "user_id": 1, "event_id": 10})
    writer.upsert({"region": "US", "user_id": 1, "event_id": 11})
    await writer.flush()

    lookuper = table.new_lookup().create_lookuper()
    prefix = table.new_lookup().lookup_by(["region", "user_id"]).create_lookuper()
    assert await lookuper.lookup({"region": "NOWHERE", "user_id": 1, "event_id": 10}) is None
    assert await prefix.lookup({"region": "NOWHERE", "user_id": 1}) == []
    assert sorted(r["event_id"] for r in await prefix.lookup({"region": "US", "user_id": 1})) == [10, 11]


@pytest.mark.asyncio
async def test_a_dropped_and_recreated_partition_starts_empty(server: ServerProcess, fluss: Any) -> None:
    """Reads go through fresh connections: a connection that already resolved a partition keeps its old id
    after the drop, and pyfluss retries the server's "unknown bucket" answer for it without end."""
    path, table = await user_table(fluss, ["US", "EU"])
    admin = fluss.get_admin()
    writer = table.new_upsert().create_writer()
    writer.upsert({"region": "US", "user_id": 1, "name": "a", "score": 1})
    writer.upsert({"region": "EU", "user_id": 1, "name": "b", "score": 2})
    await writer.flush()
    old_id = (await partition_ids(admin, path))["US"]

    await admin.drop_partition(path, {"region": "US"})
    assert sorted(await partition_ids(admin, path)) == ["EU"]
    async with await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": server.address})) as reader:
        lookuper = (await reader.get_table(path)).new_lookup().create_lookuper()
        assert await lookuper.lookup({"region": "US", "user_id": 1}) is None

    await admin.create_partition(path, {"region": "US"})
    assert (await partition_ids(admin, path))["US"] != old_id
    assert await admin.list_partition_offsets(path, "US", [0, 1], pyfluss.OffsetSpec.latest()) == {0: 0, 1: 0}
    async with await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": server.address})) as reader:
        fresh = await reader.get_table(path)
        assert await lookup_many(fresh, [{"region": "US", "user_id": 1}, {"region": "EU", "user_id": 1}]) == [
            None,
            {"region": "EU", "user_id": 1, "name": "b", "score": 2},
        ]


@pytest.mark.asyncio
async def test_a_partitioned_log_table_is_appended_scanned_and_offset_per_partition(fluss: Any) -> None:
    admin = fluss.get_admin()
    fields = [pa.field("id", pa.int32()), pa.field("region", pa.string()), pa.field("value", pa.int64())]
    path, _ = await create_table(fluss, fields, partition_keys=["region"], bucket_count=1)
    for region in ("US", "EU"):
        await admin.create_partition(path, {"region": region})
    table = await fluss.get_table(path)
    before_ms = time.time_ns() // 1_000_000 - 1
    writer = table.new_append().create_writer()
    for row_id, region in [(1, "US"), (2, "US"), (3, "EU")]:
        writer.append({"id": row_id, "region": region, "value": row_id * 100})
    schema = pa.schema(fields)
    writer.write_arrow_batch(pa.RecordBatch.from_pylist(
        [{"id": 4, "region": "EU", "value": 400}, {"id": 5, "region": "EU", "value": 500}], schema=schema
    ))
    await writer.flush()

    latest = pyfluss.OffsetSpec.latest()
    assert await admin.list_partition_offsets(path, "US", [0], latest) == {0: 2}
    assert await admin.list_partition_offsets(path, "EU", [0], latest) == {0: 3}
    assert await admin.list_partition_offsets(path, "EU", [0], pyfluss.OffsetSpec.earliest()) == {0: 0}
    assert await admin.list_partition_offsets(path, "US", [0], pyfluss.OffsetSpec.timestamp(before_ms)) == {0: 0}

    ids = await partition_ids(admin, path)
    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe_partition_buckets({(ids["US"], 0): pyfluss.EARLIEST_OFFSET, (ids["EU"], 0): 1})
    seen: dict[int | None, list[tuple[int, int]]] = {}
    deadline = time.monotonic() + 15
    while sum(len(v) for v in seen.values()) < 4 and time.monotonic() < deadline:
        for bucket, records in (await scanner.poll(500)).items():
            seen.setdefault(bucket.partition_id, []).extend((r.offset, r.row["id"]) for r in records)
    assert seen == {ids["US"]: [(0, 1), (1, 2)], ids["EU"]: [(1, 4), (2, 5)]}

    eu_only = await table.new_scan().create_record_batch_log_scanner()
    eu_only.subscribe_partition(ids["EU"], 0, pyfluss.EARLIEST_OFFSET)
    arrow = await eu_only.to_arrow()
    assert arrow.to_pydict() == {"id": [3, 4, 5], "region": ["EU"] * 3, "value": [300, 400, 500]}


@pytest.mark.asyncio
async def test_the_changelog_of_a_partitioned_primary_key_table_is_kept_per_partition(fluss: Any) -> None:
    path, table = await user_table(fluss, ["US", "EU"])
    writer = table.new_upsert().create_writer()
    await writer.upsert({"region": "US", "user_id": 1, "name": "a", "score": 1}).wait()
    await writer.upsert({"region": "EU", "user_id": 1, "name": "b", "score": 2}).wait()
    await writer.upsert({"region": "US", "user_id": 1, "name": "a2", "score": 3}).wait()
    ids = await partition_ids(fluss.get_admin(), path)
    latest = await fluss.get_admin().list_partition_offsets(path, "US", [0, 1], pyfluss.OffsetSpec.latest())
    assert sorted(latest.values()) == [0, 3]
    bucket = max(latest, key=lambda b: latest[b])

    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe_partition(ids["US"], bucket, pyfluss.EARLIEST_OFFSET)
    records = await poll_records(scanner, 3)

    assert change_types(records) == ["+I", "-U", "+U"]
    assert [r.offset for r in records] == [0, 1, 2]
    assert [(r.row["region"], r.row["name"]) for r in records] == [("US", "a"), ("US", "a"), ("US", "a2")]


@pytest.mark.asyncio
async def test_partial_updates_of_a_partitioned_table_stay_in_their_partition(fluss: Any) -> None:
    _, table = await user_table(fluss, ["US", "EU"])
    writer = table.new_upsert().create_writer()
    writer.upsert({"region": "US", "user_id": 1, "name": "us", "score": 1})
    writer.upsert({"region": "EU", "user_id": 1, "name": "eu", "score": 2})
    await writer.flush()

    partial = table.new_upsert().partial_update_by_name(["region", "user_id", "score"]).create_writer()
    await partial.upsert({"region": "US", "user_id": 1, "score": 100}).wait()
    await partial.delete({"region": "EU", "user_id": 1}).wait()

    assert await lookup_many(table, [{"region": "US", "user_id": 1}, {"region": "EU", "user_id": 1}]) == [
        {"region": "US", "user_id": 1, "name": "us", "score": 100},
        {"region": "EU", "user_id": 1, "name": "eu", "score": None},
    ]


@pytest.mark.asyncio
async def test_limit_scan_reads_one_bucket_of_one_partition(fluss: Any) -> None:
    path, table = await user_table(fluss, ["US", "EU"])
    writer = table.new_upsert().create_writer()
    for user_id in range(6):
        writer.upsert({"region": "US", "user_id": user_id, "name": f"us{user_id}", "score": user_id})
        writer.upsert({"region": "EU", "user_id": user_id, "name": f"eu{user_id}", "score": user_id})
    await writer.flush()
    ids = await partition_ids(fluss.get_admin(), path)
    table_id = table.get_table_info().table_id

    names: list[str] = []
    for bucket_id in (0, 1):
        bucket = pyfluss.TableBucket.with_partition(table_id, ids["EU"], bucket_id)
        arrow = await table.new_scan().limit(100).create_bucket_batch_scanner(bucket).to_arrow()
        names.extend(arrow.column("name").to_pylist())

    assert sorted(names) == [f"eu{i}" for i in range(6)]
