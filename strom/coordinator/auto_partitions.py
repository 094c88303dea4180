"""The coordinator's auto-partition manager: upcoming partitions created, expired ones dropped.

Fluss's ``AutoPartitionManager``. For every table with ``table.auto-partition.enabled`` a check creates
the partitions of the current time unit and the next ``num-precreate - 1`` (in the table's time zone) and
drops every partition whose time value sorts below the unit ``num-retention`` units back
(``strom.metadata.auto_partition``). Checks run when such a table is created or altered (before the
request is answered, so a client can write into today's partition at once), when the coordinator starts
(before it serves: a coordinator that was down for days catches up first) and every
``auto-partition.check.interval``.

A dropped partition goes as a DropPartition would take it: its record, its replicas' local data, its KV
snapshots and leases, its remote log files. Its lake copy stays: Spark's union read finds such partitions
in the lake table by name.

The historical system partition (``__historical__``, of tables with
``table.datalake.historical-partition.enabled``) is never dropped by retention: the coordinator creates and
drops it with the option. Each check also reconciles it with the option for every partitioned table (Fluss
does so when its coordinator starts): a table with the option but without the partition gets it (a
creation that failed after the table was stored), one without the option loses it (a drop that failed after
AlterTable stored the option off).

Where strom differs from Fluss: Fluss delays the creation of a DAY table's partitions by a random number
of minutes per table (to spread many tables' creations over the day); strom creates them at the first
check, so tomorrow's partition exists from today on either way with the default ``num-precreate`` 2.
A partition of a primary-key table that would exceed the cluster's KV leader replica capacity
(``kv.leader-replica.memory-reserved``) is not created: that is logged, and the next check tries again.
Owned by the event loop of the active coordinator; the metadata store refuses a second create of a
partition, so a check racing a client's CreatePartition creates it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from strom.clock import Clock
from strom.coordinator.service import CoordinatorService
from strom.errors import (
    InsufficientKvLeaderReplicaCapacityError,
    PartitionMaxNumError,
    StromError,
    TableNotExistError,
)
from strom.metadata.auto_partition import AutoPartitionStrategy
from strom.metadata.table_info import TableInfo
from strom.table_properties import HISTORICAL_PARTITION_VALUE

log = logging.getLogger(__name__)


@dataclass
class CheckResult:
    """What one check did, per table path (for logs and tests)."""

    created: dict[str, list[str]] = field(default_factory=dict)
    dropped: dict[str, list[str]] = field(default_factory=dict)


class AutoPartitionManager:
    """:meth:`catch_up` and :meth:`start` once after the coordinator started; :meth:`stop` once."""

    def __init__(self, coordinator: CoordinatorService, clock: Clock, check_interval_ms: int) -> None:
        self._coordinator = coordinator
        self._clock = clock
        self.check_interval_ms = check_interval_ms
        """Read before each wait: a changed ``auto-partition.check.interval`` applies from the next one."""
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        coordinator.on_table_changed(self._table_changed)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._check_periodically())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def catch_up(self) -> None:
        """The check a starting coordinator runs before it serves: partitions expired while no coordinator
        ran are dropped and today's exist before any client asks. A failure is logged, not raised."""
        try:
            await self.check()
        except Exception:
            log.exception("the auto-partition check at start failed; trying again next interval")

    async def _check_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_ms / 1000)
            try:
                await self.check()
            except Exception:
                log.exception("the auto-partition check failed; trying again next interval")

    async def _table_changed(self, table: TableInfo) -> None:
        """The created or altered table alone; a failure is logged (its partitions come at the next check)."""
        if _strategy(table).enabled:
            await self.check([table])

    async def check(self, tables: Collection[TableInfo] | None = None) -> CheckResult:
        """One check of every auto-partitioned table (of ``tables``): drop expired partitions first, then
        create missing upcoming ones; and the historical partition of every partitioned table reconciled
        with its option. A failure on one table is logged and the others go on."""
        async with self._lock:
            now_ms = self._clock.now_ms()
            result = CheckResult()
            for table in self._coordinator.tables() if tables is None else tables:
                await self._reconcile_historical(table, result)
                try:
                    strategy = _strategy(table)
                    if not strategy.enabled:
                        continue
                    dropped = await self._drop_expired(table, strategy, now_ms)
                    created = await self._create_upcoming(table, strategy, now_ms)
                except TableNotExistError:
                    continue  # dropped meanwhile
                except Exception:
                    log.exception("auto-partitioning %s failed; trying again at the next check", table.path)
                    continue
                if dropped:
                    result.dropped.setdefault(str(table.path), []).extend(dropped)
                if created:
                    result.created.setdefault(str(table.path), []).extend(created)
            return result

    async def _reconcile_historical(self, table: TableInfo, result: CheckResult) -> None:
        try:
            done = await self._coordinator.reconcile_historical_partition(table)
        except TableNotExistError:
            return  # dropped meanwhile
        except Exception:
            log.exception("reconciling the historical partition of %s failed; trying again at the next check",
                          table.path)
            return
        if done is not None:
            (result.created if done == "created" else result.dropped).setdefault(str(table.path), []).append(
                HISTORICAL_PARTITION_VALUE)

    async def _drop_expired(self, table: TableInfo, strategy: AutoPartitionStrategy, now_ms: int) -> list[str]:
        earliest = strategy.earliest_retained(now_ms)
        if earliest is None:
            return []
        assert strategy.time_key is not None
        dropped = []
        for record in self._coordinator.list_partitions(table):
            value = dict(record.spec).get(strategy.time_key)
            if value == HISTORICAL_PARTITION_VALUE:  # a system partition: the option drops it, not retention
                continue
            if value is not None and value < earliest:
                await self._coordinator.drop_partition_of(table, record)
                dropped.append(record.name)
                log.info("auto-partitioning dropped partition %s of %s (earliest retained %s)",
                         record.name, table.path, earliest)
        return dropped

    async def _create_upcoming(self, table: TableInfo, strategy: AutoPartitionStrategy, now_ms: int) -> list[str]:
        assert strategy.time_key is not None
        created = []
        for value in strategy.precreated(now_ms):  # pre-creation needs a single partition key (checked)
            try:
                if await self._coordinator.create_partition_of(table, {strategy.time_key: value}, ignore_if_exists=True):
                    created.append(value)
                    log.info("auto-partitioning created partition %s of %s", value, table.path)
            except PartitionMaxNumError:
                log.warning("auto-partitioning cannot create partition %s of %s: it has max.partition.num "
                            "partitions", value, table.path)
                break
            except InsufficientKvLeaderReplicaCapacityError as exc:  # the later ones would not fit either
                log.warning("auto-partitioning cannot create partition %s of %s: %s", value, table.path, exc)
                break
            except StromError as exc:
                log.warning("auto-partitioning cannot create partition %s of %s: %s", value, table.path, exc)
        return created


def _strategy(table: TableInfo) -> AutoPartitionStrategy:
    return AutoPartitionStrategy.of(table.properties, table.partition_keys)


__all__ = ["AutoPartitionManager", "CheckResult"]
