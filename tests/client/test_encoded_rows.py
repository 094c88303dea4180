"""Grouping an upsert writer's encoded rows by bucket keeps every row, in its order within its bucket,
with its row-API handle, for plain and partitioned tables."""

from __future__ import annotations

import asyncio

import hypothesis.strategies as st
from hypothesis import given, settings

from strom.client.writer import _EncodedRows

row = st.tuples(st.sampled_from([None, 11, 12]), st.integers(0, 3), st.binary(max_size=3),
                st.one_of(st.none(), st.binary(min_size=1, max_size=3)))


def reference(rows: list[tuple[int | None, int, bytes, bytes | None, object]]) -> dict[object, list[object]]:
    grouped: dict[object, list[object]] = {}
    for partition_id, bucket, key, value, handle in rows:
        grouped.setdefault((partition_id, bucket), []).append((key, value, handle))
    return grouped


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(row, max_size=30), partitioned=st.booleans(), handled=st.lists(st.booleans(), min_size=30),
       with_handles=st.booleans())
def test_rows_are_grouped_by_bucket_in_their_order(
    rows: list[tuple[int | None, int, bytes, bytes | None]], partitioned: bool, handled: list[bool],
    with_handles: bool,
) -> None:
    if not partitioned:
        rows = [(None, bucket, key, value) for _p, bucket, key, value in rows]
    handles = [object() if with_handles and handle else None for handle, _ in zip(handled, rows, strict=False)]
    encoded = _EncodedRows(
        [p for p, *_ in rows] if partitioned else None,
        [b for _p, b, _k, _v in rows], [k for *_, k, _v in rows], [v for *_, v in rows],
        handles if with_handles else None,
    )
    expected = reference([(*r, h) for r, h in zip(rows, handles, strict=True)])
    got = encoded.by_bucket()
    assert len(got) == len(expected)
    for group, keys, values, futures in got:
        want = expected[group]
        assert keys == [k for k, _v, _h in want]
        assert values == [v for _k, v, _h in want]
        assert futures == ([h for _k, _v, h in want if h is not None] if with_handles else [])


def test_bytes_keys_stay_whole_and_concat_and_interleave_keep_the_order() -> None:
    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()
        upserts = _EncodedRows(None, [1, 0], [b"ab", b"cd"], [b"v1", b"v2"], [None, done])
        deletes = _EncodedRows(None, [1], [b"ab"], [None], [None])
        mixed = _EncodedRows.interleave(upserts, deletes, [True, False, True])
        assert mixed.keys == [b"ab", b"ab", b"cd"] and mixed.values == [b"v1", None, b"v2"]
        assert mixed.by_bucket() == [((None, 0), [b"cd"], [b"v2"], [done]),
                                     ((None, 1), [b"ab", b"ab"], [b"v1", None], [])]
        joined = _EncodedRows.concat([upserts, _EncodedRows([7], [2], [b"x"], [None], None)])
        assert joined.partition_ids == [None, None, 7] and joined.futures == [None, done, None]
        assert _EncodedRows(None, [], [], [], None).by_bucket() == []
    finally:
        loop.close()
