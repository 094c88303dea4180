"""The coordinator's lake side on real server processes, through strom's client (and pyfluss where it
reaches): lake-enabled tables and their options, AlterTable, the tiering heartbeat, prepare and commit of
lake snapshots with epoch fencing, GetLakeSnapshot, DescribeLakeTiering, restarts, drops and metrics."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.client.lake import FinishedTiering, TieringAssignment
from strom.errors import (
    FencedTieringEpochError,
    InvalidAlterTableError,
    InvalidConfigError,
    InvalidCoordinatorError,
    LakeSnapshotNotExistError,
    LogOffsetOutOfRangeError,
    PartitionNotExistError,
    StromError,
    TableNotExistError,
    UnknownTableOrBucketError,
    UnsupportedVersionError,
)
from strom.ids import TableBucket
from strom.records.types import IntType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.server_process import ServerProcess, free_port

pytestmark = pytest.mark.asyncio

FAST = {"lake.tiering.heartbeat-timeout": "30s", "lake.tiering.heartbeat-check-interval": "100ms",
        "kv.snapshot.interval": "0s"}
LAKE = {"table.datalake.enabled": "true", "table.datalake.freshness": "0s"}
SCHEMA = Schema.of([("id", IntType()), ("name", StringType())], ["id"])
PARTITIONED_SCHEMA = Schema.of([("id", IntType()), ("region", StringType())], ["id", "region"])
WAIT_S = 20.0
"""Bound on waiting for the server to hand a table out (normally immediate; ~1 s after a timeout)."""
# FAST's heartbeat timeout is long so that a busy machine never fences a job between two of a test's
# requests; the test of the timeout itself sets 1 s.


ROWS = 200
"""Rows written to each new table: every bucket's log then reaches past the offsets the tests commit (a
prepare beyond a bucket's high watermark is refused)."""


async def create(connection: Connection, properties: dict[str, str] | None = None, buckets: int = 2) -> TablePath:
    path = TablePath("fluss", unique_name("lake"))
    await connection.get_admin().create_table(
        path, TableDescriptor(SCHEMA, bucket_count=buckets, properties=properties or {})
    )
    await fill(connection, path, {"id": list(range(ROWS)), "name": [f"n{i}" for i in range(ROWS)]})
    return path


async def fill(connection: Connection, path: TablePath, columns: dict[str, list[Any]]) -> None:
    writer = (await connection.get_table(path)).new_upsert().create_writer()
    await writer.upsert_batch(pa.table(columns))


def read_json(location: str) -> Any:
    return json.loads(Path(location).read_text())


def exists(location: str) -> bool:
    return Path(location).exists()


def write(location: str, text: str) -> None:
    Path(location).write_text(text)


def scrape(port: int) -> str:
    return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())


async def take_table(connection: Connection, table_id: int) -> TieringAssignment:
    """Ask for tables until ``table_id`` is handed out (bounded)."""
    admin = connection.get_admin()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        result = await admin.lake_tiering_heartbeat(request_table=True)
        if result.assignment is not None and result.assignment.table_id == table_id:
            return result.assignment
        await asyncio.sleep(0.02)
    raise AssertionError(f"table {table_id} was never handed out")


async def taken(connection: Connection) -> tuple[TablePath, int, int]:
    """A new lake table with rows, taken by this test as its tiering job: its path, id and tiering epoch."""
    path = await create(connection, LAKE)
    table_id = (await connection.get_admin().get_table_info(path)).table_id
    return path, table_id, (await take_table(connection, table_id)).tiering_epoch


async def commit_round(
    connection: Connection, path: TablePath, table_id: int, snapshot_id: int, offsets: dict[int, int]
) -> tuple[TieringAssignment, str]:
    """Take the table, prepare and commit ``offsets`` (bucket -> offset), report the round finished."""
    admin = connection.get_admin()
    assignment = await take_table(connection, table_id)
    buckets = {TableBucket(table_id, bucket): offset for bucket, offset in offsets.items()}
    file = await admin.prepare_lake_table_snapshot(table_id, path, buckets, assignment.tiering_epoch)
    await admin.commit_lake_table_snapshot(table_id, snapshot_id, file, tiering_epoch=assignment.tiering_epoch)
    done = await admin.lake_tiering_heartbeat(finished=[FinishedTiering(table_id, assignment.tiering_epoch)])
    assert done.errors == {}
    return assignment, file


async def test_one_round_of_the_protocol(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        info = await admin.get_table_info(path)
        assert info.properties["table.datalake.format"] == "delta"
        assert info.properties["table.datalake.delta.warehouse"] == str((server.data_dir / "lake").resolve())
        with pytest.raises(LakeSnapshotNotExistError, match="has no lake snapshot yet"):
            await admin.get_lake_snapshot(path)
        registration = await admin.lake_tiering_heartbeat()
        assert (registration.coordinator_epoch, registration.assignment, registration.errors) == (0, None, {})

        assignment = await take_table(connection, info.table_id)
        assert (assignment.table_path, assignment.tiering_epoch) == (path, 1)
        assert (await admin.lake_tiering_heartbeat(tiering={info.table_id: 1})).errors == {}
        # a long freshness keeps the table Scheduled once this round ends, so that its status can be read
        # before the next round falls due
        await admin.alter_table(path, set_properties={"table.datalake.freshness": "1 h"})
        offsets = {TableBucket(info.table_id, 0): 10, TableBucket(info.table_id, 1): 3}
        file = await admin.prepare_lake_table_snapshot(info.table_id, path, offsets, tiering_epoch=1)
        remote = (server.data_dir / "remote").resolve()
        assert Path(file).parent == remote / "lake" / "fluss" / f"{path.table_name}-{info.table_id}" / "metadata"
        assert file.endswith(".offsets")
        assert read_json(file) == {"version": 1, "table_id": info.table_id, "bucket_offsets": [10, 3]}
        await admin.commit_lake_table_snapshot(
            info.table_id, 7, file, tiering_epoch=1, max_timestamps={TableBucket(info.table_id, 0): 1_234}
        )
        snapshot = await admin.get_lake_snapshot(path)
        assert (snapshot.table_id, snapshot.snapshot_id, snapshot.bucket_offsets) == (info.table_id, 7, offsets)
        assert (await admin.get_lake_snapshot(path, readable=True)).snapshot_id == 7
        assert (await admin.get_lake_snapshot(path, snapshot_id=7)).bucket_offsets == offsets

        done = await admin.lake_tiering_heartbeat(finished=[FinishedTiering(info.table_id, 1, False, 512, 13)])
        assert done.errors == {}
        [status] = await admin.describe_lake_tiering(path)
        assert (status.table_id, status.table_path, status.state, status.tiering_epoch) == (
            info.table_id, path, "Scheduled", 1)
        assert (status.lake_snapshot_id, status.bucket_offsets, status.file_size, status.record_count) == (
            7, offsets, 512, 13)
        assert (status.failures, status.freshness_ms, status.newest_timestamp) == (0, 3_600_000, 1_234)
        assert status.last_tiered_time is not None and status.last_round_duration_ms is not None
        assert status.pending_since is None

        # A shorter freshness re-arms the waiting table's timer: the next round is due at once.
        await admin.alter_table(path, set_properties={"table.datalake.freshness": "0s"})
        # The next round merges its offsets into the previous ones; the older snapshot and its file go.
        second = await take_table(connection, info.table_id)
        assert second.tiering_epoch == 2
        merged = await admin.prepare_lake_table_snapshot(info.table_id, path, {TableBucket(info.table_id, 1): 9}, 2)
        assert read_json(merged)["bucket_offsets"] == [10, 9]
        await admin.commit_lake_table_snapshot(info.table_id, 8, merged, tiering_epoch=2)
        assert not exists(file)
        with pytest.raises(LakeSnapshotNotExistError, match=r"Lake snapshot 7 of table"):
            await admin.get_lake_snapshot(path, snapshot_id=7)


async def test_lake_offsets_only_move_forward(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        table_id = (await admin.get_table_info(path)).table_id
        await commit_round(connection, path, table_id, 1, {0: 10, 1: 3})
        epoch = (await take_table(connection, table_id)).tiering_epoch
        backwards = await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): 4}, epoch)
        with pytest.raises(LogOffsetOutOfRangeError, match="back from offset 10 to 4"):
            await admin.commit_lake_table_snapshot(table_id, 2, backwards, tiering_epoch=epoch)
        request = pb.PrepareLakeTableSnapshotRequest(ignore_previous_table_offsets=True)
        entry = request.bucket_offsets.add(table_id=table_id, table_path=pb.PbTablePath(
            database_name=path.database_name, table_name=path.table_name))
        entry.bucket_offsets.add(bucket_id=0, log_end_offset=11)
        response = await connection.coordinator_request(ApiKey.PREPARE_LAKE_TABLE_SNAPSHOT, request)
        forgetful = response.prepare_lake_table_resp[0].lake_table_offsets_path
        assert read_json(forgetful)["bucket_offsets"] == [11]
        with pytest.raises(LogOffsetOutOfRangeError, match="has no offset for"):
            await admin.commit_lake_table_snapshot(table_id, 2, forgetful, tiering_epoch=epoch)
        assert (await admin.get_lake_snapshot(path)).snapshot_id == 1


async def test_official_client_reads_the_latest_lake_snapshot(server_factory: Any) -> None:
    import fluss

    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE, buckets=1)
        table_id = (await admin.get_table_info(path)).table_id
        await commit_round(connection, path, table_id, 3, {0: 5})
    official = await fluss.FlussConnection.create(fluss.Config({"bootstrap.servers": server.address}))
    try:
        snapshot = await official.get_admin().get_latest_lake_snapshot(fluss.TablePath(*path))
        assert snapshot.snapshot_id == 3
        assert list(snapshot.table_buckets_offset.values()) == [5]
    finally:
        await official.close()


async def test_a_job_that_stops_heartbeating_is_fenced_and_its_table_handed_out_again(server_factory: Any) -> None:
    server = server_factory({**FAST, "lake.tiering.heartbeat-timeout": "1s"})
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        table_id = (await admin.get_table_info(path)).table_id
        first = await take_table(connection, table_id)
        file = await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): 1}, 1)
        second = await take_table(connection, table_id)  # once the 1 s heartbeat timeout has passed
        assert second.tiering_epoch == first.tiering_epoch + 1
        stale = await admin.lake_tiering_heartbeat(
            tiering={table_id: first.tiering_epoch}, failed={table_id: first.tiering_epoch},
            finished=[FinishedTiering(table_id, first.tiering_epoch)],
        )
        assert isinstance(stale.errors[table_id], FencedTieringEpochError)
        assert "is not match current epoch 2" in str(stale.errors[table_id])
        with pytest.raises(FencedTieringEpochError):
            await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): 1}, first.tiering_epoch)
        with pytest.raises(FencedTieringEpochError):
            await admin.commit_lake_table_snapshot(table_id, 1, file, tiering_epoch=first.tiering_epoch)
        [status] = await admin.describe_lake_tiering(path)
        assert (status.state, status.failures) == ("Tiering", 1)
        assert status.last_failure is not None and "no heartbeat from the tiering job" in status.last_failure
        assert status.last_failure_time is not None and status.last_failure_time > 0
        # the new holder commits; a commit without an epoch (an official client) is served as Fluss does
        await admin.commit_lake_table_snapshot(table_id, 1, file, tiering_epoch=second.tiering_epoch)
        await admin.commit_lake_table_snapshot(table_id, 2, file)
        assert (await admin.get_lake_snapshot(path)).snapshot_id == 2


async def test_heartbeats_from_another_coordinator_epoch_are_refused_per_table(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        path = await create(connection, LAKE)
        table_id = (await connection.get_admin().get_table_info(path)).table_id
        held = await take_table(connection, table_id)  # a job presents the epoch it was handed
        request = pb.LakeTieringHeartbeatRequest()
        request.tiering_tables.add(table_id=table_id, coordinator_epoch=3, tiering_epoch=held.tiering_epoch)
        request.tiering_tables.add(table_id=table_id, coordinator_epoch=0, tiering_epoch=held.tiering_epoch)
        response = await connection.coordinator_request(ApiKey.LAKE_TIERING_HEARTBEAT, request)
        stale, current = response.tiering_table_resp
        assert stale.error.error_code == InvalidCoordinatorError.code
        assert "coordinator epoch 3" in stale.error.error_message
        assert not current.HasField("error")


async def test_alter_table_enables_and_disables_the_lake_keeping_epochs_and_snapshots(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection)
        assert "table.datalake.format" not in (await admin.get_table_info(path)).properties
        assert await admin.describe_lake_tiering() == []
        await admin.alter_table(path, set_properties={"table.datalake.enabled": "true",
                                                      "table.datalake.freshness": "0s"})
        info = await admin.get_table_info(path)
        assert info.properties["table.datalake.delta.warehouse"] == str((server.data_dir / "lake").resolve())
        assignment, _ = await commit_round(connection, path, info.table_id, 4, {0: 2})

        await admin.alter_table(path, reset_properties=["table.datalake.enabled"])
        properties = (await admin.get_table_info(path)).properties
        assert "table.datalake.format" not in properties and "table.datalake.delta.warehouse" not in properties
        assert properties["table.datalake.freshness"] == "0s", "the table's own options stay"
        assert await admin.describe_lake_tiering() == []
        assert (await admin.lake_tiering_heartbeat(request_table=True)).assignment is None
        assert (await admin.get_lake_snapshot(path)).snapshot_id == 4, "the lake still holds the data"

        await admin.alter_table(path, set_properties={"table.datalake.enabled": "true"})
        again = await take_table(connection, info.table_id)
        assert again.tiering_epoch > assignment.tiering_epoch, "re-enabling never reuses an epoch"
        await admin.alter_table(path, set_properties={"table.datalake.freshness": "1 h"})
        [status] = await admin.describe_lake_tiering(path)
        assert status.freshness_ms == 3_600_000


async def test_alter_table_refuses_what_cannot_change(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection)
        with pytest.raises(InvalidConfigError, match="not the cluster's lake format"):
            await admin.alter_table(path, set_properties={"table.datalake.enabled": "true",
                                                          "table.datalake.format": "paimon"})
        with pytest.raises(InvalidConfigError, match=r"Could not parse value 'soon' for key 'table\.datalake\.freshness'"):
            await admin.alter_table(path, set_properties={"table.datalake.freshness": "soon"})
        with pytest.raises(InvalidConfigError, match=r"Could not parse value '-1s' for key 'table\.datalake\.freshness'"):
            await admin.alter_table(path, set_properties={"table.datalake.freshness": "-1s"})
        with pytest.raises(InvalidConfigError, match=r"Could not parse value 'yes' for key 'table\.datalake\.enabled'"):
            await admin.alter_table(path, set_properties={"table.datalake.enabled": "yes"})
        with pytest.raises(InvalidAlterTableError, match=r"not supported to alter yet: 'table\.kv\.format'\."):
            await admin.alter_table(path, set_properties={"table.kv.format": "INDEXED"})
        with pytest.raises(TableNotExistError):
            await admin.alter_table(TablePath("fluss", "missing"), set_properties={"a": "b"})
        await admin.alter_table(TablePath("fluss", "missing"), set_properties={"a": "b"}, ignore_if_not_exists=True)
        await admin.alter_table(path, set_properties={"owner": "ops"})
        assert (await admin.get_table_info(path)).descriptor.custom_properties == {"owner": "ops"}
        await admin.alter_table(path, reset_properties=["owner"])
        assert (await admin.get_table_info(path)).descriptor.custom_properties == {}

        table_path = pb.PbTablePath(database_name=path.database_name, table_name=path.table_name)
        append = pb.AlterTableRequest(table_path=table_path, ignore_if_not_exists=False)
        append.config_changes.add(config_key="owner", config_value="x", op_type=2)
        with pytest.raises(InvalidAlterTableError, match="Alter operation 2"):
            await connection.coordinator_request(ApiKey.ALTER_TABLE, append)
        columns = pb.AlterTableRequest(table_path=table_path, ignore_if_not_exists=False)
        columns.drop_columns.add(column_name="name")
        with pytest.raises(InvalidAlterTableError, match="Not support drop column now"):
            await connection.coordinator_request(ApiKey.ALTER_TABLE, columns)
        with pytest.raises(InvalidConfigError, match=r"Could not parse value 'yes' for key 'table\.datalake\.enabled'"):
            await create(connection, {"table.datalake.enabled": "yes"})
        with pytest.raises(InvalidConfigError, match="not the cluster's lake format"):
            await create(connection, {"table.datalake.enabled": "true", "table.datalake.format": "iceberg"})


async def test_server_lake_options_reach_tables_except_secrets(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({**FAST, "datalake.delta.warehouse": "s3://bucket/lake",
                             "datalake.delta.aws_region": "eu-west-1",
                             "datalake.delta.aws_secret_access_key": "hunter2"})
    async with await Connection.create(server.address) as connection:
        path = await create(connection, {"table.datalake.enabled": "TRUE", "table.datalake.format": "Delta"})
        properties = (await connection.get_admin().get_table_info(path)).properties
        assert properties["table.datalake.enabled"] == "true"
        assert properties["table.datalake.format"] == "delta"
        assert properties["table.datalake.delta.warehouse"] == "s3://bucket/lake"
        assert properties["table.datalake.delta.aws_region"] == "eu-west-1"
        assert not any("secret" in key for key in properties)


async def test_an_unknown_lake_format_stops_the_server_at_start(tmp_path: Path) -> None:
    process = ServerProcess(tmp_path / "data", {"datalake.format": "orc"})
    with pytest.raises(RuntimeError, match=r"invalid value for datalake\.format: 'orc' is not one of delta, iceberg, lance, paimon"):
        process.start()


async def test_partitioned_tables_snapshots_carry_partition_names(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = TablePath("fluss", unique_name("lake"))
        await admin.create_table(path, TableDescriptor(PARTITIONED_SCHEMA, partition_keys=("region",),
                                                       bucket_count=2, properties=LAKE))
        await admin.create_partition(path, {"region": "EU"})
        await admin.create_partition(path, {"region": "US"})
        await fill(connection, path, {"id": [*range(ROWS), *range(ROWS)], "region": ["EU"] * ROWS + ["US"] * ROWS})
        ids = {p.partition_name: p.partition_id for p in await admin.list_partition_infos(path)}
        table_id = (await admin.get_table_info(path)).table_id
        epoch = (await take_table(connection, table_id)).tiering_epoch
        offsets = {TableBucket(table_id, 1, ids["EU"]): 6, TableBucket(table_id, 0, ids["US"]): 2}
        with pytest.raises(UnknownTableOrBucketError, match="needs partitions"):
            await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): 1}, epoch)
        with pytest.raises(PartitionNotExistError):
            await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0, 999_999): 1}, epoch)
        file = await admin.prepare_lake_table_snapshot(table_id, path, offsets, epoch)
        assert read_json(file)["partition_offsets"] == [
            {"partition_id": ids["EU"], "bucket_offsets": [-1, 6]}, {"partition_id": ids["US"], "bucket_offsets": [2]},
        ]
        await admin.commit_lake_table_snapshot(table_id, 1, file, tiering_epoch=epoch)
        snapshot = await admin.get_lake_snapshot(path)
        assert (snapshot.bucket_offsets, snapshot.partition_names) == (offsets, {ids["EU"]: "EU", ids["US"]: "US"})
        [status] = await admin.describe_lake_tiering(path)
        assert status.partition_names == {ids["EU"]: "EU", ids["US"]: "US"}
        await admin.drop_partition(path, {"region": "US"})
        after = await admin.get_lake_snapshot(path)
        assert (after.bucket_offsets, after.partition_names) == (offsets, {ids["EU"]: "EU", ids["US"]: "US"}), (
            "a dropped partition's rows are still in the lake, under its recorded name")
        assert (await admin.lake_tiering_heartbeat(finished=[FinishedTiering(table_id, epoch)])).errors == {}
        epoch = (await take_table(connection, table_id)).tiering_epoch
        eu_only = await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0, ids["EU"]): 1}, epoch)
        await admin.commit_lake_table_snapshot(table_id, 2, eu_only, tiering_epoch=epoch)
        latest = await admin.get_lake_snapshot(path)
        assert latest.partition_names == {ids["EU"]: "EU", ids["US"]: "US"}, "names carry over across commits"


async def test_readable_snapshots_and_retention(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE, buckets=1)
        table_id = (await admin.get_table_info(path)).table_id
        epoch = (await take_table(connection, table_id)).tiering_epoch
        bucket = TableBucket(table_id, 0)
        first = await admin.prepare_lake_table_snapshot(table_id, path, {bucket: 5}, epoch)
        await admin.commit_lake_table_snapshot(table_id, 1, first, tiering_epoch=epoch, readable=False)
        with pytest.raises(LakeSnapshotNotExistError, match="no readable lake snapshot"):
            await admin.get_lake_snapshot(path, readable=True)
        second = await admin.prepare_lake_table_snapshot(table_id, path, {bucket: 9}, epoch)
        readable = await admin.prepare_lake_table_snapshot(table_id, path, {bucket: 7}, epoch)
        request = pb.CommitLakeTableSnapshotRequest()
        request.lake_table_snapshot_metadata.add(
            table_id=table_id, snapshot_id=2, tiered_bucket_offsets_file_path=second,
            readable_bucket_offsets_file_path=readable, earliest_snapshot_id_to_keep=-1, tiering_epoch=epoch,
        )
        response = await connection.coordinator_request(ApiKey.COMMIT_LAKE_TABLE_SNAPSHOT, request)
        assert not response.table_resp[0].HasField("error_code") or response.table_resp[0].error_code == 0
        assert (await admin.get_lake_snapshot(path)).bucket_offsets == {bucket: 9}
        assert (await admin.get_lake_snapshot(path, readable=True)).bucket_offsets == {bucket: 7}
        assert (await admin.get_lake_snapshot(path, snapshot_id=1)).bucket_offsets == {bucket: 5}, "-1 keeps all"
        third = await admin.prepare_lake_table_snapshot(table_id, path, {bucket: 12}, epoch)
        await admin.commit_lake_table_snapshot(table_id, 3, third, tiering_epoch=epoch, earliest_snapshot_id_to_keep=2)
        with pytest.raises(LakeSnapshotNotExistError):
            await admin.get_lake_snapshot(path, snapshot_id=1)
        assert not exists(first) and exists(second) and exists(readable)


async def test_restart_keeps_lake_snapshots_and_fences_the_round_in_flight(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        table_id = (await admin.get_table_info(path)).table_id
        await take_table(connection, table_id)
        file = await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 1): 4}, 1)
        await admin.commit_lake_table_snapshot(table_id, 2, file, tiering_epoch=1)
    server.stop()
    restarted = server_factory(FAST, data_dir=server.data_dir, port=server.port)
    async with await Connection.create(restarted.address) as connection:
        admin = connection.get_admin()
        snapshot = await admin.get_lake_snapshot(path)
        assert (snapshot.snapshot_id, snapshot.bucket_offsets) == (2, {TableBucket(table_id, 1): 4})
        [status] = await admin.describe_lake_tiering(path)
        assert (status.state, status.tiering_epoch) == ("Pending", 2), "the round in flight at the restart is fenced"
        with pytest.raises(FencedTieringEpochError):
            await admin.commit_lake_table_snapshot(table_id, 3, file, tiering_epoch=1)
        assert (await take_table(connection, table_id)).tiering_epoch == 2


async def test_drop_forgets_the_lake_state_and_deletes_its_offsets_files(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        table_id = (await admin.get_table_info(path)).table_id
        _, file = await commit_round(connection, path, table_id, 1, {0: 1})
        lake_dir = Path(file).parent.parent
        await admin.drop_table(path)
        assert not exists(str(lake_dir))
        assert await admin.describe_lake_tiering() == []
        heartbeat = await admin.lake_tiering_heartbeat(tiering={table_id: 1})
        assert isinstance(heartbeat.errors[table_id], TableNotExistError)
        await admin.create_table(path, TableDescriptor(SCHEMA, bucket_count=2, properties=LAKE))
        assert (await admin.get_table_info(path)).table_id != table_id
        with pytest.raises(LakeSnapshotNotExistError):  # same name, new id: nothing of the old table comes back
            await admin.get_lake_snapshot(path)


async def test_bad_input_gets_clear_errors_and_the_server_keeps_serving(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path, table_id, epoch = await taken(connection)
        good = await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): 1}, epoch)
        directory = str(Path(good).parent)

        with pytest.raises(TableNotExistError, match="The table 987654 doesn't exist"):
            await admin.commit_lake_table_snapshot(987654, 1, good)
        with pytest.raises(TableNotExistError):
            await admin.prepare_lake_table_snapshot(table_id, TablePath("fluss", "other"), {}, None)
        with pytest.raises(UnknownTableOrBucketError, match="has 2 buckets; there is no bucket 5"):
            await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 5): 1}, epoch)
        with pytest.raises(LogOffsetOutOfRangeError, match="negative"):
            await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): -3}, epoch)
        for outside in (str(tmp_path / "elsewhere.offsets"), f"{directory}/../../x.offsets", f"{directory}/"):
            with pytest.raises(StromError, match="is not an offsets file of table"):
                await admin.commit_lake_table_snapshot(table_id, 1, outside, tiering_epoch=epoch)
        with pytest.raises(StromError, match="does not exist"):
            await admin.commit_lake_table_snapshot(table_id, 1, f"{directory}/missing.offsets", tiering_epoch=epoch)
        write(f"{directory}/garbage.offsets", '{"version":1,"table_id":"x"}')
        with pytest.raises(StromError, match="is not a lake offsets file: table_id must be an integer"):
            await admin.commit_lake_table_snapshot(table_id, 1, f"{directory}/garbage.offsets", tiering_epoch=epoch)
        write(f"{directory}/foreign.offsets", '{"version":1,"table_id":5,"bucket_offsets":[1]}')
        with pytest.raises(StromError, match="belongs to table 5"):
            await admin.commit_lake_table_snapshot(table_id, 1, f"{directory}/foreign.offsets", tiering_epoch=epoch)
        write(f"{directory}/wide.offsets", json.dumps({"version": 1, "table_id": table_id,
                                                      "bucket_offsets": [1, 1, 1]}))
        with pytest.raises(UnknownTableOrBucketError):
            await admin.commit_lake_table_snapshot(table_id, 1, f"{directory}/wide.offsets", tiering_epoch=epoch)

        legacy = pb.CommitLakeTableSnapshotRequest()
        legacy.tables_req.add(table_id=table_id, snapshot_id=1).buckets_req.add(bucket_id=0, log_end_offset=1,
                                                                               max_timestamp=5)
        [result] = (await connection.coordinator_request(ApiKey.COMMIT_LAKE_TABLE_SNAPSHOT, legacy)).table_resp
        assert result.error_code == UnsupportedVersionError.code
        assert "lake_table_snapshot_metadata" in result.error_message

        await admin.commit_lake_table_snapshot(table_id, 1, good, tiering_epoch=epoch)  # and a good one still works
        assert (await admin.get_lake_snapshot(path)).snapshot_id == 1


async def test_metrics_report_tiering_states_lag_and_failures(server_factory: Any) -> None:
    port = free_port()
    server = server_factory({**FAST, "metrics.reporter.prometheus.port": str(port)})
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path, table_id, epoch = await taken(connection)
        file = await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): 1}, epoch)
        await admin.commit_lake_table_snapshot(
            table_id, 1, file, tiering_epoch=epoch, max_timestamps={TableBucket(table_id, 0): 1_000}
        )
        [before] = await admin.describe_lake_tiering(path)
        assert (before.last_failure, before.last_failure_time) == (None, None)
        await admin.lake_tiering_heartbeat(failed={table_id: epoch},
                                           failure_reasons={table_id: "ValueError: the lake refused a commit"})
        [failed] = await admin.describe_lake_tiering(path)
        assert failed.last_failure == "ValueError: the lake refused a commit"
        await take_table(connection, table_id)
        await admin.lake_tiering_heartbeat(failed={table_id: epoch + 1})  # an official client sends no reason
        [again] = await admin.describe_lake_tiering(path)
        assert again.failures == 2 and again.last_failure == "the tiering job reported a failure"
        await take_table(connection, table_id)
    body = await asyncio.to_thread(scrape, port)
    assert 'strom_lake_tiering_tables{state="Tiering"} 1.0' in body
    assert 'strom_lake_tiering_tables{state="Pending"} 0.0' in body
    assert f'strom_lake_tiering_lag_seconds{{table="{path}"}}' in body
    assert f'strom_lake_tiering_data_lag_seconds{{table="{path}"}}' in body
    assert f'strom_lake_tiering_failures{{table="{path}"}} 2.0' in body


async def test_offsets_beyond_the_high_watermark_are_refused_and_record_nothing(server_factory: Any) -> None:
    """A caller cannot record lake offsets the log has not reached: they would make every honest commit
    after it look like a step back."""
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path, table_id, epoch = await taken(connection)
        with pytest.raises(LogOffsetOutOfRangeError, match="beyond its log's high watermark"):
            await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): 10**15}, epoch)
        with pytest.raises(LakeSnapshotNotExistError):
            await admin.get_lake_snapshot(path)
        await admin.lake_tiering_heartbeat(finished=[FinishedTiering(table_id, epoch)])
        await commit_round(connection, path, table_id, 1, {0: 10, 1: 3})  # the honest round goes through
        assert (await admin.get_lake_snapshot(path)).snapshot_id == 1


async def test_prepares_never_committed_leave_a_bounded_number_of_files_and_a_commit_clears_them(
    server_factory: Any,
) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path, table_id, epoch = await taken(connection)
        prepared = [await admin.prepare_lake_table_snapshot(table_id, path, {TableBucket(table_id, 0): 1}, epoch)
                    for _ in range(20)]
        directory = Path(prepared[0]).parent
        assert len(list(directory.iterdir())) <= 8, "at most 8 uncommitted offsets files per table"
        await admin.commit_lake_table_snapshot(table_id, 1, prepared[-1], tiering_epoch=epoch)
        assert [str(p) for p in directory.iterdir()] == [prepared[-1]], "only the committed file is left"


async def test_errors_never_name_the_table_behind_an_id(server_factory: Any) -> None:
    server = server_factory(FAST)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        path = await create(connection, LAKE)
        table_id = (await admin.get_table_info(path)).table_id
        with pytest.raises(TableNotExistError) as wrong_path:
            await admin.prepare_lake_table_snapshot(table_id, TablePath("x", "y"), {}, None)
        with pytest.raises(StromError) as outside:
            await admin.commit_lake_table_snapshot(table_id, 1, "/tmp/elsewhere.offsets")
        for message in (str(wrong_path.value), str(outside.value)):
            assert path.table_name not in message and str(server.data_dir) not in message, message
