"""The coordinator's ``LakeTableTieringManager``: which lake-enabled table is tiered when, by whom.

Each lake-enabled table moves through Fluss's states::

    New -> Scheduled -(freshness since its last round)-> Pending -> Tiering -> Tiered -> Scheduled
                                                          ^            |
                                                          +-- Failed <-+  (reported, or heartbeats stopped)

Entering *Pending* increments the table's **tiering epoch**; a job must present the current epoch with
every heartbeat, report and commit, so a job that lost the table (its heartbeats stopped for
``lake.tiering.heartbeat-timeout``) is fenced. Pending tables are handed out first in, first out. A round
that was cut at the freshness deadline (*force-finished*) makes the table Pending again at once.

Unlike Fluss, whose manager lives in memory only, every state change is persisted through the
``MetadataStore`` together with the table's lake snapshots: after a restart a table that was Tiering is
Pending with the next epoch (its old holder is fenced), and a Scheduled table waits only what is left of
its freshness since the *stored* end of its last round.

The manager is driven from the coordinator's event loop: :meth:`tick` (called by a loop task and before
every table request) fires due timers; nothing here runs on its own thread.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum

from strom.clock import Clock
from strom.errors import FencedTieringEpochError, InvalidConfigError, TableNotExistError
from strom.ids import TableBucket, TablePath
from strom.metadata.store import MetadataStore

log = logging.getLogger(__name__)


class TieringState(Enum):
    NEW = "New"
    SCHEDULED = "Scheduled"
    PENDING = "Pending"
    TIERING = "Tiering"
    TIERED = "Tiered"
    FAILED = "Failed"


@dataclass
class LakeSnapshotRecord:
    """One lake snapshot the coordinator knows: its id, offsets file and the offsets in it."""

    snapshot_id: int
    tiered_offsets_path: str
    readable_offsets_path: str | None
    offsets: list[tuple[int | None, int, int]]
    """``(partition id, bucket, next offset to tier)`` for every bucket ever tiered."""

    def bucket_offsets(self, table_id: int) -> dict[TableBucket, int]:
        return {TableBucket(table_id, bucket, partition): offset for partition, bucket, offset in self.offsets}


@dataclass
class LakeTableEntry:
    table_id: int
    path: TablePath
    freshness_ms: int
    state: TieringState = TieringState.NEW
    tiering_epoch: int = 0
    last_tiered_ms: int = 0
    due_ms: int = 0
    pending_since_ms: int = -1
    round_started_ms: int = -1
    last_heartbeat_ms: int = -1
    last_round_duration_ms: int = -1
    file_size: int = -1
    record_count: int = -1
    failures: int = 0
    snapshots: list[LakeSnapshotRecord] = field(default_factory=list)
    max_timestamps: dict[str, int] = field(default_factory=dict)

    @property
    def latest_snapshot(self) -> LakeSnapshotRecord | None:
        return self.snapshots[-1] if self.snapshots else None

    def encode(self) -> bytes:
        document = asdict(self)
        document["path"] = [self.path.database_name, self.path.table_name]
        document["state"] = self.state.value
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> LakeTableEntry:
        document = json.loads(payload)
        document["path"] = TablePath(*document["path"])
        document["state"] = TieringState(document["state"])
        document["snapshots"] = [
            LakeSnapshotRecord(s["snapshot_id"], s["tiered_offsets_path"], s["readable_offsets_path"],
                               [tuple(o) for o in s["offsets"]])  # type: ignore[misc]
            for s in document["snapshots"]
        ]
        return cls(**document)


@dataclass(frozen=True, slots=True)
class Assignment:
    table_id: int
    path: TablePath
    tiering_epoch: int


class LakeTableTieringManager:
    """Shared by the coordinator's RPC handlers on one event loop (no locking needed)."""

    def __init__(self, store: MetadataStore, clock: Clock, heartbeat_timeout_ms: int, check_interval_ms: int) -> None:
        self._store = store
        self._clock = clock
        self._timeout_ms = heartbeat_timeout_ms
        self._check_interval_ms = check_interval_ms
        self._last_check_ms = clock.now_ms()
        self._tables: dict[int, LakeTableEntry] = {}
        self._pending: deque[int] = deque()
        for payload in store.list_lake_tables().values():
            self._recover(LakeTableEntry.decode(payload))

    def _recover(self, entry: LakeTableEntry) -> None:
        self._tables[entry.table_id] = entry
        if entry.state in (TieringState.TIERING, TieringState.FAILED, TieringState.PENDING):
            self._to_pending(entry)  # the next epoch: whoever held the table before the restart is fenced  # its old holder (if any) is fenced by the new epoch
        else:  # New, Scheduled or Tiered: the next round is due one freshness after the last
            self._to_scheduled(entry)

    # ---- registration ----
    def add_table(self, table_id: int, path: TablePath, freshness_ms: int) -> None:
        """A table became lake-enabled (created, or altered): its first round is due after one freshness."""
        if table_id in self._tables:
            self.update_freshness(table_id, freshness_ms)
            return
        entry = LakeTableEntry(table_id, path, freshness_ms, last_tiered_ms=self._clock.now_ms())
        self._tables[table_id] = entry
        self._to_scheduled(entry)

    def remove_table(self, table_id: int) -> LakeTableEntry | None:
        entry = self._tables.pop(table_id, None)
        if entry is not None:
            self._store.delete_lake_table(table_id)
            if table_id in self._pending:
                self._pending.remove(table_id)
        return entry

    def update_freshness(self, table_id: int, freshness_ms: int) -> None:
        entry = self._tables.get(table_id)
        if entry is None or entry.freshness_ms == freshness_ms:
            return
        entry.freshness_ms = freshness_ms
        if entry.state is TieringState.SCHEDULED:
            entry.due_ms = entry.last_tiered_ms + freshness_ms
        self._persist(entry)

    # ---- the state machine ----
    def _to_scheduled(self, entry: LakeTableEntry) -> None:
        entry.state = TieringState.SCHEDULED
        entry.due_ms = entry.last_tiered_ms + entry.freshness_ms
        self._persist(entry)

    def _to_pending(self, entry: LakeTableEntry) -> None:
        entry.state = TieringState.PENDING
        entry.tiering_epoch += 1
        entry.pending_since_ms = self._clock.now_ms()
        if entry.table_id not in self._pending:
            self._pending.append(entry.table_id)
        self._persist(entry)

    def _persist(self, entry: LakeTableEntry) -> None:
        self._store.put_lake_table(entry.table_id, entry.encode())

    def tick(self) -> None:
        """Fire due schedules, and (every check interval) time out tiering jobs that went silent."""
        now = self._clock.now_ms()
        for entry in self._tables.values():
            if entry.state is TieringState.SCHEDULED and entry.due_ms <= now:
                self._to_pending(entry)
        if now - self._last_check_ms >= self._check_interval_ms:
            self._last_check_ms = now
            for entry in list(self._tables.values()):
                if entry.state is TieringState.TIERING and now - entry.last_heartbeat_ms >= self._timeout_ms:
                    log.warning("tiering of %s (epoch %d) timed out: no heartbeat for %d ms",
                                entry.path, entry.tiering_epoch, now - entry.last_heartbeat_ms)
                    self._fail(entry)

    def request_table(self) -> Assignment | None:
        """The next pending table, now Tiering under its epoch; None when nothing is due."""
        self.tick()
        while self._pending:
            entry = self._tables.get(self._pending.popleft())
            if entry is None or entry.state is not TieringState.PENDING:
                continue
            now = self._clock.now_ms()
            entry.state = TieringState.TIERING
            entry.round_started_ms = entry.last_heartbeat_ms = now
            self._persist(entry)
            return Assignment(entry.table_id, entry.path, entry.tiering_epoch)
        return None

    def entry(self, table_id: int, tiering_epoch: int | None = None) -> LakeTableEntry:
        """The table's entry, checking ``tiering_epoch`` when given (Fluss's messages)."""
        entry = self._tables.get(table_id)
        if entry is None:
            raise TableNotExistError(f"The table {table_id} doesn't exist.")
        if tiering_epoch is not None and tiering_epoch != entry.tiering_epoch:
            raise FencedTieringEpochError(
                f"The tiering epoch {tiering_epoch} is not match current epoch {entry.tiering_epoch} in "
                f"coordinator for table {table_id}."
            )
        return entry

    def tiering_entry(self, table_id: int, tiering_epoch: int) -> LakeTableEntry:
        entry = self.entry(table_id, tiering_epoch)
        if entry.state is not TieringState.TIERING:
            raise FencedTieringEpochError(
                f"The table {table_id} is {entry.state.value}, not being tiered under epoch {tiering_epoch}."
            )
        return entry

    def renew(self, table_id: int, tiering_epoch: int) -> None:
        self.tiering_entry(table_id, tiering_epoch).last_heartbeat_ms = self._clock.now_ms()

    def finish(self, table_id: int, tiering_epoch: int, force_finished: bool,
               file_size: int | None = None, record_count: int | None = None) -> None:
        entry = self.tiering_entry(table_id, tiering_epoch)
        now = self._clock.now_ms()
        entry.state = TieringState.TIERED
        entry.last_tiered_ms = now
        entry.last_round_duration_ms = now - entry.round_started_ms
        if file_size is not None:
            entry.file_size = file_size
        if record_count is not None:
            entry.record_count = record_count
        if force_finished:
            self._to_pending(entry)
        else:
            self._to_scheduled(entry)

    def fail(self, table_id: int, tiering_epoch: int) -> None:
        self._fail(self.tiering_entry(table_id, tiering_epoch))

    def _fail(self, entry: LakeTableEntry) -> None:
        entry.state = TieringState.FAILED
        entry.failures += 1
        self._to_pending(entry)

    # ---- lake snapshots ----
    def add_snapshot(self, entry: LakeTableEntry, snapshot: LakeSnapshotRecord, earliest_to_keep: int | None) -> list[LakeSnapshotRecord]:
        """Record a committed lake snapshot; returns the ones retention discards (Fluss's rule:
        ``earliest_to_keep`` None keeps only the new one, -1 keeps all, an id keeps from that id on)."""
        snapshots = [s for s in entry.snapshots if s.snapshot_id != snapshot.snapshot_id]
        if earliest_to_keep is None:
            kept, dropped = [], snapshots
        elif earliest_to_keep == -1:
            kept, dropped = snapshots, []
        else:
            ids = [s.snapshot_id for s in snapshots]
            start = ids.index(earliest_to_keep) if earliest_to_keep in ids else 0
            kept, dropped = snapshots[start:], snapshots[:start]
        entry.snapshots = [*kept, snapshot]
        self._persist(entry)
        return dropped

    def record_max_timestamps(self, entry: LakeTableEntry, timestamps: dict[TableBucket, int]) -> None:
        for bucket, timestamp in timestamps.items():
            key = f"{bucket.partition_id if bucket.partition_id is not None else ''}:{bucket.bucket}"
            entry.max_timestamps[key] = max(timestamp, entry.max_timestamps.get(key, -1))
        self._persist(entry)

    # ---- views ----
    def __iter__(self) -> Iterator[LakeTableEntry]:
        return iter(list(self._tables.values()))

    def __contains__(self, table_id: int) -> bool:
        return table_id in self._tables

    def counts_by_state(self) -> dict[TieringState, int]:
        counts = dict.fromkeys(TieringState, 0)
        for entry in self._tables.values():
            counts[entry.state] += 1
        return counts


def freshness_ms_of(properties: dict[str, str], default_ms: int) -> int:
    from strom.config import parse_duration

    raw = properties.get("table.datalake.freshness")
    if raw is None:
        return default_ms
    try:
        value = int(parse_duration(raw).total_seconds() * 1000)
    except ValueError as exc:
        raise InvalidConfigError(f"table.datalake.freshness: {exc}") from None
    if value < 0:
        raise InvalidConfigError(f"table.datalake.freshness must not be negative, got {raw!r}")
    return value
