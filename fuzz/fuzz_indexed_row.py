"""Fuzz target: IndexedRow decoding (``table.kv.format = INDEXED``), alone and into an Arrow batch.

Input: two bytes seeding a random schema (fuzz/rows.py), then the row. Allowed outcome: ValueError. A row
that decodes, re-encoded, decodes to the same values.
"""

from __future__ import annotations

import contextlib
import sys

from fuzz.common import instrumented, main

with instrumented():
    from fuzz.rows import split
    from strom.records import row_arrow
    from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
    from strom.records.types import to_arrow_schema


def test_one_input(data: bytes) -> None:
    case = split(data)
    if case is None:
        return
    row_type, row = case
    decoder = IndexedRowDecoder(row_type)
    try:
        values = decoder.decode(row)
    except ValueError:
        values = None
    with contextlib.suppress(ValueError):
        row_arrow.rows_to_record_batch([row], decoder, to_arrow_schema(row_type))
    if values is None:
        return
    try:
        again = IndexedRowEncoder(row_type).encode(values)
    except ValueError:
        return  # e.g. a CHAR longer than its length after UTF-8 replacement
    assert repr(decoder.decode(again)) == repr(values)


if __name__ == "__main__":
    main("indexed_row", test_one_input)
    sys.exit(0)
