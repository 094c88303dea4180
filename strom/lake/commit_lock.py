"""One committer at a time on a local lake table, for the formats whose library does not make a commit a
compare-and-set on the version the round was planned on (Lance rebases one append over another, Paimon
commits on top of whatever landed): under this lock a committer checks the table's latest version and
commits, and nothing lands in between.

Across threads it is a lock per table; across processes an ``flock`` on a file beside the table
(``<table>.strom-lock``). An object store gets no lock here: its own atomic commit refuses a second writer
of the same version, and the formats report a commit that landed on top of another one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator

LOCK_FILE_SUFFIX = ".strom-lock"

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    return uri.removeprefix("file://")


@contextlib.contextmanager
def exclusive(uri: str) -> Iterator[None]:
    """Hold the table at ``uri`` alone (nothing for an object store; see the module docstring)."""
    if not is_local(uri):
        yield
        return
    path = local_path(uri).rstrip("/")
    with _LOCKS_GUARD:
        in_process = _LOCKS.setdefault(path, threading.Lock())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with in_process, open(path + LOCK_FILE_SUFFIX, "a+b") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
