"""The protobuf message classes, generated from ``proto/*.proto`` at install time: Fluss's (``pb``) and
strom's extensions (``ext``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError, Message

try:
    from strom.rpc.proto import fluss_api_pb2 as _fluss_api
    from strom.rpc.proto import strom_ext_pb2 as _strom_ext
except ImportError as exc:  # pragma: no cover - only when the package was copied without building
    raise ImportError(
        "strom's protocol module is not built: run `make install` (or `pip install -e .`), which compiles "
        "strom/rpc/proto/fluss_api.proto"
    ) from exc

from strom.ids import TableBucket
from strom.rpc.api_keys import ApiKey, message_names

# Generated modules have no type stubs: their message classes are attributes created at import.
pb: Any = _fluss_api
ext: Any = _strom_ext

__all__ = [
    "DecodeError", "EncodedRequest", "Message", "add_snapshot_pins", "ext", "pb", "read_snapshot_pins", "request_class",
    "response_class",
]


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """A request already serialized without a protobuf object, with the reader of its response body (which
    raises ValueError on a malformed one): the Lookup hot path (lookup_wire.py)."""

    body: bytes
    parse: Callable[[bytes], Any]


def _message_class(name: str) -> type[Message] | None:
    cls: Any = getattr(pb, name, None)
    if cls is None:
        cls = getattr(ext, name, None)
    return cls


@functools.cache
def request_class(key: ApiKey) -> type[Message] | None:
    """The request message of ``key``, or None when strom's proto does not define it (not served)."""
    return _message_class(message_names(key)[0])


@functools.cache
def response_class(key: ApiKey) -> type[Message] | None:
    return _message_class(message_names(key)[1])


def _add_bucket_values(tables: Any, values: Mapping[TableBucket, int], entries: str, value_field: str) -> None:
    """Fill a repeated per-table message (``table_id`` and a repeated ``entries`` of bucket entries) with
    ``{bucket: value}``, one entry per table, buckets in order."""
    by_table: dict[int, Any] = {}
    for bucket, value in sorted(values.items(), key=lambda item: item[0].sort_key()):
        table_entry = by_table.get(bucket.table_id)
        if table_entry is None:
            table_entry = by_table[bucket.table_id] = tables.add(table_id=bucket.table_id)
        entry = getattr(table_entry, entries).add(bucket_id=bucket.bucket, **{value_field: value})
        if bucket.partition_id is not None:
            entry.partition_id = bucket.partition_id


def _read_bucket_values(tables: Iterable[Any], entries: str, value_field: str) -> dict[TableBucket, int]:
    values: dict[TableBucket, int] = {}
    for table_entry in tables:
        for entry in getattr(table_entry, entries):
            partition_id = entry.partition_id if entry.HasField("partition_id") else None
            values[TableBucket(table_entry.table_id, entry.bucket_id, partition_id)] = getattr(entry, value_field)
    return values


def add_snapshot_pins(tables: Any, pins: Mapping[TableBucket, int]) -> None:
    """Fill a repeated ``PbKvSnapshotLeaseForTable`` field (lease requests, unavailable snapshots) with
    ``{bucket: snapshot id}``."""
    _add_bucket_values(tables, pins, "bucket_snapshots", "snapshot_id")


def read_snapshot_pins(tables: Iterable[Any]) -> dict[TableBucket, int]:
    """``{bucket: snapshot id}`` from a repeated ``PbKvSnapshotLeaseForTable`` field."""
    return _read_bucket_values(tables, "bucket_snapshots", "snapshot_id")


def add_producer_offsets(tables: Any, offsets: Mapping[TableBucket, int]) -> None:
    """Fill a repeated ``PbProducerTableOffsets`` field with ``{bucket: log end offset}``."""
    _add_bucket_values(tables, offsets, "bucket_offsets", "log_end_offset")


def read_producer_offsets(tables: Iterable[Any]) -> dict[TableBucket, int]:
    """``{bucket: log end offset}`` from a repeated ``PbProducerTableOffsets`` field."""
    return _read_bucket_values(tables, "bucket_offsets", "log_end_offset")
