"""Spark as people deploy it, from the pyspark package alone: a standalone cluster (a master and workers as
processes) and a Spark Connect server, each started on free loopback ports and stopped by its pids."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyspark

from tests.server_process import free_port

SPARK_HOME = Path(pyspark.__file__).parent
READY_S = 120.0
STOP_S = 20.0


def spark_environment() -> dict[str, str]:
    """What every Spark process of the tests runs with: this venv's Python for the Python workers (where
    strom is importable), loopback addresses only."""
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_HOSTNAME": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}


class _JavaProcess:
    def __init__(self, command: list[str], log_path: Path, ready_line: str) -> None:
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=spark_environment())
        deadline = time.monotonic() + READY_S
        while ready_line not in self.log_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{command[:3]} did not get ready:\n{self.log_text()[-3000:]}")
            time.sleep(0.2)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_S)


class StandaloneCluster:
    """``spark-class …Master`` and ``workers`` × ``spark-class …Worker`` (one core, 1 GiB each)."""

    def __init__(self, directory: Path, workers: int = 2) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        self.master = _JavaProcess(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
             "--webui-port", str(free_port())],
            directory / "master.log", "I have been elected leader")
        self.workers: list[_JavaProcess] = []
        try:
            for index in range(workers):
                self.workers.append(_JavaProcess(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                     "--memory", "1g", "--work-dir", str(directory / f"worker-{index}"), "--webui-port",
                     str(free_port()), self.url],
                    directory / f"worker-{index}.log", "Successfully registered with master"))
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def stop(self) -> None:
        for process in [*self.workers, self.master]:
            process.stop()


class ConnectServer:
    """A Spark Connect server (``spark-submit --class …SparkConnectServer``) on ``local[2]``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.server = _JavaProcess(
            [str(SPARK_HOME / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--master", "local[2]", "--name", "strom-connect-tests",
             "--conf", f"spark.connect.grpc.binding.port={self.port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
             "--conf", "spark.driver.bindAddress=127.0.0.1",
             "--conf", f"spark.sql.warehouse.dir={directory / 'warehouse'}"],
            directory / "connect.log", "Spark Connect server started")

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop()
