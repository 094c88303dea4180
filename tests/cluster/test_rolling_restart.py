"""A rolling restart (SIGTERM, start again, next server) of every tablet server under pyfluss writes: each
stopping server first has the coordinator move its leaderships to in-sync replicas (ControlledShutdown,
api key 1043), so no bucket is left without a leader while the server goes, and nothing acknowledged is
lost. The ZooKeeper session timeout is set long (30 s) so that only the controlled shutdown can explain
writes that keep flowing."""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.client import Connection, TableBucket
from strom.server.local_cluster import LocalCluster
from tests.cluster.test_cluster_processes import SECURITY, _cluster, rows
from tests.cluster.test_replication import (
    PK_FIELDS,
    PYFLUSS_WRITER,
    States,
    create,
    pyfluss_writer_environment,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

CONFIG = {"zookeeper.client.session-timeout": "30s", "log.replica.max-lag-time": "60s",
          "log.replica.max-silence-time": "60s", "kv.snapshot.interval": "0s"}
WRITES_MAX = 100_000
GAP_MAX_S = 10.0
"""Longest pause between two acknowledged writes; a stop without ControlledShutdown would leave the
stopped server's buckets leaderless for the 30 s session timeout."""


@pytest.fixture(params=SECURITY)
def three(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path / "cluster", 3, CONFIG, secure=request.param == "secure")


class _Writer:
    """pyfluss upserting key after key in a process of its own; records when each key was acknowledged.

    ``replace_silent_after_s``: a writer silent that long is replaced by a new one going on from the first
    key not acknowledged, for the tests where a bucket's leader moves with a batch in flight: pyfluss
    1.0.0's writer then goes silent for good (docs/cluster.md, "pyfluss during a failover"). None (the
    rolling restart): a silent writer fails the test."""

    def __init__(self, local: LocalCluster, path: object, replace_silent_after_s: float | None = None) -> None:
        self.tag = "rolling"
        """The value every upsert writes."""
        self.acknowledged: list[tuple[int, float]] = []
        self.other: list[str] = []
        self.replaced = 0
        self._local, self._path = local, path
        self._replace_silent_after_s = replace_silent_after_s
        self._start(0)

    def _start(self, first: int) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(PYFLUSS_WRITER), self._local.pyfluss_bootstrap, self._path.database_name,  # type: ignore[attr-defined]
             self._path.table_name, str(first), str(WRITES_MAX - first), self.tag],  # type: ignore[attr-defined]
            env=pyfluss_writer_environment(self._local), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self._started = time.monotonic()
        self._reader = threading.Thread(target=self._read, args=(self._process,), daemon=True)
        self._reader.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.strip()
            if line.isdigit():
                self.acknowledged.append((int(line), time.monotonic()))
            else:
                self.other.append(line)

    def _replace_if_silent(self) -> None:
        if self._replace_silent_after_s is None:
            return
        last = max(self._started, self.acknowledged[-1][1] if self.acknowledged else 0.0)
        if time.monotonic() - last > self._replace_silent_after_s:
            self._stop_process()
            self.replaced += 1
            self._start(self.acknowledged[-1][0] + 1 if self.acknowledged else 0)

    def wait_for(self, count: int, within_s: float = 30.0) -> None:
        deadline = time.monotonic() + within_s
        while len(self.acknowledged) < count:
            assert time.monotonic() < deadline, f"pyfluss acknowledged only {len(self.acknowledged)}: {self.other[-3:]}"
            self._replace_if_silent()
            time.sleep(0.05)

    def assert_steady_and_kept(self, what: str, stored: dict[int, str], gap_max_s: float = GAP_MAX_S) -> None:
        """No two acknowledgements were more than ``gap_max_s`` apart, and every acknowledged key is in
        ``stored`` (the table read back) with the writer's value."""
        times = [at for _, at in self.acknowledged]
        longest = max(later - earlier for earlier, later in itertools.pairwise(times))
        print(f"{what}: {len(times)} pyfluss writes acknowledged, longest pause {longest:.2f} s, "
              f"{self.replaced} silent writers replaced")
        assert longest < gap_max_s, f"writes stalled for {longest:.1f} s"
        missing = {key for key, _ in self.acknowledged} - stored.keys()
        assert not missing, f"acknowledged and lost: {sorted(missing)[:10]}"
        assert {stored[key] for key, _ in self.acknowledged} == {self.tag}

    def stop(self) -> None:
        self._stop_process()

    def _stop_process(self) -> None:
        self._process.kill()
        self._process.wait(10)
        self._reader.join(10)


def test_a_rolling_restart_under_pyfluss_writes_loses_nothing_and_never_stalls(three: LocalCluster) -> None:
    async def setup() -> tuple[object, TableBucket]:
        async with await Connection.create(three.client_config()) as connection:
            path = await create(connection, PK_FIELDS, ["id"])
            return path, TableBucket((await connection.get_admin().get_table_info(path)).table_id, 0)

    path, bucket = asyncio.run(setup())
    states = States(three)
    writer = _Writer(three, path)
    try:
        states.wait_full_isr(bucket)
        writer.wait_for(20)
        for server_id in (1, 2, 3):
            member = three.member("tablet-server", server_id)
            assert three.signal_member(member, signal.SIGTERM) == 0, f"tablet server {server_id} stopped uncleanly"
            written = len(writer.acknowledged)
            writer.wait_for(written + 20)  # writes go on while the server is down
            three.start_member("tablet-server", server_id)
            states.wait_full_isr(bucket)
            log_text = Path(member.log).read_text(errors="replace")
            assert "controlled shutdown: every leadership moved off" in log_text, f"server {server_id}"
        writer.wait_for(len(writer.acknowledged) + 20)
    finally:
        writer.stop()
        states.close()
    writer.assert_steady_and_kept("rolling restart", asyncio.run(_rows(three, path)))


async def _rows(local: LocalCluster, path: object) -> dict[int, str]:
    async with await Connection.create(local.client_config()) as connection:
        return await rows(connection, path)  # type: ignore[arg-type]

