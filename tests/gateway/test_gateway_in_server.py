"""`strom server --gateway HOST:PORT`: the REST gateway and its console served by the server process itself
(on a thread of its own), configured by the server's `-D gateway.*` keys, stopped with the server."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from strom.cli.main import main as strom_cli
from tests.conftest import unique_name
from tests.gateway.support import wait_ready
from tests.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def server_with_gateway(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    process = ServerProcess(tmp_path / "data", {"gateway.rest.lookup.max-keys": "2"},
                            server_args=["--gateway", f"127.0.0.1:{port}"])
    process.start()  # ready once it answers RPCs; the gateway starts right after
    wait_ready(f"http://127.0.0.1:{port}", lambda: process.process is not None and process.process.poll() is None,
               process.log_text)
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        code = process.stop()
    assert code == 0, process.log_text()[-3000:]
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the gateway stopped with the server


def test_the_server_serves_the_gateway_and_its_console(server_with_gateway: tuple[ServerProcess, str]) -> None:
    server, base = server_with_gateway
    with httpx.Client(base_url=base, timeout=30) as http:
        assert http.get("/ready").json() == {"status": "ready"}
        name = unique_name("embedded")
        created = http.post("/v1/databases/fluss/tables", json={
            "name": name, "columns": [{"name": "id", "type": "INT"}, {"name": "v", "type": "STRING"}],
            "primary_key": ["id"]})
        assert created.status_code == 201, created.text
        table = f"/v1/databases/fluss/tables/{name}"
        assert http.post(f"{table}/rows:upsert", json={"rows": [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]}).json() == {
            "written": 2}
        assert http.post(f"{table}/lookup", json={"keys": [[1], [3]]}).json() == {"rows": [{"id": 1, "v": "a"}, None]}
        refused = http.post(f"{table}/lookup", json={"keys": [[1], [2], [3]]})
        assert refused.status_code == 400, "-D gateway.rest.lookup.max-keys=2 reached the gateway"
        page = http.get(f"/console/tables/fluss/{name}")
        assert page.status_code == 200 and f"Table fluss.{name}" in page.text
    log = server.log_text()
    assert f"gateway listening on {base}" in log
    assert "ignoring unknown config keys" not in log, "gateway.* keys are the gateway's, not the server's"


def test_gateway_keys_without_a_gateway_are_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(strom_cli, ["server", "--data-dir", str(tmp_path / "d"), "--bind", "127.0.0.1:0",
                                            "-D", "gateway.rest.lookup.max-keys=2"])
    assert result.exit_code == 2 and "give --gateway HOST:PORT too" in result.output
    result = CliRunner().invoke(strom_cli, ["server", "--workers", "2", "--gateway", "127.0.0.1:0",
                                            "--data-dir", str(tmp_path / "d"), "--bind", "127.0.0.1:0"])
    assert result.exit_code == 2 and "--workers 1" in result.output
