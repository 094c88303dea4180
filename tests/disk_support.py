"""Filling a (small, test-mounted) disk: what the disk-full tests and the nemesis do to a server."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

BALLAST_NAME = "ballast"


def fill(directory: Path) -> Path:
    """Write a ballast file into ``directory`` until its disk is full; returns the file (delete it to free)."""
    ballast = directory / BALLAST_NAME
    descriptor = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 20, 4096, 1):  # big chunks, then what is left
            chunk = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(descriptor, chunk)
    finally:
        os.close(descriptor)
    return ballast
