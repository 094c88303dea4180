"""The README's Spark and lake tiering examples run as written (against a test server instead of
127.0.0.1:9123, with its data directory instead of ./strom-data)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from strom.spark import FlussDataSource
from tests.spark.support import Fluss

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(300)]

README = Path(__file__).resolve().parents[2] / "README.md"
ADDRESS = "127.0.0.1:9123"


def blocks_after(heading: str, language: str) -> list[str]:
    text = README.read_text()
    section = text[text.index(heading) :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def run_python(code: str, namespace: dict[str, Any], wrap_async: bool = False) -> None:
    if wrap_async:
        code = "import asyncio\nasync def example():\n" + "".join(f"    {line}\n" for line in code.splitlines())
        code += "asyncio.run(example())\n"
    exec(compile(code, "README example", "exec"), namespace)


def test_readme_spark_and_lake_tiering_examples(spark: Any, server_factory: Any, capsys: Any) -> None:
    server = server_factory({"kv.snapshot.interval": "0s"})
    cluster = Fluss(server.address)
    [client_example] = blocks_after("## strom's own client", "python")
    run_python(client_example.replace(ADDRESS, server.address), {"__name__": "readme"}, wrap_async=True)
    assert capsys.readouterr().out.split()[0] == "2"

    [spark_example] = blocks_after("## Spark", "python")
    spark_namespace: dict[str, Any] = {"__name__": "readme", "spark": spark}
    try:
        run_python(spark_example.replace(ADDRESS, server.address), spark_namespace)
    finally:
        spark.dataSource.register(FlussDataSource)  # register() swapped in the pushdown source
    assert "|  2|" in capsys.readouterr().out
    assert sorted(row["id"] for row in cluster.rows("fluss.orders_copy")) == [1, 2]
    copy = cluster.describe("fluss.orders_copy")
    assert (copy.primary_key, copy.bucket_count, copy.column_names) == (["id"], 4, ["id", "amount"])
    changes = spark_namespace["changes"].collect()
    assert sorted(r.id for r in changes) == [1, 2] and None not in {r._log_offset for r in changes}

    enable, query = blocks_after("## Lake tiering", "python")
    [shell] = blocks_after("## Lake tiering", "sh")
    run_python(enable.replace(ADDRESS, server.address), {"__name__": "readme"}, wrap_async=True)
    for line in shell.strip().splitlines():
        words = shlex.split(line.replace(ADDRESS, server.address))
        assert words[0] == ".venv/bin/strom"
        done = subprocess.run([sys.executable, "-m", "strom.cli.main", *words[1:]], capture_output=True, text=True,
                              timeout=240, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "fluss.orders" in done.stdout and "Scheduled" in done.stdout, done.stdout
    as_json = subprocess.run([sys.executable, "-m", "strom.cli.main", "tiering", "status", "-b", server.address,
                              "--json"], capture_output=True, text=True, timeout=60, check=True)
    [status] = json.loads(as_json.stdout)["tables"]
    assert (status["table_path"], status["state"], status["lake_snapshot_id"]) == ("fluss.orders", "Scheduled", 1)
    assert sum(entry["offset"] for entry in status["bucket_offsets"]) == 2, "both upserts are in the lake"

    namespace: dict[str, Any] = {"__name__": "readme", "spark": spark}
    lake_root = str(server.data_dir / "lake")
    run_python(query.replace(ADDRESS, server.address).replace("strom-data/lake", lake_root), namespace)
    assert capsys.readouterr().out.split()[-1] == "2"
    assert namespace["orders"].count() == 2
