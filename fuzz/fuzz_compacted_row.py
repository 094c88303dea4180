"""Fuzz target: CompactedRow decoding, the C batch decoder against the Python reference.

Input: two bytes seeding a random schema (fuzz/rows.py), then the row. Allowed outcome: ValueError (the
documented error; MalformedRowError at the server). ``row_batches.decode_rows`` (C) and
``decode_rows_python`` must give identical batches or the same error and message; a row that decodes,
re-encoded, decodes to the same values.
"""

from __future__ import annotations

import sys
from typing import Any

from fuzz.common import batches_identical, instrumented, main

with instrumented():
    from fuzz.rows import split
    from strom.records import row_batches
    from strom.records.compacted import CompactedRowDecoder, CompactedRowEncoder, field_spans


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except ValueError as exc:
        return "error", (type(exc), str(exc))


def test_one_input(data: bytes) -> None:
    case = split(data)
    if case is None:
        return
    row_type, row = case
    decoded = _outcome(lambda: CompactedRowDecoder(row_type).decode(row))
    _outcome(lambda: field_spans(row_type, row))
    fast = _outcome(lambda: row_batches.decode_rows([row], row_type))
    reference = _outcome(lambda: row_batches.decode_rows_python([row], row_type))
    assert fast[0] == reference[0], (fast, reference)
    if fast[0] == "error":
        assert fast[1] == reference[1], (fast, reference)
    else:
        assert batches_identical(fast[1], reference[1]), (fast, reference)
    if decoded[0] == "ok":
        try:
            again = CompactedRowEncoder(row_type).encode(decoded[1])
        except ValueError:
            return  # e.g. a null bit set on a NOT NULL field, which the decoder ignores
        assert repr(CompactedRowDecoder(row_type).decode(again)) == repr(decoded[1])


if __name__ == "__main__":
    main("compacted_row", test_one_input)
    sys.exit(0)
