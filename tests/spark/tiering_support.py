"""Test helpers for the tiering service: lake-enabled tables, drivers in this process or as real
``strom tiering`` processes, gates to stop a round at a named point, and the lake read back by DuckDB."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from strom.client.lake import LakeSnapshot
from strom.errors import LakeSnapshotNotExistError
from strom.ids import TablePath
from strom.lake.formats import lake_format
from strom.records.types import DataType
from strom.tiering.driver import TieringDriver, TieringOptions
from tests.lake.duckdb_reader import read_delta, read_iceberg, read_lance
from tests.lake.paimon_reader import pypaimon_rows
from tests.spark.support import Fluss, run, wait_until

LAKE_TABLE = {"table.datalake.enabled": "true", "table.datalake.freshness": "1s"}
FAST_TIERING = {"kv.snapshot.interval": "0s", "lake.tiering.heartbeat-timeout": "3s",
                "lake.tiering.heartbeat-check-interval": "200ms"}
STOP_S = 60.0
LAKE_FORMATS = ("delta", "iceberg", "paimon", "lance")
"""Every lake format strom tiers into; log tables tier into each."""
PK_LAKE_FORMATS = ("delta", "iceberg", "paimon")
"""The formats that hold primary-key tables (Lance holds log tables only, as in Fluss)."""


def tiering_config(lake_format: str, **overrides: str) -> dict[str, str]:
    """A server that tiers quickly into ``lake_format``."""
    return {**FAST_TIERING, "datalake.format": lake_format, **overrides}


def create_lake_table(cluster: Fluss, columns: Sequence[tuple[str, DataType]], **kwargs: Any) -> str:
    properties = {**LAKE_TABLE, **kwargs.pop("properties", {})}
    return cluster.create_table(columns, properties=properties, prefix="lake", **kwargs)


def tier_once(spark: Any, cluster: Fluss, job_id: str = "test-job", **options: Any) -> TieringDriver:
    """Run an in-process driver until every lake table of the server has been tiered once."""
    driver = TieringDriver(spark, TieringOptions(cluster.address, job_id, poll_interval_ms=200, once=True, **options))
    driver.run()
    return driver


class DriverThread:
    """An in-process driver on a thread, for tests that act while its round runs."""

    def __init__(self, spark: Any, cluster: Fluss, job_id: str = "test-job", **options: Any) -> None:
        self.driver = TieringDriver(spark, TieringOptions(cluster.address, job_id, poll_interval_ms=200, once=True, **options))
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.driver.run()
        except BaseException as exc:
            self.error = exc

    def start(self) -> DriverThread:
        self._thread.start()
        return self

    def join(self, timeout_s: float = 120.0) -> TieringDriver:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the tiering driver did not finish"
        if self.error is not None:
            raise self.error
        return self.driver


class Gates:
    """The test's side of :mod:`strom.tiering.gates`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory

    @property
    def path(self) -> str:
        return str(self.directory)

    def hold(self, point: str) -> None:
        (self.directory / f"hold-{point}").touch()

    def release(self, point: str) -> None:
        (self.directory / f"hold-{point}").unlink(missing_ok=True)

    def pids(self, point: str) -> list[int]:
        marker = self.directory / f"reached-{point}"
        return [int(line) for line in marker.read_text().split()] if marker.exists() else []

    def wait_reached(self, point: str, count: int = 1, timeout_s: float = 120.0) -> list[int]:
        return wait_until(lambda: len(self.pids(point)) >= count and self.pids(point), f"gate {point}", timeout_s)

    def reset(self, point: str) -> None:
        (self.directory / f"reached-{point}").unlink(missing_ok=True)


class TieringProcess:
    """``strom tiering`` as a real child process, stopped or killed by its own pid."""

    def __init__(self, cluster: Fluss, log_path: Path, job_id: str = "test-job", once: bool = False,
                 defines: Mapping[str, str] | None = None) -> None:
        command = [sys.executable, "-m", "strom.cli.main", "tiering", "-b", cluster.address, "--job-id", job_id,
                   "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                   "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
                   "--conf", "spark.ui.showConsoleProgress=false",
                   "-D", "tiering.poll.table.interval=200ms"]
        for key, value in (defines or {}).items():
            command += ["-D", f"{key}={value}"]
        if once:
            command.append("--once")
        self.log_path = log_path
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_S)

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def wait(self, timeout_s: float = 180.0) -> int:
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"strom tiering did not exit:\n{self.log()[-4000:]}") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def lake_snapshot(cluster: Fluss, table: str) -> LakeSnapshot | None:
    async def get(connection: Any) -> LakeSnapshot | None:
        try:
            return await connection.get_admin().get_lake_snapshot(TablePath.parse(table))
        except LakeSnapshotNotExistError:
            return None

    return run(cluster.address, get)


def _table_info(cluster: Fluss, table: str) -> Any:
    async def info(connection: Any) -> Any:
        return await connection.get_admin().get_table_info(TablePath.parse(table))

    return run(cluster.address, info)


def lake_uri(cluster: Fluss, table: str) -> str:
    info = _table_info(cluster, table)
    return lake_format(info).table(info).uri


def lake_rows(cluster: Fluss, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The lake table at its latest version as an independent reader reads it (DuckDB's delta, iceberg or
    lance extension; pypaimon 2.1.0 for Paimon), not the library strom writes with, sorted."""
    info = _table_info(cluster, table)
    lake_table: Any = lake_format(info).table(info)
    name = info.properties.get("table.datalake.format")
    if name == "paimon":
        return sorted(tuple(row) for row in pypaimon_rows(lake_table.catalog_options["warehouse"],
                                                          lake_table.identifier, list(columns)))
    if name == "iceberg":
        result: pa.Table = read_iceberg(lake_table.iceberg().metadata_location)
    elif name == "lance":
        result = read_lance(lake_table.uri)
    else:
        result = read_delta(lake_table.uri)
    return sorted(zip(*(result.column(c).to_pylist() for c in columns), strict=True))


def strom_rows(cluster: Fluss, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    rows = cluster.rows(table)
    return sorted(tuple(row[c] for c in columns) for row in rows)
