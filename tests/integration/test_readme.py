"""The README's examples run as written (against a test server instead of 127.0.0.1:9123)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.server_process import ServerProcess

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_block_after(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python example under {heading!r}"
    return match.group(1)


def test_the_pyfluss_quickstart_runs_and_prints_the_changelog(server: ServerProcess, capsys) -> None:  # type: ignore[no-untyped-def]
    code = _python_block_after("## Quickstart with the official client").replace("127.0.0.1:9123", server.address)
    exec(compile(code, "README quickstart", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "{'id': 1, 'name': 'Ada', 'age': 37}"
    assert [line.split()[1] for line in printed[1:]] == ["+I", "+I", "-U", "+U", "-D"]


def test_the_strom_client_example_runs(server: ServerProcess, capsys) -> None:  # type: ignore[no-untyped-def]
    code = _python_block_after("## strom's own client").replace("127.0.0.1:9123", server.address)
    wrapped = "import asyncio\nasync def example():\n" + "".join(f"    {line}\n" for line in code.splitlines())
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(wrapped + "asyncio.run(example())\n", "README client example", "exec"), namespace)
    printed = capsys.readouterr().out.split()
    assert printed[0] == "2"  # the scan saw both rows (the test server takes no snapshots: no lease output)
