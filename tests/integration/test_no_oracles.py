"""No oracles: a user without any right asks every request about objects that exist and about objects that
do not, and gets the same answers, up to the name or id it gave. So the answers tell it neither what exists
nor what anything it may not DESCRIBE is called.

Every api key is walked: those naming a table (by id or path), a database, a partition, a producer or a lease
are asked twice and compared; the others are listed below with the reason they name nothing a caller could
probe, and a new api key fails the test until it is placed in one list or the other."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from google.protobuf.json_format import MessageToDict

from strom.client import Connection, Schema, TableBucket, TableDescriptor, TablePath
from strom.errors import StromError
from strom.records.types import IntType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import Message, pb
from strom.security.internal import SERVER_ONLY_KEYS
from tests.conftest import unique_name
from tests.integration.security_support import SECURE_CONFIG, strom_config
from tests.integration.snapshot_support import create_pk_table, wait_for_snapshot_ids, write_round
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

NAMES_NO_OBJECT = {
    ApiKey.API_VERSIONS: "asked before logging in; names nothing",
    ApiKey.AUTHENTICATE: "the login itself",
    ApiKey.CREATE_DATABASE: "needs CREATE on the cluster before anything else",
    ApiKey.LIST_DATABASES: "lists only what the caller may DESCRIBE",
    ApiKey.GET_FILESYSTEM_SECURITY_TOKEN: "names nothing (Fluss leaves it unchecked)",
    ApiKey.CREATE_ACLS: "ALTER on the cluster first",
    ApiKey.LIST_ACLS: "DESCRIBE on the cluster first",
    ApiKey.DROP_ACLS: "ALTER on the cluster first",
    ApiKey.LAKE_TIERING_HEARTBEAT: "ALTER on the cluster first",
    ApiKey.DESCRIBE_LAKE_TIERING: "DESCRIBE on the cluster first",
    ApiKey.LIST_KV_SNAPSHOT_LEASES: "DESCRIBE on the cluster first",
    ApiKey.DESCRIBE_CLUSTER_CONFIGS: "DESCRIBE on the cluster first",
    ApiKey.ALTER_CLUSTER_CONFIGS: "ALTER on the cluster first",
    ApiKey.ADD_SERVER_TAG: "ALTER on the cluster first",
    ApiKey.REMOVE_SERVER_TAG: "ALTER on the cluster first",
    ApiKey.REBALANCE: "ALTER on the cluster first",
    ApiKey.CANCEL_REBALANCE: "ALTER on the cluster first",
    ApiKey.LIST_REBALANCE_PROGRESS: "DESCRIBE on the cluster first",
    ApiKey.GET_CLUSTER_HEALTH: "DESCRIBE on the cluster first",
}
"""Api keys whose answer to a user without rights cannot depend on whether some object exists."""


@dataclass(frozen=True)
class Objects:
    """What one side of the comparison names: the existing objects, or made-up ones nobody uses."""

    table_id: int
    table: str
    database: str
    partitioned_id: int
    partitioned: str
    partition_id: int
    producer: str
    lease: str

    def table_path(self, name: str | None = None) -> Any:
        return pb.PbTablePath(database_name="fluss", table_name=name or self.table)

    def tokens(self) -> dict[str, str]:
        """How the objects may appear in an answer, and the placeholder each becomes."""
        return {self.table: "<table>", self.partitioned: "<partitioned>", self.database: "<database>",
                self.producer: "<producer>", self.lease: "<lease>"}

    def ids(self) -> dict[int, str]:
        return {self.table_id: "<table id>", self.partitioned_id: "<partitioned id>", self.partition_id: "<partition id>"}


def requests(o: Objects) -> dict[ApiKey, Message]:
    """One request per api key that names an object, about the objects of ``o``."""
    bucket = {"bucket_id": 0}
    return {
        # by table id, on the data path (answered per bucket) ...
        ApiKey.PRODUCE_LOG: pb.ProduceLogRequest(acks=-1, table_id=o.table_id, timeout_ms=1_000,
                                                 buckets_req=[pb.PbProduceLogReqForBucket(**bucket, records=b"")]),
        ApiKey.PUT_KV: pb.PutKvRequest(acks=-1, table_id=o.table_id, timeout_ms=1_000,
                                       buckets_req=[pb.PbPutKvReqForBucket(**bucket, records=b"")]),
        ApiKey.LOOKUP: pb.LookupRequest(table_id=o.table_id, buckets_req=[pb.PbLookupReqForBucket(**bucket, keys=[b"k"])]),
        ApiKey.PREFIX_LOOKUP: pb.PrefixLookupRequest(
            table_id=o.table_id, buckets_req=[pb.PbPrefixLookupReqForBucket(**bucket, keys=[b"k"])]),
        ApiKey.FETCH_LOG: pb.FetchLogRequest(follower_server_id=-1, max_bytes=1 << 20, tables_req=[
            pb.PbFetchLogReqForTable(table_id=o.table_id, projection_pushdown_enabled=False, buckets_req=[
                pb.PbFetchLogReqForBucket(**bucket, fetch_offset=0, max_fetch_bytes=1 << 20)])]),
        ApiKey.LIST_OFFSETS: pb.ListOffsetsRequest(follower_server_id=-1, offset_type=1, table_id=o.partitioned_id,
                                                   partition_id=o.partition_id, bucket_id=[0]),
        ApiKey.LIMIT_SCAN: pb.LimitScanRequest(table_id=o.table_id, bucket_id=0, limit=10),
        ApiKey.GET_TABLE_STATS: pb.GetTableStatsRequest(table_id=o.table_id, buckets_req=[pb.PbTableStatsReqForBucket(**bucket)]),
        ApiKey.SCAN_KV: pb.ScanKvRequest(bucket_scan_req=pb.PbScanReqForBucket(table_id=o.table_id, bucket_id=0),
                                         batch_size_bytes=1024, call_seq_id=0),
        # ... and at the coordinator
        ApiKey.GET_KV_SNAPSHOT_METADATA: pb.GetKvSnapshotMetadataRequest(table_id=o.table_id, bucket_id=0, snapshot_id=0),
        ApiKey.LIST_KV_SNAPSHOTS: pb.ListKvSnapshotsRequest(table_id=o.table_id),
        ApiKey.LIST_REMOTE_LOG_MANIFESTS: pb.ListRemoteLogManifestsRequest(table_id=o.table_id),
        ApiKey.ACQUIRE_KV_SNAPSHOT_LEASE: pb.AcquireKvSnapshotLeaseRequest(
            lease_id=unique_name("mine"), lease_duration_ms=1_000, snapshots_to_lease=[pb.PbKvSnapshotLeaseForTable(
                table_id=o.table_id, bucket_snapshots=[pb.PbKvSnapshotLeaseForBucket(**bucket, snapshot_id=0)])]),
        ApiKey.RELEASE_KV_SNAPSHOT_LEASE: pb.ReleaseKvSnapshotLeaseRequest(
            lease_id=o.lease, buckets_to_release=[pb.PbTableBucket(table_id=o.table_id, bucket_id=0)]),
        ApiKey.DROP_KV_SNAPSHOT_LEASE: pb.DropKvSnapshotLeaseRequest(lease_id=o.lease),
        ApiKey.REGISTER_PRODUCER_OFFSETS: pb.RegisterProducerOffsetsRequest(
            producer_id=unique_name("mine"), table_offsets=[pb.PbProducerTableOffsets(
                table_id=o.table_id, bucket_offsets=[pb.PbBucketOffset(**bucket, log_end_offset=1)])]),
        ApiKey.GET_PRODUCER_OFFSETS: pb.GetProducerOffsetsRequest(producer_id=o.producer),
        ApiKey.DELETE_PRODUCER_OFFSETS: pb.DeleteProducerOffsetsRequest(producer_id=o.producer),
        ApiKey.PREPARE_LAKE_TABLE_SNAPSHOT: pb.PrepareLakeTableSnapshotRequest(bucket_offsets=[pb.PbTableOffsets(
            table_id=o.table_id, table_path=o.table_path(), tiering_epoch=1)]),
        ApiKey.COMMIT_LAKE_TABLE_SNAPSHOT: pb.CommitLakeTableSnapshotRequest(tables_req=[pb.PbLakeTableSnapshotInfo(
            table_id=o.table_id, snapshot_id=1, table_path=o.table_path())]),
        # by path
        ApiKey.CREATE_TABLE: pb.CreateTableRequest(table_path=o.table_path(), table_json=b"{}", ignore_if_exists=False),
        ApiKey.GET_TABLE_INFO: pb.GetTableInfoRequest(table_path=o.table_path()),
        ApiKey.GET_TABLE_SCHEMA: pb.GetTableSchemaRequest(table_path=o.table_path()),
        ApiKey.LIST_PARTITION_INFOS: pb.ListPartitionInfosRequest(table_path=o.table_path(o.partitioned)),
        ApiKey.CREATE_PARTITION: pb.CreatePartitionRequest(
            table_path=o.table_path(o.partitioned), ignore_if_not_exists=False,
            partition_spec=pb.PbPartitionSpec(partition_key_values=[pb.PbKeyValue(key="day", value="d1")])),
        ApiKey.DROP_PARTITION: pb.DropPartitionRequest(
            table_path=o.table_path(o.partitioned), ignore_if_not_exists=False,
            partition_spec=pb.PbPartitionSpec(partition_key_values=[pb.PbKeyValue(key="day", value="d1")])),
        ApiKey.DROP_TABLE: pb.DropTableRequest(table_path=o.table_path(), ignore_if_not_exists=False),
        ApiKey.ALTER_TABLE: pb.AlterTableRequest(table_path=o.table_path(), ignore_if_not_exists=False),
        ApiKey.GET_LATEST_KV_SNAPSHOTS: pb.GetLatestKvSnapshotsRequest(table_path=o.table_path()),
        ApiKey.GET_LAKE_SNAPSHOT: pb.GetLakeSnapshotRequest(table_path=o.table_path()),
        ApiKey.TABLE_EXISTS: pb.TableExistsRequest(table_path=o.table_path()),
        ApiKey.INIT_WRITER: pb.InitWriterRequest(table_path=[o.table_path()]),
        ApiKey.GET_METADATA: pb.MetadataRequest(table_path=[o.table_path()], partitions_id=[o.partition_id]),
        # by database
        ApiKey.GET_DATABASE_INFO: pb.GetDatabaseInfoRequest(database_name=o.database),
        ApiKey.ALTER_DATABASE: pb.AlterDatabaseRequest(database_name=o.database, ignore_if_not_exists=False),
        ApiKey.DROP_DATABASE: pb.DropDatabaseRequest(database_name=o.database, ignore_if_not_exists=False, cascade=True),
        ApiKey.LIST_TABLES: pb.ListTablesRequest(database_name=o.database),
        ApiKey.DATABASE_EXISTS: pb.DatabaseExistsRequest(database_name=o.database),
    }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("oracles") / "data", SECURE_CONFIG).start()
    yield process
    assert process.stop() == 0, process.log_text()[-3000:]
    assert not process.internal_errors()


@pytest_asyncio.fixture
async def existing(secured: ServerProcess) -> Objects:
    """Objects the admin made: a table with rows and a snapshot, a partitioned table with a partition, a
    database, a producer's offsets and a lease (the admin's)."""
    async with await Connection.create(strom_config(secured, "admin")) as connection:
        admin = connection.get_admin()
        path = TablePath("fluss", unique_name("existing"))
        table = await create_pk_table(connection, path, buckets=1)
        await write_round(table, range(5), "a")
        snapshot = (await wait_for_snapshot_ids(admin, path, 0)).snapshots[0]
        assert snapshot is not None
        partitioned = TablePath("fluss", unique_name("partitioned"))
        await admin.create_table(partitioned, TableDescriptor(
            Schema.of([("id", IntType()), ("day", StringType())]), partition_keys=("day",)))
        await admin.create_partition(partitioned, {"day": "d1"})
        (partition,) = await admin.list_partition_infos(partitioned)
        database = unique_name("private")
        await admin.create_database(database)
        table_id = table.layout.info.table_id
        producer, lease = unique_name("producer"), unique_name("lease")
        await admin.register_producer_offsets(producer, {TableBucket(table_id, 0): 5})
        await admin.create_kv_snapshot_lease(lease, 600_000).acquire_snapshots({table.bucket(0): snapshot.snapshot_id})
        partitioned_id = (await admin.get_table_info(partitioned)).table_id
        return Objects(table_id, path.table_name, database, partitioned_id, partitioned.table_name,
                       partition.partition_id, producer, lease)


def missing(existing: Objects) -> Objects:
    """Made-up objects of the same kinds, with ids far from any in use."""
    return Objects(existing.table_id + 100_000, unique_name("missing"), unique_name("nodb"),
                   existing.partitioned_id + 100_000, unique_name("nopartitioned"), existing.partition_id + 100_000,
                   unique_name("noproducer"), unique_name("nolease"))


def normalized(text: str, objects: Objects) -> str:
    """An answer's text with the objects' names and ids (where they stand as ids) replaced by placeholders."""
    for token, placeholder in objects.tokens().items():
        text = text.replace(token, placeholder)
    for number, placeholder in objects.ids().items():
        text = re.sub(rf"(table_id=|[Tt]able id |partition_id=|[Pp]artition id |'tableId': '){number}\b",
                      lambda match, p=placeholder: match.group(1) + p, text)
    return text


async def answer(connection: Connection, key: ApiKey, request: Message) -> object:
    try:
        return "answered", MessageToDict(await connection.bootstrap_request(key, request))
    except StromError as error:
        return "refused", error.code, str(error)


async def test_every_api_key_answers_a_user_without_rights_alike_for_existing_and_missing_objects(
    secured: ServerProcess, existing: Objects
) -> None:
    absent = missing(existing)
    asked, about_missing = requests(existing), requests(absent)
    unplaced = set(ApiKey) - set(asked) - SERVER_ONLY_KEYS - set(NAMES_NO_OBJECT)
    assert not unplaced, f"api keys the walk does not cover: {sorted(k.name for k in unplaced)}"
    assert not set(asked) & (SERVER_ONLY_KEYS | set(NAMES_NO_OBJECT))

    differing: dict[str, tuple[str, str]] = {}
    async with await Connection.create(strom_config(secured, "carol")) as carol:  # carol has no right at all
        for key, request in asked.items():
            raw = repr(await answer(carol, key, request))
            for name in (existing.table, existing.partitioned, existing.database, existing.producer, existing.lease):
                assert name not in raw or name in _named_in(request), f"{key.name} names {name}: {raw}"
            about_it = normalized(raw, existing)
            about_nothing = normalized(repr(await answer(carol, key, about_missing[key])), absent)
            if about_it != about_nothing:
                differing[key.name] = (about_it, about_nothing)
    assert not differing, "\n".join(f"{key}:\n  existing: {a}\n  missing:  {b}" for key, (a, b) in differing.items())

    async with await Connection.create(strom_config(secured, "admin")) as connection:  # carol changed nothing
        admin = connection.get_admin()
        found = await admin.get_producer_offsets(existing.producer)
        assert found is not None and found.offsets == {TableBucket(existing.table_id, 0): 5}
        assert [lease.lease_id for lease in await admin.list_kv_snapshot_leases(existing.lease)] == [existing.lease]
        assert await admin.table_exists(TablePath("fluss", existing.table))


def _named_in(request: Message) -> str:
    """The names the request itself carries: an answer may repeat those (a refusal names the path asked)."""
    return str(MessageToDict(request))

