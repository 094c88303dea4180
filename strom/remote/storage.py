"""Remote storage for KV snapshots and log segments: a local directory by default, any fsspec URL (``s3://…``) otherwise.

Every method blocks; callers on the event loop run them in a worker thread. Local writes are fsynced
and renamed into place, so a file that exists is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from strom.fsync import fsync_path


class RemoteStorage:
    """A root location and the file operations snapshots and remote logs need. Thread-safe (no shared mutable state)."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        """``storage_options``: the file system's own (s3fs's credentials and endpoint for ``s3://``)."""
        self.root = root.rstrip("/")
        self._fs, self._root_path = fsspec.core.url_to_fs(self.root, **dict(storage_options or {}))
        self.is_local = isinstance(self._fs, LocalFileSystem)
        if self.is_local:
            Path(self._root_path).mkdir(parents=True, exist_ok=True)

    def url(self, relative: str) -> str:
        """The full location of ``relative`` (what snapshot metadata records)."""
        return f"{self.root}/{relative.lstrip('/')}"

    def relative(self, location: str) -> str:
        """``location`` (a full location under the root, as :meth:`url` gives) relative to the root; any
        other location unchanged."""
        return location[len(self.root) + 1:] if location.startswith(self.root + "/") else location

    def _path(self, location: str) -> str:
        if location.startswith(self.root + "/"):
            location = location[len(self.root) + 1 :]
        elif location.startswith("/") and not self.is_local:
            raise ValueError(f"{location} is not under {self.root}")
        elif location.startswith("/"):
            return location
        return f"{self._root_path}/{location}"

    def put_file(self, local_path: Path, location: str) -> int:
        """Upload a local file; returns its size."""
        target = self._path(location)
        if self.is_local:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            temporary = f"{target}.{uuid.uuid4().hex}.tmp"
            shutil.copyfile(local_path, temporary)
            fsync_path(temporary)
            os.replace(temporary, target)
            fsync_path(Path(target).parent)
        else:
            self._fs.put_file(str(local_path), target)
        return local_path.stat().st_size

    def write_bytes(self, location: str, data: bytes) -> None:
        target = self._path(location)
        if self.is_local:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            temporary = f"{target}.{uuid.uuid4().hex}.tmp"
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
            fsync_path(Path(target).parent)
        else:
            with self._fs.open(target, "wb") as handle:
                handle.write(data)

    def read_bytes(self, location: str) -> bytes:
        data: bytes = self._fs.cat_file(self._path(location))
        return data

    def get_file(self, location: str, local_path: Path) -> None:
        local_path.parent.mkdir(parents=True, exist_ok=True)
        self._fs.get_file(self._path(location), str(local_path))

    def exists(self, location: str) -> bool:
        return bool(self._fs.exists(self._path(location)))

    def size(self, location: str) -> int:
        return int(self._fs.size(self._path(location)))

    def delete(self, location: str) -> None:
        """Delete a file; a missing file is not an error (deletes are retried and idempotent)."""
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm_file(self._path(location))

    def list_files(self, location: str) -> list[str]:
        """Every file under ``location``, as full locations (the form :meth:`url` gives)."""
        base = self._path(location)
        if not self._fs.exists(base):
            return []
        prefix = self._root_path.rstrip("/") + "/"
        found = []
        for path in self._fs.find(base):
            path = str(path)
            found.append(self.url(path[len(prefix):]) if path.startswith(prefix) else path)
        return sorted(found)

    def list_dirs(self, location: str) -> list[str]:
        """The names of the directories directly under ``location`` (none when it does not exist)."""
        base = self._path(location)
        try:
            entries = self._fs.ls(base, detail=True)
        except FileNotFoundError:
            return []
        return sorted(str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")

    def delete_empty_dirs(self, location: str) -> None:
        """Remove the empty directories under ``location`` (local storage; object stores have none)."""
        if not self.is_local:
            return
        root = Path(self._path(location))
        if not root.is_dir():
            return
        for directory, _subdirs, _files in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
            if Path(directory) != root:
                with contextlib.suppress(OSError):  # not empty, or already gone
                    os.rmdir(directory)

    def delete_tree(self, location: str) -> None:
        path = self._path(location)
        if self._fs.exists(path):
            self._fs.rm(path, recursive=True)


def read_location(location: str) -> bytes:
    """The bytes of one remote file (any fsspec URL or local path)."""
    fs, path = fsspec.core.url_to_fs(location)
    data: bytes = fs.cat_file(path)
    return data


def download(location: str, local_path: Path) -> None:
    """Copy one remote file (any fsspec URL or local path) to ``local_path``."""
    fs, path = fsspec.core.url_to_fs(location)
    local_path.parent.mkdir(parents=True, exist_ok=True)
    fs.get_file(path, str(local_path))
