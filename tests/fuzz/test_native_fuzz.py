"""Property-based differential fuzzing of the rest of the C module (``native/rowcodec.c``) against the
Python references: columnar encode (rows, keys, buckets), bucket ids, PutKv's upsert planning and ScanKv's
value batches. Valid and odd input alike (empty keys, nulls in keys, duplicate keys, limits of 0 and -1):
the same answer, or the same error with the same message."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strom.kv import changelog
from strom.records import bucketing, kv_batch, row_batches
from strom.records.bucketing import bucket_for_key
from strom.records.compacted import CompactedRowEncoder
from strom.records.types import MapType, RowType
from tests.fuzz.mutations import FUZZ_SETTINGS, assert_same_outcome, outcome
from tests.records.row_values import random_row, random_row_type

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(row_batches.native is None, reason="the C module is not built"),
]


def _key_indexes(rng: random.Random, row_type: RowType) -> list[int] | None:
    candidates = [i for i, f in enumerate(row_type.fields) if not isinstance(f.type, MapType)]
    if not candidates or rng.random() < 0.2:
        return None
    return rng.sample(candidates, rng.randint(1, min(3, len(candidates))))


@FUZZ_SETTINGS
@given(st.randoms(use_true_random=False), st.integers(0, 4), st.sampled_from((None, 1, 3, 128, 2**31 - 1)))
def test_encode_batch_equals_the_reference(rng: random.Random, row_count: int, bucket_count: int | None) -> None:
    row_type = random_row_type(rng, depth_max=2)
    null_rate = rng.choice((0.0, 0.2, 0.9))  # a null key value is an error both must report alike
    rows = [CompactedRowEncoder(row_type).encode(random_row(rng, row_type, null_rate)) for _ in range(row_count)]
    batch = row_batches.decode_rows_python(rows, row_type)
    keys = _key_indexes(rng, row_type)
    bucket_keys = _key_indexes(rng, row_type) if bucket_count is not None else None
    prefix = rng.choice((b"", b"\x01\x00"))
    context = f"type={row_type} keys={keys} bucket_keys={bucket_keys} buckets={bucket_count}"
    assert_same_outcome(
        outcome(lambda: row_batches.encode_batch(batch, row_type, keys, bucket_keys, bucket_count, value_prefix=prefix)),
        outcome(lambda: row_batches.encode_batch_python(batch, row_type, keys, bucket_keys, bucket_count, value_prefix=prefix)),
        context,
    )


@FUZZ_SETTINGS
@given(st.lists(st.binary(max_size=40), max_size=8), st.sampled_from((1, 2, 7, 1024, 2**31 - 1)))
def test_bucket_ids_equal_the_reference(keys: list[bytes], bucket_count: int) -> None:
    assert_same_outcome(
        outcome(lambda: bucketing.bucket_ids(keys, bucket_count)),
        outcome(lambda: [bucket_for_key(key, bucket_count) for key in keys]),
        f"keys={keys} buckets={bucket_count}",
    )


_KEYS = st.sampled_from((b"a", b"b", b"c", b"\x00", b""))
_VALUES = st.one_of(st.none(), st.binary(max_size=12))


@FUZZ_SETTINGS
@given(st.lists(st.tuples(_KEYS, _VALUES, _VALUES), max_size=10), st.binary(max_size=3), st.booleans())
def test_full_rows_in_c_equal_the_one_emitter(
    records: list[tuple[bytes, bytes | None, bytes | None]], prefix: bytes, ignore_deletes: bool
) -> None:
    keys = [k for k, _, _ in records]
    values = [v for _, v, _ in records]
    olds = [o for _, _, o in records]
    assert_same_outcome(
        outcome(lambda: changelog.emit_full_rows(keys, values, olds, prefix, ignore_deletes)),
        outcome(lambda: changelog.emit(keys, values, olds, prefix, changelog.LAST_WRITE_WINS,
                                       ignore_deletes=ignore_deletes, wal_image=False)),
        f"records={records} prefix={prefix!r} ignore_deletes={ignore_deletes}",
    )


@FUZZ_SETTINGS
@given(
    st.lists(st.binary(max_size=50), max_size=10),
    st.one_of(st.none(), st.binary(max_size=20)),
    st.sampled_from((0, 1, 9, 30, 100, 1 << 20)),
    st.sampled_from((-1, 0, 1, 2, 5, 100)),
)
def test_fill_value_batch_equals_the_reference(
    values: list[bytes], lookahead: bytes | None, batch_size_bytes: int, limit: int
) -> None:
    def run(fill: Any) -> Any:
        iterator = iter(values)
        batch, count, following = fill(iterator, lookahead, batch_size_bytes, limit)
        return batch, count, following, list(iterator)  # what is left must match too

    assert_same_outcome(
        outcome(lambda: run(kv_batch.fill_value_batch)),
        outcome(lambda: run(kv_batch.fill_value_batch_python)),
        f"values={values} lookahead={lookahead!r} size={batch_size_bytes} limit={limit}",
    )
