"""Where a lake table lives: a warehouse as every process reads it, and the file system of a location.

No lake library is imported here, so every format (and Spark tasks of any of them) can use it.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs

from strom.errors import InvalidConfigError


def pin_warehouse(warehouse: str, local_scheme: str = "") -> str:
    """A warehouse as every process reads it: a URL unchanged, a local path made absolute (Spark tasks may
    run in another working directory) with ``local_scheme`` before it (``file://`` for libraries that want
    a URL); no trailing slash. Empty stays empty."""
    warehouse = warehouse.strip()
    if warehouse and "://" not in warehouse:
        warehouse = local_scheme + os.path.abspath(warehouse)
    return warehouse.rstrip("/")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system and root path of a table URI (a local path, or any URL pyarrow or
    fsspec understands). Credentials come from the environment, as pyarrow's file systems take them."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        try:
            import fsspec
        except ImportError as exc:
            raise InvalidConfigError(f"pyarrow cannot open {uri!r} and fsspec is not installed") from exc
        fs, path = fsspec.core.url_to_fs(uri)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


__all__ = ["filesystem", "pin_warehouse"]
