"""Notice when any process writes to a file, without polling it: Linux's inotify, through libc.

The processes of ``strom server --workers N`` share their membership in one SQLite file. Polling it every
100 ms woke every process ten times a second for nothing, and each wake-up on a busy machine lands on a
core a request wants. An inotify descriptor becomes readable when a watched file is written by anyone, so a
watcher can sleep in ``poll`` until something changed.

SQLite's own files are no good signal: its write-ahead log is written before a commit is fsynced and
published, so a reader woken by that write may not see the commit yet, and nothing wakes it again. The
membership's writers touch a file of their own after each commit instead (``local_membership``).

Where inotify is missing (not Linux, a sandbox without the calls), :meth:`FileChanges.open` returns None
and callers poll as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
from pathlib import Path

log = logging.getLogger(__name__)

_IN_MODIFY = 0x0002
_IN_MOVED_TO = 0x0080
_IN_CREATE = 0x0100
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_WATCHED = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, name length (the name follows, NUL-padded)
_READ_SIZE_BYTES = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    """The C library's inotify calls, from the symbols the interpreter has loaded (no search of the system,
    which would start ``ldconfig``); None where they are missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


class FileChanges:
    """One inotify descriptor watching some files (through their directories, so a file created later or
    replaced counts too): :meth:`fileno` is readable once something happened in one of the directories;
    :meth:`take` reads what and says whether a watched file was written. Not thread-safe: one thread uses
    it."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self._fd = fd
        self._names: dict[int, set[bytes]] = {}  # per watch (a directory), the file names watched in it

    @classmethod
    def open(cls) -> FileChanges | None:
        """A new descriptor, or None where inotify is not available."""
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            log.info("no inotify here (%s): membership changes are polled", os.strerror(ctypes.get_errno()))
            return None
        return cls(libc, fd)

    def watch(self, path: str) -> bool:
        """Watch ``path`` for writes; False when its directory cannot be watched (then the caller has to poll
        it)."""
        file = Path(path).absolute()
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(file.parent), _WATCHED)
        if wd < 0:
            log.info("cannot watch %s (%s): membership changes are polled", file.parent,
                     os.strerror(ctypes.get_errno()))
            return False
        self._names.setdefault(wd, set()).add(os.fsencode(file.name))
        return True

    def fileno(self) -> int:
        return self._fd

    def take(self) -> bool:
        """Read every pending event; True when one was about a watched file, or when events may have been
        missed (the kernel's queue overflowed, a watched directory went away). A wake-up is only a hint:
        what changed, the caller reads from the file itself."""
        changed = False
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE_BYTES)
            except BlockingIOError:
                return changed
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _, name_size = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size:offset + _EVENT.size + name_size].rstrip(b"\0")
                offset += _EVENT.size + name_size
                if mask & _IN_IGNORED:  # the directory went away
                    self._names.pop(wd, None)
                    changed = True
                elif mask & _IN_Q_OVERFLOW or name in self._names.get(wd, ()):
                    changed = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


__all__ = ["FileChanges"]
