"""One local[2] SparkSession for the whole test run, and servers for the connector's tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.server_process import ServerProcess
from tests.spark.support import Fluss


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Shared by every Spark test (starting Spark costs seconds); workers run this venv's Python."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import warnings

    from pyspark.sql import SparkSession

    from strom.spark import PUSHDOWN_SETTING, FlussDataSource

    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("strom-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("spark-warehouse")))  # CREATE TABLE's files
        .config(PUSHDOWN_SETTING, "true")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(FlussDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(server: ServerProcess) -> Fluss:
    """The shared server (KV snapshots off: primary-key reads come from the changelog alone)."""
    return Fluss(server.address)


@pytest.fixture(scope="session")
def snapshotting_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that snapshots every second and keeps one snapshot per bucket (plus leased ones)."""
    config = {"kv.snapshot.interval": "1s", "kv.snapshot.num-retained": "1"}
    process = ServerProcess(tmp_path_factory.mktemp("spark-snapshots") / "data", config).start()
    yield process
    code = process.stop()
    assert not process.internal_errors(), process.internal_errors()[:5]
    assert code == 0, process.log_text()[-3000:]


@pytest.fixture(scope="session")
def snapshot_cluster(snapshotting_server: ServerProcess) -> Fluss:
    return Fluss(snapshotting_server.address)
