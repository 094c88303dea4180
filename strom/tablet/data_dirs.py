"""The data directories of a tablet server (Fluss's ``data.dirs``): which one holds each bucket's log and
RocksDB, and which of them can be used.

A data directory ``D`` holds ``D/disk.properties`` (its format version, a random disk id and the server's
id), ``D/.lock`` (locked while a server process uses it) and the buckets under
``D/tablets/<db>/<table>-<id>/[p<partition>/]<bucket>``.

At start every configured directory is opened: created if missing, locked, its ``disk.properties`` read (or
written). One that cannot be is OFFLINE — logged at ERROR, the server starts without it — and if none can,
the start fails. A directory that belongs to another server, or two with one disk id (a copied directory),
stop the start: serving either would mix two servers' data. Every online directory is then scanned: a bucket
stays where it is found; a new bucket goes to the directory with the fewest buckets of its kind (KV buckets
for a primary-key table, logs for a log table), ties to the first configured.

With ``data.dirs`` set, which disk each bucket went to is recorded outside the disks too, in ``data.dir``
(:class:`PlacementRecord`). A configured path that held a disk and is now missing or empty stays OFFLINE
instead of being created anew, and a bucket recorded on a disk that is not online is *lost*, never
re-created empty in another directory behind its clients' backs: :meth:`DataDirectories.offline_reason`
says why it cannot be served.

A directory that vanishes while the server runs (its ``disk.properties`` is gone; looked for every second)
goes offline: the listeners (the replica manager) close its buckets, which answer StorageError from then on,
while the other directories' buckets serve on.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from strom.config import DATA_DIRS, TABLET_SERVER_ID, Configuration
from strom.errors import InvalidConfigError, StorageError
from strom.ids import TableBucket
from strom.metadata.table_info import TableInfo

log = logging.getLogger(__name__)

DISK_PROPERTIES = "disk.properties"
LOCK_FILE = ".lock"
TABLETS = "tablets"
RECORD_DIR = "data-dirs"
"""Where in ``data.dir`` the placements are recorded (:class:`PlacementRecord`)."""
PROPERTIES_VERSION = "1"
CHECK_INTERVAL_S = 1.0
"""How often the online directories are looked at for one that vanished."""


def open_configured(config: Configuration, data_dir: Path) -> DataDirectories:
    """This server's directories (:func:`configured_paths`), opened; with ``data.dirs`` set, placements are
    recorded in ``<data.dir>/data-dirs``."""
    record = _absolute(str(data_dir)) / RECORD_DIR if config.get(DATA_DIRS) is not None else None
    directories = DataDirectories.open(configured_paths(config, data_dir), config.get(TABLET_SERVER_ID), record)
    log.info("data directories: %s", ", ".join(
        f"{d.path} ({'OFFLINE' if d.offline else f'{d.log_buckets} buckets, {d.kv_buckets} with KV state'})"
        for d in directories.directories))
    return directories


def configured_paths(config: Configuration, data_dir: Path) -> list[Path]:
    """The data directories, absolute: ``data.dirs``, else ``data.dir`` alone.

    Raises:
        InvalidConfigError: an empty entry, a path named twice, or one inside another.
    """
    entries = config.get(DATA_DIRS)
    if entries is None:
        return [_absolute(str(data_dir))]
    if not entries or not all(entries):
        raise InvalidConfigError(f"{DATA_DIRS.key} has an empty entry: {','.join(entries)!r}")
    paths = [_absolute(entry) for entry in entries]
    for index, path in enumerate(paths):
        for other in paths[index + 1:]:
            if path == other:
                raise InvalidConfigError(f"{DATA_DIRS.key} names {path} twice")
            if path.is_relative_to(other) or other.is_relative_to(path):
                inner, outer = (path, other) if path.is_relative_to(other) else (other, path)
                raise InvalidConfigError(f"{DATA_DIRS.key}: {inner} lies inside {outer}; data directories must not nest")
    return paths


def _absolute(entry: str) -> Path:
    return Path(os.path.abspath(os.path.expanduser(entry)))


def bucket_path(table: TableInfo, bucket: TableBucket) -> Path:
    """Where a bucket lives under a directory's ``tablets``."""
    table_dir = Path(table.path.database_name) / f"{table.path.table_name}-{table.table_id}"
    if bucket.partition_id is not None:
        table_dir = table_dir / f"p{bucket.partition_id}"
    return table_dir / str(bucket.bucket)


@dataclass(eq=False)
class DataDirectory:
    """One configured directory."""

    path: Path
    tablets: Path
    """The root of its buckets."""
    disk_id: str | None = None
    """From its ``disk.properties``; None for a directory used as it is (:meth:`DataDirectories.plain`)."""
    offline: str | None = None
    """Why it cannot be used; None while online."""
    log_buckets: int = 0
    kv_buckets: int = 0
    _lock_fd: int | None = field(default=None, repr=False)

    def lock(self) -> None:
        """An advisory lock, held until :meth:`unlock` (per process: a server started again in the same
        process, as tests do, takes it again)."""
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise OSError(exc.errno, "another process holds its lock") from exc
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None


def bucket_key(bucket: TableBucket) -> str:
    if bucket.partition_id is None:
        return f"{bucket.table_id}-{bucket.bucket}"
    return f"{bucket.table_id}-p{bucket.partition_id}-{bucket.bucket}"


def parse_bucket_key(name: str) -> TableBucket | None:
    parts = name.split("-")
    if len(parts) == 2 and all(part.isdigit() for part in parts):
        return TableBucket(int(parts[0]), int(parts[1]))
    if len(parts) == 3 and parts[0].isdigit() and parts[1][:1] == "p" and parts[1][1:].isdigit() and parts[2].isdigit():
        return TableBucket(int(parts[0]), int(parts[2]), int(parts[1][1:]))
    return None


@dataclass
class RecordedDisk:
    path: str | None
    buckets: set[TableBucket]


class PlacementRecord:
    """Which disk each bucket was placed on, kept outside the disks (in ``data.dir``):
    ``<root>/<disk id>/path`` holds the disk's last path and ``<root>/<disk id>/buckets/`` an empty file per
    bucket. Written as buckets are placed and deleted; a failed write is logged (the record then only misses
    a bucket, which would start empty should its disk be lost)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def load(self) -> dict[str, RecordedDisk]:
        disks: dict[str, RecordedDisk] = {}
        if not self.root.is_dir():
            return disks
        for disk_dir in (d for d in self.root.iterdir() if d.is_dir()):
            path_file = disk_dir / "path"
            path = path_file.read_text().strip() if path_file.is_file() else None
            buckets_dir = disk_dir / "buckets"
            names = [f.name for f in buckets_dir.iterdir()] if buckets_dir.is_dir() else []
            disks[disk_dir.name] = RecordedDisk(path, {b for name in names if (b := parse_bucket_key(name)) is not None})
        return disks

    def disk_dir(self, disk_id: str) -> Path:
        return self.root / disk_id

    def set_path(self, disk_id: str, path: Path) -> None:
        def write() -> None:
            (self.root / disk_id / "buckets").mkdir(parents=True, exist_ok=True)
            path_file = self.root / disk_id / "path"
            if not path_file.is_file() or path_file.read_text().strip() != str(path):
                partial = path_file.with_suffix(".partial")
                partial.write_text(f"{path}\n")
                partial.replace(path_file)

        self._quietly(write)

    def add(self, disk_id: str, bucket: TableBucket) -> None:
        self._quietly(lambda: (self.root / disk_id / "buckets" / bucket_key(bucket)).touch())

    def remove(self, disk_id: str, bucket: TableBucket) -> None:
        self._quietly(lambda: (self.root / disk_id / "buckets" / bucket_key(bucket)).unlink(missing_ok=True))

    def drop(self, disk_id: str) -> None:
        def remove_disk() -> None:
            disk_dir = self.root / disk_id
            for marker in (disk_dir / "buckets").glob("*"):
                marker.unlink()
            with contextlib.suppress(FileNotFoundError):
                (disk_dir / "buckets").rmdir()
            (disk_dir / "path").unlink(missing_ok=True)
            disk_dir.rmdir()

        self._quietly(remove_disk)

    def _quietly(self, write: Callable[[], object]) -> None:
        try:
            write()
        except OSError as exc:
            log.warning("recording the buckets' data directories in %s failed: %s", self.root, exc)


@dataclass
class _Lost:
    disk_id: str
    path: str | None


OfflineListener = Callable[[DataDirectory], None]


class DataDirectories:
    """The directories of one tablet server and where each bucket lives. Owned by the event loop."""

    def __init__(self, directories: list[DataDirectory], record: PlacementRecord | None = None) -> None:
        self.directories = directories
        self._record = record
        self._placed: dict[TableBucket, DataDirectory] = {}
        self._kv: set[TableBucket] = set()
        self._lost: dict[TableBucket, _Lost] = {}
        self._listeners: list[OfflineListener] = []
        self._watch: asyncio.Task[None] | None = None

    @classmethod
    def plain(cls, tablets: Path) -> DataDirectories:
        """One directory used as it is, its buckets right under it: no ``disk.properties``, lock or record
        (a replica manager of its own, as tests build)."""
        return cls([DataDirectory(tablets, tablets)])

    @classmethod
    def open(cls, paths: Sequence[Path], server_id: int, record_dir: Path | None = None) -> DataDirectories:
        """Open every directory of ``paths`` (:func:`configured_paths`) and find the buckets in them;
        ``record_dir``: where placements are recorded (:class:`PlacementRecord`), None to keep no record.

        Raises:
            InvalidConfigError: a directory of another server, or one disk id twice.
            StorageError: no directory can be used, or a bucket lies in two of them.
        """
        record = PlacementRecord(record_dir) if record_dir is not None else None
        recorded = _load(record)
        recorded_at = {disk.path: disk_id for disk_id, disk in recorded.items() if disk.path is not None}
        directories: list[DataDirectory] = []
        try:
            for path in paths:
                disk_id = recorded_at.get(str(path))
                forget = record.disk_dir(disk_id) if record is not None and disk_id is not None else None
                directories.append(_open_directory(path, server_id, disk_id, forget))
            _check_disk_ids(directories)
            opened = cls(directories, record)
            opened._scan()
            for directory in directories:
                if directory.offline is not None:
                    log.error("data directory %s is OFFLINE: %s", directory.path, directory.offline)
            if not opened.online:
                raise StorageError("no data directory can be used: " + "; ".join(
                    f"{directory.path} ({directory.offline})" for directory in directories))
            opened._reconcile(recorded)
        except BaseException:
            for directory in directories:
                directory.unlock()
            raise
        return opened

    @property
    def online(self) -> list[DataDirectory]:
        return [directory for directory in self.directories if directory.offline is None]

    @property
    def offline(self) -> list[DataDirectory]:
        return [directory for directory in self.directories if directory.offline is not None]

    def online_paths(self) -> list[Path]:
        return [directory.path for directory in self.online]

    def on_offline(self, listener: OfflineListener) -> None:
        """Call ``listener(directory)`` when a directory goes offline while the server runs."""
        self._listeners.append(listener)

    # ---- placement ----
    def directory_of(self, table: TableInfo, bucket: TableBucket) -> Path:
        """Where ``bucket`` lives: where it was found or placed before, else in the directory with the fewest
        buckets of its kind, placed there now. A lost bucket keeps the path it had on its offline disk.

        Raises:
            StorageError: a new bucket, and no directory is online.
        """
        placed = self._placed.get(bucket)
        if placed is not None:
            return placed.tablets / bucket_path(table, bucket)
        lost = self._lost.get(bucket)
        if lost is not None:
            return Path(lost.path or "/offline-disk-" + lost.disk_id) / TABLETS / bucket_path(table, bucket)
        kv = table.has_primary_key
        online = self.online
        if not online:
            raise StorageError(f"cannot place {bucket}: no data directory is online")
        directory = min(online, key=lambda d: d.kv_buckets if kv else d.log_buckets)  # ties: the first configured
        self._add(bucket, directory, kv)
        if self._record is not None and directory.disk_id is not None:
            self._record.add(directory.disk_id, bucket)
        return directory.tablets / bucket_path(table, bucket)

    def existing_directory(self, table: TableInfo, bucket: TableBucket) -> Path | None:
        """Where ``bucket`` was found or placed in an online directory; None if it has no place there (nothing
        is placed here), so what lies in an offline one — maybe another process's — is never touched."""
        directory = self._placed.get(bucket)
        if directory is None or directory.offline is not None:
            return None
        return directory.tablets / bucket_path(table, bucket)

    def offline_reason(self, bucket: TableBucket) -> str | None:
        """Why ``bucket`` cannot be served here: its directory is offline, or it is lost with a disk that is
        not online; None if it can be."""
        directory = self._placed.get(bucket)
        if directory is not None and directory.offline is not None:
            return f"{bucket}: its data directory {directory.path} is offline ({directory.offline})"
        lost = self._lost.get(bucket)
        if lost is not None:
            forget = (f", or delete {self._record.disk_dir(lost.disk_id)} to let its buckets start empty"
                      if self._record is not None else "")
            return (f"{bucket} lies on disk {lost.disk_id} ({lost.path or 'path unknown'}), which is not online: "
                    f"bring that directory back{forget}")
        return None

    def forget(self, bucket: TableBucket) -> None:
        """``bucket`` is no longer kept here (deleted, or to be placed anew): its place and record go."""
        directory = self._placed.pop(bucket, None)
        kv = bucket in self._kv
        self._kv.discard(bucket)
        if directory is not None:
            directory.log_buckets -= 1
            directory.kv_buckets -= kv
            if self._record is not None and directory.disk_id is not None:
                self._record.remove(directory.disk_id, bucket)
        lost = self._lost.pop(bucket, None)
        if lost is not None and self._record is not None:
            self._record.remove(lost.disk_id, bucket)

    def forget_table(self, table_id: int, partition_id: int | None = None) -> None:
        """Every bucket of a dropped table (or partition)."""
        for bucket in [b for b in (*self._placed, *self._lost)
                       if b.table_id == table_id and (partition_id is None or b.partition_id == partition_id)]:
            self.forget(bucket)

    def _add(self, bucket: TableBucket, directory: DataDirectory, kv: bool) -> None:
        self._placed[bucket] = directory
        directory.log_buckets += 1
        if kv:
            self._kv.add(bucket)
            directory.kv_buckets += 1

    # ---- start ----
    def _scan(self) -> None:
        """Find the buckets of every online directory (a directory that cannot be read goes offline)."""
        where: dict[TableBucket, Path] = {}
        for directory in self.online:
            try:
                found = list(_buckets_in(directory.tablets))
            except OSError as exc:
                directory.offline = f"it cannot be read: {exc}"
                directory.unlock()
                continue
            for bucket, bucket_dir in found:
                if bucket in where:
                    raise StorageError(
                        f"{bucket} is in two data directories, {where[bucket]} and {bucket_dir}: keep the copy "
                        "that is current, delete the other, and start again")
                where[bucket] = bucket_dir
                self._add(bucket, directory, (bucket_dir / "kv").is_dir())

    def _reconcile(self, recorded: dict[str, RecordedDisk]) -> None:
        """Bring the record in line with what was found, and take the buckets of disks that are not online
        as lost."""
        record = self._record
        if record is None:
            return
        online_ids = set()
        for directory in self.online:
            assert directory.disk_id is not None
            online_ids.add(directory.disk_id)
            record.set_path(directory.disk_id, directory.path)
            here = {bucket for bucket, placed in self._placed.items() if placed is directory}
            known = recorded.get(directory.disk_id, RecordedDisk(None, set())).buckets
            for bucket in here - known:
                record.add(directory.disk_id, bucket)
            for bucket in known - here:
                record.remove(directory.disk_id, bucket)
        for disk_id, disk in recorded.items():
            if disk_id in online_ids:
                continue
            for bucket in disk.buckets & self._placed.keys():  # found on an online disk: it moved
                record.remove(disk_id, bucket)
            lost = disk.buckets - self._placed.keys()
            if not lost:
                record.drop(disk_id)
                continue
            log.error("disk %s (last at %s) is not online: its %d buckets answer StorageError until it is back "
                      "(or until %s is deleted: then they start empty)", disk_id, disk.path, len(lost),
                      record.disk_dir(disk_id))
            for bucket in lost:
                self._lost[bucket] = _Lost(disk_id, disk.path)

    # ---- while running ----
    def check(self) -> list[DataDirectory]:
        """Take a directory whose ``disk.properties`` is gone offline (it was removed or its disk failed);
        returns those that went offline now."""
        failed = []
        for directory in self.online:
            if directory.disk_id is None:
                continue  # used as it is: nothing to look for
            try:
                os.stat(directory.path / DISK_PROPERTIES)
            except OSError as exc:
                self.mark_offline(directory, f"its {DISK_PROPERTIES} cannot be found: {exc.strerror or exc}")
                failed.append(directory)
        return failed

    def mark_offline(self, directory: DataDirectory, reason: str) -> None:
        if directory.offline is not None:
            return
        directory.offline = reason
        directory.unlock()
        log.error("data directory %s is OFFLINE: %s; its buckets answer StorageError", directory.path, reason)
        for listener in self._listeners:
            try:
                listener(directory)
            except Exception:
                log.exception("taking the buckets of %s offline failed in %r", directory.path, listener)

    def start(self) -> None:
        """Look for vanished directories every second."""
        if any(directory.disk_id is not None for directory in self.directories):
            self._watch = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            self.check()

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None

    def close(self) -> None:
        """Release the directories' locks."""
        for directory in self.directories:
            directory.unlock()


def _load(record: PlacementRecord | None) -> dict[str, RecordedDisk]:
    if record is None:
        return {}
    try:
        return record.load()
    except OSError as exc:
        log.warning("the record of the buckets' data directories in %s cannot be read: %s", record.root, exc)
        return {}


def _open_directory(path: Path, server_id: int, recorded_disk: str | None, forget: Path | None) -> DataDirectory:
    """Create (unless it held a disk that is gone), lock and identify one directory; one that cannot be
    used comes back offline.

    Raises:
        InvalidConfigError: it belongs to another server.
    """
    directory = DataDirectory(path, path / TABLETS)
    properties = path / DISK_PROPERTIES
    try:
        if recorded_disk is not None and not properties.exists():
            what = "it is missing" if not path.exists() else f"it holds no {DISK_PROPERTIES}"
            directory.offline = (f"{what}, but it held disk {recorded_disk}: bring that disk back, or delete "
                                 f"{forget} to start it empty (its buckets are then lost)")
            return directory
        path.mkdir(parents=True, exist_ok=True)
        directory.lock()
        if properties.exists():
            values = _read_properties(properties)
        else:
            values = {"version": PROPERTIES_VERSION, "disk.id": str(uuid.uuid4()), "server.id": str(server_id)}
            _write_properties(properties, values)
        directory.disk_id = values["disk.id"]
        directory.tablets.mkdir(exist_ok=True)
    except (OSError, ValueError) as exc:
        directory.unlock()
        directory.offline = f"it cannot be used: {exc}"
        return directory
    if values["server.id"] != str(server_id):
        directory.unlock()
        raise InvalidConfigError(
            f"data directory {path} belongs to tablet server {values['server.id']}, not to this one "
            f"({server_id}): give each server directories of its own")
    return directory


def _read_properties(properties: Path) -> dict[str, str]:
    values = {}
    for line in properties.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            values[key.strip()] = value.strip()
    if values.get("version") != PROPERTIES_VERSION:
        raise ValueError(f"{properties} has version {values.get('version')!r}; this server reads {PROPERTIES_VERSION}")
    missing = [key for key in ("disk.id", "server.id") if not values.get(key)]
    if missing:
        raise ValueError(f"{properties} lacks {', '.join(missing)}")
    return values


def _write_properties(properties: Path, values: dict[str, str]) -> None:
    """Written whole and renamed into place: a crash leaves the file complete or absent."""
    partial = properties.with_suffix(".partial")
    text = "# a strom data directory: its disk id must stay unique (do not copy this file)\n"
    with open(partial, "w") as file:
        file.write(text + "".join(f"{key}={value}\n" for key, value in values.items()))
        file.flush()
        os.fsync(file.fileno())
    partial.replace(properties)


def _check_disk_ids(directories: Sequence[DataDirectory]) -> None:
    """Two directories with one disk id are copies of each other: serving both would fork its buckets."""
    seen: dict[str, Path] = {}
    for directory in directories:
        if directory.disk_id is None or directory.offline is not None:
            continue
        if directory.disk_id in seen:
            for each in directories:
                each.unlock()
            raise InvalidConfigError(
                f"data directories {seen[directory.disk_id]} and {directory.path} have the same disk id "
                f"{directory.disk_id} (one is a copy of the other): remove the copy, or its {DISK_PROPERTIES} "
                "if it is meant to be a new directory")
        seen[directory.disk_id] = directory.path


def _buckets_in(tablets: Path) -> Iterator[tuple[TableBucket, Path]]:
    """The bucket directories under ``tablets`` (``<db>/<table>-<id>/[p<partition>/]<bucket>``)."""
    for database_dir in _subdirectories(tablets):
        for table_dir in _subdirectories(database_dir):
            _, _, table_id = table_dir.name.rpartition("-")
            if not table_id.isdigit():
                continue
            for child in _subdirectories(table_dir):
                if child.name.isdigit():
                    yield TableBucket(int(table_id), int(child.name)), child
                elif child.name[:1] == "p" and child.name[1:].isdigit():
                    for bucket_dir in _subdirectories(child):
                        if bucket_dir.name.isdigit():
                            yield TableBucket(int(table_id), int(bucket_dir.name), int(child.name[1:])), bucket_dir


def _subdirectories(directory: Path) -> Iterator[Path]:
    if not directory.is_dir():
        return
    for child in sorted(directory.iterdir()):
        if child.is_dir():
            yield child


__all__ = [
    "DataDirectories", "DataDirectory", "PlacementRecord", "bucket_path", "configured_paths", "open_configured",
]
