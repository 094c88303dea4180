"""A StromServer running in this process, for what only in-process access can trigger: a bucket losing
leadership (no RPC asks a single-node cluster to give it up) and the metrics endpoint's live values."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.errors import ScannerExpiredError, StorageError
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.server.node import StromServer
from tests.server_process import free_port

pytestmark = pytest.mark.asyncio


async def _started(tmp_path: Path, config: dict[str, str]) -> StromServer:
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration(config))
    await server.start()
    return server


async def _pk_table(address: str, name: str, rows: int) -> tuple[Connection, object]:
    connection = await Connection.create(address)
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    await connection.get_admin().create_table(TablePath("fluss", name), TableDescriptor(schema, bucket_count=1))
    table = await connection.get_table(TablePath("fluss", name))
    await table.new_upsert().create_writer().upsert_batch(pa.table({"id": list(range(rows)), "v": ["x"] * rows}))
    return connection, table


async def test_a_bucket_losing_leadership_closes_its_scan_sessions(tmp_path: Path) -> None:
    server = await _started(tmp_path, {"kv.snapshot.interval": "0s"})
    try:
        connection, table = await _pk_table(f"127.0.0.1:{server.port}", "leader", 50)
        rpc = await RpcConnection.connect("127.0.0.1", server.port)
        try:
            table_id = table.table_info.table_id  # type: ignore[attr-defined]
            request = pb.ScanKvRequest(call_seq_id=0, batch_size_bytes=1)
            request.bucket_scan_req.table_id = table_id
            request.bucket_scan_req.bucket_id = 0
            opened = await rpc.request(ApiKey.SCAN_KV, request)
            assert opened.has_more_results and not opened.HasField("error_code")
            assert server.scans is not None and server.scans.scanners.session_count == 1
            assert server.tablet_server is not None
            await server.tablet_server.stop_replicas(table_id, None, delete=False)
            assert server.scans.scanners.session_count == 0
            late = await rpc.request(
                ApiKey.SCAN_KV, pb.ScanKvRequest(scanner_id=opened.scanner_id, call_seq_id=1, batch_size_bytes=1)
            )
            assert late.error_code == ScannerExpiredError.code
            reopen = await rpc.request(ApiKey.SCAN_KV, request)
            assert reopen.error_code == 21  # the bucket is no longer hosted here
        finally:
            await rpc.close()
            await connection.close()
    finally:
        await server.stop()


async def test_metrics_report_leases_and_retained_snapshots(tmp_path: Path) -> None:
    port = free_port()
    server = await _started(
        tmp_path, {"kv.snapshot.interval": "100ms", "metrics.reporter.prometheus.port": str(port)}
    )
    try:
        address = f"127.0.0.1:{server.port}"
        connection, _table = await _pk_table(address, "metered", 20)
        try:
            admin = connection.get_admin()
            path = TablePath("fluss", "metered")
            for _ in range(200):
                latest = await admin.get_latest_kv_snapshots(path)
                if latest.snapshots[0] is not None:
                    break
                await asyncio.sleep(0.05)
            assert latest.snapshots[0] is not None
            lease = admin.create_kv_snapshot_lease("metered-lease", 60_000)
            await lease.acquire_snapshots({latest.table_bucket(0): latest.snapshots[0].snapshot_id})

            def scrape() -> dict[str, float]:
                body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read()
                values = {}
                for line in body.decode().splitlines():
                    if line and not line.startswith("#"):
                        name, _, value = line.rpartition(" ")
                        values[name] = float(value)
                return values

            metrics = await asyncio.to_thread(scrape)
            assert metrics["strom_kv_snapshot_lease_count"] == 1
            assert metrics["strom_kv_snapshot_leased_snapshot_count"] == 1
            assert metrics['strom_kv_snapshot_retained_count{table="fluss.metered"}'] >= 1
            assert metrics['strom_kv_snapshot_retained_bytes{table="fluss.metered"}'] > 0
            await lease.drop()
            metrics = await asyncio.to_thread(scrape)
            assert metrics["strom_kv_snapshot_lease_count"] == 0
        finally:
            await connection.close()
    finally:
        await server.stop()


async def test_log_retention_keeps_the_changelog_after_a_leased_snapshot(tmp_path: Path) -> None:
    """A leased snapshot outside the retention window still has its catch-up changelog; the lease's release
    lets retention trim it. Snapshots and retention are triggered directly, so nothing depends on timing."""
    server = await _started(
        tmp_path,
        {"kv.snapshot.interval": "0s", "log.segment.file-size": "4kb", "table.log.ttl": "1ms",
         "kv.snapshot.num-retained": "1"},
    )
    try:
        connection, table = await _pk_table(f"127.0.0.1:{server.port}", "held", 100)
        try:
            admin = connection.get_admin()
            path = TablePath("fluss", "held")
            table_id = table.table_info.table_id  # type: ignore[attr-defined]
            (replica,) = [r for r in server.replicas.hosted() if r.bucket.table_id == table_id]
            writer = table.new_upsert().create_writer()  # type: ignore[attr-defined]

            async def write_round(tag: str) -> None:
                await writer.upsert_batch(pa.table({"id": list(range(100)), "v": [f"{tag}-{i:04d}" * 8 for i in range(100)]}))

            async def snapshot() -> int:
                completed = await server.snapshot_scheduler.snapshot(replica)
                assert completed is not None
                return completed.log_offset

            async def earliest() -> int:
                return (await admin.list_offsets(path, [0], OffsetSpec.earliest()))[0]

            await write_round("a")
            leased_offset = await snapshot()
            lease = admin.create_kv_snapshot_lease("reader", 60_000)
            await lease.acquire_snapshots({replica.bucket: 0})
            for tag in ("b", "c", "d"):
                await write_round(tag)
                await snapshot()
            await asyncio.sleep(0.01)  # every segment is now older than the 1 ms ttl

            await server.snapshot_scheduler.apply_log_retention()
            assert await earliest() <= leased_offset
            scanner = table.new_scan().create_log_scanner()  # type: ignore[attr-defined]
            scanner.subscribe(0, leased_offset)
            batches = await scanner.poll(5_000)
            assert batches and batches[0].base_offset == leased_offset

            await lease.drop()  # snapshot 0 leaves retention; the changelog before snapshot 3 may go
            await server.snapshot_scheduler.apply_log_retention()
            assert await earliest() > leased_offset
        finally:
            await connection.close()
    finally:
        await server.stop()


async def test_a_commit_whose_newest_timestamp_cannot_be_stored_is_still_reported_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest-timestamp statistic is written after the lake snapshot is recorded; its failed write used
    to turn a recorded commit into an error, so the job retried a commit that had already happened."""
    server = await _started(tmp_path, {"kv.snapshot.interval": "0s"})
    try:
        address = f"127.0.0.1:{server.port}"
        connection, table = await _pk_table(address, "stats", 20)
        path = TablePath("fluss", "stats")
        admin = connection.get_admin()
        await admin.alter_table(path, set_properties={"table.datalake.enabled": "true", "table.datalake.freshness": "0s"})
        table_id = table.table_info.table_id  # type: ignore[attr-defined]
        deadline = asyncio.get_running_loop().time() + 20
        while (assignment := (await admin.lake_tiering_heartbeat(request_table=True)).assignment) is None:
            assert asyncio.get_running_loop().time() < deadline, "the table was never handed out"
            await asyncio.sleep(0.05)
        bucket = table.bucket(0)  # type: ignore[attr-defined]
        file = await admin.prepare_lake_table_snapshot(table_id, path, {bucket: 20}, assignment.tiering_epoch)

        def disk_full(*_args: object) -> None:
            raise StorageError("disk full")

        assert server.role is not None
        monkeypatch.setattr(server.role.lake_tiering, "record_newest_timestamp", disk_full)
        await admin.commit_lake_table_snapshot(table_id, 1, file, tiering_epoch=assignment.tiering_epoch,
                                               max_timestamps={bucket: 1_700_000_000_000})
        assert (await admin.get_lake_snapshot(path)).snapshot_id == 1
        await connection.close()
    finally:
        await server.stop()


async def test_metrics_reporters_without_prometheus_starts_no_endpoint(tmp_path: Path) -> None:
    """Fluss's ``metrics.reporters``: only the listed reporters start."""
    port = free_port()
    server = await _started(tmp_path, {"metrics.reporter.prometheus.port": str(port), "metrics.reporters": "jmx"})
    try:
        assert server.metrics_port is None
        with pytest.raises(OSError):
            await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/metrics", timeout=2)
    finally:
        await server.stop()


async def _lake_round(connection: Connection, path: TablePath, table_id: int, snapshot_id: int, offset: int) -> None:
    """One tiering round's protocol, as the tiering service runs it: take the table, prepare and commit bucket
    0's offset, finish."""
    from strom.client.lake import FinishedTiering
    from strom.ids import TableBucket

    admin = connection.get_admin()
    for _ in range(200):
        assignment = (await admin.lake_tiering_heartbeat(request_table=True)).assignment
        if assignment is not None and assignment.table_id == table_id:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the table was never handed out for tiering")
    file = await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): offset},
                                                   assignment.tiering_epoch)
    await admin.commit_lake_table_snapshot(table_id, snapshot_id, file, tiering_epoch=assignment.tiering_epoch)
    await admin.lake_tiering_heartbeat(finished=[FinishedTiering(table_id, assignment.tiering_epoch)])


async def test_a_lake_tables_log_outlives_its_ttl_until_the_lake_holds_it(tmp_path: Path) -> None:
    """``table.log.ttl`` deletes none of a lake-enabled table's records before a lake snapshot holds them:
    the coordinator tells the buckets how far the lake reaches (NotifyLakeTableOffset), and retention stops
    there — the segment holding the lake's end stays, and so does everything after it."""
    server = await _started(tmp_path, {"kv.snapshot.interval": "0s", "log.segment.file-size": "1kb",
                                       "remote.log.task-interval-duration": "0s",
                                       "lake.tiering.heartbeat-timeout": "30s"})
    try:
        connection = await Connection.create(f"127.0.0.1:{server.port}")
        try:
            admin = connection.get_admin()
            path = TablePath("fluss", "tiered_events")
            schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]))
            await admin.create_table(path, TableDescriptor(schema, bucket_count=1, properties={
                "table.datalake.enabled": "true", "table.datalake.freshness": "0s", "table.log.ttl": "1ms"}))
            table = await connection.get_table(path)
            writer = table.new_append().create_writer()
            for batch in range(12):  # a segment per batch or two
                ids = list(range(batch * 20, batch * 20 + 20))
                await writer.write_arrow_batch(pa.table({"id": ids, "v": ["x" * 40] * 20}))
            table_id = table.table_info.table_id
            (replica,) = [r for r in server.replicas.hosted() if r.bucket.table_id == table_id]
            assert len(replica.log.closed_segments(replica.log.high_watermark)) >= 4
            await asyncio.sleep(0.01)  # every segment is older than the 1 ms ttl

            async def earliest() -> int:
                return (await admin.list_offsets(path, [0], OffsetSpec.earliest()))[0]

            assert server.snapshot_scheduler is not None
            assert await server.snapshot_scheduler.apply_log_retention() == 0  # nothing is in the lake yet
            assert await earliest() == 0
            await _lake_round(connection, path, table_id, 1, 100)
            assert replica.bucket in {b for b in [replica.bucket] if server.replicas.retained.lake(b) is not None}
            assert await server.snapshot_scheduler.apply_log_retention() > 0
            start = await earliest()
            assert 0 < start <= 100  # what the lake holds went; the segment holding offset 100 stayed
            scanner = table.new_scan().create_log_scanner()
            scanner.subscribe(0, start)
            first = await scanner.poll(5_000)
            assert first and first[0].base_offset == start
        finally:
            await connection.close()
    finally:
        await server.stop()


async def test_remote_segments_of_a_lake_table_expire_only_once_the_lake_holds_them(tmp_path: Path) -> None:
    """Fluss's rule for a lake-enabled table's remote log: a segment past ``table.log.ttl`` is deleted from
    remote storage only once the lake holds all of it."""
    server = await _started(tmp_path, {"kv.snapshot.interval": "0s", "log.segment.file-size": "1kb",
                                       "remote.log.task-interval-duration": "50ms",
                                       "lake.tiering.heartbeat-timeout": "30s"})
    try:
        connection = await Connection.create(f"127.0.0.1:{server.port}")
        try:
            path = TablePath("fluss", "remote_tiered")
            schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]))
            await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1, properties={
                "table.datalake.enabled": "true", "table.datalake.freshness": "0s", "table.log.ttl": "1ms"}))
            table = await connection.get_table(path)
            writer = table.new_append().create_writer()
            for batch in range(12):
                ids = list(range(batch * 20, batch * 20 + 20))
                await writer.write_arrow_batch(pa.table({"id": ids, "v": ["x" * 40] * 20}))
            table_id = table.table_info.table_id
            bucket = next(r.bucket for r in server.replicas.hosted() if r.bucket.table_id == table_id)
            remote = server.tablets.remote_logs
            assert remote is not None

            async def until(condition: Callable[[], bool], what: str) -> None:
                for _ in range(400):
                    if condition():
                        return
                    await asyncio.sleep(0.025)
                raise AssertionError(what)

            await until(lambda: (remote.remote_end_offset(bucket) or 0) >= 200, "the segments were not copied")
            await asyncio.sleep(0.3)  # several rounds, each of which would expire every copied segment
            assert remote.start_offset(bucket) == 0
            await _lake_round(connection, path, table_id, 1, 100)
            await until(lambda: (remote.start_offset(bucket) or 0) > 0, "nothing expired after the commit")
            assert 0 < (remote.start_offset(bucket) or 0) <= 100
        finally:
            await connection.close()
    finally:
        await server.stop()
