"""Lookup (api key 1017) requests and responses as bytes, without a protobuf object per key.

A point lookup is nearly all overhead: through protobuf's Python objects the server built a response
entry and a ``PbValue`` per key and the client walked them back out, several µs of a single lookup and
~0.5 µs a key on each side of a batched one (docs/benchmarks.md). ``native/lookupwire.c`` writes and
reads the same bytes directly. Each ``*_python`` function is its reference through the generated
protobuf classes: the compiled one returns exactly the same, and everything uses the reference when the
module was built without a C compiler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from strom.rpc.messages import DecodeError, pb

try:
    import strom.rpc._lookupwire as native
except ImportError:  # built without a C compiler
    native = None

NATIVE_AVAILABLE = native is not None

BucketAnswer = tuple[int, int | None, int | None, str | None, list[bytes | None]]
"""One bucket's part of a LookupResponse: bucket id, partition id, error code, error message and the
values in request order (None: no row). Absent optional fields are None."""


def lookup_request_python(table_id: int, partition_id: int | None, bucket_id: int, keys: Sequence[bytes]) -> bytes:
    """A LookupRequest body asking one bucket for ``keys``."""
    request = pb.LookupRequest(table_id=table_id)
    entry = request.buckets_req.add(bucket_id=bucket_id, keys=keys)
    if partition_id is not None:
        entry.partition_id = partition_id
    return request.SerializeToString()  # type: ignore[no-any-return]


def lookup_bucket_entry_python(bucket_id: int, partition_id: int | None, values: Sequence[bytes | None]) -> bytes:
    """One bucket's entry of a LookupResponse body, its field tag and length included, so a response body
    is its entries one after another. A None value is a ``PbValue`` without bytes: no row."""
    response = pb.LookupResponse()
    entry = response.buckets_resp.add(bucket_id=bucket_id)
    if partition_id is not None:
        entry.partition_id = partition_id
    add = entry.values.add
    for value in values:
        if value is None:
            add()
        else:
            add().values = value
    return response.SerializeToString()  # type: ignore[no-any-return]


def parse_lookup_response_python(body: bytes) -> list[BucketAnswer]:
    """A LookupResponse body's entries; raises ValueError on a malformed one. A value that is absent or
    empty is None: a stored value always starts with its schema id."""
    try:
        response = pb.LookupResponse.FromString(body)
    except DecodeError as exc:
        raise ValueError(f"malformed LookupResponse: {exc}") from exc
    answers: list[BucketAnswer] = []
    for entry in response.buckets_resp:
        if not entry.HasField("bucket_id"):
            raise ValueError("malformed LookupResponse: a bucket entry without its bucket_id")
        answers.append((
            entry.bucket_id,
            entry.partition_id if entry.HasField("partition_id") else None,
            entry.error_code if entry.HasField("error_code") else None,
            entry.error_message if entry.HasField("error_message") else None,
            [value.values or None for value in entry.values],
        ))
    return answers


PlainLookup = tuple[int, list[tuple[int, int | None, list[bytes]]]]
"""A LookupRequest that only reads: its table id and, per bucket, bucket id, partition id and keys."""


def plain_lookup_request_python(body: bytes) -> PlainLookup | None:
    """The table id and buckets of a well-formed LookupRequest that only reads (no ``insert_if_not_exists``,
    no ``original_partition_name``), else None: the server's short path, which leaves every other request,
    malformed ones included, to protobuf and its errors."""
    try:
        request = pb.LookupRequest.FromString(body)
    except DecodeError:
        return None
    if not request.IsInitialized() or request.insert_if_not_exists:
        return None
    buckets = []
    for entry in request.buckets_req:
        if entry.HasField("original_partition_name"):
            return None
        buckets.append((entry.bucket_id, entry.partition_id if entry.HasField("partition_id") else None, list(entry.keys)))
    return request.table_id, buckets


lookup_request = native.lookup_request if native is not None else lookup_request_python
lookup_bucket_entry = native.lookup_bucket_entry if native is not None else lookup_bucket_entry_python
parse_lookup_response = native.parse_lookup_response if native is not None else parse_lookup_response_python
plain_lookup_request = native.plain_lookup_request if native is not None else plain_lookup_request_python

OneKeyAnswer = bytes | tuple[int, str | None] | None
"""A single lookup's answer: the stored value, None (no row), or the bucket's (or the frame's) error code and
message."""

lookup_round_trip: Callable[[int, int, int, int, int, int | None, int, bytes], OneKeyAnswer] | None = (
    native.lookup_round_trip if native is not None else None
)
"""``lookup_round_trip(fd, api_key, api_version, request_id, table_id, partition_id, bucket_id, key)``: one key of one
bucket looked up over a blocking socket in one C call (frame written, sent, received and read without the
GIL held across a system call), or None where the module was built without a C compiler: the blocking
client then sends the same request through its Python frames, which are the reference. Raises OSError when
the connection fails or answers another request, ValueError when the answer is malformed."""
