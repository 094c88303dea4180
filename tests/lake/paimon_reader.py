"""Readers of strom's Paimon tables that do not go through strom: pypaimon-rust's DataFusion SQL context
(SQL over the catalog, as a Paimon user queries it) and pypaimon 2.1.0, Paimon's pure-Python
implementation, in a virtualenv of its own (its pins, pyarrow < 20 among them, would clash with strom's);
``make install`` creates it as ``.venv-pypaimon``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
from pypaimon_rust.datafusion import SQLContext

ROOT = Path(__file__).resolve().parents[2]
PYPAIMON_PYTHON = ROOT / ".venv-pypaimon" / "bin" / "python"

_PYPAIMON_READ = """
import json, sys
from pypaimon import CatalogFactory
warehouse, identifier, columns = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
table = CatalogFactory.create({"warehouse": warehouse}).get_table(identifier)
builder = table.new_read_builder().with_projection(columns)
splits = builder.new_scan().plan().splits()
frame = builder.new_read().to_arrow(splits)
rows = [] if frame is None else frame.select(columns).to_pylist()
print(json.dumps(sorted([[row[c] for c in columns] for row in rows], key=str), default=str))
"""


def sql_rows(warehouse: str, query: str) -> list[tuple[Any, ...]]:
    """``query`` through pypaimon-rust's SQL context, with the warehouse as catalog ``lake``."""
    context = SQLContext()
    context.register_catalog("lake", {"warehouse": warehouse}, default_database="")
    context.set_current_catalog("lake")
    batches = context.sql(query)
    table = pa.Table.from_batches(batches) if batches else pa.table({})
    return [tuple(row.values()) for row in table.to_pylist()]


def pypaimon_rows(warehouse: str, identifier: str, columns: list[str]) -> list[list[Any]]:
    """The table's latest snapshot as pypaimon 2.1.0 reads it (``columns``, sorted by their text)."""
    assert PYPAIMON_PYTHON.exists(), f"{PYPAIMON_PYTHON} is missing: run `make install`"
    done = subprocess.run([str(PYPAIMON_PYTHON), "-c", _PYPAIMON_READ, warehouse, identifier, json.dumps(columns)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))
