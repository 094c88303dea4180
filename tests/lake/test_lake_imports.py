"""The plain install stays small at run time: the server, the client, the CLI, the tiering driver and the
Spark source load no lake library until a table uses that format (delta-rs, pyiceberg and pylance each
load on a table's first use, through :mod:`strom.lake.formats`)."""

from __future__ import annotations

import subprocess
import sys

LAKE_LIBRARIES = ("deltalake", "pyiceberg", "lance")


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


def test_a_lance_table_without_pylance_installed_is_a_clear_error() -> None:
    probe = (
        "import sys\n"
        "sys.modules['lance'] = None  # as where `pip install strom` left the extra out\n"
        "from strom.errors import InvalidConfigError\n"
        "from strom.lake.formats import FORMATS\n"
        "try:\n"
        "    FORMATS['lance']({'warehouse': '.'})\n"
        "except InvalidConfigError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert "the lance lake format needs pylance" in result.stdout and "pip install 'strom[lance]'" in result.stdout
