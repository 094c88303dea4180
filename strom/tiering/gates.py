"""Named pause points of a round, for tests that must act between two steps (kill, drop, restart).

With ``testing.tiering.gate-dir`` set, passing point ``P`` appends this process's pid to
``<dir>/reached-P`` and then waits while ``<dir>/hold-P`` exists. Without it, passing is free. The
points are ``task`` (a Spark task, before it reads its split), ``planned`` (the driver, after leasing
and before the Spark job), ``lake-commit`` (before the lake commit), ``coordinator-commit`` (between
the lake commit and the coordinator commit) and ``committed`` (after both).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD_S_MAX = 300.0
POLL_S = 0.05


def pass_gate(directory: str | None, point: str) -> None:
    if directory is None:
        return
    root = Path(directory)
    with open(root / f"reached-{point}", "a") as marker:
        marker.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + HOLD_S_MAX
    while (root / f"hold-{point}").exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)
