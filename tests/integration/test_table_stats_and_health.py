"""GetTableStats (1059) and GetClusterHealth (1062) on a real server, through strom's client and the CLI."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from strom.cli.main import main as strom_cli
from strom.client import Connection, Schema, TableBucket, TableDescriptor, TablePath
from strom.errors import PartitionNotExistError
from strom.metadata.cluster_health import ClusterHealthStatus
from strom.metadata.rebalance_plan import ServerTag
from tests.conftest import unique_name

pytestmark = pytest.mark.asyncio

KV = pa.schema([("id", pa.int64()), ("name", pa.string())])
LOG = pa.schema([("id", pa.int64()), ("day", pa.string())])


async def _table(connection: Any, schema: pa.Schema, **descriptor: Any) -> Any:
    path = TablePath("fluss", unique_name("stats"))
    primary_key = descriptor.pop("primary_key", None)
    await connection.get_admin().create_table(
        path, TableDescriptor(Schema.from_arrow(schema, primary_key=primary_key), **descriptor))
    return await connection.get_table(path)


async def _cli(arguments: list[str]) -> Any:
    """The CLI runs its own event loop: on a thread, beside this test's."""
    return await asyncio.to_thread(CliRunner().invoke, strom_cli, arguments)


async def _counts(connection: Any, table: Any, partition_id: int | None = None) -> dict[int, int | None]:
    info = table.layout.info
    counts = await connection.get_admin().get_bucket_row_counts(info.buckets(partition_id))
    return {bucket.bucket: count for bucket, count in counts.items()}


async def test_row_counts_of_primary_key_log_and_partitioned_tables(server: Any) -> None:
    async with await Connection.create(server.address) as connection:
        kv = await _table(connection, KV, primary_key=["id"], bucket_count=3)
        writer = kv.new_upsert().create_writer()
        writer.upsert_arrow_batch(pa.record_batch({"id": list(range(20)), "name": ["a"] * 20}, schema=KV))
        writer.upsert_arrow_batch(pa.record_batch({"id": list(range(10)), "name": ["b"] * 10}, schema=KV))
        for key in (1, 2, 3, 99):  # 99 was never written
            writer.delete({"id": key})
        await writer.flush()
        kv_counts = await _counts(connection, kv)
        assert sorted(kv_counts) == [0, 1, 2] and sum(kv_counts.values()) == 17  # type: ignore[arg-type]

        wal = await _table(connection, KV, primary_key=["id"], bucket_count=1,
                           properties={"table.changelog.image": "WAL"})
        writer = wal.new_upsert().create_writer()
        writer.upsert({"id": 1, "name": "x"})
        await writer.flush()
        assert await _counts(connection, wal) == {0: None}, "a WAL changelog cannot count live keys"

        log = await _table(connection, LOG, bucket_count=2)
        appender = log.new_append().create_writer()
        appender.append_arrow_batch(pa.record_batch({"id": list(range(15)), "day": ["d"] * 15}, schema=LOG))
        await appender.flush()
        assert sum((await _counts(connection, log)).values()) == 15  # type: ignore[arg-type]

        partitioned = await _table(connection, LOG, bucket_count=1, partition_keys=["day"])
        admin = connection.get_admin()
        for day in ("d1", "d2"):
            await admin.create_partition(partitioned.layout.info.path, {"day": day})
        partitioned = await connection.get_table(partitioned.layout.info.path)
        appender = partitioned.new_append().create_writer()
        appender.append_arrow_batch(pa.record_batch({"id": [1, 2, 3], "day": ["d1", "d2", "d2"]}, schema=LOG))
        await appender.flush()
        ids = {p.partition_name: p.partition_id for p in await admin.list_partition_infos(partitioned.layout.info.path)}
        assert await _counts(connection, partitioned, ids["d1"]) == {0: 1}
        assert await _counts(connection, partitioned, ids["d2"]) == {0: 2}

        with pytest.raises(PartitionNotExistError):
            await admin.get_bucket_row_counts([TableBucket(kv.layout.info.table_id, 0, 12345)])

        shown = await _cli(["table", "stats", str(kv.layout.info.path), "-b", server.address, "--json"])
        assert shown.exit_code == 0, shown.output
        document = json.loads(shown.output)
        assert document["row_count"] == 17 and len(document["buckets"]) == 3
        shown = await _cli(["table", "stats", str(partitioned.layout.info.path), "--partition", "d2",
                                               "-b", server.address, "--json"])
        assert json.loads(shown.output)["buckets"] == [{"partition": "d2", "bucket": 0, "row_count": 2}]
        shown = await _cli(["table", "stats", str(wal.layout.info.path), "-b", server.address])
        assert shown.exit_code == 0 and "- rows" in shown.output, shown.output


async def test_a_single_server_is_green_with_every_bucket_led(server: Any) -> None:
    async with await Connection.create(server.address) as connection:
        before = await connection.get_admin().get_cluster_health()
        await _table(connection, KV, primary_key=["id"], bucket_count=4)
        after = await connection.get_admin().get_cluster_health()
    assert after.status is ClusterHealthStatus.GREEN
    assert after.num_leader_replicas == before.num_leader_replicas + 4
    assert after.num_replicas == after.in_sync_replicas == after.num_leader_replicas == after.active_leader_replicas
    shown = await _cli(["health", "-b", server.address])
    assert shown.exit_code == 0 and shown.output.startswith("GREEN: "), shown.output


async def test_bucket_sizes_leaderships_and_server_tags_of_strom_s_extensions(server: Any) -> None:
    """What the console shows beyond Fluss's fields: bytes per bucket, the ISR, a server's tag."""
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        kv = await _table(connection, KV, primary_key=["id"], bucket_count=2)
        log_table = await _table(connection, LOG, bucket_count=1)
        writer = kv.new_upsert().create_writer()
        writer.upsert_arrow_batch(pa.record_batch({"id": list(range(200)), "name": ["x" * 50] * 200}, schema=KV))
        await writer.flush()
        appender = log_table.new_append().create_writer()
        appender.append_arrow_batch(pa.record_batch({"id": [1, 2], "day": ["d", "d"]}, schema=LOG))
        await appender.flush()

        stats = await admin.get_bucket_stats(kv.layout.info.buckets() + log_table.layout.info.buckets())
        for bucket in kv.layout.info.buckets():
            assert stats[bucket].log_size_bytes and stats[bucket].log_size_bytes > 0
            assert stats[bucket].kv_size_bytes and stats[bucket].kv_size_bytes > 0  # memtables before a flush
        (log_bucket,) = log_table.layout.info.buckets()
        assert stats[log_bucket].row_count == 2 and stats[log_bucket].kv_size_bytes is None
        assert stats[log_bucket].log_size_bytes and stats[log_bucket].log_size_bytes > 0

        leaderships = await admin.get_bucket_leaderships(kv.layout.info.path)
        server_id = next(n.id for n in await admin.get_server_nodes() if n.server_type == "TabletServer")
        assert [(lead.bucket.bucket, lead.leader, lead.replicas, lead.isr) for lead in leaderships] == [
            (0, server_id, (server_id,), (server_id,)), (1, server_id, (server_id,), (server_id,))]

        assert all(n.tag is None for n in await admin.get_server_nodes(include_tags=True))
        await admin.add_server_tag([server_id], ServerTag.TEMPORARY_OFFLINE)
        try:
            tagged = {n.id: n.tag for n in await admin.get_server_nodes(include_tags=True)
                      if n.server_type == "TabletServer"}
            assert tagged == {server_id: "TEMPORARY_OFFLINE"}
            assert all(n.tag is None for n in await admin.get_server_nodes()), "tags only when asked for"
        finally:
            await admin.remove_server_tag([server_id], ServerTag.TEMPORARY_OFFLINE)
