"""The exactly-once commit of one table round: the lake first, then the coordinator.

The lake commit carries the path of the coordinator's offsets file (``fluss-offsets``), so the lake
alone says which Fluss offsets it holds. The coordinator's lake snapshot is the source of truth every
round is planned from. A crash between the two commits leaves the lake ahead of the coordinator; the
next round finds that commit (:func:`register_missing_lake_commit`), registers it with the coordinator
and plans from its offsets, so nothing is written twice. A round whose lake moved under it (another
job committed) is aborted before it commits. Every coordinator call carries the round's tiering epoch,
so a job that lost the table (heartbeat timeout) is refused before it touches the lake.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from strom.client.admin import Admin
from strom.client.lake import LakeSnapshot
from strom.errors import LakeSnapshotNotExistError, StromError, TableNotExistError
from strom.ids import TableBucket
from strom.lake.format import OFFSETS_PROPERTY, LakeStats, LakeTable, LakeWriteResult
from strom.metadata.table_info import TableInfo
from strom.tiering.gates import pass_gate
from strom.tiering.splits import TieringSplit
from strom.tiering.tasks import SplitResult

log = logging.getLogger(__name__)

TIERING_EPOCH_PROPERTY = "strom.tiering-epoch"


class RoundAbortedError(StromError):
    """The round must not commit (the lake moved under it, or the table changed); it is re-planned."""


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    lake_snapshot_id: int | None
    """The new lake snapshot, or None when the round had nothing to commit."""
    offsets: dict[TableBucket, int]
    forced: bool
    stats: LakeStats | None
    record_count: int
    file_size: int
    file_count: int


async def latest_lake_snapshot(admin: Admin, table: TableInfo) -> LakeSnapshot | None:
    try:
        return await admin.get_lake_snapshot(table.path)
    except LakeSnapshotNotExistError:
        return None


async def register_missing_lake_commit(
    admin: Admin, table: TableInfo, lake_table: LakeTable, known: LakeSnapshot | None, tiering_epoch: int
) -> LakeSnapshot | None:
    """If the lake holds a strom commit the coordinator does not know, register it; returns the
    coordinator's lake snapshot afterwards (unchanged when nothing was missing)."""
    missing = lake_table.last_strom_commit(known.snapshot_id if known else None)
    if missing is None:
        return known
    path = missing.properties.get(OFFSETS_PROPERTY)
    if not path:
        raise RoundAbortedError(
            f"lake commit {missing.snapshot_id} of '{table.path}' has no '{OFFSETS_PROPERTY}' property"
        )
    log.warning(
        "lake table of %s has commit %d that the coordinator does not know (a tiering job died between its "
        "two commits); registering it", table.path, missing.snapshot_id,
    )
    await admin.commit_lake_table_snapshot(table.table_id, missing.snapshot_id, path, tiering_epoch=tiering_epoch)
    return await latest_lake_snapshot(admin, table)


async def commit_round(
    admin: Admin,
    table: TableInfo,
    lake_table: LakeTable,
    tiering_epoch: int,
    base_snapshot_id: int | None,
    splits: Sequence[TieringSplit],
    results: Sequence[SplitResult],
    gate_dir: str | None = None,
) -> RoundOutcome:
    """Commit one round's results once, or raise (the caller reports the round failed)."""
    if sorted(r.split_index for r in results) != list(range(len(splits))):
        raise RoundAbortedError(f"expected one result per split of {len(splits)}, got {len(results)}")
    written: list[LakeWriteResult] = [r.write_result for r in results if r.write_result is not None]
    pass_gate(gate_dir, "lake-commit")
    try:
        offsets = {splits[r.split_index].bucket: r.log_end_offset for r in results if r.log_end_offset >= 0}
        max_timestamps = {splits[r.split_index].bucket: r.max_timestamp for r in results if r.max_timestamp >= 0}
        forced = any(r.forced for r in results)
        if not offsets:
            lake_table.abort(written)
            return RoundOutcome(None, {}, forced, None, 0, 0, 0)
        current = await admin.get_table_info(table.path)
        if current.table_id != table.table_id:
            raise TableNotExistError(f"table '{table.path}' was dropped and re-created during the round")
        if lake_table.latest_snapshot_id() != base_snapshot_id:
            raise RoundAbortedError(
                f"the lake table of '{table.path}' moved from snapshot {base_snapshot_id} to "
                f"{lake_table.latest_snapshot_id()} during the round"
            )
        # Last checks right before the lake commit: the epoch (prepare is refused once the job lost the
        # table) and the lake's version (another job's commit since planning).
        path = await admin.prepare_lake_table_snapshot(table.table_id, table.path, offsets, tiering_epoch=tiering_epoch)
    except BaseException:
        lake_table.abort(written)
        raise
    properties = {OFFSETS_PROPERTY: path, TIERING_EPOCH_PROPERTY: str(tiering_epoch)}
    try:
        snapshot_id = lake_table.commit(written, properties, base_snapshot_id)
    except BaseException:
        landed = lake_table.last_strom_commit(base_snapshot_id)
        if landed is None or landed.properties.get(OFFSETS_PROPERTY) != path:
            lake_table.abort(written)  # surely not committed: its files are orphans
        raise
    pass_gate(gate_dir, "coordinator-commit")
    await admin.commit_lake_table_snapshot(
        table.table_id, snapshot_id, path, tiering_epoch=tiering_epoch, max_timestamps=max_timestamps
    )
    pass_gate(gate_dir, "committed")
    return RoundOutcome(
        snapshot_id, offsets, forced, lake_table.stats(snapshot_id),
        sum(w.record_count for w in written), sum(w.file_size for w in written), len(written),
    )
