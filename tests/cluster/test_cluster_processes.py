"""A cluster of real processes on loopback: ZooKeeper, `strom coordinator` and `strom tablet-server`s, driven
by strom's client and the official pyfluss. Buckets spread over the tablet servers; each server keeps only
its own; restarts and kill -9 of a tablet server lose no acknowledged write; table changes and drops reach
every server; KV snapshots are committed through the coordinator."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Column, Connection, OffsetSpec, Schema, TableBucket, TableDescriptor, TablePath
from strom.errors import (
    ConnectionFailedError,
    InvalidCoordinatorError,
    InvalidReplicationFactorError,
    NetworkError,
    NotCoordinatorLeaderError,
)
from strom.records.types import StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.security.internal import InternalCredentials
from strom.server.local_cluster import LocalCluster
from strom.zk.zookeeper_server import unavailable_reason
from tests.conftest import unique_name

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("cluster")]

FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
WAIT_S = 30.0
FAST_SESSIONS = {"zookeeper.client.session-timeout": "4s"}
"""For the tests that crash or pause a server: it counts as gone after 4 s instead of 18 s."""


SECURITY = ["plain", "secure"]
"""Each cluster test that takes its cluster from a fixture parametrized with these runs on a plain cluster
and on a ``--secure --sasl-listener`` one (TLS, logins, ACLs, ZooKeeper with authentication): securing a
cluster must not change what it does."""


@pytest.fixture(scope="module", params=SECURITY)
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Two tablet servers shared by the tests that leave no server down."""
    yield from _cluster(tmp_path_factory.mktemp("cluster"), 2, {"kv.snapshot.interval": "300ms"},
                        secure=request.param == "secure")


@pytest.fixture(params=SECURITY)
def own_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A cluster this test may break (restarts, kills)."""
    yield from _cluster(tmp_path / "cluster", 2, {"kv.snapshot.interval": "0s", **FAST_SESSIONS},
                        secure=request.param == "secure")


def _cluster(data_dir: Path, tablet_servers: int, config: dict[str, str], coordinators: int = 1,
             secure: bool = False, member_config: dict[str, dict[str, str]] | None = None) -> Iterator[LocalCluster]:
    """A started cluster (``secure``: with a SASL listener for pyfluss; ``member_config``: settings of single
    members, by name), stopped after the test with a check of its members' exit codes and logs."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(data_dir, tablet_servers, config, coordinators=coordinators, secure=secure,
                         sasl_listener=secure, member_config=member_config).start()
    try:
        _wait_for_servers(local, tablet_servers)
        yield local
    finally:
        codes = local.stop()
        errors = [line for member in local.state.members if member.log
                  for line in Path(member.log).read_text(errors="replace").splitlines() if "AssertionError" in line]
        assert not errors, f"a server logged a broken invariant: {errors[:5]}"
        failed = {name: code for name, code in codes.items() if name != "zookeeper" and code not in (0, None)}
        tails = {member.log: Path(member.log).read_text(errors="replace").splitlines()[-15:]
                 for member in local.state.members if member.log and member.role != "zookeeper"
                 and f"{member.role}-{member.server_id}" in failed}
        assert not failed, f"exit codes {codes}; the last lines of their logs: {tails}"


def _wait_for_servers(local: LocalCluster, count: int) -> None:
    async def registered() -> int:
        async with await Connection.create(local.client_config()) as connection:
            return sum(node.server_type == "TabletServer" for node in await connection.get_admin().get_server_nodes())

    deadline = time.monotonic() + WAIT_S
    while asyncio.run(registered()) < count:
        assert time.monotonic() < deadline, f"{count} tablet servers did not register"
        time.sleep(0.1)


async def create_table(connection: Connection, buckets: int = 4, **properties: str) -> TablePath:
    path = TablePath("fluss", unique_name("clustered"))
    schema = Schema.from_arrow(FIELDS, ["id"])
    await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=buckets, properties=properties))
    return path


async def upsert(connection: Connection, path: TablePath, ids: range, tag: str) -> None:
    table = await connection.get_table(path)
    writer = table.new_upsert().create_writer()
    writer.upsert_arrow_batch(pa.table({"id": list(ids), "v": [f"{tag}{i}" for i in ids]}))
    await writer.flush()


async def rows(connection: Connection, path: TablePath) -> dict[int, str]:
    table = await connection.get_table(path)
    scanned = await (await table.new_scan().create_batch_scanner()).to_arrow()
    return dict(zip(scanned.column("id").to_pylist(), scanned.column("v").to_pylist(), strict=True))


async def bucket_leaders(connection: Connection, path: TablePath, partition_id: int | None = None) -> list[int]:
    """Each bucket's leader as the cluster's metadata names it."""
    request = pb.MetadataRequest()
    request.table_path.add(database_name=path.database_name, table_name=path.table_name)
    if partition_id is not None:
        request.partitions_id.append(partition_id)
    response = await connection.bootstrap_request(ApiKey.GET_METADATA, request)
    if partition_id is None:
        buckets = response.table_metadata[0].bucket_metadata
    else:
        buckets = next(p for p in response.partition_metadata if p.partition_id == partition_id).bucket_metadata
    return [b.leader_id for b in sorted(buckets, key=lambda b: b.bucket_id)]


def test_buckets_spread_over_the_tablet_servers_and_both_clients_read_and_write(cluster: LocalCluster) -> None:
    async def scenario() -> tuple[dict[int, str], Any, list[int]]:
        async with await Connection.create(cluster.client_config()) as connection:
            path = await create_table(connection)
            await upsert(connection, path, range(1000), "s")
            placed = await bucket_leaders(connection, path)
        client = await pyfluss.FlussConnection.create(pyfluss.Config(cluster.pyfluss_config()))
        try:
            table = await client.get_table(pyfluss.TablePath(path.database_name, path.table_name))
            writer = table.new_upsert().create_writer()
            for i in range(1000, 1010):
                writer.upsert({"id": i, "v": f"p{i}"})
            await writer.flush()
            lookuper = table.new_lookup().create_lookuper()
            found = [await lookuper.lookup({"id": i}) for i in (5, 1005)]
        finally:
            await client.close()
        async with await Connection.create(cluster.client_config()) as connection:
            return await rows(connection, path), found, placed

    stored, found, placed = asyncio.run(scenario())
    assert stored == {**{i: f"s{i}" for i in range(1000)}, **{i: f"p{i}" for i in range(1000, 1010)}}
    assert found == [{"id": 5, "v": "s5"}, {"id": 1005, "v": "p1005"}]
    assert sorted(set(placed)) == [1, 2], f"4 buckets on 2 servers should use both: {placed}"
    for server_id in (1, 2):  # each server holds exactly its buckets
        hosted = {int(p.name) for p in (cluster.data_dir / f"tablet-server-{server_id}" / "tablets").glob("fluss/*/*")
                  if p.name.isdigit()}
        assert hosted == {b for b, s in enumerate(placed) if s == server_id}


def test_log_tables_and_partitions_spread_too(cluster: LocalCluster) -> None:
    async def scenario() -> tuple[list[int], int]:
        async with await Connection.create(cluster.client_config()) as connection:
            admin = connection.get_admin()
            path = TablePath("fluss", unique_name("events"))
            schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("day", pa.string())]))
            await admin.create_table(path, TableDescriptor(schema, bucket_count=2, partition_keys=["day"]))
            await admin.create_partition(path, {"day": "d1"})
            table = await connection.get_table(path)
            writer = table.new_append().create_writer()
            writer.append_arrow_batch(pa.table({"id": list(range(50)), "day": ["d1"] * 50}))
            await writer.flush()
            partition = (await admin.list_partition_infos(path))[0]
            placed = await bucket_leaders(connection, path, partition.partition_id)
            seen = 0
            for bucket in range(2):
                scanner = table.new_scan().create_log_scanner()
                bucket_id = TableBucket(table.layout.info.table_id, bucket, partition.partition_id)
                end = (await admin.list_offsets(path, [bucket], OffsetSpec.latest(), partition_name="d1"))[bucket]
                async for change in scanner.read_range(bucket_id, 0, end):
                    seen += change.batch.num_rows
            return placed, seen

    placed, seen = asyncio.run(scenario())
    assert sorted(set(placed)) == [1, 2] and seen == 50


def test_a_tablet_server_killed_and_restarted_keeps_every_acknowledged_write(own_cluster: LocalCluster) -> None:
    async def write_some() -> tuple[TablePath, list[int]]:
        async with await Connection.create(own_cluster.client_config()) as connection:
            path = await create_table(connection)
            await upsert(connection, path, range(500), "a")
            return path, await bucket_leaders(connection, path)

    path, placed = asyncio.run(write_some())
    victim = own_cluster.member("tablet-server", 1)
    own_cluster.signal_member(victim, signal.SIGKILL)
    own_cluster.start_member("tablet-server", 1)  # same port, same data directory
    _wait_for_servers(own_cluster, 2)

    async def after() -> tuple[dict[int, str], dict[int, str]]:
        async with await Connection.create(own_cluster.client_config()) as connection:
            before = await rows(connection, path)
            await upsert(connection, path, range(250, 750), "b")
            return before, await rows(connection, path)

    before, now = asyncio.run(after())
    assert 1 in placed
    assert before == {i: f"a{i}" for i in range(500)}
    assert now == {**{i: f"a{i}" for i in range(250)}, **{i: f"b{i}" for i in range(250, 750)}}


def test_changes_and_drops_reach_every_tablet_server_even_one_that_was_down(own_cluster: LocalCluster) -> None:
    async def scenario() -> tuple[dict[str, Any], list[Path]]:
        async with await Connection.create(own_cluster.client_config()) as connection:
            admin = connection.get_admin()
            altered = await create_table(connection)
            await upsert(connection, altered, range(100), "a")
            await admin.alter_table(altered, add_columns=[Column("note", StringType())])
            table = await connection.get_table(altered)
            writer = table.new_upsert().create_writer()
            writer.upsert_arrow_batch(pa.table({"id": list(range(100, 140)), "v": ["n"] * 40, "note": ["x"] * 40}))
            await writer.flush()
            scanned = await (await table.new_scan().create_batch_scanner()).to_arrow()

            dropped = await create_table(connection)
            await upsert(connection, dropped, range(100), "d")
            info = await admin.get_table_info(dropped)
            directories = [d for d in own_cluster.data_dir.glob(f"tablet-server-*/tablets/fluss/*-{info.table_id}")]
            own_cluster.signal_member(own_cluster.member("tablet-server", 2))  # down while the table is dropped
            await admin.drop_table(dropped)
            return {"notes": sorted(set(scanned.column("note").to_pylist()), key=str), "rows": scanned.num_rows}, directories

    found, directories = asyncio.run(scenario())
    assert found == {"notes": [None, "x"], "rows": 140}
    assert len(directories) == 2, "both servers held buckets of the dropped table"
    assert not directories[0].exists() or not directories[1].exists(), "the live server deleted its buckets at once"
    own_cluster.start_member("tablet-server", 2)
    _wait_for_servers(own_cluster, 2)
    assert not any(d.exists() for d in directories), "the restarted server deleted the dropped table's data"


def test_kv_snapshots_are_committed_through_the_coordinator(cluster: LocalCluster) -> None:
    async def scenario() -> dict[int, Any]:
        async with await Connection.create(cluster.client_config()) as connection:
            path = await create_table(connection)
            await upsert(connection, path, range(200), "s")
            deadline = time.monotonic() + WAIT_S
            while True:
                snapshots = (await connection.get_admin().get_latest_kv_snapshots(path)).snapshots
                if all(s is not None and s.log_offset > 0 for s in snapshots.values()):
                    return snapshots
                assert time.monotonic() < deadline, f"snapshots of every bucket: {snapshots}"
                await asyncio.sleep(0.2)

    snapshots = asyncio.run(scenario())
    assert sorted(snapshots) == [0, 1, 2, 3]
    assert sum(s.log_offset for s in snapshots.values()) == 200


def test_a_snapshot_interval_set_at_run_time_reaches_every_tablet_server(own_cluster: LocalCluster) -> None:
    """AlterClusterConfigs goes to the active coordinator; each tablet server rereads the cluster configs
    from ZooKeeper and starts taking snapshots (off at start) of the buckets it leads."""
    async def scenario() -> tuple[dict[int, Any], list[int], TablePath]:
        async with await Connection.create(own_cluster.client_config()) as connection:
            admin = connection.get_admin()
            path = await create_table(connection)
            await upsert(connection, path, range(200), "s")
            leaders = await bucket_leaders(connection, path)
            assert all(s is None for s in (await admin.get_latest_kv_snapshots(path)).snapshots.values())
            await admin.alter_cluster_configs({"kv.snapshot.interval": "500ms"})
            described = {e.key: (e.value, e.source) for e in await admin.describe_cluster_configs()}
            assert described["kv.snapshot.interval"] == ("500ms", "DYNAMIC_SERVER_CONFIG")
            deadline = time.monotonic() + WAIT_S
            while True:
                snapshots = (await admin.get_latest_kv_snapshots(path)).snapshots
                if all(s is not None for s in snapshots.values()):
                    return snapshots, leaders, path
                assert time.monotonic() < deadline, f"snapshots of every bucket: {snapshots}"
                await asyncio.sleep(0.2)

    snapshots, leaders, table_path = asyncio.run(scenario())
    assert sum(s.log_offset for s in snapshots.values()) == 200
    assert len(set(leaders)) == 2, "the buckets are led by both tablet servers"

    # a tablet server started again takes the stored interval (its own settings say 0s: no snapshots)
    restarted = leaders[0]
    own_cluster.signal_member(own_cluster.member("tablet-server", restarted))
    own_cluster.start_member("tablet-server", restarted)
    _wait_for_servers(own_cluster, 2)

    async def after_restart() -> None:
        async with await Connection.create(own_cluster.client_config()) as connection:
            admin = connection.get_admin()
            await upsert(connection, table_path, range(200, 400), "t")
            deadline = time.monotonic() + WAIT_S
            while True:
                snapshots = (await admin.get_latest_kv_snapshots(table_path)).snapshots
                if sum(s.log_offset for s in snapshots.values() if s is not None) == 400:
                    return
                assert time.monotonic() < deadline, f"snapshots after the restart: {snapshots}"
                await asyncio.sleep(0.2)

    asyncio.run(after_restart())


def test_a_table_wanting_more_replicas_than_tablet_servers_is_refused(cluster: LocalCluster) -> None:
    async def scenario() -> None:
        async with await Connection.create(cluster.client_config()) as connection:
            with pytest.raises(InvalidReplicationFactorError, match="larger than available tablet servers: 2"):
                await create_table(connection, **{"table.replication.factor": "3"})

    asyncio.run(scenario())


def test_the_cluster_command_starts_reports_and_stops_a_cluster(tmp_path: Path) -> None:
    data_dir = tmp_path / "cli-cluster"
    command = [sys.executable, "-m", "strom.cli.main", "cluster"]
    started = subprocess.run([*command, "start", "--tablet-servers", "1", "--data-dir", str(data_dir)],
                             capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stderr
        assert "bootstrap.servers=127.0.0.1:" in started.stdout
        status = subprocess.run([*command, "status", "--data-dir", str(data_dir), "--json"],
                                capture_output=True, text=True, timeout=60)
        members = json.loads(status.stdout)
        assert [(m["role"], m["up"]) for m in members] == [
            ("zookeeper", True), ("coordinator", True), ("tablet-server", True)
        ]
    finally:
        stopped = subprocess.run([*command, "stop", "--data-dir", str(data_dir)], capture_output=True, text=True,
                                 timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    after = subprocess.run([*command, "status", "--data-dir", str(data_dir), "--json"], capture_output=True, text=True,
                           timeout=60)
    assert after.returncode == 0 and not any(m["up"] for m in json.loads(after.stdout))


def test_a_standby_coordinator_takes_over_and_keeps_leases_snapshots_and_expiry(tmp_path: Path) -> None:
    """SIGKILL the active coordinator: the standby is elected, loads snapshot records, leases and producer
    offsets from ZooKeeper, keeps the leased snapshot through retention, expires the short lease, and serves catalog
    changes and snapshot commits; the deposed coordinator's epoch is fenced by the tablet servers."""
    config = {"kv.snapshot.interval": "300ms", "kv.snapshot.num-retained": "1",
              "kv.snapshot.lease.expiration-check-interval": "200ms", **FAST_SESSIONS}
    local = _cluster(tmp_path / "cluster", 1, config, coordinators=2)
    cluster = next(local)
    try:
        first, second = (cluster.member("coordinator", index) for index in (1, 2))

        async def before() -> tuple[TablePath, int]:
            async with await Connection.create(cluster.client_config()) as connection:
                admin = connection.get_admin()
                with pytest.raises(NotCoordinatorLeaderError):  # the standby refuses catalog changes
                    async with await Connection.create(second.address) as direct:
                        await direct.request(second.address, ApiKey.CREATE_DATABASE,
                                             pb.CreateDatabaseRequest(database_name="x", ignore_if_exists=True))
                path = await create_table(connection, buckets=1)
                await upsert(connection, path, range(100), "a")
                pinned = await snapshot_after(admin, path, -1)
                table = await connection.get_table(path)
                bucket = table.bucket(0)
                await admin.create_kv_snapshot_lease("keep", 600_000).acquire_snapshots({bucket: pinned})
                await admin.create_kv_snapshot_lease("short", 12_000).acquire_snapshots({bucket: pinned})
                await admin.register_producer_offsets("spark-query", {bucket: 100})
                return path, pinned

        path, pinned = asyncio.run(before())
        cluster.signal_member(first, signal.SIGKILL)

        async def after() -> tuple[str, list[str], int, bool, dict[TableBucket, int] | None]:
            async with await Connection.create(cluster.client_config()) as connection:
                admin = connection.get_admin()
                deadline = time.monotonic() + WAIT_S
                while True:  # the killed coordinator's node lives until its ZooKeeper session times out
                    try:
                        await admin.create_database(unique_name("after_failover"))
                        break
                    except (NotCoordinatorLeaderError, ConnectionFailedError, NetworkError):
                        assert time.monotonic() < deadline, "no coordinator took over"
                        await asyncio.sleep(0.2)
                active = (await admin.get_server_nodes())[0]
                await upsert(connection, path, range(100, 200), "b")  # new snapshots, committed to the new one
                newest = await snapshot_after(admin, path, pinned)
                deadline = time.monotonic() + WAIT_S
                while "short" in [lease.lease_id for lease in await admin.list_kv_snapshot_leases()]:
                    assert time.monotonic() < deadline, "the short lease never expired after the failover"
                    await asyncio.sleep(0.2)
                leases = [lease.lease_id for lease in await admin.list_kv_snapshot_leases()]
                producer = await admin.get_producer_offsets("spark-query")
                table = await connection.get_table(path)
                kept = bool(await admin.get_kv_snapshot_metadata(table.bucket(0), pinned))
                fenced = False
                tablet = cluster.member("tablet-server", 1)
                stale = pb.StopReplicaRequest(coordinator_epoch=0)
                stale.stop_replicas_req.add(leader_epoch=0, delete=True).table_bucket.CopyFrom(
                    pb.PbTableBucket(table_id=table.layout.info.table_id, bucket_id=-1))
                # sent as a server would (a plain client's is refused before its epoch is looked at)
                as_coordinator = InternalCredentials(cluster.settings()["security.internal.secret"], "coordinator",
                                                     target="tablet-server-1")
                host, _, port = tablet.address.rpartition(":")
                peer = await RpcConnection.connect(host, int(port), credentials=as_coordinator)
                try:
                    await peer.request(ApiKey.STOP_REPLICA, stale)
                except InvalidCoordinatorError:
                    fenced = True
                finally:
                    await peer.close()
                offsets = None if producer is None else producer.offsets
                return f"{active.host}:{active.port}", leases, newest, kept and fenced, offsets

        active, leases, newest, kept_and_fenced, producer_offsets = asyncio.run(after())
        assert producer_offsets is not None and list(producer_offsets.values()) == [100]
        assert active == second.address
        assert leases == ["keep"]
        assert newest > pinned
        assert kept_and_fenced, "the leased snapshot survived retention and the old epoch was refused"
    finally:
        next(local, None)


async def snapshot_after(admin: Any, path: TablePath, snapshot_id: int) -> int:
    """The id of bucket 0's first snapshot newer than ``snapshot_id`` that covers the whole log."""
    deadline = time.monotonic() + WAIT_S
    while True:
        latest = (await admin.get_latest_kv_snapshots(path)).snapshots.get(0)
        ends = await admin.list_offsets(path, [0], OffsetSpec.latest())
        if latest is not None and latest.snapshot_id > snapshot_id and latest.log_offset == ends[0]:
            return int(latest.snapshot_id)
        assert time.monotonic() < deadline, f"no snapshot after {snapshot_id}: {latest}"
        await asyncio.sleep(0.2)


def test_a_coordinator_paused_beyond_its_session_is_deposed_and_stops(tmp_path: Path) -> None:
    """SIGSTOP the active coordinator longer than the ZooKeeper session timeout (4 s here): the standby takes
    over, and a client whose metadata still names the paused one fails over to it (the paused process's
    kernel still accepts connections; only the handshake times out); on SIGCONT the paused one learns it
    was deposed and exits non-zero instead of acting."""
    local = _cluster(tmp_path / "cluster", 1, {"kv.snapshot.interval": "0s", **FAST_SESSIONS}, coordinators=2)
    cluster = next(local)
    try:
        first, second = (cluster.member("coordinator", index) for index in (1, 2))

        async def new_active() -> tuple[str, bool]:
            stale_config = {"bootstrap.servers": second.address, "client.connect-timeout": "1s"}
            async with await Connection.create(stale_config) as stale, \
                    await Connection.create(second.address) as connection:
                assert await stale.metadata.coordinator_address() == first.address
                cluster.signal_member(first, signal.SIGSTOP)
                deadline = time.monotonic() + WAIT_S
                while True:
                    # the client's own view, which its coordinator requests go by
                    await connection.metadata.refresh()
                    if await connection.metadata.coordinator_address() == second.address:
                        await connection.get_admin().create_database(unique_name("after_pause"))
                        break
                    assert time.monotonic() < deadline, "the standby was never elected"
                    await asyncio.sleep(0.2)
                await stale.get_admin().create_database(unique_name("stale_client"))
                return second.address, await stale.metadata.coordinator_address() == second.address

        assert asyncio.run(new_active()) == (second.address, True)
        cluster.signal_member(first, signal.SIGCONT)
        process = cluster.processes[first.pid]
        assert process.wait(WAIT_S) == 1, "the deposed coordinator stops with a failure code"
        assert "was deposed" in Path(first.log).read_text()
    finally:
        next(local, None)


def test_a_cluster_member_with_several_listeners_must_say_which_is_internal(tmp_path: Path) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", "coordinator", "--bind", "127.0.0.1:0", "--data-dir",
         str(tmp_path / "member"), "-D", "zookeeper.address=127.0.0.1:1", "-D", "security.internal.secret=s",
         "-D", "bind.listeners=CLIENT://127.0.0.1:0,OTHER://127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )
    assert started.returncode != 0
    assert "invalid configuration" in started.stderr and "set internal.listener.name" in started.stderr


def test_racks_spread_every_bucket_over_both_racks(tmp_path: Path) -> None:
    """Four tablet servers on two racks (``strom cluster start --racks a,a,b,b``): metadata names each
    server's rack, and each bucket of a table with two replicas has one on each rack."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(tmp_path / "cluster", 4, {"kv.snapshot.interval": "0s"}, racks=["a", "a", "b", "b"]).start()
    try:
        _wait_for_servers(local, 4)

        from tests.cluster.test_replication import States

        async def scenario() -> tuple[dict[int, str | None], list[tuple[int, ...]]]:
            async with await Connection.create(local.client_config()) as connection:
                admin = connection.get_admin()
                racks = {n.id: n.rack for n in await admin.get_server_nodes() if n.server_type == "TabletServer"}
                path = await create_table(connection, 8, **{"table.replication.factor": "2"})
                table_id = (await admin.get_table_info(path)).table_id
            states = States(local)
            try:
                return racks, [states.get(TableBucket(table_id, b)).replicas for b in range(8)]
            finally:
                states.close()

        racks, replicas = asyncio.run(scenario())
        assert racks == {1: "a", 2: "a", 3: "b", 4: "b"}
        assert all({racks[r] for r in bucket} == {"a", "b"} for bucket in replicas), replicas
    finally:
        local.stop()
