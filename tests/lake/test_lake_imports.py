"""The plain install stays small at run time: the server, the client, the CLI, the tiering driver and the
Spark source load no lake library until a table uses that format (delta-rs, pyiceberg, pypaimon-rust and
pylance each load on a table's first use, through :mod:`strom.lake.formats`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

LAKE_LIBRARIES = ("deltalake", "pyiceberg", "lance", "pypaimon_rust")


def test_no_lake_library_loads_until_a_table_uses_its_format() -> None:
    probe = (
        "import sys\n"
        "import strom.server.node, strom.client, strom.cli.main, strom.tiering.driver, strom.spark.source\n"
        "import strom.lake.formats\n"
        f"print(sorted(m for m in {LAKE_LIBRARIES!r} if m in sys.modules))\n"
        "from strom.lake.formats import FORMATS\n"
        "FORMATS['lance']({'warehouse': '.'})\n"
        f"print(sorted(m for m in {LAKE_LIBRARIES!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    before, after = result.stdout.split("\n")[:2]
    assert before == "[]", f"a lake library loaded before any table used it: {before}"
    assert after == "['lance']", "a Lance table loads pylance and nothing else"


@pytest.mark.parametrize(("lake", "module", "library"), [("lance", "lance", "pylance"),
                                                          ("paimon", "pypaimon_rust", "pypaimon-rust")])
def test_a_table_of_an_extras_format_without_its_library_is_a_clear_error(lake: str, module: str, library: str) -> None:
    probe = (
        "import sys\n"
        f"sys.modules[{module!r}] = None  # as where `pip install strom` left the extra out\n"
        "from strom.errors import InvalidConfigError\n"
        "from strom.lake.formats import FORMATS\n"
        "try:\n"
        f"    FORMATS[{lake!r}]({{'warehouse': '.'}})\n"
        "except InvalidConfigError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert f"the {lake} lake format needs {library}" in result.stdout
    assert f"pip install 'strom[{lake}]'" in result.stdout
