"""The memory a tablet server reports in its registration (Fluss's TabletServerResourceProbe, memory only).

The coordinator divides the live tablet servers' memory by ``kv.leader-replica.memory-reserved`` to bound
the cluster's primary-key bucket leaders (``strom.coordinator.kv_leader_capacity``). A server reports, first
found: ``tablet-server.advertised-resource.memory-size`` when set and positive; its cgroup's memory limit
(v2 ``memory.max``, else v1 ``memory/memory.limit_in_bytes``) when that is a number (not ``max``, not a
v1 "unlimited" near 2^63); the machine's physical memory. Nothing here limits or reserves memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from strom.config import TABLET_SERVER_ADVERTISED_RESOURCE_MEMORY_SIZE, Configuration

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED_MEMORY_BYTES = ((1 << 63) - 1) // 2
"""A cgroup limit at or above this means no limit (cgroup v1 writes 2^63 rounded down to a page)."""


def physical_memory_bytes() -> int | None:
    """The machine's memory; None when the platform does not tell."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return total if total > 0 else None


def cgroup_memory_bytes(cgroup_root: Path = CGROUP_ROOT) -> int | None:
    """The memory limit of this process's cgroup (v2, else v1) when it is a number; None without one."""
    for path in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        limit = _memory_value(path)
        if limit is not None:
            return limit
    return None


def _memory_value(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        log.debug("ignoring the memory limit %r in %s", text, path)
        return None
    return value if 0 < value < UNLIMITED_MEMORY_BYTES else None


def advertised_memory_bytes(
    config: Configuration, cgroup_root: Path = CGROUP_ROOT,
    physical: Callable[[], int | None] = physical_memory_bytes,
) -> int | None:
    """What this tablet server registers as its memory: the configured size, else the cgroup limit, else
    the machine's memory (None only when none of them is known)."""
    configured = config.get(TABLET_SERVER_ADVERTISED_RESOURCE_MEMORY_SIZE)
    if configured is not None and configured > 0:
        return int(configured)
    limit = cgroup_memory_bytes(cgroup_root)
    return limit if limit is not None else physical()


__all__ = ["advertised_memory_bytes", "cgroup_memory_bytes", "physical_memory_bytes"]
