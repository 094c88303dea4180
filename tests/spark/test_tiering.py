"""The tiering service end to end: real server processes, real Spark (local mode), real Delta tables read
back by DuckDB. Each test has its own server, so a driver's ``once`` covers just that test's tables."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from strom.client.lake import tiering_lease_id
from strom.records.types import BigIntType, IntType, StringType
from tests.spark.support import Fluss, wait_until
from tests.spark.tiering_support import (
    FAST_TIERING,
    LAKE_FORMATS,
    PK_LAKE_FORMATS,
    DriverThread,
    Gates,
    create_lake_table,
    lake_rows,
    lake_snapshot,
    strom_rows,
    tier_once,
    tiering_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(300)]

PK_COLUMNS = [("id", IntType()), ("name", StringType()), ("score", BigIntType())]
LOG_COLUMNS = [("id", IntType()), ("day", StringType()), ("event", StringType())]
PK_NAMES = ["id", "name", "score"]


@pytest.mark.parametrize("lake_format", PK_LAKE_FORMATS)
def test_primary_key_table_lake_copy_is_its_state_across_rounds(spark: Any, server_factory: Any, lake_format: str) -> None:
    cluster = Fluss(server_factory(tiering_config(lake_format)).address)
    table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(100)])
    first = tier_once(spark, cluster)
    assert len(first.outcomes) == 1
    assert lake_rows(cluster, table, PK_NAMES) == strom_rows(cluster, table, PK_NAMES)

    cluster.upsert(table, [{"id": i, "name": f"u{i}", "score": -i} for i in range(0, 100, 3)])
    cluster.delete(table, [{"id": i} for i in range(1, 100, 5)])
    cluster.upsert(table, [{"id": i, "name": f"new{i}", "score": i} for i in range(100, 120)])
    cluster.delete(table, [{"id": 101}])
    cluster.upsert(table, [{"id": 101, "name": "back", "score": 1}])
    tier_once(spark, cluster)
    assert lake_rows(cluster, table, PK_NAMES) == strom_rows(cluster, table, PK_NAMES)

    cluster.delete(table, [{"id": i} for i in range(0, 120, 2)])
    tier_once(spark, cluster)
    expected = strom_rows(cluster, table, PK_NAMES)
    assert lake_rows(cluster, table, PK_NAMES) == expected
    assert len(expected) < 70

    snapshot = lake_snapshot(cluster, table)
    assert snapshot is not None
    assert {b.bucket: o for b, o in snapshot.bucket_offsets.items()} == cluster.high_watermarks(table, 2)
    buckets = dict(lake_rows(cluster, table, ["id", "__bucket"]))
    assert set(buckets.values()) == {0, 1}


@pytest.mark.parametrize("lake_format", LAKE_FORMATS)
def test_partitioned_log_table_holds_every_record_once(spark: Any, server_factory: Any, lake_format: str) -> None:
    cluster = Fluss(server_factory(tiering_config(lake_format)).address)
    days = [{"day": "d1"}, {"day": "d2"}]
    table = create_lake_table(cluster, LOG_COLUMNS, partition_keys=["day"], partitions=days, bucket_count=2)
    cluster.append(table, [{"id": i, "day": f"d{1 + i % 2}", "event": f"e{i}"} for i in range(50)])
    tier_once(spark, cluster)
    cluster.append(table, [{"id": i, "day": f"d{1 + i % 2}", "event": f"e{i}"} for i in range(50, 80)])
    tier_once(spark, cluster)
    expected = [(i, f"d{1 + i % 2}", f"e{i}") for i in range(80)]
    assert lake_rows(cluster, table, ["id", "day", "event"]) == expected


def test_first_round_reads_the_leased_snapshots_while_they_roll(spark: Any, server_factory: Any, tmp_path: Path) -> None:
    """Snapshots roll every second and only one is retained, yet the round reads exactly what it leased,
    the lease is renewed while the round outlasts its duration, and pins nothing afterwards."""
    server = server_factory({**FAST_TIERING, "kv.snapshot.interval": "1s", "kv.snapshot.num-retained": "1",
                             "kv.snapshot.lease.expiration-check-interval": "200ms"})
    cluster = Fluss(server.address)
    table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(200)])
    snapshots = cluster.wait_for_snapshots_at_high_watermark(table, 2)
    gates = Gates(tmp_path / "gates")
    gates.hold("task")
    thread = DriverThread(spark, cluster, lease_duration_ms=1500, gate_dir=gates.path).start()
    gates.wait_reached("task")
    lease_id = tiering_lease_id("test-job")
    [held] = [lease for lease in cluster.leases() if lease.lease_id == lease_id]
    pinned = held.snapshots
    assert {b.bucket: s for b, s in pinned.items()} == {b: s.snapshot_id for b, s in snapshots.items()}
    for round_number in range(4):  # newer snapshots replace the retained one while the round waits
        cluster.upsert(table, [{"id": 1000 + round_number, "name": "later", "score": 0}])
        wait_until(lambda: cluster.latest_snapshots(table) != snapshots, "a newer snapshot")

    time.sleep(2.0)  # longer than the lease duration, with expired leases reaped every 200 ms
    [renewed] = [lease for lease in cluster.leases() if lease.lease_id == lease_id]
    assert renewed.snapshots == pinned
    assert renewed.expiration_ms > held.expiration_ms, "the heartbeats renewed the lease"
    gates.release("task")
    driver = thread.join()
    [(_, outcome)] = driver.outcomes
    assert {b.bucket: o for b, o in outcome.offsets.items()} == {b: s.log_offset for b, s in snapshots.items()}
    assert lake_rows(cluster, table, PK_NAMES) == [(i, f"n{i}", i) for i in range(200)]
    assert all(not lease.snapshots for lease in cluster.leases() if lease.lease_id == lease_id)

    tier_once(spark, cluster)  # the changelog after the snapshots follows as log splits
    assert lake_rows(cluster, table, PK_NAMES) == strom_rows(cluster, table, PK_NAMES)


def test_log_only_table_takes_no_lease_and_the_lease_is_dropped_at_the_end(spark: Any, server_factory: Any) -> None:
    cluster = Fluss(server_factory(FAST_TIERING).address)
    table = create_lake_table(cluster, LOG_COLUMNS, bucket_count=1)
    cluster.append(table, [{"id": 1, "day": "d", "event": "e"}])
    tier_once(spark, cluster)
    assert [lease.lease_id for lease in cluster.leases()] == []
    assert lake_rows(cluster, table, ["id"]) == [(1,)]


def test_table_with_nothing_new_finishes_without_a_lake_commit(spark: Any, server_factory: Any) -> None:
    cluster = Fluss(server_factory(FAST_TIERING).address)
    table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=1)
    cluster.upsert(table, [{"id": 1, "name": "a", "score": 1}])
    tier_once(spark, cluster)
    before = lake_snapshot(cluster, table)
    driver = tier_once(spark, cluster)
    [(_, outcome)] = driver.outcomes
    assert outcome.lake_snapshot_id is None
    assert lake_snapshot(cluster, table) == before


def _spark_rows(frame: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted(tuple(row[c] for c in columns) for row in frame.select(*columns).collect())


def _planned(cluster: Fluss, table: str, **options: str) -> list[Any]:
    from strom.spark import FlussDataSource

    source = FlussDataSource(cluster.options(table, **options))
    return list(source.reader(source.schema()).partitions())


@pytest.mark.parametrize("lake_format", PK_LAKE_FORMATS)
def test_union_read_merges_the_lake_with_the_changes_after_it(spark: Any, server_factory: Any, lake_format: str) -> None:
    from strom.spark.partitions import KvStatePartition, LakeBucketPartition
    from tests.spark.test_spark_batch_read import load

    cluster = Fluss(server_factory(tiering_config(lake_format)).address)
    table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(1, 41)])
    assert {type(p) for p in _planned(cluster, table)} == {KvStatePartition}, "not tiered yet: strom alone"
    tier_once(spark, cluster)
    tiered = strom_rows(cluster, table, PK_NAMES)
    cluster.upsert(table, [{"id": 2, "name": "updated", "score": -2}, {"id": 41, "name": "new", "score": 41}])
    cluster.delete(table, [{"id": 3}, {"id": 4}])
    current = strom_rows(cluster, table, PK_NAMES)
    assert current != tiered

    planned = _planned(cluster, table)
    assert {type(p) for p in planned} == {LakeBucketPartition}
    assert sum(p.log_end_offset - p.log_start_offset for p in planned) > 0, "the changelog tail is read"
    assert _spark_rows(load(spark, cluster, table), PK_NAMES) == current
    assert _spark_rows(load(spark, cluster, table, **{"read.source": "lake"}), PK_NAMES) == tiered
    assert _spark_rows(load(spark, cluster, table, **{"read.source": "strom"}), PK_NAMES) == current
    assert {type(p) for p in _planned(cluster, table, **{"read.source": "strom"})} == {KvStatePartition}


@pytest.mark.parametrize("lake_format", LAKE_FORMATS)
def test_union_read_of_a_partitioned_log_table_returns_every_record_once(
    spark: Any, server_factory: Any, lake_format: str
) -> None:
    from tests.spark.test_spark_batch_read import load

    cluster = Fluss(server_factory(tiering_config(lake_format)).address)
    days = [{"day": "d1"}, {"day": "d2"}]
    table = create_lake_table(cluster, LOG_COLUMNS, partition_keys=["day"], partitions=days, bucket_count=2)
    cluster.append(table, [{"id": i, "day": f"d{1 + i % 2}", "event": f"e{i}"} for i in range(30)])
    tier_once(spark, cluster)
    cluster.append(table, [{"id": i, "day": f"d{1 + i % 2}", "event": f"e{i}"} for i in range(30, 45)])
    names = ["id", "day", "event"]
    assert _spark_rows(load(spark, cluster, table), names) == [(i, f"d{1 + i % 2}", f"e{i}") for i in range(45)]
    assert _spark_rows(load(spark, cluster, table, **{"read.source": "lake"}), names) == [
        (i, f"d{1 + i % 2}", f"e{i}") for i in range(30)
    ]


def test_read_source_lake_on_a_table_without_a_lake_is_a_clear_error(spark: Any, server_factory: Any) -> None:
    from tests.spark.test_spark_batch_read import load

    cluster = Fluss(server_factory(FAST_TIERING).address)
    table = cluster.create_table(PK_COLUMNS, primary_key=["id"], bucket_count=1)
    with pytest.raises(Exception, match="has no lake"):
        load(spark, cluster, table, **{"read.source": "lake"}).collect()
    lake_table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=1)
    with pytest.raises(Exception, match="not been tiered"):
        load(spark, cluster, lake_table, **{"read.source": "lake"}).collect()


def test_union_read_keeps_partitions_only_the_lake_still_has(spark: Any, server_factory: Any) -> None:
    """A partition dropped from strom after it was tiered is still read from the lake; a new partition
    that was never tiered is read from strom alone."""
    from strom.ids import TablePath
    from tests.spark.support import run
    from tests.spark.test_spark_batch_read import load

    cluster = Fluss(server_factory(FAST_TIERING).address)
    columns = [("id", IntType()), ("day", StringType()), ("name", StringType())]
    table = create_lake_table(cluster, columns, primary_key=["id", "day"], partition_keys=["day"],
                              partitions=[{"day": "d1"}, {"day": "d2"}], bucket_count=1)
    cluster.upsert(table, [{"id": i, "day": day, "name": f"{day}-{i}"} for i in range(5) for day in ("d1", "d2")])
    tier_once(spark, cluster)

    async def reshape(connection: Any) -> None:
        admin = connection.get_admin()
        await admin.drop_partition(TablePath.parse(table), {"day": "d1"})
        await admin.create_partition(TablePath.parse(table), {"day": "d3"})

    run(cluster.address, reshape)
    cluster.upsert(table, [{"id": 9, "day": "d3", "name": "new"}, {"id": 0, "day": "d2", "name": "changed"}])
    got = _spark_rows(load(spark, cluster, table), ["day", "id", "name"])
    expected = ([("d1", i, f"d1-{i}") for i in range(5)] + [("d2", 0, "changed")]
                + [("d2", i, f"d2-{i}") for i in range(1, 5)] + [("d3", 9, "new")])
    assert got == sorted(expected)


@pytest.mark.parametrize("lake_format", PK_LAKE_FORMATS)
def test_a_column_added_to_a_tiered_table_reaches_the_lake(spark: Any, server_factory: Any, lake_format: str) -> None:
    """ADD COLUMN on a lake-enabled table: the next round adds it to the lake table; rows tiered before read
    it as null in the lake (DuckDB) and in the union read, which right after the ALTER still reads the old
    lake snapshot with the new schema."""
    from strom.client import Column, Connection, TablePath
    from tests.spark.support import run
    from tests.spark.test_spark_batch_read import load

    cluster = Fluss(server_factory(tiering_config(lake_format)).address)
    table = create_lake_table(cluster, PK_COLUMNS, primary_key=["id"], bucket_count=2)
    cluster.upsert(table, [{"id": i, "name": f"n{i}", "score": i} for i in range(10)])
    tier_once(spark, cluster)

    async def add(connection: Connection) -> None:
        await connection.get_admin().alter_table(TablePath.parse(table), add_columns=[Column("email", StringType())])

    run(cluster.address, add)
    names = [*PK_NAMES, "email"]
    assert _spark_rows(load(spark, cluster, table), names) == [(i, f"n{i}", i, None) for i in range(10)]
    cluster.upsert(table, [{"id": 3, "name": "x", "score": 3, "email": "x@y"},
                           {"id": 20, "name": "new", "score": 20, "email": "n@y"}])
    tier_once(spark, cluster)
    expected = strom_rows(cluster, table, names)
    assert (3, "x", 3, "x@y") in expected and (0, "n0", 0, None) in expected
    assert lake_rows(cluster, table, names) == expected
    assert _spark_rows(load(spark, cluster, table, **{"read.source": "lake"}), names) == expected


def test_lookups_of_an_expired_partition_are_answered_from_the_lake(spark: Any, server_factory: Any) -> None:
    """Historical partitions (``table.datalake.historical-partition.enabled``, Paimon): a partition tiered into
    the lake and then expired from the cluster by auto-partition retention stays readable by key — strom's
    lookuper sends its keys to the table's ``__historical__`` partition, whose bucket leader reads the lake
    table; a key it lacks is None, a current or future partition never created holds nothing, and keys of
    live and expired partitions mix in one batch. A server that takes one such lookup at a time refuses the
    others with HistoricalPartitionThrottled (73), which the lookuper retries."""
    import asyncio
    from datetime import UTC, datetime, timedelta

    from strom.client import Connection, TablePath
    from strom.ids import TableBucket
    from strom.rpc.api_keys import ApiKey
    from strom.rpc.client import RpcConnection
    from strom.rpc.messages import pb
    from strom.table_properties import HISTORICAL_PARTITION_VALUE
    from tests.spark.support import run

    cluster = Fluss(server_factory(tiering_config("paimon", **{
        "auto-partition.check.interval": "300ms", "netty.server.max-queued-historical-requests": "1"})).address)
    today = datetime.now(UTC).date()
    old, recent = (today - timedelta(days=3)).strftime("%Y%m%d"), today.strftime("%Y%m%d")
    future = (today + timedelta(days=30)).strftime("%Y%m%d")
    columns = [("id", IntType()), ("dt", StringType()), ("name", StringType())]
    table = create_lake_table(cluster, columns, primary_key=["id", "dt"], partition_keys=["dt"], bucket_count=2,
                              partitions=[{"dt": old}], properties={
                                  "table.auto-partition.enabled": "true", "table.auto-partition.time-unit": "DAY",
                                  "table.auto-partition.time-zone": "UTC", "table.auto-partition.num-retention": "7",
                                  "table.datalake.historical-partition.enabled": "true"})
    cluster.upsert(table, [{"id": i, "dt": old, "name": f"old-{i}"} for i in range(20)])
    tier_once(spark, cluster)
    path = TablePath.parse(table)

    async def expire(connection: Connection) -> None:
        admin = connection.get_admin()
        await admin.alter_table(path, set_properties={"table.auto-partition.num-retention": "1"})
        deadline = time.monotonic() + 30
        while old in {p.partition_name for p in await admin.list_partition_infos(path)}:
            assert time.monotonic() < deadline, "retention did not drop the old partition"
            await asyncio.sleep(0.2)

    run(cluster.address, expire)
    cluster.upsert(table, [{"id": 1, "dt": recent, "name": "live"}])

    async def look(connection: Connection) -> tuple[Any, ...]:
        lookuper = (await connection.get_table(path)).new_lookup().create_lookuper()
        one = await lookuper.lookup({"id": 7, "dt": old})
        missing = await lookuper.lookup({"id": 99, "dt": old})
        not_created = await lookuper.lookup({"id": 7, "dt": future})
        mixed = await lookuper.lookup_many([{"id": 1, "dt": recent}, {"id": 2, "dt": old}, {"id": 3, "dt": old}])
        many = await asyncio.gather(*(lookuper.lookup({"id": i, "dt": old}) for i in range(10)))
        return one, missing, not_created, mixed, many

    one, missing, not_created, mixed, many = run(cluster.address, look)
    assert one == {"id": 7, "dt": old, "name": "old-7"}
    assert missing is None and not_created is None
    assert mixed == [{"id": 1, "dt": recent, "name": "live"}, {"id": 2, "dt": old, "name": "old-2"},
                     {"id": 3, "dt": old, "name": "old-3"}]
    assert many == [{"id": i, "dt": old, "name": f"old-{i}"} for i in range(10)]

    async def raw(connection: Connection) -> list[int]:
        """Concurrent historical lookups straight at the leader: beyond one at a time, refused with 73."""
        info = (await connection.get_table(path)).layout.info
        historical = await connection.metadata.partition_id(info, HISTORICAL_PARTITION_VALUE)
        host, port = (await connection.metadata.leader_address(TableBucket(info.table_id, 0, historical))).rsplit(":", 1)
        rpc = await RpcConnection.connect(host, int(port))
        try:
            request = pb.LookupRequest(table_id=info.table_id)
            request.buckets_req.add(partition_id=historical, bucket_id=0, keys=[b"not-a-key"],
                                    original_partition_name=f"{int(old) - 1}")  # a bucket never read: slow
            answers = await asyncio.gather(*(rpc.request(ApiKey.LOOKUP, request) for _ in range(6)))
            return [a.buckets_resp[0].error_code if a.buckets_resp[0].HasField("error_code") else 0 for a in answers]
        finally:
            await rpc.close()

    codes = run(cluster.address, raw)
    assert 73 in codes and 0 in codes, codes
