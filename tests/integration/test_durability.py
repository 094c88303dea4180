"""Acknowledged writes survive crashes and restarts, exactly once, with offsets that never repeat.

Every test drives real ``strom server`` processes with the official pyfluss client. A write counts as
acknowledged only once ``await handle.wait()`` returned for it. A crash is SIGKILL (no shutdown code runs);
the server then restarts on the same data directory and port. pyfluss keeps retrying the writes it had in
flight, so the restarted server also has to recognise retried batches (writer state rebuilt from the log)
instead of applying them twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest

from tests.conftest import unique_name
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(120)

BUCKETS = 2
IN_FLIGHT_MAX = 16
WRITE_SECONDS = 1.0
ACKED_PER_PHASE_MIN = 100
DEADLINE_S = 30.0
HANDLE_WAIT_MAX_S = 10.0  # a write whose writer the client abandoned (see AckedStream) is given up on
CLIENT_CONFIG = {"writer.batch-timeout-ms": "1"}  # a writer waiting on each ack would idle 100 ms per batch
FIELDS = [pa.field("id", pa.int64()), pa.field("payload", pa.string())]

Record = tuple[int, int, str, dict[str, Any]]  # bucket, offset, change type, row


def payload(id_: int, version: int = 0) -> str:
    return f"row-{id_}-v{version}-" + "x" * (id_ % 17)


async def connect(server: ServerProcess) -> Any:
    return await pyfluss.FlussConnection.create(
        pyfluss.Config({"bootstrap.servers": server.address, **CLIENT_CONFIG})
    )


async def close_quietly(connection: Any) -> None:
    """Close a connection after its server may have restarted; an error here is not what the tests check."""
    with contextlib.suppress(TimeoutError, pyfluss.FlussError):
        await asyncio.wait_for(connection.close(), 5)


async def create_table(connection: Any, *, primary_key: bool) -> Any:
    path = pyfluss.TablePath("fluss", unique_name("durable"))
    schema = pyfluss.Schema(pa.schema(FIELDS), primary_keys=["id"] if primary_key else None)
    await connection.get_admin().create_table(path, pyfluss.TableDescriptor(schema, bucket_count=BUCKETS))
    return path


class AckedStream:
    """Writes rows with ids ``first_id``, ``first_id + 1``, ... keeping up to ``IN_FLIGHT_MAX`` writes in flight,
    and records an id in ``acked`` only after ``await handle.wait()`` returned for it.

    It keeps going across a server restart: pyfluss retries the writes in flight, and a write the client
    refuses while the server is unreachable is offered again after a fresh table handle is fetched.
    """

    def __init__(self, connection: Any, path: Any, write: Callable[[Any, int], Any], first_id: int = 0) -> None:
        self._connection = connection
        self._path = path
        self._write = write
        self._first_id = first_id
        self.acked: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.refused_count = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> AckedStream:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _writer(self) -> Any:
        table = await self._connection.get_table(self._path)
        return table.new_upsert().create_writer() if table.has_primary_key() else table.new_append().create_writer()

    async def _run(self) -> None:
        writer = await self._writer()
        window: list[tuple[int, Any]] = []
        for id_ in itertools.count(self._first_id):
            if self._stop.is_set():
                break
            while True:
                try:
                    window.append((id_, self._write(writer, id_)))
                    break
                except pyfluss.FlussError:  # e.g. the table's metadata was dropped while the server was down
                    self.refused_count += 1
                    await asyncio.sleep(0.05)
                    with contextlib.suppress(pyfluss.FlussError):
                        writer = await self._writer()
            if len(window) >= IN_FLIGHT_MAX:
                await self._wait(*window.pop(0))
        for entry in window:
            await self._wait(*entry)

    async def _wait(self, id_: int, handle: Any) -> None:
        try:
            await asyncio.wait_for(handle.wait(), HANDLE_WAIT_MAX_S)
        except (pyfluss.FlussError, TimeoutError) as exc:  # not acknowledged: stored once or not at all
            self.failed.append((id_, repr(exc)))
            return
        self.acked.append(id_)

    async def wait_for_acks(self, count: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while len(self.acked) < count:
            assert self._task is not None
            if self._task.done():
                self._task.result()  # raises what stopped the writer
            assert time.monotonic() < deadline, (
                f"only {len(self.acked)} of {count} writes acknowledged ({self.refused_count} refused, "
                f"failed: {self.failed[:3]})"
            )
            await asyncio.sleep(0.01)

    async def stop(self) -> list[int]:
        """Stop offering rows and wait for the ones in flight; returns the acknowledged ids."""
        self._stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, DEADLINE_S)
        return list(self.acked)


def upsert(writer: Any, id_: int) -> Any:
    return writer.upsert({"id": id_, "payload": payload(id_)})


def append(writer: Any, id_: int) -> Any:
    return writer.append({"id": id_, "payload": payload(id_)})


async def end_offsets(connection: Any, path: Any) -> dict[int, int]:
    return await connection.get_admin().list_offsets(path, list(range(BUCKETS)), pyfluss.OffsetSpec.latest())


async def read_log(connection: Any, path: Any) -> tuple[list[Record], dict[int, int]]:
    """Every record of every bucket up to the end offsets listed now, and those end offsets."""
    ends = await end_offsets(connection, path)
    table = await connection.get_table(path)
    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe_buckets({bucket: pyfluss.EARLIEST_OFFSET for bucket in range(BUCKETS)})
    records: list[Record] = []
    next_offsets = {bucket: 0 for bucket in range(BUCKETS)}
    deadline = time.monotonic() + DEADLINE_S
    while any(next_offsets[b] < ends[b] for b in range(BUCKETS)):
        assert time.monotonic() < deadline, f"read up to {next_offsets}, the log ends at {ends}"
        for bucket, bucket_records in (await scanner.poll(500)).items():
            for record in bucket_records:
                records.append((bucket.bucket_id, record.offset, record.change_type.short_string(), record.row))
                next_offsets[bucket.bucket_id] = max(next_offsets[bucket.bucket_id], record.offset + 1)
    return records, ends


async def kv_state(connection: Any, path: Any) -> dict[int, str]:
    """The whole primary-key state, read from every bucket's RocksDB with a limit scan."""
    table = await connection.get_table(path)
    table_id = table.get_table_info().table_id
    state: dict[int, str] = {}
    for bucket in range(BUCKETS):
        scanner = table.new_scan().limit(1_000_000).create_bucket_batch_scanner(pyfluss.TableBucket(table_id, bucket))
        for row in (await scanner.to_arrow()).to_pylist():
            assert row["id"] not in state, f"id {row['id']} is stored in two buckets"
            state[row["id"]] = row["payload"]
    return state


def assert_offsets_dense(records: list[Record], ends: dict[int, int]) -> None:
    """Each bucket's records carry the offsets 0 .. end-1, each exactly once: none reused, none skipped."""
    by_bucket: dict[int, list[int]] = defaultdict(list)
    for bucket, offset, _change, _row in records:
        by_bucket[bucket].append(offset)
    for bucket in range(BUCKETS):
        offsets = by_bucket[bucket]
        repeated = sorted(o for o, n in Counter(offsets).items() if n > 1)
        assert not repeated, f"bucket {bucket} repeats offsets {repeated[:10]}"
        assert sorted(offsets) == list(range(ends[bucket])), f"bucket {bucket}: offsets are not 0..{ends[bucket] - 1}"


def assert_written_exactly_once(records: list[Record], acked: list[int], change: str) -> None:
    assert {c for _b, _o, c, _r in records} == {change}, "every id was written once: only " + change
    counts = Counter(row["id"] for _b, _o, _c, row in records)
    missing = sorted(set(acked) - set(counts))
    twice = sorted(id_ for id_, n in counts.items() if n > 1)
    assert not missing, f"{len(missing)} acknowledged ids are missing, e.g. {missing[:10]}"
    assert not twice, f"ids written twice: {twice[:10]}"
    assert all(row["payload"] == payload(row["id"]) for _b, _o, _c, row in records)


async def write_through_a_kill(server_factory: Any, *, primary_key: bool) -> tuple[ServerProcess, Any, list[int]]:
    """Stream writes, SIGKILL the server mid-stream, restart it on the same directory and port while the same
    writer goes on; returns the restarted server, the table path and the acknowledged ids."""
    server = server_factory()
    connection = await connect(server)
    try:
        path = await create_table(connection, primary_key=primary_key)
        stream = AckedStream(connection, path, upsert if primary_key else append).start()
        await stream.wait_for_acks(ACKED_PER_PHASE_MIN)
        await asyncio.sleep(WRITE_SECONDS / 2)

        server.kill()
        acked_at_kill = len(stream.acked)
        restarted = server_factory(data_dir=server.data_dir, port=server.port)
        await stream.wait_for_acks(acked_at_kill + ACKED_PER_PHASE_MIN)
        await asyncio.sleep(WRITE_SECONDS / 2)
        acked = await stream.stop()
    finally:
        await close_quietly(connection)
    print(f"acked {len(acked)} ({acked_at_kill} at the kill), failed {len(stream.failed)}")
    return restarted, path, acked


# ---- kill -9 ----


@pytest.mark.asyncio
async def test_every_acknowledged_upsert_survives_kill_9_exactly_once(server_factory: Any) -> None:
    restarted, path, acked = await write_through_a_kill(server_factory, primary_key=True)

    reader = await connect(restarted)
    try:
        records, ends = await read_log(reader, path)
        state = await kv_state(reader, path)
    finally:
        await close_quietly(reader)
    assert_offsets_dense(records, ends)
    assert_written_exactly_once(records, acked, "+I")
    # RocksDB, recovered from the changelog after the crash, agrees with the changelog
    assert state == {row["id"]: row["payload"] for _b, _o, _c, row in records}


@pytest.mark.asyncio
async def test_every_acknowledged_append_survives_kill_9_exactly_once(server_factory: Any) -> None:
    restarted, path, acked = await write_through_a_kill(server_factory, primary_key=False)

    reader = await connect(restarted)
    try:
        records, ends = await read_log(reader, path)
    finally:
        await close_quietly(reader)
    assert_offsets_dense(records, ends)
    assert_written_exactly_once(records, acked, "+A")


# ---- clean shutdown and repeated restarts ----


@pytest.mark.asyncio
async def test_sigterm_exits_cleanly_and_a_restart_keeps_data_and_continues_offsets(server_factory: Any) -> None:
    server = server_factory()
    connection = await connect(server)
    try:
        path = await create_table(connection, primary_key=False)
        first = AckedStream(connection, path, append).start()
        await first.wait_for_acks(200)
        acked = await first.stop()
        ends_before = await end_offsets(connection, path)
    finally:
        await close_quietly(connection)
    assert sum(ends_before.values()) == len(acked)

    assert server.stop() == 0, server.log_text()[-3000:]
    restarted = server_factory(data_dir=server.data_dir, port=server.port)
    connection = await connect(restarted)
    try:
        assert await end_offsets(connection, path) == ends_before
        second = AckedStream(connection, path, append, first_id=len(acked)).start()
        await second.wait_for_acks(200)
        acked += await second.stop()
        records, ends = await read_log(connection, path)
    finally:
        await close_quietly(connection)
    assert all(ends[b] >= ends_before[b] for b in range(BUCKETS))
    assert sum(ends.values()) == len(acked)
    assert_offsets_dense(records, ends)  # the new appends took new offsets: none was handed out twice
    assert_written_exactly_once(records, acked, "+A")
    assert restarted.stop() == 0, restarted.log_text()[-3000:]


@pytest.mark.asyncio
async def test_two_restarts_in_a_row_keep_kv_state_changelog_and_offsets_consistent(server_factory: Any) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    expected: dict[int, str] = {}
    ends_seen: list[dict[int, int]] = []
    server = server_factory()
    path = None
    for phase, restart in enumerate(["sigterm", "sigkill", None]):
        connection = await connect(server)
        try:
            if path is None:
                path = await create_table(connection, primary_key=True)
            assert await kv_state(connection, path) == expected, f"seed={seed} phase={phase}: state after restart"
            table = await connection.get_table(path)
            writer = table.new_upsert().create_writer()
            handles = []
            for _ in range(150):  # inserts, updates and deletes over a small key space
                id_ = rng.randrange(60)
                if id_ in expected and rng.random() < 0.25:
                    handles.append(writer.delete({"id": id_}))
                    del expected[id_]
                else:
                    value = payload(id_, version=phase * 1000 + rng.randrange(1000))
                    handles.append(writer.upsert({"id": id_, "payload": value}))
                    expected[id_] = value
            await asyncio.wait_for(asyncio.gather(*(handle.wait() for handle in handles)), DEADLINE_S)
            assert await kv_state(connection, path) == expected, f"seed={seed} phase={phase}"
            ends_seen.append(await end_offsets(connection, path))
        finally:
            await close_quietly(connection)
        if restart is None:
            break
        if restart == "sigterm":
            assert server.stop() == 0, server.log_text()[-3000:]
        else:
            server.kill()
        server = server_factory(data_dir=server.data_dir, port=server.port)

    connection = await connect(server)
    try:
        records, ends = await read_log(connection, path)
        state = await kv_state(connection, path)
    finally:
        await close_quietly(connection)
    assert state == expected, f"seed={seed}"
    assert ends == ends_seen[-1], f"seed={seed}"
    for earlier, later in itertools.pairwise(ends_seen):
        assert all(later[b] > earlier[b] for b in range(BUCKETS)), f"seed={seed}: offsets went back {ends_seen}"
    # replaying the changelog in offset order gives the same state: the log and RocksDB agree
    replayed: dict[int, str] = {}
    for _bucket, _offset, change, row in sorted(records, key=lambda r: (r[0], r[1])):
        if change in ("+I", "+U"):
            replayed[row["id"]] = row["payload"]
        elif change == "-D":
            del replayed[row["id"]]
    assert replayed == expected, f"seed={seed}"
    # a changelog batch may be empty (a write that changed nothing), but no offset is ever used twice
    offsets = Counter((bucket, offset) for bucket, offset, _c, _r in records)
    assert all(n == 1 for n in offsets.values()), f"seed={seed}"
    assert all(offset < ends[bucket] for bucket, offset in offsets), f"seed={seed}"
