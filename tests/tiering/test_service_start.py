"""``strom tiering`` checks its server before it starts Spark: a server that is down, or that refuses the
job's credentials, is one line on stderr and exit code 1 — no Spark start-up, no traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tests.integration.security_support import SECURE_CONFIG
from tests.server_process import ServerProcess, free_port


def _tiering(*arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "strom.cli.main", "tiering", "--once", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _assert_one_line_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strom tiering: cannot use the server at"), done.stderr
    assert expected in lines[0]
    assert "Traceback" not in done.stderr + done.stdout and "Spark" not in done.stderr + done.stdout


def test_a_server_that_is_down_is_one_line_and_no_spark() -> None:
    address = f"127.0.0.1:{free_port()}"
    _assert_one_line_error(_tiering("-b", address), "ConnectionFailedError: no bootstrap server answered")


def test_refused_credentials_are_one_line_and_no_spark(server_factory: Callable[..., ServerProcess]) -> None:
    secured = server_factory(SECURE_CONFIG)
    done = _tiering(
        "-b", secured.address,
        "-D", "client.security.protocol=SASL", "-D", "client.security.sasl.mechanism=PLAIN",
        "-D", "client.security.sasl.username=alice", "-D", "client.security.sasl.password=wrong",
    )
    _assert_one_line_error(done, "AuthenticationError")
