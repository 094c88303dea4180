"""The lake format plug-in: what the tiering service and the Spark reader need from a lakehouse table.

A format (Delta first) creates or opens the lake copy of a strom table, gives Spark tasks writers that
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
from typing import ClassVar

import pyarrow as pa

from strom.errors import InvalidConfigError
from strom.ids import TableBucket
from strom.metadata.table_info import TableInfo

COMMIT_USER = "__fluss_lake_tiering"
"""Fluss's marker of a lake commit made by tiering (``commit-user``)."""
COMMIT_USER_PROPERTY = "commit-user"
OFFSETS_PROPERTY = "fluss-offsets"
"""Fluss's commit property: the path of the coordinator's offsets file this commit brings the lake to."""
FORMAT_PROPERTY = "table.datalake.format"


@dataclass(frozen=True, slots=True)
class LakeWriteResult:
    """What one Spark task wrote (picklable and small): the format's file actions, not the data."""

    bucket: TableBucket
    partition_name: str | None
    payload: bytes
    record_count: int
    """Rows added by this split (rewritten rows of a copy-on-write included)."""
    file_size: int
    """Bytes added by this split."""
    file_count: int


@dataclass(frozen=True, slots=True)
class CommittedLakeSnapshot:
    snapshot_id: int
    properties: dict[str, str]


@dataclass(frozen=True, slots=True)
class LakeStats:
    """The whole lake table at one snapshot: what the coordinator's tiering stats report."""

    file_size: int
    record_count: int


class LakeWriter(ABC):
    """Writes one split of one bucket into new lake files. Never commits; ``close()`` always runs."""

    @abstractmethod
    def append(self, rows: pa.RecordBatch, offsets: pa.Array, timestamps: pa.Array) -> None:
        """Add rows (the strom table's Arrow schema) with their log offsets and commit timestamps (epoch
        ms; -1 where unknown, as for rows of a KV snapshot)."""

    @abstractmethod
    def delete_keys(self, keys: pa.Table) -> None:
        """Primary-key tables: remove from the lake every row of this bucket whose key (the columns of
        ``keys``) is in ``keys``, as of the base snapshot. An upsert is ``delete_keys`` then ``append``."""

    @abstractmethod
    def complete(self) -> LakeWriteResult: ...

    @abstractmethod
    def close(self) -> None: ...


class LakeTable(ABC):
    """One strom table's lake copy."""

    @property
    @abstractmethod
    def uri(self) -> str: ...

    @abstractmethod
    def writer(self, bucket: TableBucket, partition_name: str | None, base_snapshot_id: int | None) -> LakeWriter:
        """A writer for one bucket; ``base_snapshot_id`` is the snapshot its deletes apply to."""

    @abstractmethod
    def latest_snapshot_id(self) -> int | None: ...

    @abstractmethod
    def commit(self, results: Sequence[LakeWriteResult], properties: Mapping[str, str]) -> int:
        """One atomic commit of every result (an empty one too: it records progress), carrying
        ``properties`` and the commit user. Returns the new snapshot id."""

    @abstractmethod
    def abort(self, results: Sequence[LakeWriteResult]) -> None:
        """Delete the files of results that were never committed."""

    @abstractmethod
    def last_strom_commit(self, after_snapshot_id: int | None) -> CommittedLakeSnapshot | None:
        """The newest commit by :data:`COMMIT_USER` newer than ``after_snapshot_id`` (None: any)."""

    @abstractmethod
    def stats(self, snapshot_id: int | None = None) -> LakeStats: ...

    @abstractmethod
    def read_bucket(
        self, snapshot_id: int, bucket: int, partition_name: str | None, with_system_columns: bool = False
    ) -> Iterator[pa.RecordBatch]:
        """One bucket's rows at a snapshot, in the strom table's Arrow schema (plus the system columns
        if asked)."""

    @abstractmethod
    def read(self, snapshot_id: int | None = None) -> pa.Table:
        """The whole table at a snapshot (latest by default), system columns included."""


class LakeFormat(ABC):
    identifier: ClassVar[str]

    @abstractmethod
    def table(self, info: TableInfo) -> LakeTable:
        """The lake copy of ``info``, created if absent (safe if several processes race)."""


def lake_format(info: TableInfo) -> LakeFormat:
    """The format a lake-enabled table names, configured from its ``table.datalake.<format>.*`` properties."""
    properties = info.properties
    name = properties.get(FORMAT_PROPERTY, "").strip().lower()
    prefix = f"table.datalake.{name}."
    options = {key[len(prefix):]: value for key, value in properties.items() if key.startswith(prefix)}
    if name == "delta":
        from strom.lake.delta import DeltaLakeFormat

        return DeltaLakeFormat(options)
    raise InvalidConfigError(
        f"table '{info.path}' names lake format {name or '(none)'!r} ({FORMAT_PROPERTY}); strom writes 'delta'"
    )
