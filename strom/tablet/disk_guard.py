"""Write protection of a tablet server's data disk (Fluss's ``server.data-disk.write-limit-ratio``): the
disk's usage is sampled every ``server.data-disk.check-interval``; once it reaches the limit ratio client
writes are refused with DiskWriteLocked (70, retriable) until it falls to the recover ratio. Followers'
replication is not refused (a replica must keep up with its leader), and 1.0 turns the protection off.
Usage is measured as ``df`` shows it, used / (used + available); Fluss counts (total - usable) / total,
which on a disk with many reserved blocks reads far fuller than ``df`` does. With several data directories
(``data.dirs``) every online one's file system is sampled, each once, and the fullest decides: writes are
refused once any of them reaches the limit, as in Fluss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from strom.config import (
    SERVER_DATA_DISK_CHECK_INTERVAL,
    SERVER_DATA_DISK_WRITE_LIMIT_RATIO,
    SERVER_DATA_DISK_WRITE_RECOVER_RATIO,
    Configuration,
)
from strom.errors import DiskWriteLockedError, InvalidConfigError
from strom.kv.backpressure import ramp

log = logging.getLogger(__name__)


def check_ratios(limit: float, recover: float) -> None:
    """Raises InvalidConfigError unless 0 < recover < limit <= 1 (Fluss's rule)."""
    if not 0.0 < recover < limit <= 1.0:
        raise InvalidConfigError(
            f"{SERVER_DATA_DISK_WRITE_RECOVER_RATIO.key} ({recover}) must be above 0 and below "
            f"{SERVER_DATA_DISK_WRITE_LIMIT_RATIO.key} ({limit}), which must be at most 1.0"
        )


def file_system_of(directory: Path) -> int:
    """The device of the file system ``directory`` lies on: directories on one are sampled once."""
    return os.stat(directory).st_dev


class DiskWriteGuard:
    """The locked/unlocked state of the data disks, sampled on the event loop."""

    def __init__(self, server_id: int, data_dirs: Path | Callable[[], Sequence[Path]], config: Configuration) -> None:
        """``data_dirs``: one directory, or what gives the online data directories at each sample."""
        self.server_id = server_id
        self._data_dirs = data_dirs if callable(data_dirs) else lambda: [data_dirs]
        self.limit = config.get(SERVER_DATA_DISK_WRITE_LIMIT_RATIO)
        self.recover = config.get(SERVER_DATA_DISK_WRITE_RECOVER_RATIO)
        check_ratios(self.limit, self.recover)
        self.interval_s = max(config.get_ms(SERVER_DATA_DISK_CHECK_INTERVAL), 10) / 1000
        self.locked = False
        self.usage = 0.0
        self.fullest: Path | None = None
        """The directory on the fullest file system at the last sample."""
        self._task: asyncio.Task[None] | None = None

    def apply(self, config: Configuration) -> None:
        """The ratios changed at run time (a pair that breaks the rule is logged and not applied)."""
        limit, recover = config.get(SERVER_DATA_DISK_WRITE_LIMIT_RATIO), config.get(SERVER_DATA_DISK_WRITE_RECOVER_RATIO)
        try:
            check_ratios(limit, recover)
        except InvalidConfigError as exc:
            log.error("the data disk's write ratios were not changed: %s", exc)
            return
        self.limit, self.recover = limit, recover
        self.update(self.usage)

    def sample(self) -> None:
        """Measure every data directory's file system now, each once (a failed measurement keeps the state)."""
        usages: list[tuple[float, Path]] = []
        devices: set[int] = set()
        for directory in self._data_dirs():
            try:
                device = file_system_of(directory)
                if device in devices:
                    continue
                devices.add(device)
                usage = shutil.disk_usage(directory)
            except OSError as exc:
                log.warning("sampling the data disk's usage failed; keeping the write lock %s: %s", self.locked, exc)
                return
            # as `df` reports it: what is used of what is usable (blocks reserved for root count as neither)
            usable = usage.used + usage.free
            usages.append((usage.used / usable if usable else 0.0, directory))
        if usages:
            usage_max, self.fullest = max(usages, key=lambda entry: entry[0])
            self.update(usage_max)

    def update(self, usage: float) -> None:
        self.usage = usage
        if self.limit >= 1.0:
            self.locked = False
        elif not self.locked and usage >= self.limit:
            self.locked = True
            log.warning("data disk usage %.2f%% (at %s) reached the limit %.2f%%: refusing writes until %.2f%%",
                        usage * 100, self.fullest, self.limit * 100, self.recover * 100)
        elif self.locked and usage <= self.recover:
            self.locked = False
            log.info("data disk usage dropped to %.2f%%: writes resume", usage * 100)

    def pressure(self) -> float:
        """A put's back-pressure signal from the disk: rising from the recover ratio to just below 1 at the
        limit ratio, where writes are refused (0 while protection is off or writes are refused already)."""
        if self.limit >= 1.0 or self.locked:
            return 0.0
        return ramp(self.usage, self.recover, self.limit)

    def ensure_writable(self) -> None:
        """Raises DiskWriteLockedError while writes are refused."""
        if self.locked:
            raise DiskWriteLockedError(
                f"TabletServer {self.server_id} has rejected writes because the data disk usage reached "
                f"{self.usage * 100:.2f}% (limit: {self.limit * 100:.2f}%) at {self.fullest}. Free up space or "
                "scale the cluster."
            )

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.sample()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


__all__ = ["DiskWriteGuard", "check_ratios"]
