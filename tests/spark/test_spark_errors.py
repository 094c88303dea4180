"""What a user sees when a read or write cannot work: one line naming the option, table or address."""

from __future__ import annotations

from typing import Any

import pytest

from strom.records.types import IntType
from tests.server_process import free_port
from tests.spark.support import Fluss

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(120)]


def failure_line(action: Any) -> str:
    """The line of Spark's error text that carries the connector's message."""
    with pytest.raises(Exception) as failure:
        action()
    lines = [line for line in str(failure.value).splitlines() if "FlussConnectorError: " in line]
    assert lines, f"no FlussConnectorError line in:\n{failure.value}"
    message = lines[-1].split("FlussConnectorError: ", 1)[1]
    assert "py4j" not in message.lower() and "Traceback" not in message
    return message


def test_an_unknown_table_names_the_table_and_the_option(spark: Any, cluster: Fluss) -> None:
    message = failure_line(
        lambda: spark.read.format("fluss").options(**cluster.options("fluss.no_such_table")).load()
    )
    assert message.startswith("table 'fluss.no_such_table' does not exist on " + cluster.address + " (option 'table')")


def test_a_missing_option_is_named(spark: Any, cluster: Fluss) -> None:
    message = failure_line(lambda: spark.read.format("fluss").option("bootstrap.servers", cluster.address).load())
    assert message.startswith("option 'table' is required")
    message = failure_line(lambda: spark.read.format("fluss").option("table", "fluss.t").load())
    assert message.startswith("option 'bootstrap.servers' is required")


def test_a_server_that_is_down_names_the_address(spark: Any) -> None:
    address = f"127.0.0.1:{free_port()}"
    message = failure_line(
        lambda: spark.read.format("fluss").option("bootstrap.servers", address).option("table", "fluss.t").load()
    )
    assert message.startswith(f"cannot reach the Fluss cluster at {address} (option 'bootstrap.servers')")


def test_a_bad_option_value_is_named(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table([("id", IntType())])
    message = failure_line(
        lambda: spark.read.format("fluss").options(**cluster.options(table, **{"scan.startup.mode": "sometimes"})).load().collect()
    )
    assert message == "option 'scan.startup.mode' must be one of full, earliest, latest, timestamp, got 'sometimes'"
    message = failure_line(
        lambda: spark.read.format("fluss").options(**cluster.options(table, **{"scan.startup.mode": "latest"})).load().collect()
    )
    assert message.startswith("option 'scan.startup.mode'=latest only applies to streaming reads")
