"""Lists gathered and put back by a sort's positions, and the rows among a lookup's answers: the compiled
loops return what their Python references return, and refuse what they refuse."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.records import positions, row_batches
from strom.records.rowcodec_native import native

pytestmark = pytest.mark.skipif(native is None, reason="strom.records._rowcodec was not built")


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.one_of(st.none(), st.binary(max_size=6)), max_size=40), seed=st.integers(0, 1 << 32))
def test_take_and_unsort_are_their_references_and_inverse(items: list[bytes | None], seed: int) -> None:
    order = np.random.default_rng(seed).permutation(len(items)).astype(np.int64)
    taken = native.take(items, order)
    assert taken == positions.take_python(items, order) == [items[i] for i in order.tolist()]
    assert native.unsort(taken, order) == positions.unsort_python(taken, order) == items


def test_a_stable_sort_by_bucket_gathers_and_restores_a_batch() -> None:
    """What a batched lookup does: keys sorted by bucket, each bucket's run answered, answers put back."""
    keys = [b"k%d" % i for i in range(10)]
    buckets = np.array([3, 1, 3, 0, 1, 1, 0, 3, 2, 0], dtype=np.int64)
    order = np.argsort(buckets, kind="stable")
    grouped = positions.take(keys, order)
    assert grouped == [b"k3", b"k6", b"k9", b"k1", b"k4", b"k5", b"k8", b"k0", b"k2", b"k7"]
    answers = [key.upper() for key in grouped]
    assert positions.unsort(answers, order) == [key.upper() for key in keys]


@pytest.mark.parametrize("implementation", ["native", "python"])
def test_orders_that_do_not_fit_are_refused(implementation: str) -> None:
    take = native.take if implementation == "native" else positions.take_python
    unsort = native.unsort if implementation == "native" else positions.unsort_python
    with pytest.raises(ValueError, match="differ in length"):
        unsort([b"x"], b"")
    with pytest.raises(ValueError, match="differ in length"):
        take([b"x"], np.array([0, 1], dtype=np.int64))
    with pytest.raises(ValueError, match="out of range"):
        unsort([b"x", b"y"], np.array([0, -1], dtype=np.int64))
    with pytest.raises(ValueError, match="out of range"):
        take([b"x", b"y"], np.array([2, 0], dtype=np.int64))


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.binary(max_size=5)), max_size=30), prefix=st.binary(max_size=2))
def test_present_rows_are_the_values_that_are_not_none_and_the_first_of_another_schema(
    values: list[bytes | None], prefix: bytes
) -> None:
    rows, mismatch = native.present_rows(values, prefix)
    assert (rows, mismatch) == row_batches.present_rows_python(values, prefix)
    assert rows == [value for value in values if value is not None]
    assert mismatch == -1 or not rows[mismatch].startswith(prefix)
    assert all(row.startswith(prefix) for row in rows[: len(rows) if mismatch < 0 else mismatch])


def test_present_rows_refuse_a_value_that_is_not_bytes() -> None:
    with pytest.raises(TypeError, match="bytes or None"):
        native.present_rows([b"\x00\x01", "text"], b"\x00\x01")
