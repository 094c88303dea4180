"""Replicated buckets with real processes: three tablet servers, replication factor 3. Leaders are SIGKILLed
during acknowledged writes by strom's client and by pyfluss, twenty times: after each election no acknowledged
write is lost or duplicated, and both clients keep writing and reading. A leader paused past its ZooKeeper
session cannot acknowledge alone and comes back as a follower."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import (
    Connection,
    OffsetSpec,
    ReplayableWriterId,
    Schema,
    TableBucket,
    TableDescriptor,
    TablePath,
)
from strom.client.batch_scanner import BucketBatchScanner
from strom.errors import FencedLeaderEpochError, KvSnapshotNotExistError, ScannerExpiredError, StromError
from strom.kv.snapshot import CompletedKvSnapshot
from strom.membership.contract import LeaderAndIsr
from strom.records.log_batch import REPLAYABLE_WRITER_ID_MIN
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.security.internal import InternalCredentials
from strom.server.local_cluster import LocalCluster
from strom.zk.bucket_state import ZooKeeperBucketStates
from strom.zk.metadata_store import connect_kazoo, parse_location
from strom.zk.zookeeper_server import unavailable_reason
from tests.cluster.test_cluster_processes import SECURITY, bucket_leaders, snapshot_after
from tests.conftest import unique_name

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("cluster")]

CONFIG = {"zookeeper.client.session-timeout": "4s", "log.replica.max-lag-time": "6s", "kv.snapshot.interval": "0s"}
PK_FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
LOG_FIELDS = pa.schema([("id", pa.int64())])
KILLS = 20
PYFLUSS_WRITES = 30
PYFLUSS_PROCESSES_MAX = 6
STALL_S = 6.0
PYFLUSS_WRITER = Path(__file__).with_name("pyfluss_writer.py")


def pyfluss_writer_environment(local: LocalCluster) -> dict[str, str]:
    """The environment of a ``pyfluss_writer.py`` process for ``local``: pyfluss's login on a secure
    cluster (its bootstrap servers, ``local.pyfluss_bootstrap``, go on the command line)."""
    options = {key: value for key, value in local.pyfluss_config().items() if key != "bootstrap.servers"}
    return {**os.environ, "PYFLUSS_OPTIONS": json.dumps(options)}
ROUND_S = 60.0
WAIT_S = 60.0


@pytest.fixture
def three(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Three tablet servers; a plain cluster unless a test asks for ``secure`` too (indirect
    parametrization)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    secure = getattr(request, "param", "plain") == "secure"
    local = LocalCluster(tmp_path / "cluster", 3, CONFIG, secure=secure, sasl_listener=secure).start()
    try:
        yield local
    finally:
        local.stop()
        for member in local.state.members:
            if member.log:
                text = Path(member.log).read_text(errors="replace")
                assert "AssertionError" not in text, f"{member.role} {member.server_id} broke an invariant"


class States:
    """The buckets' leadership as ZooKeeper holds it (what the test waits on)."""

    def __init__(self, local: LocalCluster) -> None:
        hosts, root = parse_location(local.zookeeper_address)
        self._client = connect_kazoo(hosts, 10_000, login=local.zookeeper_login())
        self._states = ZooKeeperBucketStates(self._client, root)

    def get(self, bucket: TableBucket) -> LeaderAndIsr:
        found = self._states.get(bucket)
        assert found is not None
        return found[0]

    def wait_full_isr(self, bucket: TableBucket) -> LeaderAndIsr:
        deadline = time.monotonic() + WAIT_S
        while True:
            state = self.get(bucket)
            if len(state.isr) == len(state.replicas) and state.leader in state.replicas:
                return state
            assert time.monotonic() < deadline, f"{bucket} never got all replicas back in sync: {state}"
            time.sleep(0.2)

    def wait_leader_change(self, bucket: TableBucket, old_leader: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.get(bucket).leader == old_leader:
            assert time.monotonic() < deadline, "no new leader while the old one was paused"
            time.sleep(0.2)

    def close(self) -> None:
        self._client.stop()
        self._client.close()


async def create(connection: Connection, fields: pa.Schema, primary_key: list[str] | None) -> TablePath:
    path = TablePath("fluss", unique_name("replicated"))
    descriptor = TableDescriptor(Schema.from_arrow(fields, primary_key), bucket_count=1,
                                 properties={"table.replication.factor": "3"})
    await connection.get_admin().create_table(path, descriptor)
    return path


def wait_for_servers(local: LocalCluster, count: int, login: dict[str, str] | None = None) -> None:
    """Until the coordinator's metadata lists ``count`` tablet servers (``login``: the client's options on a
    secured cluster)."""
    async def registered() -> int:
        async with await Connection.create(login or local.client_config()) as connection:
            return sum(n.server_type == "TabletServer" for n in await connection.get_admin().get_server_nodes())

    deadline = time.monotonic() + WAIT_S
    while asyncio.run(registered()) < count:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_acknowledged_writes_survive_repeated_leader_kills(three: LocalCluster) -> None:
    wait_for_servers(three, 3)

    async def setup() -> tuple[TablePath, TablePath, int]:
        async with await Connection.create(three.client_config()) as connection:
            kv = await create(connection, PK_FIELDS, ["id"])
            log_table = await create(connection, LOG_FIELDS, None)
            return kv, log_table, (await connection.get_admin().get_table_info(kv)).table_id

    kv, log_table, kv_table_id = asyncio.run(setup())
    states = States(three)
    acknowledged: dict[int, str] = {}
    appended: list[int] = []
    try:
        states.wait_full_isr(TableBucket(kv_table_id, 0))
        for round_ in range(KILLS):
            bucket = TableBucket(kv_table_id, 0)
            leader = states.get(bucket).leader

            def rejoin(killed: int = leader, bucket: TableBucket = bucket) -> None:
                """Once another replica leads, the killed one comes back with its data as a follower while the
                writes go on: it truncates, catches up and rejoins the ISR under load."""
                states.wait_leader_change(bucket, killed)
                three.start_member("tablet-server", killed)

            asyncio.run(_write_round(three, kv, log_table, round_, leader, acknowledged, appended, rejoin))
            states.wait_full_isr(bucket)
        stored, logged = asyncio.run(_read_back(three, kv, log_table))
    finally:
        states.close()
    differing = {key: (value, stored.get(key)) for key, value in acknowledged.items() if stored.get(key) != value}
    assert not differing, (f"acknowledged upserts missing or stale (key: acknowledged, stored): {differing}\n"
                           + replication_events(three))
    assert set(stored) == set(acknowledged), "nothing stored that was never written"
    assert sorted(logged) == sorted(appended) and len(set(logged)) == len(logged), "each append exactly once"


REPLICATION_EVENTS = ("leading at", "following server", "ISR is now", "truncated", "diverges", "starts over",
                      "holding", "replayed")


def replication_events(local: LocalCluster, most: int = 120) -> str:
    """The tablet servers' leadership, ISR and truncation log lines, in time order: what a failure of an
    acknowledged write needs explained."""
    lines = []
    for member in local.state.members:
        if member.role == "tablet-server" and member.log:
            text = Path(member.log).read_text(errors="replace")
            lines += [f"[{member.server_id}] {line}" for line in text.splitlines()
                      if any(event in line for event in REPLICATION_EVENTS)]
    lines.sort(key=lambda line: line.split("] ", 1)[1][:23])
    return "\n".join(lines[-most:])


async def _write_round(local: LocalCluster, kv: TablePath, log_table: TablePath, round_: int, leader: int,
                       acknowledged: dict[int, str], appended: list[int], rejoin: Callable[[], None]) -> None:
    """Upserts and appends by strom's client and upserts by pyfluss while the bucket's leader is SIGKILLed
    and then restarted (``rejoin``, in a thread); then each client reads back its last acknowledged write."""
    first = round_ * 1000
    async with await Connection.create(local.client_config()) as connection:
        table = await connection.get_table(kv)
        events = await connection.get_table(log_table)
        writer = table.new_upsert().create_writer()
        appender = events.new_append().create_writer()

        async def strom_writes() -> None:
            for step in range(10):
                ids = list(range(first + step * 50, first + step * 50 + 50))
                await writer.upsert_arrow_batch(pa.table({"id": ids, "v": [f"r{round_}"] * 50})).wait()
                acknowledged.update(dict.fromkeys(ids, f"r{round_}"))
                await appender.append_arrow_batch(pa.table({"id": ids})).wait()
                appended.extend(ids)
                await asyncio.sleep(0.05)
            assert await table.new_lookup().create_lookuper().lookup({"id": ids[-1]}) == {"id": ids[-1],
                                                                                         "v": f"r{round_}"}

        async def official_writes() -> None:
            """pyfluss, in a process of its own (its writer blocks its event loop while a leader is
            unreachable). pyfluss 1.0.0's writer goes silent for good when its bucket's leader dies with a
            batch in flight (docs/cluster.md), so a writer silent for STALL_S is replaced by a new one that
            goes on from the first key it had not acknowledged."""
            next_key, end = first + 900, first + 900 + PYFLUSS_WRITES
            for _attempt in range(PYFLUSS_PROCESSES_MAX):
                process = await asyncio.create_subprocess_exec(
                    sys.executable, str(PYFLUSS_WRITER), local.pyfluss_bootstrap, kv.database_name, kv.table_name,
                    str(next_key), str(end - next_key), f"p{round_}", env=pyfluss_writer_environment(local),
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
                assert process.stdout is not None
                read_back, failures = None, []
                try:
                    while line := await _read_line(process.stdout, STALL_S):
                        if line.isdigit():
                            acknowledged[int(line)] = f"p{round_}"
                            next_key = int(line) + 1
                        elif line.startswith("read"):
                            read_back = line
                        else:
                            failures.append(line)
                finally:
                    if process.returncode is None:
                        process.kill()
                    await process.wait()
                if read_back is not None:
                    assert read_back == f"read p{round_}", "pyfluss reads its last write back"
                    return
            raise AssertionError(f"pyfluss never finished its writes (next key {next_key}): {failures[-5:]}")

        async def kill() -> None:
            await asyncio.sleep(0.3)
            local.signal_member(local.member("tablet-server", leader), signal.SIGKILL)
            await asyncio.to_thread(rejoin)

        await asyncio.wait_for(asyncio.gather(strom_writes(), official_writes(), kill()), ROUND_S)


async def _read_line(stream: asyncio.StreamReader, timeout_s: float) -> str:
    """The next line of ``stream`` ("" at its end or after ``timeout_s`` without one)."""
    try:
        return (await asyncio.wait_for(stream.readline(), timeout_s)).decode().strip()
    except TimeoutError:
        return ""


async def _read_back(local: LocalCluster, kv: TablePath, log_table: TablePath) -> tuple[dict[int, str], list[int]]:
    async with await Connection.create(local.client_config()) as connection:
        table = await connection.get_table(kv)
        rows = await (await table.new_scan().create_batch_scanner()).to_arrow()
        stored = dict(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))
        events = await connection.get_table(log_table)
        end = (await connection.get_admin().list_offsets(log_table, [0], OffsetSpec.latest()))[0]
        logged: list[int] = []
        async for change in events.new_scan().create_log_scanner().read_range(events.bucket(0), 0, end):
            logged += change.batch.column("id").to_pylist()
        return stored, logged


@pytest.mark.parametrize("three", SECURITY, indirect=True)
def test_a_paused_leader_cannot_acknowledge_alone_and_rejoins_as_a_follower(three: LocalCluster) -> None:
    wait_for_servers(three, 3)

    async def setup() -> tuple[TablePath, int]:
        async with await Connection.create(three.client_config()) as connection:
            path = await create(connection, PK_FIELDS, ["id"])
            await _upsert(connection, path, range(100), "before")
            return path, (await connection.get_admin().get_table_info(path)).table_id

    path, table_id = asyncio.run(setup())
    bucket = TableBucket(table_id, 0)
    states = States(three)
    try:
        paused = states.wait_full_isr(bucket)
        old = three.member("tablet-server", paused.leader)
        three.signal_member(old, signal.SIGSTOP)
        states.wait_leader_change(bucket, paused.leader)
        asyncio.run(_upsert_through(three.client_config(), path, range(100, 200), "after"))
        three.signal_member(old, signal.SIGCONT)
        rejoined = states.wait_full_isr(bucket)  # the paused one caught up as a follower
        assert rejoined.leader != paused.leader and rejoined.leader_epoch > paused.leader_epoch

        async def stale_write() -> Any:
            direct_to_old = {**three.client_config(), "bootstrap.servers": old.address}
            async with await Connection.create(direct_to_old) as direct:  # straight to the former leader
                table = await direct.get_table(path)
                return await table.new_lookup().create_lookuper().lookup({"id": 150})

        assert asyncio.run(stale_write()) == {"id": 150, "v": "after"}, "metadata routes to the new leader"
        leaders = asyncio.run(_leaders(three.client_config(), path))
        assert leaders == [rejoined.leader]
    finally:
        states.close()


async def _upsert(connection: Connection, path: TablePath, ids: range, tag: str) -> None:
    writer = (await connection.get_table(path)).new_upsert().create_writer()
    await writer.upsert_arrow_batch(pa.table({"id": list(ids), "v": [tag] * len(ids)})).wait()


async def _upsert_through(client: dict[str, str], path: TablePath, ids: range, tag: str) -> None:
    async with await Connection.create(client) as connection:
        await _upsert(connection, path, ids, tag)


async def _leaders(client: dict[str, str], path: TablePath) -> list[int]:
    async with await Connection.create(client) as connection:
        return await bucket_leaders(connection, path)


def test_snapshots_carry_their_leader_epoch_and_a_deposed_leaders_is_refused(tmp_path: Path) -> None:
    """A new leader's snapshots commit under its epoch; a commit under the epoch before is refused with
    FENCED_LEADER_EPOCH (24) and nothing of it is recorded."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    local = LocalCluster(tmp_path / "cluster", 3, {**CONFIG, "kv.snapshot.interval": "300ms"}).start()
    states = States(local)
    try:
        wait_for_servers(local, 3)

        async def before() -> tuple[TablePath, TableBucket, int]:
            async with await Connection.create(local.client_config()) as connection:
                path = await create(connection, PK_FIELDS, ["id"])
                await _upsert(connection, path, range(100), "before")
                bucket = TableBucket((await connection.get_admin().get_table_info(path)).table_id, 0)
                return path, bucket, await snapshot_after(connection.get_admin(), path, -1)

        path, bucket, first = asyncio.run(before())
        deposed = states.wait_full_isr(bucket)
        local.signal_member(local.member("tablet-server", deposed.leader), signal.SIGKILL)

        async def after() -> tuple[int, LeaderAndIsr, type[Exception] | None, type[Exception] | None]:
            async with await Connection.create(local.client_config()) as connection:
                await _upsert(connection, path, range(100, 200), "after")  # through the new leader
                newest = await snapshot_after(connection.get_admin(), path, first)
                stale = CompletedKvSnapshot(bucket, newest + 1000, 0, 0, (), "nowhere", 0, 0)
                request = pb.CommitKvSnapshotRequest(
                    completed_snapshot=stale.to_json(), coordinator_epoch=0, bucket_leader_epoch=deposed.leader_epoch
                )
                refused: type[Exception] | None = None
                # sent as the deposed leader's server would (a plain client's is refused before its epoch is read)
                as_deposed = InternalCredentials(local.settings()["security.internal.secret"],
                                                 f"tablet-server-{deposed.leader}")
                host, _, port = local.bootstrap.split(",")[0].rpartition(":")
                peer = await RpcConnection.connect(host, int(port), credentials=as_deposed)
                try:
                    await peer.request(ApiKey.COMMIT_KV_SNAPSHOT, request)
                except StromError as error:
                    refused = type(error)
                finally:
                    await peer.close()
                recorded: type[Exception] | None = None
                try:
                    await connection.get_admin().get_kv_snapshot_metadata(bucket, stale.snapshot_id)
                except StromError as error:
                    recorded = type(error)
                return newest, states.get(bucket), refused, recorded

        newest, now, refused, recorded = asyncio.run(after())
        assert now.leader != deposed.leader and now.leader_epoch > deposed.leader_epoch
        assert newest > first, "the new leader's snapshot was committed under its own epoch"
        assert refused is FencedLeaderEpochError
        assert recorded is KvSnapshotNotExistError, "nothing of the refused commit was recorded"
    finally:
        states.close()
        local.stop()


def test_a_scan_session_ends_when_its_leader_is_replaced_and_a_new_scan_reads_everything(
    three: LocalCluster,
) -> None:
    """A ScanKv session lives on its leader. Pause that leader past its session: once it is back as a
    follower its sessions are closed, the scan's next call gets SCANNER_EXPIRED (66, "restart the scan"),
    and a scan opened again reads every row from the new leader; a lookup sent to the former leader
    follows the leadership too."""
    wait_for_servers(three, 3)
    rows = 2000

    async def setup() -> tuple[TablePath, TableBucket]:
        async with await Connection.create(three.client_config()) as connection:
            path = await create(connection, PK_FIELDS, ["id"])
            await _upsert(connection, path, range(rows), "x" * 20)
            return path, TableBucket((await connection.get_admin().get_table_info(path)).table_id, 0)

    path, bucket = asyncio.run(setup())
    states = States(three)
    try:
        paused = states.wait_full_isr(bucket)

        async def scan() -> tuple[int, type[Exception] | None, int]:
            async with await Connection.create(three.client_config()) as connection:
                table = await connection.get_table(path)
                lookuper = table.new_lookup().create_lookuper()
                assert await lookuper.lookup({"id": 7}) is not None  # the client knows the old leader now
                scanner = BucketBatchScanner(table, bucket, batch_size_bytes=1024)
                first = await scanner.next_batch()
                assert first is not None and 0 < first.num_rows < rows
                old = three.member("tablet-server", paused.leader)
                three.signal_member(old, signal.SIGSTOP)
                await asyncio.to_thread(states.wait_leader_change, bucket, paused.leader)
                three.signal_member(old, signal.SIGCONT)
                await asyncio.to_thread(states.wait_full_isr, bucket)  # the old leader follows now
                assert await lookuper.lookup({"id": 7}) == {"id": 7, "v": "x" * 20}, "a lookup follows the leader"
                ended: type[Exception] | None = None
                try:
                    while await scanner.next_batch() is not None:
                        pass
                except StromError as error:
                    ended = type(error)
                again = BucketBatchScanner(table, bucket, batch_size_bytes=1024)
                count = 0
                while (batch := await again.next_batch()) is not None:
                    count += batch.num_rows
                return first.num_rows, ended, count

        _first, ended, count = asyncio.run(scan())
        assert ended is ScannerExpiredError
        assert count == rows
    finally:
        states.close()



def test_a_batched_lookup_finds_every_row_after_the_leaders_it_knew_moved(three: LocalCluster) -> None:
    """A batched lookup asks each leader once for all of its buckets, from the leaders the client has
    cached. Pause the leader of a bucket past its session: every bucket it led moves, and the client's next
    lookup sends them all to it in one request. Back as a follower, it answers NotLeaderOrFollower for each;
    those buckets are asked again alone, at their new leaders, and every row is found."""
    wait_for_servers(three, 3)
    rows, buckets = 600, 6

    async def setup() -> tuple[TablePath, int]:
        async with await Connection.create(three.client_config()) as connection:
            path = TablePath("fluss", unique_name("grouped_lookups"))
            descriptor = TableDescriptor(Schema.from_arrow(PK_FIELDS, ["id"]), bucket_count=buckets,
                                         properties={"table.replication.factor": "3"})
            await connection.get_admin().create_table(path, descriptor)
            await _upsert(connection, path, range(rows), "x")
            return path, (await connection.get_admin().get_table_info(path)).table_id

    path, table_id = asyncio.run(setup())
    states = States(three)
    try:
        layout = {b: states.wait_full_isr(TableBucket(table_id, b)) for b in range(buckets)}
        old_leader = layout[0].leader
        led = [b for b, state in layout.items() if state.leader == old_leader]

        async def scenario() -> pa.Table:
            async with await Connection.create(three.client_config()) as connection:
                lookuper = (await connection.get_table(path)).new_lookup().create_lookuper()
                keys = pa.table({"id": list(range(rows))})
                assert (await lookuper.lookup_arrow(keys)).num_rows == rows  # every leader is cached now
                old = three.member("tablet-server", old_leader)
                three.signal_member(old, signal.SIGSTOP)
                for bucket in led:
                    await asyncio.to_thread(states.wait_leader_change, TableBucket(table_id, bucket), old_leader)
                three.signal_member(old, signal.SIGCONT)
                for bucket in led:
                    await asyncio.to_thread(states.wait_full_isr, TableBucket(table_id, bucket))
                return await lookuper.lookup_arrow(keys)

        found = asyncio.run(scenario())
        assert found.column("id").to_pylist() == list(range(rows))
        assert set(found.column("v").to_pylist()) == {"x"}
        assert all(states.get(TableBucket(table_id, b)).leader != old_leader for b in led)
    finally:
        states.close()


@pytest.mark.parametrize("three", SECURITY, indirect=True)
def test_a_log_scanner_reads_on_across_a_leader_kill(three: LocalCluster) -> None:
    """A subscribed log scanner whose bucket's leader is SIGKILLed goes on reading from the new leader: every
    appended record once, in order, and no error surfaces while the bucket is elected anew. Offsets asked
    through a client that knew only the old leader come from the new one."""
    wait_for_servers(three, 3)
    states = States(three)
    try:

        async def scenario() -> tuple[list[int], int, int]:
            async with await Connection.create(three.client_config()) as connection:
                path = await create(connection, LOG_FIELDS, None)
                table = await connection.get_table(path)
                bucket = TableBucket(table.layout.info.table_id, 0)
                leader = await asyncio.to_thread(states.wait_full_isr, bucket)
                appender = table.new_append().create_writer()
                await appender.append_arrow_batch(pa.table({"id": list(range(500))})).wait()
                scanner = table.new_scan().create_log_scanner()
                scanner.subscribe(0, 0)
                read: list[int] = []
                await asyncio.wait_for(_poll_until(scanner, read, 500), WAIT_S)
                async with await Connection.create(three.client_config()) as other:  # knows only the old leader
                    before = (await other.get_admin().list_offsets(path, [0], OffsetSpec.latest()))[0]
                    three.signal_member(three.member("tablet-server", leader.leader), signal.SIGKILL)
                    polls = asyncio.create_task(_poll_until(scanner, read, 1000))
                    await appender.append_arrow_batch(pa.table({"id": list(range(500, 1000))})).wait()
                    await asyncio.wait_for(polls, WAIT_S)
                    after = (await other.get_admin().list_offsets(path, [0], OffsetSpec.latest()))[0]
                return read, before, after

        read, before, after = asyncio.run(scenario())
        assert read == list(range(1000))
        assert (before, after) == (500, 1000), "offsets are listed by the new leader"
    finally:
        states.close()


async def _poll_until(scanner: Any, read: list[int], count: int) -> None:
    while len(read) < count:
        read += [i for b in await scanner.poll(500) for i in b.batch.column("id").to_pylist()]


def test_a_replayable_writer_s_batches_are_known_to_the_new_leader(three: LocalCluster) -> None:
    """A replayable writer (an exactly-once Spark task) writes part of its batches into a log table and an
    aggregation table, the log table's leader is SIGKILLed, and the writer runs again from the start: the new
    leader, whose writer state came with the replicated log, acknowledges what was written and writes only the
    rest; every row is in the log once and summed once."""
    wait_for_servers(three, 3)
    states = States(three)
    identity = ReplayableWriterId(REPLAYABLE_WRITER_ID_MIN + 99, run=2)
    batches = [pa.table({"id": [i % 5 for i in range(s, s + 40)], "v": list(range(s, s + 40))})
               for s in range(0, 400, 40)]
    fields = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])
    try:

        async def write(table: Any, upto: int) -> None:
            writer = (table.new_upsert() if table.layout.primary_key else table.new_append()).create_writer(identity)
            for batch in batches[:upto]:
                await (writer.upsert_arrow_batch(batch) if table.layout.primary_key
                       else writer.append_arrow_batch(batch)).wait()
            await writer.flush()

        async def scenario() -> tuple[list[int], dict[int, int]]:
            async with await Connection.create(three.client_config()) as connection:
                log_path = await create(connection, fields, None)
                path = TablePath("fluss", unique_name("replayed_sums"))
                await connection.get_admin().create_table(path, TableDescriptor(
                    Schema.from_arrow(fields, ["id"]), bucket_count=1,
                    properties={"table.replication.factor": "3", "table.merge-engine": "aggregation",
                                "fields.v.agg": "sum"}))
                log_table, sums_table = await connection.get_table(log_path), await connection.get_table(path)
                for table in (log_table, sums_table):
                    await asyncio.to_thread(states.wait_full_isr, TableBucket(table.layout.info.table_id, 0))
                    await write(table, 6)  # the first run stops part-way
                leader = states.get(TableBucket(log_table.layout.info.table_id, 0)).leader
                three.signal_member(three.member("tablet-server", leader), signal.SIGKILL)
            async with await Connection.create(three.client_config()) as connection:
                log_table, sums_table = await connection.get_table(log_path), await connection.get_table(path)
                for table in (log_table, sums_table):
                    await write(table, len(batches))  # the run again, whole, against the new leaders
                scanner = log_table.new_scan().create_log_scanner()
                scanner.subscribe(0, 0)
                read: list[int] = []
                await asyncio.wait_for(_poll_until_v(scanner, read, 400), WAIT_S)
                found = await sums_table.new_lookup().create_lookuper().lookup_arrow(pa.table({"id": list(range(5))}))
                return read, dict(zip(found.column("id").to_pylist(), found.column("v").to_pylist(), strict=True))

        read, sums = asyncio.run(scenario())
        assert sorted(read) == list(range(400)), "every appended row once"
        assert sums == {k: sum(v for v in range(400) if v % 5 == k) for k in range(5)}, "every row summed once"
    finally:
        states.close()


async def _poll_until_v(scanner: Any, read: list[int], count: int) -> None:
    while len(read) < count:
        read += [v for b in await scanner.poll(500) for v in b.batch.column("v").to_pylist()]
