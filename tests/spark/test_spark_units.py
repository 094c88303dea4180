"""The connector's pure parts, without Spark: the changelog fold, budget sharing, and lease re-picking."""

from __future__ import annotations

import asyncio
import random

import pyarrow as pa
import pytest

from strom.client import Connection
from strom.client.changelog import ChangelogFold, KeyEncoder, change_type_column, merge_snapshot
from strom.client.log_scanner import ScanBatch
from strom.client.table import TableLayout
from strom.ids import TableBucket, TablePath
from strom.metadata.table_info import TableInfo
from strom.records.log_batch import ChangeType
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import BigIntType, IntType, StringType
from strom.spark import planning
from strom.spark.binlog import BinlogAssembler, binlog_schema
from strom.spark.errors import FlussConnectorError
from strom.spark.options import ReadOptions
from strom.spark.stream_reader import share_budget
from strom.spark.type_mapping import spark_arrow_schema
from tests.spark.support import Fluss, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(120)]

INS, UB, UA, D = ChangeType.INSERT, ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER, ChangeType.DELETE


def layout_of(columns: list[tuple[str, object]], primary_key: list[str], partition_keys: tuple[str, ...] = ()) -> TableLayout:
    descriptor = TableDescriptor(Schema.of(columns, primary_key), partition_keys=partition_keys, bucket_count=1)  # type: ignore[arg-type]
    return TableLayout(TableInfo(1, TablePath("db", "t"), 1, descriptor.to_json(), 0, 0))


def batch(layout: TableLayout, rows: list[dict[str, object]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=layout.arrow_schema)


def test_key_bytes_match_the_writers_keys_for_composite_and_partitioned_keys() -> None:
    layout = layout_of(
        [("day", StringType()), ("id", IntType()), ("name", StringType()), ("n", BigIntType())],
        ["day", "id", "name"], partition_keys=("day",),
    )
    rows = [{"day": "d1", "id": i, "name": f"x{i}", "n": i} for i in range(50)]
    expected = [layout.key_encoder.encode((r["day"], r["id"], r["name"], r["n"])) for r in rows]
    assert KeyEncoder(layout).keys(batch(layout, rows)) == expected


def test_the_fold_keeps_the_last_change_per_key_and_merges_over_a_snapshot() -> None:
    layout = layout_of([("id", IntType()), ("v", StringType())], ["id"])
    fold = ChangelogFold(layout)
    fold.add(batch(layout, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 1, "v": "a"}]), bytes([INS, INS, UB]))
    fold.add(batch(layout, [{"id": 1, "v": "a2"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}]), bytes([UA, D, INS]))
    fold.add(batch(layout, [{"id": 5, "v": "old"}]), bytes([UB]))  # -U alone neither deletes nor upserts

    keys = KeyEncoder(layout)
    snapshot_rows = batch(layout, [{"id": 0, "v": "s0"}, {"id": 1, "v": "s1"}, {"id": 2, "v": "s2"}, {"id": 5, "v": "s5"}])
    merged = list(merge_snapshot([(keys.keys(snapshot_rows), snapshot_rows)], fold))
    merged += list(fold.live_rows(batch_rows_max=1))
    assert sorted(pa.Table.from_batches(merged).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 0, "v": "s0"}, {"id": 1, "v": "a2"}, {"id": 3, "v": "c"}, {"id": 5, "v": "s5"},
    ]
    assert change_type_column(bytes([INS, UB, UA, D]), 4).to_pylist() == ["+I", "-U", "+U", "-D"]
    assert change_type_column(ChangeType.INSERT, 2).to_pylist() == ["+I", "+I"]


def test_the_read_budget_is_shared_fairly_and_always_makes_progress() -> None:
    rng = random.Random(7)
    for _ in range(500):
        pending = {TableBucket(1, b): rng.randint(1, 100) for b in range(rng.randint(1, 6))}
        budget = rng.randint(1, 300)
        taken = share_budget(pending, budget)
        assert sum(taken.values()) == min(budget, sum(pending.values())), (pending, budget, taken)
        assert all(0 <= taken[b] <= pending[b] for b in pending)
        fair = budget // len(pending)
        assert all(taken[b] >= min(pending[b], fair) for b in pending), (pending, budget, taken)


def test_a_snapshot_deleted_before_it_was_leased_is_replaced_by_the_latest(snapshot_cluster: Fluss) -> None:
    cluster = snapshot_cluster
    table = cluster.create_table([("id", IntType()), ("v", StringType())], primary_key=["id"], bucket_count=1)
    cluster.upsert(table, [{"id": 1, "v": "a"}])
    first = cluster.wait_for_snapshots_at_high_watermark(table, 1)[0]
    cluster.upsert(table, [{"id": 1, "v": "b"}])
    latest = wait_until(
        lambda: (s := cluster.latest_snapshots(table)[0]) is not None and s.snapshot_id > first.snapshot_id and s,
        "a newer snapshot",
    )
    wait_until(lambda: (0, first.snapshot_id) not in cluster.retained_snapshot_ids(table), "retention of the first")
    options = ReadOptions.parse({"scan.kv.snapshot.lease.id": "test-repick"})

    async def lease() -> dict[TableBucket, object]:
        async with await Connection.create(cluster.address) as connection:
            layout = (await connection.get_table(TablePath.parse(table))).layout
            admin = connection.get_admin()
            stale = {layout.info.buckets()[0]: first}
            picks = []

            async def rechoose(lost: object) -> planning.Choice:
                picks.append(sorted(lost))  # type: ignore[call-overload]
                return await planning.latest_snapshots(admin, layout, [planning.PartitionRef(None, None)])

            chosen = await planning.lease_snapshots(admin, options, stale, rechoose)
            assert picks == [[layout.info.buckets()[0]]]
            return dict(chosen)

    chosen = asyncio.run(lease())
    assert list(chosen.values()) == [latest]
    leases = [x for x in cluster.leases() if x.lease_id == "test-repick"]
    assert [list(x.snapshots.values()) for x in leases] == [[latest.snapshot_id]]
    asyncio.run(_drop(cluster.address, "test-repick"))


async def _drop(address: str, lease_id: str) -> None:
    async with await Connection.create(address) as connection:
        await connection.get_admin().create_kv_snapshot_lease(lease_id, 1).drop()


def test_docs_list_every_connector_option() -> None:
    from pathlib import Path

    from strom.spark.options import ALL_OPTIONS

    text = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    assert [o.key for o in ALL_OPTIONS if f"| `{o.key}` |" not in text] == []


def test_timestamps_parse_as_epoch_milliseconds_or_iso_times_in_utc_unless_zoned() -> None:
    from strom.spark.options import SCAN_STARTUP_TIMESTAMP, parse_timestamp_ms

    assert parse_timestamp_ms(SCAN_STARTUP_TIMESTAMP, "1700000000123") == 1_700_000_000_123
    assert parse_timestamp_ms(SCAN_STARTUP_TIMESTAMP, "2023-11-14 22:13:20.123") == 1_700_000_000_123
    assert parse_timestamp_ms(SCAN_STARTUP_TIMESTAMP, "2023-11-14T22:13:20.123Z") == 1_700_000_000_123
    assert parse_timestamp_ms(SCAN_STARTUP_TIMESTAMP, "2023-11-15T00:13:20.123+02:00") == 1_700_000_000_123


def test_a_long_log_range_splits_into_even_ranges_that_cover_it_exactly() -> None:
    from strom.spark.partitions import LogRangePartition, split_log_range

    bucket = TableBucket(1, 0)
    whole = LogRangePartition(bucket, 5, 105, 7, 9)
    assert split_log_range(whole, None) == [whole]
    assert split_log_range(whole, 100) == [whole]
    pieces = split_log_range(whole, 30)
    assert [(p.start_offset, p.end_offset) for p in pieces] == [(5, 30), (30, 55), (55, 80), (80, 105)]
    assert {(p.time_start_ms, p.time_end_ms) for p in pieces} == {(7, 9)}
    for size in range(1, 40):
        covered = split_log_range(LogRangePartition(bucket, 0, 97), size)
        assert all(p.end_offset - p.start_offset <= size for p in covered)
        assert [o for p in covered for o in range(p.start_offset, p.end_offset)] == list(range(97))


def binlog_assembler(first_offset: int) -> tuple[TableLayout, BinlogAssembler]:
    layout = layout_of([("id", IntType()), ("name", StringType())], ["id"])
    return layout, BinlogAssembler(layout, spark_arrow_schema(binlog_schema(layout)), 0, first_offset)


def scan(layout: TableLayout, base: int, changes: list[tuple[ChangeType, int, str]]) -> ScanBatch:
    rows = batch(layout, [{"id": key, "name": name} for _type, key, name in changes])
    return ScanBatch(TableBucket(1, 0), base, bytes(change for change, *_ in changes), rows, 1_000)


def test_binlog_pairs_an_update_across_scan_batches_and_skips_a_pair_owned_by_the_range_before() -> None:
    layout, assembler = binlog_assembler(first_offset=4)
    first = assembler.add(scan(layout, 4, [(ChangeType.UPDATE_AFTER, 1, "b"), (ChangeType.INSERT, 2, "x"),
                                           (ChangeType.UPDATE_BEFORE, 2, "x")]))
    assert assembler.awaiting_update_after
    second = assembler.add(scan(layout, 7, [(ChangeType.UPDATE_AFTER, 2, "y"), (ChangeType.DELETE, 1, "b")]))

    assert first is not None and second is not None
    rows = first.to_pylist() + second.to_pylist()
    assert [(r["_change_type"], r["_log_offset"], r["before"], r["after"]) for r in rows] == [
        ("insert", 5, None, {"id": 2, "name": "x"}),
        ("update", 6, {"id": 2, "name": "x"}, {"id": 2, "name": "y"}),
        ("delete", 8, {"id": 1, "name": "b"}, None),
    ]
    assert not assembler.awaiting_update_after


def test_binlog_refuses_a_changelog_whose_update_pairs_are_broken() -> None:
    layout, assembler = binlog_assembler(first_offset=0)
    broken = scan(layout, 0, [(ChangeType.INSERT, 1, "a"), (ChangeType.UPDATE_AFTER, 1, "b")])
    with pytest.raises(FlussConnectorError, match="offset 1: an update's -U and \\+U records are not adjacent"):
        assembler.add(broken)
