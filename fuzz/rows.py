"""Schemas for the row targets: the first two input bytes seed a random row type (every Fluss type,
nested up to two levels), as the property tests generate them."""

from __future__ import annotations

import functools
import random

from strom.records.types import RowType
from tests.records.row_values import random_row_type

SCHEMA_SEED_SIZE_BYTES = 2


@functools.lru_cache(maxsize=1 << 16)
def row_type_for(seed: int) -> RowType:
    return random_row_type(random.Random(seed), depth_max=2)


def split(data: bytes) -> tuple[RowType, bytes] | None:
    """(row type, row bytes) of an input, or None if it is too short to name a schema."""
    if len(data) < SCHEMA_SEED_SIZE_BYTES:
        return None
    return row_type_for(int.from_bytes(data[:SCHEMA_SEED_SIZE_BYTES], "little")), data[SCHEMA_SEED_SIZE_BYTES:]
