"""The operator's console in a real headless Chromium (Debian's, driven by Selenium) against a cluster of
processes — a coordinator, three tablet servers on ZooKeeper, ``strom gateway`` as its own process scraping
every member's Prometheus endpoint — under a stream of writes: each page loads, the table page names the
new leader after the old one is SIGKILLed, and the tiering page shows the lag falling after a round of the
real tiering service (Spark, into Delta). It lives with the Spark tests for that round's shared session.

Screenshots of every page are written under ``test-results/console/`` (or ``$STROM_TEST_RESULTS/console``)
for a person to look at; they are not committed."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.server.local_cluster import LocalCluster
from strom.zk.zookeeper_server import unavailable_reason
from tests.cluster.test_cluster_processes import FAST_SESSIONS, _wait_for_servers
from tests.conftest import unique_name
from tests.gateway.support import wait_ready
from tests.server_process import free_port
from tests.spark.support import Fluss, wait_until
from tests.spark.tiering_support import LAKE_TABLE, tier_once, tiering_config

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(480)]

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
WAIT_S = 60.0
RESULTS = Path(os.environ.get("STROM_TEST_RESULTS", Path(__file__).resolve().parents[2] / "test-results")) / "console"


def browser_unavailable() -> str | None:
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        return "Chromium and chromedriver are not installed (scripts/install-chromium.sh installs Debian's)"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    reason = browser_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(shutil.which("chromium"))
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1800", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(shutil.which("chromedriver"))), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class Writer(threading.Thread):
    """Upserts batches into a table until stopped, riding out a leader's death (retrying the batch)."""

    def __init__(self, bootstrap: str, path: TablePath) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.path = bootstrap, path
        self.stop_event = threading.Event()
        self.acknowledged = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._write())
        except BaseException as exc:
            self.error = exc

    async def _write(self) -> None:
        async with await Connection.create(self.bootstrap) as connection:
            writer = (await connection.get_table(self.path)).new_upsert().create_writer()
            batch = 0
            while not self.stop_event.is_set():
                ids = list(range(batch * 50, batch * 50 + 50))
                try:
                    await writer.upsert_batch(pa.table({"id": ids, "v": [f"w{batch}"] * 50}, schema=SCHEMA))
                except Exception:  # a leader going away: the batch is written again (an upsert, idempotent)
                    await asyncio.sleep(0.3)
                    continue
                self.acknowledged += 50
                batch += 1
                await asyncio.sleep(0.05)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive() and self.error is None, self.error


class GatewayProcess:
    """``strom gateway`` as a child process, stopped by its own pid."""

    def __init__(self, bootstrap: str, endpoints: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "strom.cli.main", "gateway", "--bootstrap", bootstrap,
             "--bind", f"127.0.0.1:{self.port}", "-D", f"gateway.console.metrics-endpoints={','.join(endpoints)}",
             "-D", "gateway.console.metrics-interval=500ms", "--log-level", "warning"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        wait_ready(self.url, lambda: self.process.poll() is None, log_path.read_text, WAIT_S)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


def leaders(bootstrap: str, path: TablePath) -> dict[int, int | None]:
    async def ask() -> dict[int, int | None]:
        async with await Connection.create(bootstrap) as connection:
            return {lead.bucket.bucket: lead.leader
                    for lead in await connection.get_admin().get_bucket_leaderships(path)}
    return asyncio.run(ask())


def test_every_console_page_in_chromium_on_a_cluster_under_writes(spark: Any, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    RESULTS.mkdir(parents=True, exist_ok=True)
    members = ("coordinator-1", "tablet-server-1", "tablet-server-2", "tablet-server-3")
    ports = {name: free_port() for name in members}
    config = tiering_config("delta", **{"datalake.delta.warehouse": str(tmp_path / "lake"),
                                        "kv.snapshot.interval": "1s", **FAST_SESSIONS})
    local = LocalCluster(tmp_path / "cluster", 3, config, member_config={
        name: {"metrics.reporter.prometheus.port": str(port)} for name, port in ports.items()}).start()
    gateway: GatewayProcess | None = None
    writer: Writer | None = None
    try:
        _wait_for_servers(local, 3)
        path = TablePath("fluss", unique_name("console_orders"))

        async def create() -> None:
            async with await Connection.create(local.bootstrap) as connection:
                await connection.get_admin().create_table(path, TableDescriptor(
                    Schema.from_arrow(SCHEMA, primary_key=["id"]), bucket_count=3,
                    properties={"table.replication.factor": "3", **LAKE_TABLE}, comment="written while we look"))
        asyncio.run(create())
        writer = Writer(local.bootstrap, path)
        writer.start()
        gateway = GatewayProcess(local.bootstrap, [f"127.0.0.1:{port}" for port in ports.values()],
                                 tmp_path / "gateway.log")
        wait_until(lambda: writer.acknowledged >= 500, "the first writes")

        def visit(page: str, name: str) -> Any:
            browser.get(f"{gateway.url}/console{page}{'&' if '?' in page else '?'}refresh=0")
            heading = browser.find_element(By.TAG_NAME, "h1").text
            browser.save_screenshot(str(RESULTS / f"{name}.png"))
            return heading

        # every page loads, under writes
        assert visit("/", "overview") == "Cluster overview"
        server_rows = browser.find_elements(By.CSS_SELECTOR, "#servers tbody tr[data-server]")
        assert {int(row.get_attribute("data-server")): row.get_attribute("data-state") for row in server_rows} == {
            1: "up", 2: "up", 3: "up"}
        assert "GREEN" in browser.find_element(By.ID, "health").text
        assert visit("/tables", "tables") == "Tables"
        assert str(path) in browser.find_element(By.ID, "tables").text
        table_page = f"/tables/{path.database_name}/{path.table_name}"
        assert visit(table_page, "table") == f"Table {path}"
        before = leaders(local.bootstrap, path)
        shown = {int(r.get_attribute("data-bucket")): r.find_element(By.CSS_SELECTOR, "td.leader").text
                 for r in browser.find_elements(By.CSS_SELECTOR, "#buckets tbody tr[data-bucket]")}
        assert shown == {bucket: str(leader) for bucket, leader in before.items()}
        isr = browser.find_element(By.CSS_SELECTOR, "#buckets tr[data-bucket='0'] td.isr").text
        assert sorted(int(i) for i in isr.split(", ")) == [1, 2, 3]
        for page, name, heading in (("/snapshots", "snapshots", "KV snapshots and leases"),
                                    ("/remote-log", "remote-log", "Remote log"), ("/rebalance", "rebalance", "Rebalance"),
                                    ("/configs", "configs", "Cluster configuration"), ("/acls", "acls", "ACLs")):
            assert visit(page, name) == heading

        # the leader of bucket 0 dies: the table page names its successor
        victim = before[0]
        assert victim is not None
        local.signal_member(local.member("tablet-server", victim), signal.SIGKILL)
        after = wait_until(lambda: (found := leaders(local.bootstrap, path))[0] not in (victim, None) and found,
                           "a new leader of bucket 0")
        visit(table_page, "table-after-leader-killed")
        shown = {int(r.get_attribute("data-bucket")): r.find_element(By.CSS_SELECTOR, "td.leader").text
                 for r in browser.find_elements(By.CSS_SELECTOR, "#buckets tbody tr[data-bucket]")}
        assert shown[0] == str(after[0]) and shown[0] != str(victim)
        assert all(text != str(victim) for text in shown.values()), shown
        def server_states() -> dict[int, str]:
            visit("/", "overview-after-leader-killed")
            return {int(row.get_attribute("data-server")): row.get_attribute("data-state")
                    for row in browser.find_elements(By.CSS_SELECTOR, "#servers tbody tr[data-server]")}

        wait_until(lambda: server_states() == {**dict.fromkeys({1, 2, 3} - {victim}, "up"), victim: "down"},
                   "the overview to show the killed server down")
        written = writer.acknowledged
        wait_until(lambda: writer.acknowledged > written + 200, "writes to go on after the failover")
        writer.finish()

        # tiering: the lag before a round, and after it
        def tiering_row() -> tuple[str, int, str]:
            visit("/tiering", "tiering")
            row = browser.find_element(By.CSS_SELECTOR, f"#tiering tr[data-table='{path}']")
            return (row.find_element(By.CSS_SELECTOR, "td.snapshot").text,
                    int(row.find_element(By.CSS_SELECTOR, "td.lag").text), row.find_element(By.CSS_SELECTOR, "td.state").text)

        snapshot_before, lag_before, _ = tiering_row()
        assert snapshot_before == "none" and lag_before >= writer.acknowledged // 3, lag_before
        browser.save_screenshot(str(RESULTS / "tiering-before-round.png"))
        cluster = Fluss(local.bootstrap)
        cluster.wait_for_snapshots_at_high_watermark(str(path), 3)  # a round tiers up to the KV snapshots
        tier_once(spark, cluster, job_id=unique_name("console-job"))
        snapshot_after, lag_after, state = tiering_row()
        browser.save_screenshot(str(RESULTS / "tiering-after-round.png"))
        assert snapshot_after != "none" and lag_after < lag_before and lag_after == 0, (lag_before, lag_after)
        assert state in ("Tiered", "Scheduled", "Pending", "Tiering")

        # the metrics page charts what the servers' endpoints said under those writes
        assert visit("/metrics", "metrics") == "Metrics"
        write_chart = browser.find_element(By.ID, "chart-write-requests-per-second")
        assert write_chart.find_elements(By.TAG_NAME, "polyline") and "PUT_KV" in write_chart.text
        lag_chart = browser.find_element(By.ID, "chart-tiering-lag")
        assert lag_chart.find_elements(By.TAG_NAME, "polyline")
        assert len(list(RESULTS.glob("*.png"))) >= 13
    finally:
        if writer is not None and writer.is_alive():
            writer.stop_event.set()
            writer.join(30)
        if gateway is not None:
            gateway.stop()
        local.stop()
