"""The code blocks of README.md and docs/*.md, which tests run each one, and the means to run them as a
reader would.

A newcomer copies these blocks first, so each must work exactly as written. The tests take a block's text
from the document itself (never a copy), change only what a test must change — the server address
``127.0.0.1:9123`` and other addresses, to the test's own servers — and run it the way the document says:
Python blocks as a script file in ``.venv/bin/python``, shell lines with the venv's ``strom``, Spark blocks
in the test run's one Spark session. ``REGISTRY`` in tests/docs/test_snippets.py names the test that runs
each block; its coverage test fails on a block nobody runs, so a block added later needs a test before CI
passes.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.server_process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", *sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")))
ADDRESS = "127.0.0.1:9123"
"""The address every document's examples use: `make run`'s server."""
VENV_BIN = ".venv/bin/"
"""How the documents name the venv's programs; tests run this interpreter's (``sys.executable``'s) instead."""
RUN_LANGUAGES = frozenset({"python", "sh", "yaml"})
"""Fenced blocks of these languages are code a reader runs (or, for yaml, a config file a server reads)."""
KNOWN_LANGUAGES = RUN_LANGUAGES | {""}
"""A block without a language is an output sample or a drawing; any other language is refused, so that a
```bash or ```console block cannot slip past the registry."""
SCRIPT_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 120

SPARK_TESTS = "tests/spark/test_doc_snippets.py"
DOC_TESTS = "tests/docs/test_snippets.py"
CLUSTER_DOC_TESTS = "tests/cluster/test_rebalance.py"
"""Runs the blocks that need a cluster of several tablet servers."""


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is (file, the heading above it, its position under that heading)."""

    file: str
    heading: str
    index: int
    language: str
    code: str
    line: int

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.file, self.heading, self.index)

    def __str__(self) -> str:
        return f"{self.file}:{self.line} (```{self.language} block {self.index} under {self.heading!r})"


_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def extract(file: str) -> list[Block]:
    """Every fenced block of a document, with the heading it is under (headings inside blocks are code)."""
    blocks: list[Block] = []
    heading = "(top)"
    per_heading: dict[str, int] = {}
    fence: str | None = None
    language = ""
    start = 0
    body: list[str] = []
    for number, line in enumerate((ROOT / file).read_text().splitlines(), start=1):
        if fence is None:
            match = _FENCE.match(line)
            if match:
                fence, language, start, body = match.group(1), match.group(2).lower(), number, []
                continue
            heading_match = _HEADING.match(line)
            if heading_match:
                heading = heading_match.group(1)
        elif line.strip() == fence:
            index = per_heading.get(heading, 0)
            per_heading[heading] = index + 1
            blocks.append(Block(file, heading, index, language, "\n".join(body) + "\n", start))
            fence = None
        else:
            body.append(line)
    assert fence is None, f"{file}:{start}: a code block is never closed"
    return blocks


def all_blocks() -> list[Block]:
    return [block for file in DOCUMENTS for block in extract(file)]


def snippet(file: str, heading: str, index: int) -> Block:
    """The block a test runs, by where it is; call it with literal arguments, so that the coverage test
    (tests/docs/test_snippets.py) sees which test runs which block."""
    key = (file, heading, index)
    found = [block for block in extract(file) if block.key == key]
    assert found, f"{file} has no block {index} under the heading {heading!r} any more"
    return found[0]


def snippet_calls(module: Path) -> dict[tuple[str, str, int], set[str]]:
    """Which test functions of a module fetch which block (``snippet(...)`` calls with literal arguments)."""
    calls: dict[tuple[str, str, int], set[str]] = {}
    for function in ast.walk(ast.parse(module.read_text())):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "snippet":
                try:
                    args = tuple(ast.literal_eval(arg) for arg in node.args)
                except ValueError:
                    raise AssertionError(f"{module.name}:{node.lineno}: snippet() takes literal arguments, so "
                                         "that this test can see which blocks are run") from None
                calls.setdefault(args, set()).add(f"{module.relative_to(ROOT)}::{function.name}")
    return calls


# ---- changing a block as little as a test must ----


def substituted(code: str, substitutions: Mapping[str, str]) -> str:
    """``code`` with each key replaced; every key must occur, so a stale substitution cannot hide a change."""
    for old, new in substitutions.items():
        assert old in code, f"the block no longer contains {old!r}:\n{code}"
        code = code.replace(old, new)
    return code


def venv_command(line: str, substitutions: Mapping[str, str]) -> list[str]:
    """One shell line as an argument list, its ``.venv/bin/`` program taken from this test's venv."""
    words = shlex.split(substituted(line, substitutions), comments=True)
    assert words and words[0].startswith(VENV_BIN), f"expected a {VENV_BIN} program: {line}"
    return [str(Path(sys.executable).parent / words[0].removeprefix(VENV_BIN)), *words[1:]]


def shell_lines(block: Block) -> list[str]:
    return [line for line in block.code.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# ---- running blocks ----


EXITING = "strom-docs-tests: the script has finished"
"""Printed to stderr by an ``atexit`` hook (a ``sitecustomize`` the tests put on ``PYTHONPATH``) once a
script's last statement has run and the interpreter starts to shut down."""
_EXIT_HOOK = f"import atexit, sys\natexit.register(lambda: print({EXITING!r}, file=sys.stderr, flush=True))\n"


def run_script(block: Block, cwd: Path, substitutions: Mapping[str, str] | None = None) -> list[str]:
    """Run a Python block as a script file with this venv's Python in ``cwd``; returns its printed lines.

    One failure is tolerated, and only for blocks that use pyfluss: a process killed by a signal *after* its
    script finished (the exit hook printed). pyfluss 1.0's Tokio threads keep running while the interpreter
    shuts down and, on a busy machine, now and then abort it there (pyo3-async-runtimes has no shutdown hook);
    the script's work is done and its output complete, which the callers assert line by line.
    """
    scripts = cwd.parent / "snippet-scripts"
    (scripts / "site").mkdir(parents=True, exist_ok=True)
    (scripts / "site" / "sitecustomize.py").write_text(_EXIT_HOOK)
    name = re.sub(r"\W+", "_", f"{block.file}_{block.heading}_{block.index}").strip("_")
    script = scripts / f"{name}.py"
    script.write_text(substituted(block.code, substitutions or {}))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(scripts / "site"),
                                                                            os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, env=environment,
                          timeout=SCRIPT_TIMEOUT_S, check=False)
    finished = EXITING in done.stderr
    crashed_at_exit = done.returncode < 0 and finished and re.search(r"^import fluss$", block.code, re.M)
    if crashed_at_exit:
        warnings.warn(f"{block}: pyfluss killed the interpreter at exit ({signal.Signals(-done.returncode).name}) "
                      "after the script finished", stacklevel=2)
    else:
        assert done.returncode == 0 and finished, (
            f"{block} failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}")
    return done.stdout.splitlines()


def run_command(line: str, cwd: Path, substitutions: Mapping[str, str] | None = None,
                timeout_s: float = COMMAND_TIMEOUT_S, expect_code: int = 0) -> str:
    """Run one shell line of a block to completion; returns its standard output."""
    done = subprocess.run(venv_command(line, substitutions or {}), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    assert done.returncode == expect_code, (
        f"`{line}` exited with {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def exec_in_session(block: Block, namespace: dict[str, Any], substitutions: Mapping[str, str]) -> None:
    """Run a Spark block in this process (the test run's one Spark session), in ``namespace``."""
    exec(compile(substituted(block.code, substitutions), str(block), "exec"), namespace)


class CommandProcess(ServerProcess):
    """A documented command that serves until stopped (``strom server``, ``strom coordinator``, …), run in
    the background in ``cwd``: ready when it answers on ``port``, stopped by its own pid."""

    def __init__(self, command: Sequence[str], cwd: Path, port: int, name: str) -> None:
        super().__init__(cwd / name, port=port)
        self.command = list(command)
        self.cwd = cwd
        self.log_path = cwd.parent / f"{name}.log"

    def start(self) -> CommandProcess:
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(self.command, cwd=self.cwd, stdout=log_file, stderr=subprocess.STDOUT)
        self._wait_ready()
        return self

    def interrupt(self) -> int:
        """Ctrl-C: SIGINT by pid, and the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"`{' '.join(self.command)}` did not stop on SIGINT") from None


# ---- the Makefile ----


def make_rule(target: str) -> tuple[list[str], list[str]]:
    """A Makefile rule's prerequisites and recipe lines, ``$(VAR)`` expanded from its ``VAR := value`` lines
    (targets named by a variable, like ``$(STAMP)``, are found by their expanded name)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    variables = {m.group(1): m.group(2).strip() for m in map(re.compile(r"^([A-Z_]+)\s*[:?]?=\s*(.*)$").match, lines) if m}

    def expand(text: str) -> str:
        while (match := re.search(r"\$\((\w+)\)", text)) and match.group(1) in variables:
            text = text.replace(match.group(0), variables[match.group(1)])
        return text

    for i, line in enumerate(lines):
        match = re.match(r"^([^\s:#=]+)\s*:(?!=)(.*)$", line)
        if match and expand(match.group(1)) == target:
            recipe = []
            for body in lines[i + 1 :]:
                if not body.startswith("\t"):
                    break
                if not body.strip().startswith("#"):
                    recipe.append(expand(body.strip()))
            return expand(match.group(2)).split(), recipe
    raise AssertionError(f"the Makefile has no target {target}")


def make_recipe(target: str) -> list[str]:
    return make_rule(target)[1]


def make_prerequisites(target: str) -> list[str]:
    return make_rule(target)[0]


def make_run_command() -> list[str]:
    """`make run`'s server command, the one every docs test starts its server with."""
    [command] = make_recipe("run")
    return shlex.split(command)


@contextmanager
def make_run_server(cwd: Path) -> Iterator[CommandProcess]:
    """`make run`'s server in ``cwd`` (so ``strom-data`` is where the documents say it is), on a free port;
    it must stop cleanly on Ctrl-C, as the README promises."""
    cwd.mkdir(parents=True, exist_ok=True)
    port = free_port()
    substitutions = {ADDRESS: f"127.0.0.1:{port}"}
    command = venv_command(shlex.join(make_run_command()), substitutions)
    server = CommandProcess(command, cwd, port, "make-run-server").start()
    try:
        yield server
    finally:
        code = server.interrupt()
        assert not server.internal_errors(), server.internal_errors()[:5]
        assert code == 0, f"`make run`'s server exited with {code} on SIGINT:\n{server.log_text()[-3000:]}"


@dataclass
class Readme:
    """`make run`'s server in ``cwd`` (its data in ``cwd/strom-data``), and what the README's scripts
    printed there; later examples build on the tables the quickstart and the client example create."""

    server: CommandProcess
    cwd: Path
    printed: dict[str, list[str]] = field(default_factory=dict)

    @property
    def at_server(self) -> dict[str, str]:
        """The one substitution a script against `make run`'s server needs."""
        return {ADDRESS: self.server.address}


def wait_until(condition: Any, timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(interval_s)
