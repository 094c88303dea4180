"""A cluster obeys no plain client: the requests only servers send are refused to anyone who has not logged
in as one of the cluster's servers (``security.internal.secret``), on every listener, with ACLs off.

Each test is an attack that worked before: a plain client deleting a table's replicas with StopReplica,
deposing the coordinator with a huge coordinator epoch, rewriting leadership or metadata, committing a KV
snapshot, or fetching as a follower to move the high watermark past what the real follower holds.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.client import Connection
from strom.errors import AuthenticationError, AuthorizationError
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import Message, pb
from strom.security.internal import InternalCredentials
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import _cluster, bucket_leaders, create_table, rows, upsert
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

EPOCH_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path_factory.mktemp("secured"), 2, {"kv.snapshot.interval": "0s"})


async def _send(address: str, key: ApiKey, request: Message, credentials: InternalCredentials | None = None) -> Message:
    host, _, port = address.rpartition(":")
    connection = await RpcConnection.connect(host, int(port), credentials=credentials)
    try:
        return await connection.request(key, request, timeout_ms=10_000)
    finally:
        await connection.close()


def _stop_replica(table_id: int) -> Message:
    request = pb.StopReplicaRequest(coordinator_epoch=EPOCH_MAX)
    entry = request.stop_replicas_req.add(leader_epoch=EPOCH_MAX, delete=True)
    entry.table_bucket.CopyFrom(pb.PbTableBucket(table_id=table_id, bucket_id=-1))
    return request


def _notify_leader(table_id: int, path: pb.PbPhysicalTablePath, server_id: int) -> Message:
    request = pb.NotifyLeaderAndIsrRequest(coordinator_epoch=EPOCH_MAX)
    request.notify_buckets_leader_req.add(
        physical_table_path=path, table_bucket=pb.PbTableBucket(table_id=table_id, bucket_id=0),
        leader=server_id, leader_epoch=EPOCH_MAX, replicas=[server_id], isr=[server_id], bucket_epoch=0,
    )
    return request


def _follower_fetch(table_id: int, follower: int) -> Message:
    request = pb.FetchLogRequest(follower_server_id=follower, max_bytes=1 << 20, max_wait_ms=0, min_bytes=1)
    table = request.tables_req.add(table_id=table_id, projection_pushdown_enabled=False)
    table.buckets_req.add(bucket_id=0, fetch_offset=10**15, max_fetch_bytes=1 << 20)
    return request


def test_control_requests_from_a_plain_client_are_refused_and_change_nothing(cluster: LocalCluster) -> None:
    async def attack() -> tuple[dict[int, str], list[str]]:
        async with await Connection.create(cluster.bootstrap) as connection:
            path = await create_table(connection, buckets=1, **{"table.replication.factor": "2"})
            await upsert(connection, path, range(50), "kept")
            table_id = (await connection.get_table(path)).layout.info.table_id
            physical = pb.PbPhysicalTablePath(database_name=path.database_name, table_name=path.table_name)
            refusals = []
            for server_id in (1, 2):
                address = cluster.member("tablet-server", server_id).address
                for key, request in (
                    (ApiKey.STOP_REPLICA, _stop_replica(table_id)),
                    (ApiKey.NOTIFY_LEADER_AND_ISR, _notify_leader(table_id, physical, server_id)),
                    (ApiKey.UPDATE_METADATA, pb.UpdateMetadataRequest(coordinator_epoch=EPOCH_MAX)),
                ):
                    with pytest.raises(AuthorizationError) as refused:
                        await _send(address, key, request)
                    refusals.append(str(refused.value))
            commit = pb.CommitKvSnapshotRequest(completed_snapshot=b"{}", coordinator_epoch=0, bucket_leader_epoch=0)
            with pytest.raises(AuthorizationError):
                await _send(cluster.bootstrap.split(",")[0], ApiKey.COMMIT_KV_SNAPSHOT, commit)
            await upsert(connection, path, range(50, 60), "after")  # the real coordinator still leads them
            return await rows(connection, path), refusals

    kept, refusals = asyncio.run(attack())
    assert sorted(kept) == list(range(60)), "a refused StopReplica deleted nothing"
    assert all("sent only by the cluster's servers; User:ANONYMOUS may not" in r for r in refusals), refusals


def test_only_the_follower_itself_may_fetch_as_that_follower(cluster: LocalCluster) -> None:
    secret = cluster.settings()["security.internal.secret"]

    async def attack() -> list[str]:
        async with await Connection.create(cluster.bootstrap) as connection:
            path = await create_table(connection, buckets=1, **{"table.replication.factor": "2"})
            await upsert(connection, path, range(5), "a")
            table_id = (await connection.get_table(path)).layout.info.table_id
            (leader,) = await bucket_leaders(connection, path)
            follower = 3 - leader
            leader_address = cluster.member("tablet-server", leader).address
            refused = []
            for credentials in (None, InternalCredentials(secret, f"tablet-server-{leader}", f"tablet-server-{leader}")):  # anyone, another server
                with pytest.raises(AuthorizationError) as error:
                    await _send(leader_address, ApiKey.FETCH_LOG, _follower_fetch(table_id, follower), credentials)
                refused.append(str(error.value))
            # the follower's own login is served (its offset is past the end: a per-bucket error, not a refusal)
            own = InternalCredentials(secret, f"tablet-server-{follower}", f"tablet-server-{leader}")
            answer = await _send(leader_address, ApiKey.FETCH_LOG, _follower_fetch(table_id, follower), own)
            assert answer.tables_resp[0].buckets_resp[0].error_code != AuthorizationError.code  # type: ignore[attr-defined]
            await upsert(connection, path, range(5, 10), "b")
            assert sorted(await rows(connection, path)) == list(range(10))
            return refused

    refused = asyncio.run(attack())
    assert len(refused) == 2 and all("may fetch as follower" in message for message in refused)


def test_a_server_login_with_the_wrong_secret_is_refused(cluster: LocalCluster) -> None:
    host, _, port = cluster.member("tablet-server", 1).address.rpartition(":")
    # the server proves itself first: a login with the wrong secret finds it cannot check that proof, and
    # sends nothing the server could check
    with pytest.raises(AuthenticationError, match="could not prove it knows the cluster's secret"):
        asyncio.run(RpcConnection.connect(host, int(port),
                                          credentials=InternalCredentials("guess", "coordinator", "tablet-server-1")))


def test_the_secret_is_kept_out_of_command_lines_and_readable_by_its_owner_only(cluster: LocalCluster) -> None:
    secret = cluster.settings()["security.internal.secret"]
    assert len(secret) >= 32
    assert cluster.config_path.stat().st_mode & 0o077 == 0
    for member in cluster.state.members:
        assert secret not in Path(f"/proc/{member.pid}/cmdline").read_bytes().decode(errors="replace")


def test_a_cluster_server_without_the_secret_does_not_start(tmp_path: Path) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", "tablet-server", "--server-id", "1", "--bind", "127.0.0.1:0",
         "--data-dir", str(tmp_path / "t"), "-D", "zookeeper.address=127.0.0.1:1"],
        capture_output=True, text=True, timeout=60,
    )
    assert started.returncode != 0
    assert "security.internal.secret" in started.stderr and "allow-unauthenticated" in started.stderr


def test_the_single_process_server_refuses_follower_fetches_from_clients(server: ServerProcess) -> None:
    async def attack() -> None:
        async with await Connection.create(server.address) as connection:
            path = await create_table(connection, buckets=1)
            await upsert(connection, path, range(3), "a")
            table_id = (await connection.get_table(path)).layout.info.table_id
            with pytest.raises(AuthorizationError, match="may fetch as follower"):
                await _send(server.address, ApiKey.FETCH_LOG, _follower_fetch(table_id, 0))

    asyncio.run(attack())


def test_only_a_tablet_server_itself_may_ask_to_be_shut_down(cluster: LocalCluster) -> None:
    """ControlledShutdown moves every leadership off a server: another server, or a client, may not ask it."""
    secret = cluster.settings()["security.internal.secret"]
    coordinator = cluster.bootstrap.split(",")[0]
    request = pb.ControlledShutdownRequest(tablet_server_id=2, tablet_server_epoch=-1)
    for credentials in (None, InternalCredentials(secret, "tablet-server-1")):
        with pytest.raises(AuthorizationError):
            asyncio.run(_send(coordinator, ApiKey.CONTROLLED_SHUTDOWN, request, credentials))
