"""Several data directories on one tablet server (``data.dirs``): what the configuration may name, what each
directory records about itself, where buckets go, and what becomes of the buckets of a directory that is
lost — at start (removed while the server was down) or while the server runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.config import Configuration
from strom.errors import DiskWriteLockedError, InvalidConfigError, StorageError
from strom.ids import TableBucket, TablePath
from strom.log.log_tablet import LogTablet
from strom.membership.contract import LeaderAndIsr
from strom.metadata.table_info import TableInfo
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import BigIntType
from strom.tablet import disk_guard as disk_guard_module
from strom.tablet.data_dirs import (
    DISK_PROPERTIES,
    DataDirectories,
    configured_paths,
    open_configured,
)
from strom.tablet.disk_guard import DiskWriteGuard
from strom.tablet.replica import ReplicaManager
from strom.tablet.replication import ReplicationManager
from tests.log.test_log_tablet import DURABLE_EACH_APPEND, append, batch_bytes
from tests.tablet.test_follower import LeaderLog, Registry, fetched_up_to
from tests.tablet.test_leader_high_watermark import BUCKET, ME, SECOND, GatedStates
from tests.tablet.test_leader_high_watermark import TABLE as FOLLOWED

LOG_TABLE = TableInfo(
    7, TablePath("db", "events"), 1,
    TableDescriptor(Schema.of([("id", BigIntType())]), bucket_count=8).to_json(), 0, 0,
)
KV_TABLE = TableInfo(
    8, TablePath("db", "users"), 1,
    TableDescriptor(Schema.of([("id", BigIntType())], primary_key=["id"]), bucket_count=8).to_json(), 0, 0,
)
SERVER_ID = 3


def _config(*directories: Path, **extra: str) -> Configuration:
    return Configuration({"data.dirs": ",".join(str(d) for d in directories), "tablet-server.id": SERVER_ID, **extra})


def _open(tmp_path: Path, *directories: Path) -> DataDirectories:
    return open_configured(_config(*directories), tmp_path / "node")


def _where(directories: DataDirectories, table: TableInfo, buckets: range) -> list[Path]:
    """The data directory of each bucket, placing it if new."""
    placed = [directories.directory_of(table, TableBucket(table.table_id, bucket)) for bucket in buckets]
    return [next(d.path for d in directories.directories if path.is_relative_to(d.tablets)) for path in placed]


def _write_bucket(path: Path) -> None:
    """A bucket directory as a served bucket leaves it (its log's first segment)."""
    LogTablet.open(path / "log", DURABLE_EACH_APPEND).close()


# ---- configuration ----
def test_unset_data_dirs_leave_data_dir_the_only_directory(tmp_path: Path) -> None:
    assert configured_paths(Configuration(), tmp_path / "data") == [tmp_path / "data"]


def test_relative_paths_are_made_absolute_and_normalised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    found = configured_paths(Configuration({"data.dirs": "one, ./two/../three"}), tmp_path / "data")
    assert found == [tmp_path / "one", tmp_path / "three"]


def test_a_yaml_list_is_taken_as_it_is(tmp_path: Path) -> None:
    found = configured_paths(Configuration({"data.dirs": [str(tmp_path / "a"), str(tmp_path / "b")]}), tmp_path)
    assert found == [tmp_path / "a", tmp_path / "b"]


@pytest.mark.parametrize(("entries", "complaint"), [
    ("{a},,{b}", "empty entry"),
    ("{a},", "empty entry"),
    ("", "empty entry"),
    ("{a},{b},{a}/", "names .* twice"),
    ("{a},{a}/inner", "lies inside"),
    ("{a}/inner,{a}", "lies inside"),
])
def test_empty_repeated_and_nested_entries_are_refused(tmp_path: Path, entries: str, complaint: str) -> None:
    config = Configuration({"data.dirs": entries.format(a=tmp_path / "a", b=tmp_path / "b")})
    with pytest.raises(InvalidConfigError, match=complaint):
        configured_paths(config, tmp_path / "data")


# ---- each directory's identity ----
def test_each_directory_gets_a_disk_id_of_its_own_and_keeps_it(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    directories = _open(tmp_path, a, b)
    ids = [d.disk_id for d in directories.directories]
    properties = (a / DISK_PROPERTIES).read_text()
    assert "version=1" in properties and f"server.id={SERVER_ID}" in properties and f"disk.id={ids[0]}" in properties
    assert ids[0] != ids[1] and all(ids)
    assert (a / "tablets").is_dir() and (b / "tablets").is_dir()
    directories.close()
    assert [d.disk_id for d in _open(tmp_path, a, b).directories] == ids


def test_a_directory_of_another_server_stops_the_start(tmp_path: Path) -> None:
    _open(tmp_path, tmp_path / "a").close()
    with pytest.raises(InvalidConfigError, match=rf"{tmp_path / 'a'} belongs to tablet server {SERVER_ID}"):
        open_configured(Configuration({"data.dirs": str(tmp_path / "a"), "tablet-server.id": 4}), tmp_path / "node")


def test_a_copied_directory_stops_the_start(tmp_path: Path) -> None:
    _open(tmp_path, tmp_path / "a").close()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / DISK_PROPERTIES).write_bytes((tmp_path / "a" / DISK_PROPERTIES).read_bytes())
    with pytest.raises(InvalidConfigError, match="same disk id"):
        _open(tmp_path, tmp_path / "a", tmp_path / "b")


@pytest.fixture
def locked_elsewhere(tmp_path: Path) -> Iterator[Path]:
    """A directory whose lock another process holds (until the fixture ends)."""
    directory = tmp_path / "taken"
    directory.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()", str(directory / ".lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        yield directory
    finally:
        holder.kill()
        holder.wait(10)


def test_a_directory_that_cannot_be_locked_created_or_read_is_offline_and_the_rest_serve(
    tmp_path: Path, locked_elsewhere: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("not a directory")
    usable = tmp_path / "usable"
    directories = _open(tmp_path, locked_elsewhere, tmp_path / "file" / "below", usable)
    assert [d.path for d in directories.online] == [usable]
    reasons = {d.path: d.offline for d in directories.offline}
    assert "another process holds its lock" in str(reasons[locked_elsewhere])
    assert "cannot be used" in str(reasons[tmp_path / "file" / "below"])
    assert sum("OFFLINE" in r.message and r.levelname == "ERROR" for r in caplog.records) == 2
    assert set(_where(directories, LOG_TABLE, range(3))) == {usable}


def test_without_a_usable_directory_the_start_fails_naming_them(tmp_path: Path, locked_elsewhere: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StorageError, match="no data directory can be used") as refused:
        _open(tmp_path, locked_elsewhere, tmp_path / "file" / "below")
    assert str(locked_elsewhere) in str(refused.value) and str(tmp_path / "file" / "below") in str(refused.value)


# ---- placement ----
def test_new_buckets_go_to_the_directory_with_the_fewest_of_their_kind_ties_to_the_first(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    directories = _open(tmp_path, a, b, c)
    assert _where(directories, LOG_TABLE, range(4)) == [a, b, c, a]
    # KV buckets are counted apart: the first goes to the first directory though it holds two logs
    assert _where(directories, KV_TABLE, range(4)) == [a, b, c, a]
    counts = [(d.log_buckets, d.kv_buckets) for d in directories.directories]
    assert counts == [(4, 2), (2, 1), (2, 1)]
    assert _where(directories, LOG_TABLE, range(4, 6)) == [b, c], "logs of primary-key buckets count as logs"


def test_a_bucket_stays_where_it_was_found_and_new_ones_fill_the_emptier_directory(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _open(tmp_path, a).close()
    for bucket in range(3):  # three buckets written while `a` was the only directory
        _write_bucket(a / "tablets" / "db" / "events-7" / str(bucket))
    directories = _open(tmp_path, a, b)
    assert _where(directories, LOG_TABLE, range(3)) == [a, a, a]
    assert _where(directories, LOG_TABLE, range(3, 7)) == [b, b, b, a]


def test_partitioned_buckets_are_found_again(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _open(tmp_path, a, b).close()
    _write_bucket(b / "tablets" / "db" / "events-7" / "p12" / "0")
    bucket = TableBucket(LOG_TABLE.table_id, 0, 12)
    found = _open(tmp_path, a, b).directory_of(LOG_TABLE, bucket)
    assert found == b / "tablets" / "db" / "events-7" / "p12" / "0"


def test_a_bucket_in_two_directories_asks_for_a_manual_cleanup(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _open(tmp_path, a, b).close()
    for root in (a, b):
        _write_bucket(root / "tablets" / "db" / "events-7" / "1")
    with pytest.raises(StorageError, match="two data directories") as refused:
        _open(tmp_path, a, b)
    assert str(a / "tablets" / "db" / "events-7" / "1") in str(refused.value)
    assert str(b / "tablets" / "db" / "events-7" / "1") in str(refused.value)


# ---- a lost directory ----
def test_a_directory_removed_while_down_is_offline_and_its_buckets_are_not_started_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    directories = _open(tmp_path, a, b)
    assert _where(directories, LOG_TABLE, range(4)) == [a, b, a, b]
    directories.close()
    _remove(b)

    directories = _open(tmp_path, a, b)
    assert [d.path for d in directories.online] == [a] and not b.exists(), "not created anew"
    assert "it is missing, but it held disk" in str(directories.offline[0].offline)
    assert any("OFFLINE" in r.message for r in caplog.records)
    lost = TableBucket(LOG_TABLE.table_id, 1)
    assert "which is not online" in str(directories.offline_reason(lost))
    assert directories.offline_reason(TableBucket(LOG_TABLE.table_id, 0)) is None
    assert _where(directories, LOG_TABLE, range(4, 6)) == [a, a], "new buckets go to the online directory"
    directories.close()

    # the operator gives the disk up: the directory starts empty, its buckets anew
    record = tmp_path / "node" / "data-dirs"
    (disk_dir,) = [d for d in record.iterdir() if (d / "path").read_text().strip() != str(a)]
    _remove(disk_dir)
    directories = _open(tmp_path, a, b)
    assert len(directories.online) == 2 and directories.offline_reason(lost) is None


@pytest.mark.asyncio
async def test_a_directory_that_vanishes_while_running_fails_only_its_own_buckets(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    directories = _open(tmp_path, a, b)
    replicas = ReplicaManager(directories, Configuration())
    buckets = [TableBucket(LOG_TABLE.table_id, n) for n in range(2)]
    replicas.become_leader(LOG_TABLE, buckets)
    for bucket in buckets:
        append(replicas.get(bucket).log, batch_bytes([1]))
    on_b = replicas.get(buckets[1])
    _remove(b)
    assert directories.check() == [directories.directories[1]]
    with pytest.raises(StorageError, match=f"data directory {b} is offline"):
        replicas.get(buckets[1])
    assert not on_b.is_open
    assert replicas.get(buckets[0]).log.log_end_offset == 1, "the other directory's buckets serve on"
    assert directories.online_paths() == [a]
    replicas.close()


@pytest.mark.asyncio
async def test_a_followed_bucket_of_a_lost_directory_starts_over_in_an_online_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    directories = _open(tmp_path, a, b)
    assert _where(directories, LOG_TABLE, range(2)) == [a, b]
    directories.close()
    _remove(b)
    replicas = ReplicaManager(_open(tmp_path, a, b), Configuration())
    bucket = TableBucket(LOG_TABLE.table_id, 1)
    replicas.become_leader(LOG_TABLE, [bucket])
    with pytest.raises(StorageError, match="not online"):
        replicas.get(bucket)  # leading it: its data is gone with the disk, so it is refused, not started empty
    replicas.close()


@pytest.mark.asyncio
async def test_a_follower_refetches_a_bucket_lost_with_its_directory_from_the_leader(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    directories = _open(tmp_path, a, b)
    directories.directory_of(LOG_TABLE, TableBucket(LOG_TABLE.table_id, 0))  # on a: BUCKET goes to b
    assert directories.directory_of(FOLLOWED, BUCKET).is_relative_to(b)
    directories.close()
    _remove(b)
    leader_log = LogTablet.open(tmp_path / "leader", DURABLE_EACH_APPEND)
    await leader_log.durable(append(leader_log, batch_bytes([1, 2])).next_offset)
    replicas = ReplicaManager(_open(tmp_path, a, b), Configuration())
    manager = ReplicationManager(
        ME, replicas, GatedStates(LeaderAndIsr(SECOND, 1, (ME, SECOND), (ME, SECOND))), registry=Registry(),
        peers=LeaderLog(leader_log), table_of=lambda _table_id: FOLLOWED,  # type: ignore[arg-type]
        lag_max_ms=60_000, silence_max_ms=60_000,
    )
    await manager.apply(FOLLOWED, BUCKET)  # following SECOND
    try:
        replica = replicas.replica(BUCKET)
        assert replica.directory.is_relative_to(a) and replica.offline is None, "started over in the online one"
        assert await fetched_up_to(replica, 2), "replication filled it in"
    finally:
        await manager.stop()
        replicas.close()
        leader_log.close()


# ---- disk write protection ----
def test_the_write_protection_watches_every_directorys_file_system_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for directory in (a, b):
        directory.mkdir()
    used_per_mille = {a: 500, b: 900}
    sampled: list[Path] = []
    real = disk_guard_module.shutil.disk_usage(tmp_path)

    def disk_usage(path: Path) -> object:
        sampled.append(Path(path))
        used = used_per_mille[Path(path)]
        return real._replace(total=1000, used=used, free=1000 - used)

    monkeypatch.setattr(disk_guard_module.shutil, "disk_usage", disk_usage)
    guard = DiskWriteGuard(SERVER_ID, lambda: [a, b], Configuration({"server.data-disk.write-limit-ratio": "0.85"}))
    guard.sample()
    assert sampled == [a], "one file system (one st_dev): sampled once"
    assert not guard.locked

    monkeypatch.setattr(disk_guard_module, "file_system_of", {a: 1, b: 2}.__getitem__)  # two file systems
    sampled.clear()
    guard.sample()
    assert sampled == [a, b] and guard.locked and guard.fullest == b, "the fullest file system decides"
    with pytest.raises(DiskWriteLockedError, match=f"data disk usage reached 90.00% .* at {b}"):
        guard.ensure_writable()


def _remove(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=True)
