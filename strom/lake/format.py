"""The lake format plug-in: what the tiering service and the Spark reader need from a lakehouse table.

A format (Delta, Iceberg, Lance) creates or opens the lake copy of a strom table, gives Spark tasks writers that
write files without committing, commits a round's files in one atomic lake commit that carries the
coordinator's offsets file (Fluss's ``fluss-offsets`` property, under Fluss's commit user), finds the
last such commit, and reads one bucket of a lake snapshot back as Arrow.

The format and its options come from the table's properties: ``table.datalake.format`` and
``table.datalake.<format>.<key>``, which the coordinator copies from the server's ``datalake.*`` options
when the lake is enabled, so readers and the tiering service need no lake configuration of their own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import ClassVar

import pyarrow as pa

from strom.errors import InvalidTableError, StromError
from strom.ids import TableBucket
from strom.metadata.table_info import TableInfo

COMMIT_USER = "__fluss_lake_tiering"
"""Fluss's marker of a lake commit made by tiering (the value of :data:`COMMIT_USER_PROPERTY`)."""
COMMIT_USER_PROPERTY = "commit-user"
OFFSETS_PROPERTY = "fluss-offsets"
"""Fluss's commit property: the path of the coordinator's offsets file this commit brings the lake to."""


class LakeCommitConflictError(StromError):
    """The lake changed under a round so that its commit cannot apply (another committer won the race);
    nothing of this commit is visible. Abort the round's files and plan the round again."""


CURRENT = ...
"""The ``base_snapshot_id`` of :meth:`LakeTable.commit` that means: the results' base, or the lake's current
snapshot when there are no results."""


def commit_base(bases: set[int | None], base_snapshot_id: int | EllipsisType | None) -> int | EllipsisType | None:
    """The snapshot a commit applies to: ``base_snapshot_id`` (the round's base) when given, else the one
    base of the results (:data:`CURRENT` when there are none).

    Raises:
        ValueError: the results were written against different snapshots.
        LakeCommitConflictError: the results were written against another snapshot than the round's base.
    """
    if len(bases) > 1:
        raise ValueError(f"the results of one commit were written against different lake snapshots {sorted(bases, key=str)}")
    if base_snapshot_id is CURRENT:
        return bases.pop() if bases else CURRENT
    if bases and bases != {base_snapshot_id}:
        raise LakeCommitConflictError(
            f"the round's files were written against lake snapshot {bases.pop()}, its base is {base_snapshot_id}"
        )
    return base_snapshot_id


class LakeTableMismatchError(InvalidTableError):
    """The lake location holds a table that is not this strom table's copy (another strom table id, or
    an incompatible schema). Move the old lake table away or point the warehouse elsewhere."""


@dataclass(frozen=True, slots=True)
class LakeWriteResult:
    """What one Spark task wrote (picklable and small): the format's file actions, not the data."""

    bucket: TableBucket
    partition_name: str | None
    payload: bytes
    """Format specific (Delta: JSON of the add and remove actions and the base snapshot)."""
    record_count: int
    """Rows in the files this split added (rows a copy-on-write carried over included)."""
    file_size: int
    """Bytes of the files this split added."""
    file_count: int = 0
    """Files this split added."""


@dataclass(frozen=True, slots=True)
class CommittedLakeSnapshot:
    snapshot_id: int
    properties: dict[str, str]
    """The commit's properties: :data:`OFFSETS_PROPERTY`, :data:`COMMIT_USER_PROPERTY` and what else the
    committer passed."""


@dataclass(frozen=True, slots=True)
class LakeStats:
    """The whole lake table at one snapshot: what the coordinator's tiering stats report."""

    file_size: int
    record_count: int


class LakeWriter(ABC):
    """Writes one split of one (partition, bucket) into new lake files in a Spark task. It never commits;
    the caller always calls :meth:`close`, after :meth:`complete` or after a failure."""

    @abstractmethod
    def append(self, rows: pa.RecordBatch, offsets: pa.Array, timestamps: pa.Array) -> None:
        """Add rows in the strom table's Arrow schema, with their log offsets (int64; -1 for rows of a
        KV snapshot) and commit timestamps (int64 epoch ms; -1 unknown). The writer adds the system
        columns."""

    @abstractmethod
    def delete_keys(self, keys: pa.Table) -> None:
        """Primary-key tables: remove every row of this bucket whose primary key (the key columns of
        ``keys``) is in ``keys``, as of the base snapshot. An upsert is ``delete_keys`` then ``append``.

        Raises:
            InvalidTableError: the table is a log table.
        """

    @abstractmethod
    def complete(self) -> LakeWriteResult:
        """Finish the files and describe them; nothing is visible until the driver commits them."""

    @abstractmethod
    def close(self) -> None:
        """Release resources; without :meth:`complete` first, delete the files written so far."""


class LakeTable(ABC):
    """One strom table's lake copy. Picklable (it travels to Spark tasks) and cheap to re-open."""

    @property
    @abstractmethod
    def uri(self) -> str: ...

    @abstractmethod
    def writer(self, bucket: TableBucket, partition_name: str | None, base_snapshot_id: int | None) -> LakeWriter:
        """A writer for one bucket; ``base_snapshot_id`` is the snapshot its key deletes apply to (the
        snapshot the round was planned on; every writer of one commit must share it)."""

    @abstractmethod
    def latest_snapshot_id(self) -> int | None: ...

    @abstractmethod
    def commit(
        self, results: Sequence[LakeWriteResult], properties: Mapping[str, str],
        base_snapshot_id: int | EllipsisType | None = CURRENT,
    ) -> int:
        """One atomic lake commit of every result (an empty one too: it records progress), carrying
        ``properties`` and :data:`COMMIT_USER`, applied to ``base_snapshot_id`` (see :func:`commit_base`).
        Returns the new snapshot id.

        Raises:
            LakeCommitConflictError: another commit won since the base (nothing of this one is visible).
        """

    @abstractmethod
    def abort(self, results: Sequence[LakeWriteResult]) -> None:
        """Delete the files of results that were never committed."""

    @abstractmethod
    def last_strom_commit(self, after_snapshot_id: int | None) -> CommittedLakeSnapshot | None:
        """The newest commit by :data:`COMMIT_USER` with an id above ``after_snapshot_id`` (None: any):
        how a round finds a lake commit the coordinator never heard of."""

    @abstractmethod
    def stats(self, snapshot_id: int | None = None) -> LakeStats:
        """File bytes and rows of a snapshot (the latest by default)."""

    @abstractmethod
    def read_bucket(
        self,
        snapshot_id: int,
        bucket: int,
        partition_name: str | None,
        columns: Sequence[str] | None = None,
        with_system_columns: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """One bucket's rows at a snapshot in the strom table's Arrow schema (only ``columns`` if given;
        the system columns appended if asked): the lake half of a union read."""

    @abstractmethod
    def buckets(self, snapshot_id: int) -> list[tuple[str | None, int]]:
        """(partition name, bucket) of every bucket with rows at a snapshot, sorted: what a union read
        plans from the lake alone (e.g. partitions strom has dropped since they were tiered)."""

    @abstractmethod
    def read(self, snapshot_id: int | None = None) -> pa.Table:
        """The whole table at a snapshot (latest by default) as the lake stores it, system columns
        included (tests and tools)."""


class LakeFormat(ABC):
    identifier: ClassVar[str]

    @abstractmethod
    def table(self, info: TableInfo) -> LakeTable:
        """The lake copy of ``info``, created if absent (idempotent; safe if several processes race).

        Raises:
            LakeTableMismatchError: the location holds another strom table's lake copy, or a schema
                this table cannot be written into.
            InvalidTableError: the table uses something the format cannot store.
        """
