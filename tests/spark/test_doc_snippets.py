"""The Spark and lake examples of README.md and docs/*.md run as written: Spark blocks in this run's one
Spark session (a block's own ``SparkSession.builder...getOrCreate()`` returns it), the rest as scripts and
commands (see tests/docs/snippets.py). It lives beside the other Spark tests for their session-scoped
``spark`` fixture: a second definition elsewhere would be a second session."""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strom.spark import FlussDataSource
from tests.docs.snippets import (
    CommandProcess,
    Readme,
    exec_in_session,
    make_recipe,
    make_run_server,
    run_command,
    run_script,
    shell_lines,
    snippet,
    venv_command,
    wait_until,
)
from tests.server_process import free_port
from tests.spark.support import Fluss

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def readme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Readme]:
    """`make run`'s server with the README's tables (`users` from the quickstart, `orders` from strom's
    client), which the Spark and lake examples read. Spark's workers do not run in ``cwd``: they find the
    snapshot files because the server records them under an absolute path."""
    cwd = tmp_path_factory.mktemp("readme-spark") / "work"
    with make_run_server(cwd) as server:
        story = Readme(server, cwd)
        quickstart = snippet("README.md", "Quickstart with the official client (pyfluss)", 0)
        assert run_script(quickstart, cwd, story.at_server)[0] == "{'id': 1, 'name': 'Ada', 'age': 37}"
        assert run_script(snippet("README.md", "strom's own client", 0), cwd, story.at_server)[0] == "2"
        yield story


@pytest.fixture
def session_namespace(spark: Any) -> Iterator[dict[str, Any]]:
    """Globals for Spark blocks run as a script's ``__main__``; afterwards the plain ``fluss`` source is
    registered again (``strom.spark.register`` swaps in the pushdown one, which other tests do not expect)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    yield namespace
    spark.dataSource.register(FlussDataSource)


def test_readme_spark(spark: Any, readme: Readme, session_namespace: dict[str, Any], capsys: Any) -> None:
    """The README's Spark block: what it shows, the table its write creates, the changes it reads."""
    exec_in_session(snippet("README.md", "Spark", 0), session_namespace, readme.at_server)
    assert session_namespace["spark"] is spark, "getOrCreate() must return the running session"
    printed = capsys.readouterr().out
    assert "|  n|" in printed and "|  2|" in printed, printed  # SELECT count(*) AS n FROM orders
    cluster = Fluss(readme.server.address)
    assert sorted(row["id"] for row in cluster.rows("fluss.orders_copy")) == [1, 2]
    copy = cluster.describe("fluss.orders_copy")
    assert (copy.primary_key, copy.bucket_count, copy.column_names) == (["id"], 4, ["id", "amount"])
    changes = session_namespace["changes"].collect()
    assert sorted((r.id, r.amount, r._change_type) for r in changes) == [(1, 9.5, "+I"), (2, 3.0, "+I")]
    assert None not in {r._log_offset for r in changes} and None not in {r._commit_timestamp for r in changes}
    assert "|  1|   9.5|          +I|" in printed and "|  2|   3.0|          +I|" in printed, printed


@pytest.mark.slow
def test_readme_lake_tiering_and_the_lake_docs(
    spark: Any, readme: Readme, session_namespace: dict[str, Any], capsys: Any
) -> None:
    """The README's lake path (enable, one tiering round with `strom tiering --once`, DuckDB and a union
    read), then the lake examples of docs/tiering.md and docs/lake.md on the lake that round wrote, in the
    directory `make run` started in (so `strom-data/lake` is where they say)."""
    enable = snippet("README.md", "Lake tiering", 0)
    tiering = snippet("README.md", "Lake tiering", 1)
    duckdb_read = snippet("README.md", "Lake tiering", 2)
    union_read = snippet("README.md", "Lake tiering", 3)
    assert run_script(enable, readme.cwd, readme.at_server) == []
    once, status = shell_lines(tiering)

    def state() -> str:
        [table] = json.loads(run_command(status + " --json", readme.cwd, readme.at_server))["tables"]
        return str(table["state"])

    # as a reader would, start the service once the table is due (one freshness, 10 s, after enabling): a
    # service that finds nothing due asks again only after tiering.poll.table.interval (30 s)
    wait_until(lambda: state() == "Pending", 30, "fluss.orders to become due for tiering", interval_s=1.0)
    run_command(once, readme.cwd, readme.at_server, timeout_s=240)
    shown = run_command(status, readme.cwd, readme.at_server)
    assert "fluss.orders" in shown and "Scheduled" in shown, shown
    [described] = json.loads(run_command(status + " --json", readme.cwd, readme.at_server))["tables"]
    assert (described["table_path"], described["state"], described["lake_snapshot_id"]) == ("fluss.orders", "Scheduled", 1)
    assert sum(entry["offset"] for entry in described["bucket_offsets"]) == 2, "both upserts are in the lake"
    assert run_script(duckdb_read, readme.cwd) == ["2"]

    capsys.readouterr()
    exec_in_session(union_read, session_namespace, readme.at_server)
    assert capsys.readouterr().out.split()[-1] == "2"
    assert session_namespace["orders"].count() == 2

    # docs/tiering.md: `make run` and the service line cannot finish inside a test (both serve until
    # Ctrl-C); the service line is the README's `--once` line, which ran above, without `--once`
    make_run, service, tiering_status = shell_lines(snippet("docs/tiering.md", "In a few lines", 0))
    assert shlex.split(make_run, comments=True) == ["make", "run"]
    assert "--data-dir strom-data" in make_recipe("run")[0]  # "its lake lives in strom-data/lake"
    assert (readme.cwd / "strom-data/lake/fluss/orders/_delta_log").is_dir()
    assert [*shlex.split(service, comments=True), "--once"] == shlex.split(once, comments=True)
    assert "fluss.orders" in run_command(tiering_status, readme.cwd, readme.at_server)
    assert run_script(snippet("docs/tiering.md", "Reading the lake", 0), readme.cwd) == ["[(1, 9.5), (2, 3.0)]"]

    columns, partitioning, *files, commit_user = run_script(
        snippet("docs/lake.md", "Reading the lake yourself", 0), readme.cwd)
    assert (columns, partitioning, commit_user) == (
        "['id', 'amount', '__bucket', '__offset', '__timestamp']", "['__bucket']", "__fluss_lake_tiering")
    assert sorted(files) == ["{'partition.__bucket': 0, 'num_records': 1, 'min.id': 1, 'max.id': 1}",
                             "{'partition.__bucket': 2, 'num_records': 1, 'min.id': 2, 'max.id': 2}"]


def test_spark_doc(spark: Any, readme: Readme, session_namespace: dict[str, Any], capsys: Any) -> None:
    """docs/spark.md's examples, the later ones continuing in the first one's session and globals."""
    exec_in_session(snippet("docs/spark.md", "The Spark connector", 0), session_namespace, readme.at_server)
    assert session_namespace["spark"] is spark
    printed = capsys.readouterr().out
    assert "|  1|   9.5|" in printed and "|  2|" not in printed, printed  # where amount > 5
    assert sorted(row["id"] for row in Fluss(readme.server.address).rows("fluss.orders_copy")) == [1, 2]

    exec_in_session(snippet("docs/spark.md", "Time-based reads", 0), session_namespace, readme.at_server)
    assert session_namespace["changes"].count() == 0, "nothing was written on 2026-01-02"
    capsys.readouterr()

    exec_in_session(snippet("docs/spark.md", "The `$binlog` form", 0), session_namespace, readme.at_server)
    printed = capsys.readouterr().out
    assert "|  1| 36| 37|" in printed, printed  # Ada's update in the quickstart

    exec_in_session(snippet("docs/spark.md", "Spark SQL by name", 0), session_namespace, readme.at_server)
    printed = capsys.readouterr().out
    assert "|  2| 12.5|" in printed, printed

    exec_in_session(snippet("docs/spark.md", "Spark SQL by name", 1), session_namespace, readme.at_server)
    printed = capsys.readouterr().out
    assert "|  1|/home|" in printed and "|  2|/blog|" in printed and "/docs" not in printed, printed
    assert Fluss(readme.server.address).describe("fluss.clicks").info.schema.primary_key == ("id",)


@contextlib.contextmanager
def _one_documented_round(tmp_path: Any, blocks: list[Any], documented_address: str, name: str) -> Iterator[Path]:
    """Run a lake format's documented blocks up to its round: the server line in the background on a free
    port, the script that creates and fills the table, and `strom tiering --once` once the table is due.
    Yields the directory the blocks ran in; stops the server by its pid afterwards."""
    start, create, tiering = blocks
    cwd = Path(tmp_path) / "work"
    cwd.mkdir()
    port = free_port()
    at_server = {documented_address: f"127.0.0.1:{port}"}
    [line] = shell_lines(start)
    command = [word for word in venv_command(line, at_server) if word != "&"]
    server = CommandProcess(command, cwd, port, f"{name}-server").start()
    try:
        assert run_script(create, cwd, at_server) == []
        [once] = shell_lines(tiering)

        def due() -> bool:
            status = f".venv/bin/strom tiering status -b 127.0.0.1:{port} --json"
            [table] = json.loads(run_command(status, cwd))["tables"]
            return str(table["state"]) == "Pending"

        wait_until(due, 30, f"the {name} example's table to become due for tiering", interval_s=1.0)
        run_command(once, cwd, at_server, timeout_s=240)
        yield cwd
    finally:
        code = server.stop()
    assert code == 0, server.log_text()[-3000:]


@pytest.mark.slow
def test_lance_lake_doc(tmp_path: Any) -> None:
    """docs/lake.md's Lance example as written: a server tiering into Lance, a log table, one
    `strom tiering --once` round once the table is due, and the dataset read back with pylance."""
    blocks = [snippet("docs/lake.md", "The Lance dataset", 0), snippet("docs/lake.md", "The Lance dataset", 1),
              snippet("docs/lake.md", "The Lance dataset", 2)]
    with _one_documented_round(tmp_path, blocks, "127.0.0.1:9124", "lance") as cwd:
        assert run_script(snippet("docs/lake.md", "The Lance dataset", 3), cwd) == [
            "{'id': 1, 'kind': 'a'}", "['id', 'kind', '__bucket', '__offset', '__timestamp']", "__fluss_lake_tiering"]
        import lance

        dataset = lance.dataset(str(cwd / "lance-data/lake/fluss/events.lance"))
        assert sorted(dataset.to_table(columns=["id"]).column("id").to_pylist()) == [1, 2, 3], "every row, once"


@pytest.mark.slow
def test_paimon_lake_doc(tmp_path: Any) -> None:
    """docs/lake.md's Paimon example as written: a server tiering into Paimon, a primary-key table with a
    delete, one round, and the table read back with Paimon's SQL (and pypaimon 2.1.0)."""
    blocks = [snippet("docs/lake.md", "The Paimon table", 0), snippet("docs/lake.md", "The Paimon table", 1),
              snippet("docs/lake.md", "The Paimon table", 2)]
    with _one_documented_round(tmp_path, blocks, "127.0.0.1:9125", "paimon") as cwd:
        assert run_script(snippet("docs/lake.md", "The Paimon table", 3), cwd) == [
            "[{'id': 1, 'name': 'Ada'}, {'id': 2, 'name': 'Grace'}]"]
        from tests.lake.paimon_reader import pypaimon_rows

        warehouse = f"file://{cwd}/paimon-data/lake"
        assert pypaimon_rows(warehouse, "fluss.users", ["id", "name"]) == [[1, "Ada"], [2, "Grace"]]
