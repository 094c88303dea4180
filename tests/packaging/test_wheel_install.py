"""What a user installs works: the wheel, built from this checkout and installed without extras into a clean
virtual environment, gives a ``strom`` command whose server serves the official client.

The wheel is built and installed once per run (pip fetches the build requirements and the dependencies,
from its cache after the first time); the server then runs from that environment alone, with no path to
this checkout, and pyfluss (from the test environment) writes and reads through it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import fluss
import pyarrow as pa
import pytest

from strom.kv import rocksdb
from strom.server.local_cluster import alive
from tests.server_process import ServerProcess, WorkersProcess

ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_S = 900

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel"), pytest.mark.timeout(PIP_TIMEOUT_S + 120)]


def _run(command: list[str], cwd: Path, timeout: float = PIP_TIMEOUT_S) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def clean_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtual environment holding the wheel of this checkout and its required dependencies only."""
    work = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(work / "dist"), str(ROOT)], work)
    (wheel,) = (work / "dist").glob("strom-*.whl")
    environment = work / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(environment)
    _run([str(environment / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)], work)
    yield environment


def test_the_wheel_installs_without_extras(clean_install: Path, tmp_path: Path) -> None:
    python = str(clean_install / "bin" / "python")
    where = _run([python, "-c", "import strom; print(strom.__file__)"], tmp_path)
    assert Path(where.strip()).is_relative_to(clean_install), "strom must come from the wheel, not the checkout"
    # no optional extra crept in: a cluster's ZooKeeper client and Spark are not there
    missing = _run([python, "-c", "import importlib.util as u; print(u.find_spec('kazoo'), u.find_spec('pyspark'))"], tmp_path)
    assert missing.split() == ["None", "None"]


def test_strom_help_runs_from_the_wheel(clean_install: Path, tmp_path: Path) -> None:
    shown = _run([str(clean_install / "bin" / "strom"), "--help"], tmp_path, timeout=60)
    assert "server" in shown and "tiering" in shown


def test_the_wheel_s_server_serves_pyfluss(clean_install: Path, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", strom_command=[str(clean_install / "bin" / "strom")]).start()
    try:
        async def write_and_read() -> dict[str, object] | None:
            connection = await fluss.FlussConnection.create(fluss.Config({"bootstrap.servers": server.address}))
            try:
                path = fluss.TablePath("fluss", "from_the_wheel")
                schema = fluss.Schema(pa.schema([("id", pa.int32()), ("name", pa.string())]), primary_keys=["id"])
                await connection.get_admin().create_table(path, fluss.TableDescriptor(schema, bucket_count=2))
                table = await connection.get_table(path)
                writer = table.new_upsert().create_writer()
                writer.upsert({"id": 7, "name": "seven"})
                await writer.flush()
                found: dict[str, object] | None = await table.new_lookup().create_lookuper().lookup({"id": 7})
                return found
            finally:
                await connection.close()

        assert asyncio.run(write_and_read()) == {"id": 7, "name": "seven"}
        # the wheel carries the RocksDB binding the checkout was built with (make install builds the native one
        # where it can; a plain wheel build takes it from the same cache)
        expected = "native" if rocksdb.NATIVE_AVAILABLE else "rocksdict"
        assert f"through the {expected} binding" in server.log_text()
    finally:
        assert server.stop() == 0, server.log_text()[-3000:]


def test_the_wheel_s_workers_serve_pyfluss_without_zookeeper_s_client(clean_install: Path, tmp_path: Path) -> None:
    """`strom server --workers 2` from the wheel (no kazoo): the coordinator and both workers start, a table's
    buckets spread over them, and pyfluss writes and reads through the bootstrap address."""
    supervisor = WorkersProcess(tmp_path / "data", 2, strom_command=[str(clean_install / "bin" / "strom")])
    members = supervisor.members()
    try:
        async def write_and_read() -> list[dict[str, object] | None]:
            connection = await fluss.FlussConnection.create(fluss.Config({"bootstrap.servers": supervisor.bootstrap}))
            try:
                path = fluss.TablePath("fluss", "from_the_wheel_s_workers")
                schema = fluss.Schema(pa.schema([("id", pa.int32()), ("name", pa.string())]), primary_keys=["id"])
                await connection.get_admin().create_table(path, fluss.TableDescriptor(schema, bucket_count=4))
                table = await connection.get_table(path)
                writer = table.new_upsert().create_writer()
                for key in range(20):
                    writer.upsert({"id": key, "name": f"n{key}"})
                await writer.flush()
                lookuper = table.new_lookup().create_lookuper()
                return [await lookuper.lookup({"id": key}) for key in range(20)]
            finally:
                await connection.close()

        assert asyncio.run(write_and_read()) == [{"id": key, "name": f"n{key}"} for key in range(20)]
        with sqlite3.connect(tmp_path / "data" / "cluster.sqlite") as db:  # both workers lead buckets of it
            leaders = {json.loads(state)["leader"] for (state,) in db.execute("SELECT state FROM membership_bucket_states")}
        assert leaders == {1, 2}
    finally:
        assert supervisor.stop() == 0, supervisor.log_text()[-3000:]
    assert not any(alive(pid) for pid in members.values())
