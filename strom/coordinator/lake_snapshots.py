"""Lake snapshots as the coordinator records them, and the offsets files tiering commits carry.

An **offsets file** has Fluss's layout: ``{"version":1,"table_id":N,"bucket_offsets":[o0,o1,...]}`` for a
table without partitions (the list index is the bucket; -1 marks a bucket never tiered), or
``{"version":1,"table_id":N,"partition_offsets":[{"partition_id":P,"bucket_offsets":[...]}]}``. Each offset
is the first log offset *not* in the lake. The files live in remote storage under
``lake/{database}/{table}-{table id}/metadata/{uuid}.offsets`` (Fluss's place), written by
PrepareLakeTableSnapshot and named by the lake commit that carries them.

A **lake snapshot record** (one per committed lake snapshot, in the metadata store) keeps the paths of its
offsets files and the offsets themselves, so GetLakeSnapshot needs no remote read. Retention follows
Fluss: ``earliest_snapshot_id_to_keep`` absent keeps only the new snapshot, -1 keeps every one, an id keeps
the snapshots committed from that one on (by commit order: lake snapshot ids need not grow).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strom.errors import StromError
from strom.ids import TableBucket, TablePath
from strom.metadata.store import LakeSnapshotRecord

OFFSETS_FILE_VERSION = 1
NEVER_TIERED = -1
KEEP_ALL_SNAPSHOTS = -1
_DOCUMENT_VERSION = 1


def lake_table_dir(path: TablePath, table_id: int) -> str:
    """Where a table's offsets files live, relative to the remote data dir."""
    return f"lake/{path.database_name}/{path.table_name}-{table_id}"


def offsets_file_dir(path: TablePath, table_id: int) -> str:
    return f"{lake_table_dir(path, table_id)}/metadata"


def _dense(buckets: Mapping[int, int]) -> list[int]:
    listed = [NEVER_TIERED] * (max(buckets) + 1)
    for bucket, value in buckets.items():
        listed[bucket] = value
    return listed


def offsets_document(table_id: int, offsets: Mapping[TableBucket, int]) -> dict[str, Any]:
    """Fluss's offsets-file document. The buckets must be all with or all without a partition."""
    by_partition: dict[int | None, dict[int, int]] = {}
    for bucket, offset in offsets.items():
        assert bucket.table_id == table_id, bucket
        assert offset >= 0, (bucket, offset)
        by_partition.setdefault(bucket.partition_id, {})[bucket.bucket] = offset
    assert None not in by_partition or len(by_partition) == 1, "a table's buckets are all with or all without a partition"
    document: dict[str, Any] = {"version": OFFSETS_FILE_VERSION, "table_id": table_id}
    if None in by_partition:
        document["bucket_offsets"] = _dense(by_partition[None])
    elif by_partition:
        document["partition_offsets"] = [
            {"partition_id": partition_id, "bucket_offsets": _dense(buckets)}
            for partition_id, buckets in sorted(by_partition.items(), key=lambda item: item[0] or 0)
        ]
    else:
        document["bucket_offsets"] = []
    return document


def _offsets_list(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError("bucket_offsets must be a list of integers")
    return value


def offsets_from_document(document: Any) -> tuple[int, dict[TableBucket, int]]:
    """``(table id, offsets)`` of an offsets-file document; entries below 0 are buckets never tiered.

    Raises:
        ValueError: not an offsets document of a known version.
    """
    if not isinstance(document, dict) or document.get("version") != OFFSETS_FILE_VERSION:
        raise ValueError(f"expected version {OFFSETS_FILE_VERSION} of Fluss's offsets layout")
    table_id = document.get("table_id")
    if not isinstance(table_id, int) or isinstance(table_id, bool):
        raise ValueError("table_id must be an integer")
    offsets: dict[TableBucket, int] = {}
    for bucket, offset in enumerate(_offsets_list(document.get("bucket_offsets", []))):
        if offset >= 0:
            offsets[TableBucket(table_id, bucket)] = offset
    partitions = document.get("partition_offsets", [])
    if not isinstance(partitions, list):
        raise ValueError("partition_offsets must be a list")
    for partition in partitions:
        partition_id = partition.get("partition_id") if isinstance(partition, dict) else None
        if not isinstance(partition_id, int) or isinstance(partition_id, bool):
            raise ValueError("every partition_offsets entry needs an integer partition_id")
        for bucket, offset in enumerate(_offsets_list(partition.get("bucket_offsets"))):
            if offset >= 0:
                offsets[TableBucket(table_id, bucket, partition_id)] = offset
    return table_id, offsets


def encode_offsets_file(table_id: int, offsets: Mapping[TableBucket, int]) -> bytes:
    return json.dumps(offsets_document(table_id, offsets), separators=(",", ":")).encode()


def decode_offsets_file(raw: bytes, location: str) -> tuple[int, dict[TableBucket, int]]:
    """Raises a StromError naming ``location`` when ``raw`` is not an offsets file."""
    try:
        return offsets_from_document(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise StromError(f"{location} is not a lake offsets file: {exc}") from None


@dataclass(frozen=True, slots=True)
class LakeSnapshot:
    """One committed lake snapshot of a table, decoded."""

    table_id: int
    snapshot_id: int
    tiered_offsets_path: str
    readable_offsets_path: str | None
    tiered_offsets: dict[TableBucket, int]
    readable_offsets: dict[TableBucket, int] | None
    """The offsets readers may use; None when the snapshot is not readable (yet)."""
    max_timestamps: dict[TableBucket, int]
    """Per bucket, the newest record timestamp tiered so far (carried over from earlier snapshots)."""
    partition_names: dict[int, str]
    """Names of the partitions in the offsets, recorded at commit: a partition dropped since keeps its
    name, so readers still find its rows in the lake (Fluss records them too)."""

    @property
    def paths(self) -> set[str]:
        return {self.tiered_offsets_path} | ({self.readable_offsets_path} if self.readable_offsets_path else set())

    def to_record(self) -> LakeSnapshotRecord:
        document = {
            "version": _DOCUMENT_VERSION,
            "tiered_offsets_path": self.tiered_offsets_path,
            "readable_offsets_path": self.readable_offsets_path,
            "tiered_offsets": offsets_document(self.table_id, self.tiered_offsets),
            "readable_offsets": (
                None if self.readable_offsets is None else offsets_document(self.table_id, self.readable_offsets)
            ),
            "max_timestamps": offsets_document(self.table_id, self.max_timestamps),
            "partition_names": {str(partition_id): name for partition_id, name in sorted(self.partition_names.items())},
        }
        snapshot_json = json.dumps(document, separators=(",", ":")).encode()
        return LakeSnapshotRecord(self.table_id, self.snapshot_id, self.readable_offsets is not None, snapshot_json)

    @classmethod
    def from_record(cls, record: LakeSnapshotRecord) -> LakeSnapshot:
        document = json.loads(record.snapshot_json)
        assert document["version"] == _DOCUMENT_VERSION, document["version"]
        _, tiered = offsets_from_document(document["tiered_offsets"])
        readable = None
        if document["readable_offsets"] is not None:
            _, readable = offsets_from_document(document["readable_offsets"])
        _, max_timestamps = offsets_from_document(document["max_timestamps"])
        names = {int(partition_id): str(name) for partition_id, name in document["partition_names"].items()}
        return cls(record.table_id, record.snapshot_id, document["tiered_offsets_path"],
                   document["readable_offsets_path"], tiered, readable, max_timestamps, names)


def snapshots_to_discard(committed_ids: Sequence[int], new_id: int, earliest_to_keep: int | None) -> list[int]:
    """Fluss's retention: which of ``committed_ids`` (oldest first, ``new_id`` not among them) go when
    ``new_id`` is committed with ``earliest_to_keep``. An id not found keeps everything, as in Fluss."""
    assert new_id not in committed_ids
    if earliest_to_keep is None:
        return list(committed_ids)
    if earliest_to_keep == KEEP_ALL_SNAPSHOTS:
        return []
    if earliest_to_keep == new_id:
        return list(committed_ids)
    if earliest_to_keep in committed_ids:
        return list(committed_ids[: list(committed_ids).index(earliest_to_keep)])
    return []
