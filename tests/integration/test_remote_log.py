"""Remote log storage against a real server: closed segments go to ``remote.data.dir`` in Fluss's layout,
local disk keeps ``table.log.tiered.local-segments`` of them, and pyfluss and strom's client read the whole
log from the earliest offset across the remote/local boundary; ListOffsets EARLIEST is the remote start;
TTL and dropping the table remove the remote files; a kill -9 during uploads loses and duplicates nothing
and leaves no orphan."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest
from click.testing import CliRunner

from strom.cli.main import main as strom_cli
from strom.client import Connection, OffsetSpec, Predicate, Schema, TableDescriptor, TablePath, col
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.pyfluss_support import poll_records
from tests.remote_log_support import read_listed_manifest
from tests.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.timeout(180)]

REMOTE_CONFIG = {
    "log.segment.file-size": "4kb",
    "remote.log.task-interval-duration": "200ms",
    "remote.log.task-max-upload-segments": "50",
    "kv.snapshot.interval": "0s",
}
ROWS = 3000
METRICS_PORT = "metrics.reporter.prometheus.port"
WAIT_S = 60.0


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("remote-log")
    config = {**REMOTE_CONFIG, "remote.data.dir": str(base / "remote"), METRICS_PORT: str(free_port())}
    server = ServerProcess(base / "data", config).start()
    try:
        yield server
    finally:
        server.stop()


def remote_root(server: ServerProcess) -> Path:
    return Path(server.config["remote.data.dir"])


def wait_until(condition: Any, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


async def create_log_table(address: str, properties: dict[str, str] | None = None) -> tuple[TablePath, int]:
    path = TablePath("fluss", unique_name("remote"))
    schema = Schema.from_arrow(pa.schema([("seq", pa.int64()), ("pad", pa.string())]))
    async with await Connection.create(address) as connection:
        await connection.get_admin().create_table(
            path, TableDescriptor(schema, bucket_count=1, properties={"table.log.tiered.local-segments": "2",
                                                                      **(properties or {})}))
        table = await connection.get_table(path)
        return path, table.layout.info.table_id


async def append(address: str, path: TablePath, start: int, count: int) -> None:
    async with await Connection.create(address) as connection:
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        for first in range(start, start + count, 50):  # many small batches: many 4 KiB segments
            ids = list(range(first, min(first + 50, start + count)))
            writer.append_arrow_batch(pa.table({"seq": ids, "pad": [f"row-{i:08d}" for i in ids]}))
        await writer.flush()


def tablet_dir(server: ServerProcess, path: TablePath, table_id: int) -> Path:
    return remote_root(server) / "log" / path.database_name / f"{path.table_name}-{table_id}" / "0"


def bucket_log_files(server: ServerProcess, table_id: int) -> list[Path]:
    """The bucket's local segment files (``tablets/<db>/<table>-<id>/log-0/log/*.log``)."""
    return sorted(f for f in server.data_dir.joinpath("tablets").rglob("*.log")
                  if f"-{table_id}" in f.parent.parent.parent.name)


def manifest_of(server: ServerProcess, path: TablePath, table_id: int) -> dict[str, Any]:
    """The committed manifest, found through ListRemoteLogManifests (1063)."""
    async def ask() -> Any:
        rpc = await RpcConnection.connect("127.0.0.1", server.port)
        try:
            return await rpc.request(ApiKey.LIST_REMOTE_LOG_MANIFESTS, pb.ListRemoteLogManifestsRequest(table_id=table_id))
        finally:
            await rpc.close()

    found = read_listed_manifest(lambda: asyncio.run(ask()))
    assert found is not None, f"no manifest committed for table {table_id}"
    entry, manifest = found
    return manifest | {"_end": entry.remote_log_end_offset}


def offloaded(server: ServerProcess, path: TablePath, table_id: int) -> bool:
    files = bucket_log_files(server, table_id)
    return len(files) <= 3 and tablet_dir(server, path, table_id).exists()


async def read_with_strom(address: str, path: TablePath, end: int, projection: list[int] | None = None) -> list[Any]:
    async with await Connection.create(address) as connection:
        table = await connection.get_table(path)
        scanner = table.new_scan().create_log_scanner() if projection is None else \
            table.new_scan().project(projection).create_log_scanner()
        rows: list[Any] = []
        async for change in scanner.read_range(table.bucket(0), 0, end):
            rows += change.batch.to_pylist()
        return rows


async def read_with_pyfluss(address: str, path: TablePath, count: int) -> list[Any]:
    connection = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": address}))
    try:
        table = await connection.get_table(pyfluss.TablePath(path.database_name, path.table_name))
        scanner = await table.new_scan().create_log_scanner()
        scanner.subscribe(0, pyfluss.EARLIEST_OFFSET)
        return await poll_records(scanner, count, deadline_s=60)
    finally:
        await connection.close()


def test_a_log_beyond_its_local_segments_is_read_whole_from_remote_and_local(remote_server: ServerProcess) -> None:
    address = remote_server.address
    path, table_id = asyncio.run(create_log_table(address))
    asyncio.run(append(address, path, 0, ROWS))
    wait_until(lambda: offloaded(remote_server, path, table_id), "segments copied and deleted locally")

    manifest = manifest_of(remote_server, path, table_id)
    segments = manifest["remote_log_segments"]
    assert manifest["version"] == 1 and manifest["table_id"] == table_id and manifest["bucket_id"] == 0
    assert segments[0]["start_offset"] == 0 and len(segments) > 10
    for previous, following in itertools.pairwise(segments):
        assert following["start_offset"] == previous["end_offset"]  # contiguous, end exclusive
    for segment in segments:  # Fluss's layout: <tablet dir>/<segment id>/<20-digit base>.log (+ .index)
        files = tablet_dir(remote_server, path, table_id) / segment["segment_id"]
        assert (files / f"{segment['start_offset']:020d}.log").stat().st_size == segment["size_in_bytes"]
        assert (files / f"{segment['start_offset']:020d}.index").exists()
    local_start = int(bucket_log_files(remote_server, table_id)[0].stem)
    assert local_start > 0 and local_start <= segments[-1]["end_offset"]

    async def earliest() -> int:
        async with await Connection.create(address) as connection:
            return (await connection.get_admin().list_offsets(path, [0], OffsetSpec.earliest()))[0]

    assert asyncio.run(earliest()) == 0  # the remote start, not the local one

    rows = asyncio.run(read_with_strom(address, path, ROWS))
    assert [r["seq"] for r in rows] == list(range(ROWS))
    assert rows[1234]["pad"] == "row-00001234"
    projected = asyncio.run(read_with_strom(address, path, ROWS, projection=[1]))
    assert [r["pad"] for r in projected] == [f"row-{i:08d}" for i in range(ROWS)]

    records = asyncio.run(read_with_pyfluss(address, path, ROWS))
    assert [r.offset for r in records] == list(range(ROWS))
    assert [r.row["seq"] for r in records] == list(range(ROWS))

    # the remote tier in the metrics and in `strom log remote`
    metrics_port = remote_server.config[METRICS_PORT]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    size_bytes = sum(s["size_in_bytes"] for s in manifest_of(remote_server, path, table_id)["remote_log_segments"])
    assert f'strom_remote_log_size_bytes{{bucket="0",table="{path}"}} {float(size_bytes)}' in metrics
    assert f'strom_remote_log_lag_offsets{{bucket="0",table="{path}"}}' in metrics
    shown = CliRunner().invoke(strom_cli, ["log", "remote", str(path), "-b", address, "--json"])
    assert shown.exit_code == 0, shown.output
    [bucket] = json.loads(shown.output)["buckets"]
    latest = manifest_of(remote_server, path, table_id)
    assert bucket["log_start_offset"] == 0 and bucket["high_watermark"] == ROWS
    assert bucket["remote_end_offset"] == latest["_end"] and bucket["remote_segments"] == len(latest["remote_log_segments"])
    assert bucket["lag_offsets"] == ROWS - latest["_end"] and bucket["remote_size_bytes"] > 0


def test_local_ttl_deletes_copied_segments_that_the_local_segment_count_would_keep(remote_server: ServerProcess) -> None:
    """``table.log.local-ttl``: a segment in remote storage leaves the local disk once older than it, even
    where ``table.log.tiered.local-segments`` would keep it; without it the count alone decides."""
    address = remote_server.address
    keeping = {"table.log.tiered.local-segments": "1000"}
    ttl_path, ttl_id = asyncio.run(create_log_table(address, {**keeping, "table.log.local-ttl": "1s"}))
    kept_path, kept_id = asyncio.run(create_log_table(address, keeping))
    for path in (ttl_path, kept_path):
        asyncio.run(append(address, path, 0, 600))
    wait_until(lambda: tablet_dir(remote_server, ttl_path, ttl_id).exists()
               and tablet_dir(remote_server, kept_path, kept_id).exists(), "both logs copied to remote storage")
    wait_until(lambda: len(bucket_log_files(remote_server, ttl_id)) == 1, "the expired local segments deleted")
    assert len(bucket_log_files(remote_server, kept_id)) > 3, "the count keeps the other table's segments"
    rows = asyncio.run(read_with_strom(address, ttl_path, 600))
    assert [r["seq"] for r in rows] == list(range(600)), "read whole, from remote storage"


def test_ttl_expires_remote_segments_and_a_drop_removes_the_remote_log(remote_server: ServerProcess) -> None:
    address = remote_server.address
    path, table_id = asyncio.run(create_log_table(address, {"table.log.ttl": "3s"}))
    asyncio.run(append(address, path, 0, 1000))
    wait_until(lambda: offloaded(remote_server, path, table_id), "segments copied")
    first = manifest_of(remote_server, path, table_id)["remote_log_segments"][0]["segment_id"]
    wait_until(lambda: not (tablet_dir(remote_server, path, table_id) / first).exists(), "the oldest segment expired")
    remaining = manifest_of(remote_server, path, table_id)["remote_log_segments"]
    assert all(s["segment_id"] != first for s in remaining)

    async def drop() -> None:
        async with await Connection.create(address) as connection:
            await connection.get_admin().drop_table(path)

    asyncio.run(drop())
    assert not tablet_dir(remote_server, path, table_id).parent.exists()


def test_kill_during_uploads_loses_nothing_and_leaves_no_orphans(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    config = {**REMOTE_CONFIG, "remote.data.dir": str(remote), "remote.log.task-max-upload-segments": "1"}
    server = ServerProcess(tmp_path / "data", config).start()
    try:
        path, table_id = asyncio.run(create_log_table(server.address))
        written = 0
        for _round in range(4):
            asyncio.run(append(server.address, path, written, 800))
            written += 800
            time.sleep(0.3)  # uploads are under way
            server.kill()
            server.start()
        wait_until(lambda: offloaded(server, path, table_id), "segments copied after the restarts")
        time.sleep(1.0)
        manifest = manifest_of(server, path, table_id)
        referenced = {s["segment_id"] for s in manifest["remote_log_segments"]}
        directory = tablet_dir(server, path, table_id)
        on_disk = {p.name for p in directory.iterdir() if p.is_dir() and p.name != "metadata"}
        assert on_disk == referenced, "segment directories no manifest references"
        assert len(list((directory / "metadata").iterdir())) == 1, "only the current manifest"
        rows = asyncio.run(read_with_strom(server.address, path, written))
        assert [r["seq"] for r in rows] == list(range(written))
    finally:
        server.stop()


def test_a_primary_key_changelog_is_read_from_remote_and_the_table_recovers_after_a_kill(tmp_path: Path) -> None:
    """The changelog goes remote like a log table's, but local disk keeps it from the oldest KV snapshot on
    (recovery replays it): after kill -9 every key is there, and pyfluss reads the whole changelog."""
    # One retained snapshot: the one taken after the writes ends up the oldest, so the local log may go
    # down to two segments. With two, a snapshot taken part way through the writes (a slow machine) stays
    # the oldest for good (nothing changes after them) and rightly holds the changelog after it locally.
    config = {**REMOTE_CONFIG, "remote.data.dir": str(tmp_path / "remote"), "kv.snapshot.interval": "500ms",
              "kv.snapshot.num-retained": "1"}
    server = ServerProcess(tmp_path / "data", config).start()
    keys = 400
    try:
        path = TablePath("fluss", unique_name("remote_pk"))
        schema = Schema.from_arrow(pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())]),
                                   primary_key=["id"])

        async def write() -> int:
            async with await Connection.create(server.address) as connection:
                await connection.get_admin().create_table(path, TableDescriptor(
                    schema, bucket_count=1, properties={"table.log.tiered.local-segments": "2"}))
                table = await connection.get_table(path)
                writer = table.new_upsert().create_writer()
                for version in range(3):  # every key three times: inserts, then updates (-U/+U)
                    for first in range(0, keys, 40):
                        ids = list(range(first, first + 40))
                        writer.upsert_arrow_batch(pa.table({"id": ids, "v": [f"v{version}-{i}" for i in ids]}))
                await writer.flush()
                return table.layout.info.table_id

        table_id = asyncio.run(write())
        changes = keys + 2 * 2 * keys
        wait_until(lambda: offloaded(server, path, table_id), "the changelog copied and the local log cut")
        server.kill()
        server.start()

        async def lookups() -> list[Any]:
            async with await Connection.create(server.address) as connection:
                table = await connection.get_table(path)
                lookuper = table.new_lookup().create_lookuper()
                return [await lookuper.lookup({"id": key}) for key in range(0, keys, 37)]

        assert asyncio.run(lookups()) == [{"id": key, "v": f"v2-{key}"} for key in range(0, keys, 37)]
        records = asyncio.run(read_with_pyfluss(server.address, path, changes))
        assert [r.offset for r in records] == list(range(changes))
        last = {r.row["id"]: r.row["v"] for r in records}
        assert last == {key: f"v2-{key}" for key in range(keys)}
    finally:
        server.stop()


def test_a_partitions_remote_log_lives_under_its_name_and_goes_with_it(remote_server: ServerProcess) -> None:
    address = remote_server.address
    path = TablePath("fluss", unique_name("remote_parts"))
    schema = Schema.from_arrow(pa.schema([("seq", pa.int64()), ("pad", pa.string()), ("day", pa.string())]))

    async def create_and_write() -> tuple[int, dict[str, int]]:
        async with await Connection.create(address) as connection:
            admin = connection.get_admin()
            await admin.create_table(path, TableDescriptor(
                schema, partition_keys=("day",), bucket_count=1,
                properties={"table.log.tiered.local-segments": "2"}))
            for day in ("d1", "d2"):
                await admin.create_partition(path, {"day": day})
            table = await connection.get_table(path)
            writer = table.new_append().create_writer()
            for first in range(0, 1000, 50):
                ids = list(range(first, first + 50))
                for day in ("d1", "d2"):
                    writer.append_arrow_batch(pa.table({"seq": ids, "pad": [f"row-{i:08d}" for i in ids],
                                                        "day": [day] * 50}))
            await writer.flush()
            partitions = {p.partition_name: p.partition_id for p in await admin.list_partition_infos(path)}
            return table.layout.info.table_id, partitions

    table_id, partitions = asyncio.run(create_and_write())
    table_dir = remote_root(remote_server) / "log" / path.database_name / f"{path.table_name}-{table_id}"
    day_dirs = {day: table_dir / f"{day}-p{pid}" / "0" for day, pid in partitions.items()}
    wait_until(lambda: all(any(d.glob("*/*.log")) for d in day_dirs.values()), "both partitions copied")

    async def drop_d1() -> None:
        async with await Connection.create(address) as connection:
            await connection.get_admin().drop_partition(path, {"day": "d1"})

    asyncio.run(drop_d1())
    assert not day_dirs["d1"].parent.exists()
    assert any(day_dirs["d2"].glob("*/*.log"))


def test_a_filtered_scan_skips_remote_batches_by_their_statistics(remote_server: ServerProcess) -> None:
    """Remote segments keep the batches' statistics: the client, reading them itself, skips the batches that
    cannot match as the server skips local ones; the rows found are those a full read filters."""
    address = remote_server.address
    path, table_id = asyncio.run(create_log_table(address, {"table.statistics.columns": "seq"}))
    asyncio.run(append(address, path, 0, ROWS))
    wait_until(lambda: offloaded(remote_server, path, table_id), "segments copied and deleted locally")
    wanted = (col("seq") >= 120) & (col("seq") < 130) | (col("seq") == ROWS - 1)

    async def scan(predicate: Predicate | None) -> tuple[int, list[int]]:
        async with await Connection.create(address) as connection:
            table = await connection.get_table(path)
            builder = table.new_scan()
            scanner = (builder.filter(predicate) if predicate is not None else builder).create_log_scanner()
            scanner.subscribe(0, 0)
            batches, found = 0, []
            deadline = time.monotonic() + WAIT_S
            while scanner.position(table.bucket(0)) < ROWS:
                assert time.monotonic() < deadline, scanner.position(table.bucket(0))
                for scan_batch in await scanner.poll(500):
                    batches += 1
                    found += wanted.filter(scan_batch.batch).column("seq").to_pylist()
            return batches, found

    all_batches, everything = asyncio.run(scan(None))
    filtered_batches, matching = asyncio.run(scan(wanted))
    assert matching == everything == [*range(120, 130), ROWS - 1]
    assert filtered_batches == 2 < all_batches  # the two 50-row batches holding them, one of them remote
