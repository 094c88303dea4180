"""DuckDB as an independent reader of strom's lake tables: its delta extension (delta-kernel-rs, not
delta-rs), its iceberg extension (DuckDB's own Iceberg reader, not pyiceberg; it reads manifests
through the avro extension) and its lance extension come from the ``duckdb-extension-*`` wheels, so
nothing is downloaded at run time."""

from __future__ import annotations

import glob
import os
from types import ModuleType
from typing import Any

import duckdb
import duckdb_extension_avro
import duckdb_extension_delta
import duckdb_extension_iceberg
import duckdb_extension_lance
import pyarrow as pa


def delta_extension_path() -> str:
    """The extension file the wheel ships (``extensions/v<duckdb version>/<platform>/...``)."""
    root = duckdb_extension_delta.__path__[0]
    paths = glob.glob(os.path.join(root, "extensions", "v*", "**", "delta.duckdb_extension"), recursive=True)
    assert len(paths) == 1, f"expected one delta extension under {root}, found {paths}"
    return paths[0]


def connect() -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB with the delta extension loaded."""
    connection = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    connection.execute(f"LOAD '{delta_extension_path()}'")
    return connection


def read_delta(uri: str, query: str = "SELECT * FROM lake", parameters: list[Any] | None = None) -> pa.Table:
    """``query`` over the latest version of the Delta table at ``uri``, which the query calls ``lake``."""
    with connect() as connection:
        connection.execute(f"CREATE VIEW lake AS SELECT * FROM delta_scan('{uri}')")
        return connection.execute(query, parameters).to_arrow_table()


def rows_of(uri: str, query: str, parameters: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """``read_delta`` as a list of row tuples (easy to compare with an expected state)."""
    result = read_delta(uri, query, parameters)
    return [tuple(row.values()) for row in result.to_pylist()]


def _extension_path(wheel: ModuleType, name: str) -> str:
    root = wheel.__path__[0]
    paths = glob.glob(os.path.join(root, "extensions", "v*", "**", f"{name}.duckdb_extension"), recursive=True)
    assert len(paths) == 1, f"expected one {name} extension under {root}, found {paths}"
    return paths[0]


def connect_iceberg() -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB with the avro and iceberg extensions loaded (no autoinstall)."""
    connection = duckdb.connect(config={"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false"})
    connection.execute(f"LOAD '{_extension_path(duckdb_extension_avro, 'avro')}'")
    connection.execute(f"LOAD '{_extension_path(duckdb_extension_iceberg, 'iceberg')}'")
    return connection


def read_iceberg(metadata_location: str, query: str = "SELECT * FROM lake", parameters: list[Any] | None = None) -> pa.Table:
    """``query`` over the Iceberg table whose metadata file is ``metadata_location`` (its current
    snapshot), which the query calls ``lake``."""
    with connect_iceberg() as connection:
        connection.execute(f"CREATE VIEW lake AS SELECT * FROM iceberg_scan('{metadata_location}')")
        return connection.execute(query, parameters).to_arrow_table()


def iceberg_rows(metadata_location: str, query: str, parameters: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """``read_iceberg`` as a list of row tuples."""
    return [tuple(row.values()) for row in read_iceberg(metadata_location, query, parameters).to_pylist()]


def read_lance(uri: str, query: str = "SELECT * FROM lake", parameters: list[Any] | None = None) -> pa.Table:
    """``query`` over the latest version of the Lance dataset at ``uri``, which the query calls ``lake``
    (DuckDB's lance extension, not pylance)."""
    connection = duckdb.connect(config={"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false"})
    with connection:
        connection.execute(f"LOAD '{_extension_path(duckdb_extension_lance, 'lance')}'")
        connection.execute(f"CREATE VIEW lake AS SELECT * FROM '{uri}'")
        return connection.execute(query, parameters).to_arrow_table()


def lance_rows(uri: str, query: str, parameters: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """``read_lance`` as a list of row tuples."""
    return [tuple(row.values()) for row in read_lance(uri, query, parameters).to_pylist()]
