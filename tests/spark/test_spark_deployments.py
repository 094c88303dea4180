"""The connector on Spark as people deploy it, from the pyspark package alone: a standalone cluster (a
master and two one-core workers as processes) and a Spark Connect server. A user's application
(``deployment_client.py``, its own driver process) writes a DataFrame of NOT NULL columns into a new
primary-key table, reads it back, filters one key, and streams the table into a log table; on the standalone
cluster the tiering service is then submitted there (``spark-submit --master spark://… strom/tiering/app.py``)
for one round into Delta, read back by DuckDB."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strom.tiering import app as tiering_app
from tests.conftest import unique_name
from tests.spark.deployments import SPARK_HOME, ConnectServer, StandaloneCluster, spark_environment
from tests.spark.support import Fluss
from tests.spark.tiering_support import lake_uri, read_delta, tiering_config

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark_deployments"), pytest.mark.timeout(420)]

CLIENT = Path(__file__).parent / "deployment_client.py"
CLIENT_TIMEOUT_S = 300


def run_client(master: str, cluster: Fluss, prefix: str, work: Path, lake: bool = False) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(CLIENT), master, cluster.address, prefix, str(work),
                           "lake" if lake else "plain"],
                          capture_output=True, text=True, env=spark_environment(), timeout=CLIENT_TIMEOUT_S)
    assert done.returncode == 0, f"the application failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


EXPECTED = {"count": 20_000, "found": [{"id": 12345, "v": 24690, "s": "12345"}], "streamed": 20_000}


@pytest.fixture
def lake_server(server_factory: Any) -> Iterator[Fluss]:
    yield Fluss(server_factory(tiering_config("delta")).address)


def test_a_standalone_cluster_writes_reads_filters_streams_and_tiers(lake_server: Fluss, tmp_path: Path) -> None:
    standalone = StandaloneCluster(tmp_path / "standalone")
    try:
        prefix = unique_name("standalone")
        assert run_client(standalone.url, lake_server, prefix, tmp_path / "app", lake=True) == EXPECTED
        users = f"fluss.{prefix}_users"
        # the tiering service submitted to the cluster as people submit Spark applications
        submitted = subprocess.run(
            [str(SPARK_HOME / "bin" / "spark-submit"), "--master", standalone.url, "--conf", "spark.ui.enabled=false",
             "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
             "--conf", "spark.executor.memory=512m", tiering_app.__file__, "-b", lake_server.address,
             "--job-id", "standalone", "--once"],
            capture_output=True, text=True, env=spark_environment(), timeout=CLIENT_TIMEOUT_S)
        assert submitted.returncode == 0, submitted.stderr[-4000:]
    finally:
        standalone.stop()
    lake = read_delta(lake_uri(lake_server, users), "SELECT count(*) AS n, sum(v) AS v FROM lake").to_pylist()
    assert lake == [{"n": 20_000, "v": sum(2 * i for i in range(20_000))}]


def test_a_spark_connect_client_writes_reads_filters_and_streams(server: Any, tmp_path: Path) -> None:
    connect = ConnectServer(tmp_path / "connect")
    try:
        assert run_client(connect.url, Fluss(server.address), unique_name("connect"), tmp_path / "app") == EXPECTED
    finally:
        connect.stop()
