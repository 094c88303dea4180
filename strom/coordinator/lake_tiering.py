"""The coordinator's ``LakeTableTieringManager``: which lake-enabled table is tiered when, and by whom.

Each lake-enabled table moves through Fluss's states::

    New -> Scheduled -(freshness since its last round)-> Pending -> Tiering -> Tiered -> Scheduled
                                                          ^  ^          |        |
                                                          |  +----------|--------+ (round cut at the freshness
                                                          |             |            deadline: force-finished)
                                                          +-- Failed <--+ (reported, or heartbeats stopped)

Entering *Pending* increments the table's **tiering epoch**; a tiering job presents its epoch with every
heartbeat, report, prepare and commit, so a job that lost the table is fenced. Pending tables are handed
out first in, first out.

What strom adds to Fluss, whose manager lives in memory only:

* every state change is persisted through the :class:`MetadataStore` before it shows in memory, so a failed
  write changes nothing;
* after a restart a table that was being tiered is Pending with the next epoch (its old holder is fenced),
  a Pending table keeps its place, and a Scheduled table waits only the rest of its freshness since the
  *stored* end of its last round;
* disabling the lake keeps the table's epoch (in the store, not in the schedule), so re-enabling it never
  hands out an epoch that a job from before could still hold.

Owned by the coordinator's event loop: :meth:`tick` (called by a loop task, and before every table
request) fires due timers and times out silent jobs; nothing here runs on a thread of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from strom.clock import Clock
from strom.errors import FencedTieringEpochError, StromError, TableNotExistError
from strom.ids import TablePath
from strom.metadata.off_loop import off_loop
from strom.metadata.store import LakeTieringStateStore

log = logging.getLogger(__name__)

_STATE_VERSION = 1
UNKNOWN = -1
MAX_FAILURE_REASON = 1000
"""Characters of a failure reason kept (a job's reason is one line; a longer one is cut)."""
"""Stored for times, durations and sizes not known (yet), as Fluss reports them."""


class TieringState(Enum):
    NEW = "New"
    SCHEDULED = "Scheduled"
    PENDING = "Pending"
    TIERING = "Tiering"
    TIERED = "Tiered"
    FAILED = "Failed"


_ALLOWED_FROM: dict[TieringState, frozenset[TieringState]] = {
    TieringState.NEW: frozenset(),
    TieringState.SCHEDULED: frozenset({TieringState.NEW, TieringState.TIERED}),
    TieringState.PENDING: frozenset({TieringState.SCHEDULED, TieringState.FAILED, TieringState.TIERED}),
    TieringState.TIERING: frozenset({TieringState.PENDING}),
    TieringState.TIERED: frozenset({TieringState.TIERING}),
    TieringState.FAILED: frozenset({TieringState.TIERING}),
}
"""Fluss's transitions: target state <- the states it may be entered from."""


@dataclass(frozen=True, slots=True)
class LakeTableTiering:
    """One table's tiering state: what is persisted, and what DescribeLakeTiering and the metrics show."""

    table_id: int
    path: TablePath
    freshness_ms: int
    state: TieringState
    tiering_epoch: int
    registered: bool
    """False once the lake was disabled: the table is not scheduled, but its epoch is remembered."""
    schedule_base_ms: int
    """Start of the current freshness interval: registration, or the end of the last round."""
    last_tiered_ms: int = UNKNOWN
    """End of the last finished round."""
    last_round_duration_ms: int = UNKNOWN
    file_size: int = UNKNOWN
    record_count: int = UNKNOWN
    failures: int = 0
    pending_since_ms: int = UNKNOWN
    newest_timestamp_ms: int = UNKNOWN
    """Newest record timestamp the lake holds, from the commits' max timestamps."""
    last_failure: str = ""
    """Why the last failed round failed (the job's reason, or its heartbeat timing out); empty before one."""
    last_failure_ms: int = UNKNOWN

    @property
    def due_ms(self) -> int:
        return self.schedule_base_ms + self.freshness_ms

    def lag_ms(self, now_ms: int) -> int:
        """Time since the last round ended (since registration if none has)."""
        since = self.last_tiered_ms if self.last_tiered_ms != UNKNOWN else self.schedule_base_ms
        return max(0, now_ms - since)

    def encode(self) -> bytes:
        document = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        document["path"] = [self.path.database_name, self.path.table_name]
        document["state"] = self.state.value
        document["version"] = _STATE_VERSION
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, payload: bytes) -> LakeTableTiering:
        document = json.loads(payload)
        if document.pop("version", None) != _STATE_VERSION:
            raise ValueError("unknown lake tiering state version")
        document["path"] = TablePath(*document["path"])
        document["state"] = TieringState(document["state"])
        return cls(**document)


@dataclass(frozen=True, slots=True)
class Assignment:
    """A table handed to a tiering job, under the epoch the job must present."""

    table_id: int
    path: TablePath
    tiering_epoch: int


def _not_exist(table_id: int) -> TableNotExistError:
    return TableNotExistError(f"The table {table_id} doesn't exist.")


class LakeTableTieringManager:
    """Every lake-enabled table's place in the tiering schedule (see the module docstring)."""

    def __init__(self, store: LakeTieringStateStore, clock: Clock, heartbeat_timeout_ms: int, check_interval_ms: int) -> None:
        """Recovers the persisted tables; the coordinator then registers (or removes) each table it knows."""
        self._store = store
        self._clock = clock
        self._heartbeat_timeout_ms = heartbeat_timeout_ms
        self._check_interval_ms = max(0, check_interval_ms)
        self._next_check_ms = clock.now_ms() + self._check_interval_ms
        self._tables: dict[int, LakeTableTiering] = {}
        """Every table the store holds a state for, registered or not."""
        self._pending: dict[int, None] = {}
        """Pending table ids in arrival order (a dict as an ordered set)."""
        self._timers: list[tuple[int, int]] = []
        """Heap of (due ms, table id) for Scheduled tables; an entry whose table moved on is skipped."""
        self._heartbeats_ms: dict[int, int] = {}
        """Tiering table id -> last heartbeat (the round's start counts as one)."""
        self._round_started_ms: dict[int, int] = {}
        self.armed = asyncio.Event()
        """Set when a timer or a heartbeat check is added: wakes a ticker that waits while :meth:`idle`."""
        self._changing = asyncio.Lock()
        """One change at a time: each decides on the state the one before it left (and stored)."""
        for table_id, payload in store.list_lake_tiering_states().items():
            try:
                self._tables[table_id] = LakeTableTiering.decode(payload)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("ignoring the unreadable lake tiering state of table %d: %s", table_id, exc)
        pending = sorted(
            (t for t in self._tables.values() if t.registered and t.state is TieringState.PENDING),
            key=lambda t: (t.pending_since_ms, t.table_id),
        )
        for table in pending:
            self._pending[table.table_id] = None
        for table in list(self._tables.values()):
            if not table.registered or table.state is TieringState.PENDING:
                continue
            # Stored at once (the manager is built before the coordinator serves, not on its event loop);
            # shown as a state the table moves into, so its timer is armed or it is queued.
            del self._tables[table.table_id]
            if table.state in (TieringState.TIERING, TieringState.FAILED):
                # The round in flight when the coordinator stopped: its holder is fenced by the next epoch.
                self._show(self._put_now(self._pending_state(dataclasses.replace(table, state=TieringState.FAILED))))
            else:  # New, Scheduled, Tiered: the next round is due one freshness after the stored base
                self._show(self._put_now(self._scheduled_state(dataclasses.replace(table, state=TieringState.NEW))))

    # ---- registration (the coordinator calls these on create, alter, drop and start) ----
    async def add_table(self, table_id: int, path: TablePath, freshness_ms: int) -> None:
        """A table is lake-enabled: a new one is due one freshness from now; a known one takes the new
        freshness (a Scheduled table's timer is re-armed)."""
        assert freshness_ms >= 0
        async with self._changing:
            await self._add_table(table_id, path, freshness_ms)

    async def _add_table(self, table_id: int, path: TablePath, freshness_ms: int) -> None:
        known = self._tables.get(table_id)
        if known is not None and known.registered:
            await self._update_freshness(table_id, freshness_ms)
            return
        now = self._clock.now_ms()
        epoch = known.tiering_epoch if known is not None else 0
        table = LakeTableTiering(table_id, path, freshness_ms, TieringState.NEW, epoch, True, now)
        if known is not None:  # re-enabled: keep the history, never reuse an epoch
            table = dataclasses.replace(known, freshness_ms=freshness_ms, state=TieringState.NEW,
                                        registered=True, schedule_base_ms=now, pending_since_ms=UNKNOWN)
        await self._to_scheduled(table)
        log.info("lake tiering of %s (table %d) registered, freshness %d ms", path, table_id, freshness_ms)

    async def disable_table(self, table_id: int) -> None:
        """The lake was disabled: stop scheduling the table; its holder (if any) gets TableNotExist."""
        async with self._changing:
            table = self._tables.get(table_id)
            if table is None or not table.registered:
                return
            await self._put(dataclasses.replace(table, registered=False, state=TieringState.NEW,
                                                pending_since_ms=UNKNOWN))
            self._forget_schedule(table_id)

    async def drop_table(self, table_id: int) -> None:
        """The table was dropped: forget it entirely (its id is never reused)."""
        async with self._changing:
            await self._drop_table(table_id)

    async def _drop_table(self, table_id: int) -> None:
        if table_id not in self._tables:
            return
        await off_loop(self._store.delete_lake_tiering_state, table_id)
        self._tables.pop(table_id, None)
        self._forget_schedule(table_id)

    async def retain_tables(self, table_ids: Iterable[int]) -> None:
        """Drop the state of every table not in ``table_ids`` (tables the catalog no longer has)."""
        keep = set(table_ids)
        async with self._changing:
            for table_id in [t for t in self._tables if t not in keep]:
                await self._drop_table(table_id)

    async def update_freshness(self, table_id: int, freshness_ms: int) -> None:
        assert freshness_ms >= 0
        async with self._changing:
            await self._update_freshness(table_id, freshness_ms)

    async def _update_freshness(self, table_id: int, freshness_ms: int) -> None:
        table = self._registered(table_id)
        if table.freshness_ms == freshness_ms:
            return
        updated = dataclasses.replace(table, freshness_ms=freshness_ms)
        await self._put(updated)  # a Scheduled table's timer re-armed at its new due time

    def _forget_schedule(self, table_id: int) -> None:
        self._pending.pop(table_id, None)
        self._heartbeats_ms.pop(table_id, None)
        self._round_started_ms.pop(table_id, None)

    # ---- the state machine ----
    async def _put(self, table: LakeTableTiering) -> LakeTableTiering:
        """Persist (on a store thread), then show in memory: a failed write leaves both as they were."""
        await off_loop(self._put_now, table)
        self._show(table)
        return table

    def _put_now(self, table: LakeTableTiering) -> LakeTableTiering:
        self._store.put_lake_tiering_state(table.table_id, table.encode())
        return table

    def _show(self, table: LakeTableTiering) -> None:
        """A stored state becomes the table's: a table newly Scheduled (or due at a new time) gets its
        timer, a table newly Pending joins the queue."""
        previous = self._tables.get(table.table_id)
        self._tables[table.table_id] = table
        moved = previous is None or previous.state is not table.state
        rearmed = moved or (previous is not None and previous.due_ms != table.due_ms)
        if table.state is TieringState.SCHEDULED and rearmed:
            heapq.heappush(self._timers, (table.due_ms, table.table_id))
            self._compact_timers()
            self.armed.set()
        elif table.state is TieringState.PENDING and moved:
            self._pending[table.table_id] = None
            self._heartbeats_ms.pop(table.table_id, None)
            self._round_started_ms.pop(table.table_id, None)

    def _transition(self, table: LakeTableTiering, target: TieringState, **changes: Any) -> LakeTableTiering:
        assert table.state in _ALLOWED_FROM[target], f"table {table.table_id}: {table.state} -> {target}"
        return dataclasses.replace(table, state=target, **changes)

    def _scheduled_state(self, table: LakeTableTiering) -> LakeTableTiering:
        return self._transition(table, TieringState.SCHEDULED, pending_since_ms=UNKNOWN)

    def _pending_state(self, table: LakeTableTiering) -> LakeTableTiering:
        return self._transition(
            table, TieringState.PENDING, tiering_epoch=table.tiering_epoch + 1, pending_since_ms=self._clock.now_ms()
        )

    async def _to_scheduled(self, table: LakeTableTiering) -> None:
        await self._put(self._scheduled_state(table))

    async def _to_pending(self, table: LakeTableTiering) -> None:
        await self._put(self._pending_state(table))

    def _compact_timers(self) -> None:
        """Bound the heap: rebuild it from the live timers when stale entries dominate."""
        if len(self._timers) <= 2 * len(self._tables) + 16:
            return
        self._timers = [(t.due_ms, t.table_id) for t in self._tables.values()
                        if t.registered and t.state is TieringState.SCHEDULED]
        heapq.heapify(self._timers)

    def idle(self) -> bool:
        """Whether :meth:`tick` has nothing to watch: no Scheduled table's timer, no running round's
        heartbeat. Then only a change makes work for it, and that sets :attr:`armed`."""
        return not self._timers and not self._heartbeats_ms

    async def tick(self) -> None:
        """Make due Scheduled tables Pending and, every check interval, fail rounds whose job went silent."""
        async with self._changing:
            await self._tick()

    async def _tick(self) -> None:
        now = self._clock.now_ms()
        while self._timers and self._timers[0][0] <= now:
            due_ms, table_id = self._timers[0]
            table = self._tables.get(table_id)
            if (table is not None and table.registered and table.state is TieringState.SCHEDULED
                    and table.due_ms == due_ms):
                await self._to_pending(table)  # may raise (store): the timer stays for the next tick
            heapq.heappop(self._timers)
        if now < self._next_check_ms:
            return
        self._next_check_ms = now + self._check_interval_ms
        for table_id, heartbeat_ms in list(self._heartbeats_ms.items()):
            if now - heartbeat_ms >= self._heartbeat_timeout_ms:
                table = self._tables[table_id]
                log.warning("tiering of %s (epoch %d) timed out: no heartbeat for %d ms",
                            table.path, table.tiering_epoch, now - heartbeat_ms)
                try:
                    await self._fail(table, f"no heartbeat from the tiering job for {now - heartbeat_ms} ms "
                                            f"(lake.tiering.heartbeat-timeout)")
                except StromError as exc:  # one table's failed write must not spare the others
                    log.warning("cannot end the timed-out round of %s now (%s); trying at the next check",
                                table.path, exc)

    async def request_table(self) -> Assignment | None:
        """The longest-pending table, now Tiering under its epoch; None when no table is due."""
        async with self._changing:
            return await self._request_table()

    async def _request_table(self) -> Assignment | None:
        await self._tick()
        while self._pending:
            table_id = next(iter(self._pending))
            table = self._tables.get(table_id)
            if table is None or not table.registered or table.state is not TieringState.PENDING:
                del self._pending[table_id]
                continue
            now = self._clock.now_ms()
            await self._put(self._transition(table, TieringState.TIERING, pending_since_ms=UNKNOWN))
            del self._pending[table_id]
            self._heartbeats_ms[table_id] = now
            self._round_started_ms[table_id] = now
            self.armed.set()
            return Assignment(table_id, table.path, table.tiering_epoch)
        return None

    def _registered(self, table_id: int) -> LakeTableTiering:
        table = self._tables.get(table_id)
        if table is None or not table.registered:
            raise _not_exist(table_id)
        return table

    def _validated(self, table_id: int, tiering_epoch: int) -> LakeTableTiering:
        """The table held under ``tiering_epoch`` (Fluss's messages for an unknown table or another epoch)."""
        table = self._registered(table_id)
        if tiering_epoch != table.tiering_epoch:
            raise FencedTieringEpochError(
                f"The tiering epoch {tiering_epoch} is not match current epoch {table.tiering_epoch} in "
                f"coordinator for table {table_id}."
            )
        if table.state is not TieringState.TIERING:
            raise FencedTieringEpochError(
                f"The table {table_id} is {table.state.value}: no round runs under epoch {tiering_epoch}."
            )
        return table

    def check_tiering(self, table_id: int, tiering_epoch: int) -> None:
        """Raise unless a round of ``table_id`` runs under ``tiering_epoch`` (prepare and commit fencing)."""
        self._validated(table_id, tiering_epoch)

    def renew(self, table_id: int, tiering_epoch: int) -> None:
        self._validated(table_id, tiering_epoch)
        self._heartbeats_ms[table_id] = self._clock.now_ms()

    async def finish(
        self, table_id: int, tiering_epoch: int, force_finished: bool,
        file_size: int | None = None, record_count: int | None = None,
    ) -> None:
        """End a round: the next one is due one freshness later, or at once if the round was cut short.

        As in Fluss, stats replace the previous ones when any is given (a missing one becomes unknown)."""
        async with self._changing:
            await self._finish(table_id, tiering_epoch, force_finished, file_size, record_count)

    async def _finish(
        self, table_id: int, tiering_epoch: int, force_finished: bool, file_size: int | None, record_count: int | None,
    ) -> None:
        table = self._validated(table_id, tiering_epoch)
        now = self._clock.now_ms()
        if file_size is not None or record_count is not None:
            table = dataclasses.replace(table, file_size=UNKNOWN if file_size is None else file_size,
                                        record_count=UNKNOWN if record_count is None else record_count)
        started_ms = self._round_started_ms.get(table_id, now)
        tiered = self._transition(table, TieringState.TIERED, last_tiered_ms=now, schedule_base_ms=now,
                                  last_round_duration_ms=now - started_ms)
        if force_finished:
            await self._to_pending(tiered)
        else:
            await self._to_scheduled(tiered)
        # only once the new state is stored: a failed write leaves the round Tiering, and its heartbeat
        # deadline still ends it if the job never reports again
        self._heartbeats_ms.pop(table_id, None)
        self._round_started_ms.pop(table_id, None)

    async def fail(self, table_id: int, tiering_epoch: int, reason: str = "") -> None:
        """A job gave up on its round: the table is Pending again at once, with the next epoch."""
        async with self._changing:
            await self._fail(self._validated(table_id, tiering_epoch), reason or "the tiering job reported a failure")

    async def _fail(self, table: LakeTableTiering, reason: str) -> None:
        await self._to_pending(self._transition(
            table, TieringState.FAILED, failures=table.failures + 1, last_failure=reason[:MAX_FAILURE_REASON],
            last_failure_ms=self._clock.now_ms()))

    async def record_newest_timestamp(self, table_id: int, timestamp_ms: int) -> None:
        """A commit brought records up to ``timestamp_ms`` into the lake (for the data lag)."""
        async with self._changing:
            table = self._tables.get(table_id)
            if table is not None and timestamp_ms > table.newest_timestamp_ms:
                await self._put(dataclasses.replace(table, newest_timestamp_ms=timestamp_ms))

    # ---- views ----
    def get(self, table_id: int) -> LakeTableTiering | None:
        """The table's state if it is lake-enabled."""
        table = self._tables.get(table_id)
        return table if table is not None and table.registered else None

    def tables(self) -> list[LakeTableTiering]:
        """Every lake-enabled table, by id."""
        return sorted((t for t in self._tables.values() if t.registered), key=lambda t: t.table_id)

    def counts_by_state(self) -> dict[TieringState, int]:
        counts = dict.fromkeys(TieringState, 0)
        for table in self._tables.values():
            if table.registered:
                counts[table.state] += 1
        return counts
