"""The tiering service as a program: ``strom tiering …``, or ``spark-submit`` of this file.

Under ``spark-submit`` the master and Spark settings come from spark-submit; under ``strom tiering``
they come from ``--master`` and ``--conf``. Either way the Spark session shows a console progress bar
per round, runs no speculative tasks (a speculative copy would only write orphan files) and runs its
Python workers on this interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from strom.client import Connection
from strom.config import parse_duration
from strom.errors import StromError
from strom.tiering.driver import DEFAULT_JOB_ID, TieringDriver, TieringOptions

SPARK_DEFAULTS = {
    "spark.speculation": "false",
    "spark.ui.showConsoleProgress": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def build_spark(master: str | None, job_id: str, conf: Mapping[str, str]) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"strom-tiering-{job_id}")
    if master is not None:
        builder = builder.master(master)
    for key, value in {**SPARK_DEFAULTS, **conf}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def options_from(defines: Mapping[str, str], bootstrap_servers: str, job_id: str, once: bool) -> TieringOptions:
    """Tiering options from ``-D key=value`` pairs with Fluss-style names; ``client.*`` keys (such as
    ``client.security.protocol=SASL`` and its credentials) configure strom's client."""
    known = {"tiering.poll.table.interval", "lake.tiering.kv-snapshot-lease.duration", "tiering.round.min-duration",
             "testing.tiering.gate-dir"}
    client_options = tuple(sorted((k, v) for k, v in defines.items() if k.startswith("client.")))
    unknown = sorted(set(defines) - known - {k for k, _ in client_options})
    if unknown:
        raise ValueError(f"unknown tiering options: {', '.join(unknown)} (known: {', '.join(sorted(known))})")

    def ms(key: str, default: int) -> int:
        return int(parse_duration(defines[key]).total_seconds() * 1000) if key in defines else default

    defaults = TieringOptions(bootstrap_servers)
    poll = ms("tiering.poll.table.interval", defaults.poll_interval_ms)
    lease = ms("lake.tiering.kv-snapshot-lease.duration", defaults.lease_duration_ms)
    min_round = ms("tiering.round.min-duration", defaults.min_round_duration_ms)
    if poll <= 0 or lease <= 0 or min_round < 0:
        raise ValueError("tiering.poll.table.interval and lake.tiering.kv-snapshot-lease.duration must be positive, "
                         "tiering.round.min-duration not negative")
    return TieringOptions(
        bootstrap_servers, job_id, poll, lease, min_round, once, defines.get("testing.tiering.gate-dir"), client_options
    )


def check_server(options: TieringOptions) -> None:
    """Connect once (bootstrap, credentials, metadata) before Spark starts, which takes seconds: a server
    that is down or refuses the credentials is then one line on stderr and exit code 1.

    Raises:
        SystemExit: the server cannot be used.
    """

    async def connect() -> None:
        connection = await Connection.create(options.client_config)
        await connection.close()

    try:
        asyncio.run(connect())
    except (StromError, OSError, ValueError) as exc:
        raise SystemExit(
            f"strom tiering: cannot use the server at {options.bootstrap_servers}: {type(exc).__name__}: {exc}"
        ) from None


def run_service(options: TieringOptions, master: str | None, spark_conf: Mapping[str, str]) -> None:
    """Run the driver in this process until SIGTERM/SIGINT (or, with ``once``, until done); the server is
    checked first (:func:`check_server`)."""
    check_server(options)
    spark = build_spark(master, options.job_id, spark_conf)
    driver = TieringDriver(spark, options)

    def on_signal(_signum: int, _frame: object) -> None:
        driver.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        driver.run()
        if driver.given_up:
            raise SystemExit(f"tiering failed for {len(driver.given_up)} table(s); see the log")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        spark.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point for ``spark-submit strom/tiering/app.py -b HOST:PORT …``."""
    parser = argparse.ArgumentParser(prog="strom-tiering")
    parser.add_argument("-b", "--bootstrap-servers", default="127.0.0.1:9123")
    parser.add_argument("--job-id", default=DEFAULT_JOB_ID)
    parser.add_argument("--once", action="store_true")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    defines = dict(define.split("=", 1) for define in args.defines)
    run_service(options_from(defines, args.bootstrap_servers, args.job_id, args.once), None, {})


if __name__ == "__main__":
    main()
