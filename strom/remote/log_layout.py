"""Where a bucket's log lives in remote storage, and its manifest: Fluss's remote log layout.

``{remote.data.dir}/log/{database}/{table}-{table id}[/{partition}-p{partition id}]/{bucket}/`` is a bucket's
remote log tablet directory. Each uploaded segment gets a directory of its own, named by a fresh UUID, with
``{base offset:020d}.log`` (the segment file as it was on local disk) and ``{base offset:020d}.index``
(Fluss's offset index: big-endian ``int32 relative last offset, int32 position`` entries, one per
``log.index.interval-size`` bytes). The manifest, ``metadata/{UUID}.manifest``, lists the segments the bucket's
remote log consists of; the coordinator keeps which manifest is current (a :class:`RemoteLogManifestHandle`),
so a segment directory or manifest that no handle leads to is an orphan of an interrupted upload.
"""

from __future__ import annotations

import itertools
import json
import struct
import uuid
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from strom.ids import TableBucket

LOG_DIR = "log"
MANIFEST_DIR = "metadata"
MANIFEST_SUFFIX = ".manifest"
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
MANIFEST_VERSION = 1
HANDLE_VERSION = 1
_INDEX_ENTRY = struct.Struct(">ii")


def table_log_dir(database: str, table: str, table_id: int) -> str:
    """A table's remote log directory, relative to ``remote.data.dir`` (dropping the table deletes it)."""
    return f"{LOG_DIR}/{database}/{table}-{table_id}"


def tablet_dir(database: str, table: str, bucket: TableBucket, partition_name: str | None = None) -> str:
    """A bucket's remote log tablet directory, relative to ``remote.data.dir``."""
    owner = table_log_dir(database, table, bucket.table_id)
    if bucket.partition_id is not None:
        assert partition_name is not None, "a partition's bucket needs its partition name"
        owner = f"{owner}/{partition_name}-p{bucket.partition_id}"
    return f"{owner}/{bucket.bucket}"


def offset_prefix(offset: int) -> str:
    return f"{offset:020d}"


def segment_dir(tablet: str, segment_id: str) -> str:
    return f"{tablet}/{segment_id}"


def segment_log_file(tablet: str, segment_id: str, start_offset: int) -> str:
    """The segment's data, where Fluss's clients look for it."""
    return f"{tablet}/{segment_id}/{offset_prefix(start_offset)}{LOG_SUFFIX}"


def segment_index_file(tablet: str, segment_id: str, start_offset: int) -> str:
    return f"{tablet}/{segment_id}/{offset_prefix(start_offset)}{INDEX_SUFFIX}"


def new_manifest_file(tablet: str) -> str:
    return f"{tablet}/{MANIFEST_DIR}/{uuid.uuid4()}{MANIFEST_SUFFIX}"


def new_segment_id() -> str:
    return str(uuid.uuid4())


# ---- the offset index ----
def encode_offset_index(base_offset: int, batches: Iterable[tuple[int, int]], interval_bytes: int) -> bytes:
    """Fluss's sparse offset index of a segment from its batches' ``(last offset, position)``: an entry for
    the first batch and then whenever more than ``interval_bytes`` were written since the last entry."""
    entries = bytearray()
    last_position: int | None = None
    for last_offset, position in batches:
        if last_position is None or position - last_position > interval_bytes:
            entries += _INDEX_ENTRY.pack(last_offset - base_offset, position)
            last_position = position
    return bytes(entries)


def lookup_position(index: bytes, base_offset: int, offset: int) -> int:
    """Where to start reading the segment for ``offset``: the position of the last indexed batch whose last
    offset is at or below it (0 when none is), as Fluss looks it up; reading on from there reaches the
    offset, and readers skip the records below it."""
    keys = [_INDEX_ENTRY.unpack_from(index, at)[0] for at in range(0, len(index) - len(index) % 8, 8)]
    found = bisect_right(keys, offset - base_offset) - 1
    return 0 if found < 0 else int(_INDEX_ENTRY.unpack_from(index, found * 8)[1])


# ---- the manifest ----
@dataclass(frozen=True, slots=True)
class RemoteLogSegment:
    segment_id: str
    start_offset: int
    end_offset: int
    """Exclusive: the base offset of the segment that follows."""
    max_timestamp: int
    size_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"segment_id": self.segment_id, "start_offset": self.start_offset, "end_offset": self.end_offset,
                "max_timestamp": self.max_timestamp, "size_in_bytes": self.size_bytes}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> RemoteLogSegment:
        return cls(str(value["segment_id"]), int(value["start_offset"]), int(value["end_offset"]),
                   int(value["max_timestamp"]), int(value["size_in_bytes"]))


@dataclass(frozen=True, slots=True)
class RemoteLogManifest:
    """The segments of one bucket's remote log, contiguous and in offset order (Fluss's manifest, version 1)."""

    database: str
    table: str
    bucket: TableBucket
    partition_name: str | None = None
    segments: tuple[RemoteLogSegment, ...] = field(default=())

    @property
    def start_offset(self) -> int | None:
        return self.segments[0].start_offset if self.segments else None

    @property
    def end_offset(self) -> int | None:
        """Exclusive; None for an empty remote log."""
        return self.segments[-1].end_offset if self.segments else None

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self.segments)

    def changed(self, removed: Sequence[RemoteLogSegment], added: Sequence[RemoteLogSegment]) -> RemoteLogManifest:
        """This manifest less ``removed`` (from the start: expired) plus ``added`` (at the end).

        Raises:
            ValueError: the result would not be contiguous.
        """
        gone = {segment.segment_id for segment in removed}
        kept = [segment for segment in self.segments if segment.segment_id not in gone]
        segments = (*kept, *added)
        for previous, following in itertools.pairwise(segments):
            if following.start_offset != previous.end_offset:
                raise ValueError(f"remote log segments of {self.bucket} would not be contiguous: "
                                 f"[{previous.start_offset}, {previous.end_offset}) then "
                                 f"[{following.start_offset}, {following.end_offset})")
        return replace(self, segments=segments)

    def segments_from(self, offset: int) -> list[RemoteLogSegment]:
        """The segment holding ``offset`` and every later one (empty when no segment holds it)."""
        for index, segment in enumerate(self.segments):
            if segment.start_offset <= offset < segment.end_offset:
                return list(self.segments[index:])
        return []

    def to_bytes(self) -> bytes:
        document: dict[str, Any] = {"version": MANIFEST_VERSION, "database": self.database, "table": self.table}
        if self.bucket.partition_id is not None:
            document["partition_name"] = self.partition_name
        document["table_id"] = self.bucket.table_id
        if self.bucket.partition_id is not None:
            document["partition_id"] = self.bucket.partition_id
        document["bucket_id"] = self.bucket.bucket
        document["remote_log_segments"] = [segment.to_json() for segment in self.segments]
        return json.dumps(document).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> RemoteLogManifest:
        """Raises ValueError, KeyError or TypeError on a document that is not a manifest."""
        value = json.loads(data)
        partition_id = value.get("partition_id")
        bucket = TableBucket(int(value["table_id"]), int(value["bucket_id"]),
                             None if partition_id is None else int(partition_id))
        segments = tuple(RemoteLogSegment.from_json(s) for s in value["remote_log_segments"])
        return cls(str(value["database"]), str(value["table"]), bucket, value.get("partition_name"), segments)


@dataclass(frozen=True, slots=True)
class RemoteLogManifestHandle:
    """What the coordinator keeps per bucket: the current manifest's location and the remote log's end."""

    manifest_path: str
    end_offset: int
    start_offset: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps({"version": HANDLE_VERSION, "remote_log_manifest_path": self.manifest_path,
                           "remote_log_end_offset": self.end_offset,
                           "remote_log_start_offset": self.start_offset}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> RemoteLogManifestHandle:
        value = json.loads(data)
        return cls(str(value["remote_log_manifest_path"]), int(value["remote_log_end_offset"]),
                   int(value.get("remote_log_start_offset", 0)))


__all__ = [
    "RemoteLogManifest",
    "RemoteLogManifestHandle",
    "RemoteLogSegment",
    "encode_offset_index",
    "lookup_position",
    "new_manifest_file",
    "new_segment_id",
    "segment_dir",
    "segment_index_file",
    "segment_log_file",
    "table_log_dir",
    "tablet_dir",
]
