"""Lookup requests and responses as bytes: the compiled codec writes and reads exactly what protobuf does."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from strom.client.lookup import one_bucket_values
from strom.errors import CorruptMessageError, NotLeaderOrFollowerError
from strom.rpc import lookup_wire
from strom.rpc.messages import pb

pytestmark = pytest.mark.skipif(not lookup_wire.NATIVE_AVAILABLE, reason="strom.rpc._lookupwire was not built")
native = lookup_wire.native

int32 = st.integers(-(1 << 31), (1 << 31) - 1)
int64 = st.integers(-(1 << 63), (1 << 63) - 1)
partition = st.one_of(st.none(), int64)
values_st = st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=20)


@settings(max_examples=300, deadline=None)
@given(table_id=int64, partition_id=partition, bucket_id=int32, keys=st.lists(st.binary(max_size=40), max_size=20))
def test_requests_are_the_bytes_protobuf_writes(table_id, partition_id, bucket_id, keys):
    body = native.lookup_request(table_id, partition_id, bucket_id, keys)
    assert body == lookup_wire.lookup_request_python(table_id, partition_id, bucket_id, keys)
    request = pb.LookupRequest.FromString(body)
    assert (request.table_id, list(request.buckets_req[0].keys)) == (table_id, keys)


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(st.tuples(int32, partition, values_st), max_size=4))
def test_response_entries_are_the_bytes_protobuf_writes_and_read_back(entries):
    body = b"".join(native.lookup_bucket_entry(*entry) for entry in entries)
    assert body == b"".join(lookup_wire.lookup_bucket_entry_python(*entry) for entry in entries)
    expected = [
        (bucket_id, partition_id, None, None, [value or None for value in values])
        for bucket_id, partition_id, values in entries
    ]
    assert native.parse_lookup_response(body) == expected
    assert lookup_wire.parse_lookup_response_python(body) == expected


@settings(max_examples=200, deadline=None)
@given(bucket_id=int32, partition_id=partition, code=st.one_of(st.none(), int32),
       message=st.one_of(st.none(), st.text(max_size=30)), values=values_st, unknown=st.binary(max_size=8))
def test_responses_protobuf_wrote_parse_alike_unknown_fields_included(bucket_id, partition_id, code, message, values,
                                                                      unknown):
    response = pb.LookupResponse()
    entry = response.buckets_resp.add(bucket_id=bucket_id)
    if partition_id is not None:
        entry.partition_id = partition_id
    if code is not None:
        entry.error_code = code
    if message is not None:
        entry.error_message = message
    for value in values:
        entry.values.add() if value is None else entry.values.add(values=value)
    entry.original_partition_name = "p"  # a field this reader skips
    # an unknown length-delimited field (number 15) at the top level
    body = response.SerializeToString() + bytes([15 << 3 | 2, len(unknown)]) + unknown
    assert native.parse_lookup_response(body) == lookup_wire.parse_lookup_response_python(body)


@settings(max_examples=500, deadline=None)
@given(body=st.binary(max_size=60))
def test_malformed_responses_are_refused_with_value_error_never_misread(body):
    try:
        expected = lookup_wire.parse_lookup_response_python(body)
    except ValueError:
        expected = None
    try:
        parsed = native.parse_lookup_response(body)
    except ValueError:
        return  # stricter than protobuf is fine (for example a group, or invalid UTF-8 text): an error
    assert parsed == expected


bucket_request = st.tuples(
    st.one_of(st.none(), int32), partition, st.lists(st.binary(max_size=20), max_size=5),
    st.one_of(st.none(), st.text(max_size=8)),
)


@settings(max_examples=400, deadline=None)
@given(table_id=st.one_of(st.none(), int64), buckets=st.lists(bucket_request, max_size=4),
       inserting=st.one_of(st.none(), st.booleans()), acks=st.one_of(st.none(), int32),
       unknown=st.binary(max_size=8))
def test_plain_lookup_requests_read_as_protobuf_reads_them_and_the_rest_are_left_to_it(
        table_id, buckets, inserting, acks, unknown):
    request = pb.LookupRequest()
    if table_id is not None:
        request.table_id = table_id
    for bucket_id, partition_id, keys, original in buckets:
        entry = request.buckets_req.add(keys=keys)
        if bucket_id is not None:
            entry.bucket_id = bucket_id
        if partition_id is not None:
            entry.partition_id = partition_id
        if original is not None:
            entry.original_partition_name = original
    if inserting is not None:
        request.insert_if_not_exists = inserting
    if acks is not None:
        request.acks = acks
    body = request.SerializePartialToString() + bytes([15 << 3 | 2, len(unknown)]) + unknown
    plain = table_id is not None and not inserting and all(
        bucket_id is not None and original is None for bucket_id, _, _, original in buckets)
    expected = (table_id, [(b, p, k) for b, p, k, _ in buckets]) if plain else None
    assert lookup_wire.plain_lookup_request_python(body) == expected
    assert native.plain_lookup_request(body) == expected


@settings(max_examples=500, deadline=None)
@given(body=st.binary(max_size=60))
def test_any_bytes_read_as_a_plain_lookup_are_what_protobuf_reads(body):
    """None (left to protobuf, which names the error) is always safe; an answer must be protobuf's."""
    parsed = native.plain_lookup_request(body)
    if parsed is not None:
        assert parsed == lookup_wire.plain_lookup_request_python(body)
    for cut in range(len(body)):
        native.plain_lookup_request(body[:cut])  # never raises, never crashes


@settings(max_examples=500, deadline=None)
@given(table_id=int64, bucket_id=int32, keys=st.lists(st.binary(max_size=12), min_size=1, max_size=3),
       position=st.integers(0, 200), byte=st.integers(0, 255))
def test_a_plain_lookup_with_one_byte_changed_reads_as_protobuf_reads_it_or_is_left_to_it(
        table_id, bucket_id, keys, position, byte):
    body = bytearray(native.lookup_request(table_id, None, bucket_id, keys))
    body[position % len(body)] = byte
    parsed = native.plain_lookup_request(bytes(body))
    if parsed is not None:
        assert parsed == lookup_wire.plain_lookup_request_python(bytes(body))


def test_a_truncated_response_or_one_without_bucket_id_is_refused():
    whole = native.lookup_bucket_entry(3, None, [b"\x01\x00abc"])
    for cut in range(1, len(whole)):
        with pytest.raises(ValueError):
            native.parse_lookup_response(whole[:cut])
    no_bucket = pb.LookupResponse()
    no_bucket.buckets_resp.add().values.add(values=b"x")
    with pytest.raises(ValueError, match="bucket_id"):
        native.parse_lookup_response(no_bucket.SerializePartialToString())


def test_arguments_of_the_wrong_type_raise_type_error():
    with pytest.raises(TypeError):
        native.lookup_request(1, None, 0, ["not bytes"])
    with pytest.raises(TypeError):
        native.lookup_bucket_entry(0, None, ["not bytes"])
    with pytest.raises(OverflowError):
        native.lookup_request(1, None, 1 << 40, [])


def test_the_client_raises_a_bucket_error_and_refuses_answers_that_do_not_fit_the_request():
    error = pb.LookupResponse()
    error.buckets_resp.add(bucket_id=0, error_code=NotLeaderOrFollowerError.code, error_message="moved")
    with pytest.raises(NotLeaderOrFollowerError, match="moved"):
        one_bucket_values(error.SerializeToString(), 1)
    two_values = native.lookup_bucket_entry(0, None, [b"\x01\x00a", None])
    assert one_bucket_values(two_values, 2) == [b"\x01\x00a", None]
    with pytest.raises(CorruptMessageError, match="2 values"):
        one_bucket_values(two_values, 1)
    with pytest.raises(CorruptMessageError, match="2 bucket entries"):
        one_bucket_values(two_values + two_values, 2)
    with pytest.raises(CorruptMessageError):
        one_bucket_values(b"\x0a\x05", 1)
