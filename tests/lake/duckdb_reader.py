"""DuckDB as an independent reader of strom's lake tables (its delta extension, from the
``duckdb-extension-delta`` wheel: no download at run time)."""

from __future__ import annotations

import glob
import os

import duckdb
import duckdb_extension_delta
import pyarrow as pa


def delta_extension_path() -> str:
    [path] = glob.glob(os.path.join(duckdb_extension_delta.__path__[0], "extensions", "*", "delta.duckdb_extension"))
    return path


def connect() -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    connection.load_extension(delta_extension_path())
    return connection


def read_delta(uri: str, query: str = "SELECT * FROM lake") -> pa.Table:
    """``query`` over the Delta table at ``uri`` (named ``lake``), as DuckDB reads its latest version."""
    with connect() as connection:
        connection.execute(f"CREATE VIEW lake AS SELECT * FROM delta_scan('{uri}')")
        return connection.execute(query).to_arrow_table()
