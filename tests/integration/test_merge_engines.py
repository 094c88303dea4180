"""Merge engines through a real server with the official client (pyfluss): tables created with Fluss's
options, written with upserts, partial updates and deletes, read back by lookups and from the changelog,
and the merged state after a kill -9 and restart (changelog replay). pyfluss expresses every write here
(it has partial-update writers and deletes), so strom's own client is not needed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pyroaring
import pytest

from tests.integration.pyfluss_support import change_types, changelog, create_table
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(90)

AGG_FIELDS = [
    pa.field("id", pa.int32()),
    pa.field("total", pa.int64()),  # sum
    pa.field("factor", pa.float64()),  # product
    pa.field("top", pa.int32()),  # max
    pa.field("lowest", pa.string()),  # min
    pa.field("status", pa.string()),  # last_value
    pa.field("email", pa.string()),  # no function: last_value_ignore_nulls
    pa.field("first", pa.int64()),  # first_value
    pa.field("first_nn", pa.int64()),  # first_value_ignore_nulls
    pa.field("tags", pa.string()),  # listagg with ';'
    pa.field("words", pa.string()),  # string_agg, default ','
    pa.field("all_ok", pa.bool_()),  # bool_and
    pa.field("any_alert", pa.bool_()),  # bool_or
    pa.field("visits", pa.binary()),  # rbm32
    pa.field("sessions", pa.binary()),  # rbm64
]
AGG_OPTIONS = {
    "table.merge-engine": "aggregation",
    "fields.total.agg": "sum",
    "fields.factor.agg": "product",
    "fields.top.agg": "max",
    "fields.lowest.agg": "min",
    "fields.status.agg": "last_value",
    "fields.first.agg": "first_value",
    "fields.first_nn.agg": "first_value_ignore_nulls",
    "fields.tags.agg": "listagg",
    "fields.tags.listagg.delimiter": ";",
    "fields.words.agg": "string_agg",
    "fields.all_ok.agg": "bool_and",
    "fields.any_alert.agg": "bool_or",
    "fields.visits.agg": "rbm32",
    "fields.sessions.agg": "rbm64",
}
KV_FIELDS = [pa.field("id", pa.int32()), pa.field("ver", pa.int64()), pa.field("name", pa.string())]


def rbm32(*values: int) -> bytes:
    return bytes(pyroaring.BitMap(values).serialize())


def rbm64(*values: int) -> bytes:
    return bytes(pyroaring.BitMap64(values).serialize())


WRITES = [
    {"id": 1, "total": 15, "factor": 0.9, "top": 3, "lowest": "m", "status": "online", "email": "a@x",
     "first": None, "first_nn": None, "tags": "developer", "words": "a", "all_ok": True, "any_alert": False,
     "visits": rbm32(1, 2), "sessions": rbm64(10, 2**40)},
    {"id": 1, "total": 20, "factor": 0.8, "top": 9, "lowest": "c", "status": "offline", "email": None,
     "first": 7, "first_nn": 8, "tags": "java", "words": None, "all_ok": True, "any_alert": None,
     "visits": rbm32(2, 3), "sessions": None},
    {"id": 1, "total": None, "factor": None, "top": 4, "lowest": "x", "status": None, "email": "b@x",
     "first": 99, "first_nn": 98, "tags": "flink", "words": "b", "all_ok": False, "any_alert": True,
     "visits": None, "sessions": rbm64(20)},
]
MERGED = {
    "id": 1, "total": 35, "factor": pytest.approx(0.72), "top": 9, "lowest": "c", "status": None, "email": "b@x",
    "first": 7, "first_nn": 8, "tags": "developer;java;flink", "words": "a,b", "all_ok": False, "any_alert": True,
    "visits": rbm32(1, 2, 3), "sessions": rbm64(10, 20, 2**40),
}


async def lookup(table: Any, key: dict[str, Any]) -> Any:
    return await table.new_lookup().create_lookuper().lookup(key)


async def write_each(table: Any, rows: list[dict[str, Any]]) -> None:
    writer = table.new_upsert().create_writer()
    for row in rows:
        await writer.upsert(row).wait()  # one request per row: each merges with the stored row


@pytest.mark.asyncio
async def test_aggregation_folds_every_function_and_logs_each_update(fluss: Any) -> None:
    _path, table = await create_table(fluss, AGG_FIELDS, primary_keys=["id"], bucket_count=1, properties=AGG_OPTIONS)
    await write_each(table, WRITES)
    assert await lookup(table, {"id": 1}) == MERGED
    records = await changelog(table, 5)
    assert change_types(records) == ["+I", "-U", "+U", "-U", "+U"]
    assert records[0].row["tags"] == "developer"
    assert records[2].row["tags"] == records[3].row["tags"] == "developer;java"
    assert records[4].row == MERGED


@pytest.mark.asyncio
async def test_aggregation_functions_live_in_the_schema_and_the_options_leave_the_properties(fluss: Any) -> None:
    path, _table = await create_table(fluss, AGG_FIELDS[:3], primary_keys=["id"], properties={
        "table.merge-engine": "aggregation", "fields.total.agg": "sum"})
    info = await fluss.get_admin().get_table_info(path)
    assert info.get_properties()["table.merge-engine"] == "aggregation"
    assert not [key for key in info.get_properties() if key.startswith("fields.")]


@pytest.mark.asyncio
async def test_partial_aggregation_and_deletes_follow_the_delete_behavior(fluss: Any) -> None:
    fields = [pa.field("id", pa.int32()), pa.field("clicks", pa.int64()), pa.field("views", pa.int64())]
    options = {"table.merge-engine": "aggregation", "fields.clicks.agg": "sum", "fields.views.agg": "sum"}
    _path, ignoring = await create_table(fluss, fields, primary_keys=["id"], bucket_count=1, properties=options)
    await write_each(ignoring, [{"id": 1, "clicks": 1, "views": 10}])
    partial = ignoring.new_upsert().partial_update_by_name(["id", "clicks"]).create_writer()
    await partial.upsert({"id": 1, "clicks": 5}).wait()
    assert await lookup(ignoring, {"id": 1}) == {"id": 1, "clicks": 6, "views": 10}
    await ignoring.new_upsert().create_writer().delete({"id": 1}).wait()  # ignored by default
    assert await lookup(ignoring, {"id": 1}) == {"id": 1, "clicks": 6, "views": 10}

    _path, allowing = await create_table(
        fluss, fields, primary_keys=["id"], bucket_count=1, properties={**options, "table.delete.behavior": "allow"}
    )
    await write_each(allowing, [{"id": 1, "clicks": 1, "views": 10}, {"id": 1, "clicks": 2, "views": None}])
    await allowing.new_upsert().partial_update_by_name(["id", "clicks"]).create_writer().delete({"id": 1}).wait()
    assert await lookup(allowing, {"id": 1}) == {"id": 1, "clicks": None, "views": 10}
    await allowing.new_upsert().create_writer().delete({"id": 1}).wait()
    assert await lookup(allowing, {"id": 1}) is None
    records = await changelog(allowing, 6)
    assert change_types(records) == ["+I", "-U", "+U", "-U", "+U", "-D"]
    assert records[-1].row == {"id": 1, "clicks": None, "views": 10}


@pytest.mark.asyncio
async def test_first_row_keeps_the_first_row_and_ignores_later_writes_and_deletes(fluss: Any) -> None:
    _path, table = await create_table(
        fluss, KV_FIELDS, primary_keys=["id"], bucket_count=1, properties={"table.merge-engine": "first_row"}
    )
    await write_each(table, [{"id": 1, "ver": 1, "name": "first"}, {"id": 1, "ver": 2, "name": "second"}])
    await table.new_upsert().create_writer().delete({"id": 1}).wait()
    assert await lookup(table, {"id": 1}) == {"id": 1, "ver": 1, "name": "first"}
    assert change_types(await changelog(table, 1)) == ["+I"]  # the quiet poll after it shows extras
    with pytest.raises(Exception, match="Partial update is not supported for the first_row merge engine"):
        await table.new_upsert().partial_update_by_name(["id", "name"]).create_writer().upsert(
            {"id": 1, "name": "x"}
        ).wait()


@pytest.mark.asyncio
async def test_versioned_keeps_the_newest_version_whatever_the_arrival_order(fluss: Any) -> None:
    properties = {"table.merge-engine": "versioned", "table.merge-engine.versioned.ver-column": "ver",
                  "table.delete.behavior": "disable"}
    _path, table = await create_table(fluss, KV_FIELDS, primary_keys=["id"], bucket_count=1, properties=properties)
    await write_each(table, [{"id": 1, "ver": 5, "name": "v5"}, {"id": 1, "ver": 2, "name": "v2"},
                             {"id": 1, "ver": 5, "name": "v5 again"}, {"id": 1, "ver": None, "name": "no version"}])
    assert await lookup(table, {"id": 1}) == {"id": 1, "ver": 5, "name": "v5 again"}
    records = await changelog(table, 3)
    assert [(t, r.row["name"]) for t, r in zip(change_types(records), records, strict=True)] == [
        ("+I", "v5"), ("-U", "v5"), ("+U", "v5 again")
    ]
    with pytest.raises(Exception, match="disable"):
        await table.new_upsert().create_writer().delete({"id": 1}).wait()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fields", "primary_keys", "properties", "message"),
    [
        (KV_FIELDS, None, {"table.merge-engine": "first_row"}, "Merge engine is only supported in primary key table"),
        (KV_FIELDS, None, {"table.delete.behavior": "ignore"}, "only supported for primary key tables"),
        (KV_FIELDS, ["id"], {"table.merge-engine": "first_row", "table.delete.behavior": "allow"},
         "does not support delete operations"),
        (KV_FIELDS, ["id"], {"table.merge-engine": "versioned"}, "must be set for versioned merge engine"),
        (KV_FIELDS, ["id"], {"table.merge-engine": "versioned", "table.merge-engine.versioned.ver-column": "name"},
         "must be one type of"),
        (KV_FIELDS, ["id"], {"table.merge-engine": "aggregation", "fields.name.agg": "sum"},
         "Invalid aggregation function for column 'name'"),
        (KV_FIELDS, ["id"], {"table.merge-engine": "aggregation", "fields.ver.agg": "avg"}, "Unknown aggregation function"),
        (KV_FIELDS, ["id"], {"table.merge-engine": "dedup"}, "Could not parse value 'dedup'"),
    ],
)
async def test_invalid_merge_options_are_refused_at_creation(
    fluss: Any, fields: list[pa.Field], primary_keys: list[str] | None, properties: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        await create_table(fluss, fields, primary_keys=primary_keys, properties=properties)


@pytest.mark.asyncio
async def test_merged_state_survives_a_crash_and_merging_goes_on(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_factory(data_dir=data_dir)
    config = pyfluss.Config({"bootstrap.servers": first.address})
    connection = await pyfluss.FlussConnection.create(config)
    try:
        agg_path, agg = await create_table(connection, AGG_FIELDS, primary_keys=["id"], bucket_count=1,
                                           properties=AGG_OPTIONS)
        await write_each(agg, WRITES[:2])
        first_path, first_row = await create_table(connection, KV_FIELDS, primary_keys=["id"], bucket_count=1,
                                                   properties={"table.merge-engine": "first_row"})
        await write_each(first_row, [{"id": 1, "ver": 1, "name": "first"}])
    finally:
        await connection.close()
    first.kill()

    second = server_factory(data_dir=data_dir, port=first.port)
    connection = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": second.address}))
    try:
        agg = await connection.get_table(agg_path)
        await write_each(agg, WRITES[2:])  # merges with the replayed state
        assert await lookup(agg, {"id": 1}) == MERGED
        first_row = await connection.get_table(first_path)
        await write_each(first_row, [{"id": 1, "ver": 2, "name": "second"}])
        assert await lookup(first_row, {"id": 1}) == {"id": 1, "ver": 1, "name": "first"}
    finally:
        await connection.close()
