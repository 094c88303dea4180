"""``strom tiering``: run the lake tiering service, or show how fresh each lake table is."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table as RichTable

from strom.cli.common import (
    bootstrap_option,
    client_config,
    credential_options,
    format_time,
    json_option,
    key_value_pairs,
    lease_json,
    run_on_server,
)
from strom.ids import TablePath


@click.group(invoke_without_command=True)
@click.pass_context
@bootstrap_option
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option("--job-id", default="strom-tiering", show_default=True,
              help="Names the job and its KV snapshot lease; a restarted job with the same id resumes its lease.")
@click.option("--once", is_flag=True, help="Stop once every lake-enabled table has been tiered once.")
@click.option("-D", "defines", multiple=True, metavar="KEY=VALUE",
              help="Tiering option, e.g. -D tiering.poll.table.interval=10s, "
                   "-D lake.tiering.kv-snapshot-lease.duration=6h; client.* keys (such as "
                   "-D client.security.protocol=SASL) configure the client.")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE", help="Spark setting, e.g. --conf spark.ui.enabled=false.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def tiering(ctx: click.Context, bootstrap_servers: str, master: str, job_id: str, once: bool,
            defines: tuple[str, ...], spark_conf: tuple[str, ...], log_level: str) -> None:
    """Run the lake tiering service (a PySpark application) against a strom cluster.

    It takes lake-enabled tables from the coordinator when their freshness is due, and for each runs
    one Spark job that writes the new data into the table's lake copy, committed exactly once."""
    if ctx.invoked_subcommand is not None:
        return
    from strom.tiering.app import options_from, run_service

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = options_from(key_value_pairs(defines, "-D"), bootstrap_servers, job_id, once)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    run_service(options, master, key_value_pairs(spark_conf, "--conf"))


@tiering.command()
@bootstrap_option
@credential_options
@click.option("--table", "table", default=None, help="Only this table (DATABASE.TABLE).")
@click.option("--job-id", default="strom-tiering", show_default=True, help="Whose lease to show.")
@json_option
def status(bootstrap_servers: str, username: str | None, password: str | None, table: str | None, job_id: str,
           as_json: bool) -> None:
    """Each lake-enabled table's tiering state, last tiered offsets, lag and the job's lease."""
    from strom.client.lake import tiering_lease_id

    path = TablePath.parse(table) if table else None

    async def fetch(connection: Any) -> tuple[list[Any], list[Any]]:
        admin = connection.get_admin()
        return await admin.describe_lake_tiering(path), await admin.list_kv_snapshot_leases(tiering_lease_id(job_id))

    statuses, leases = run_on_server(client_config(bootstrap_servers, username, password), fetch)
    now = int(time.time() * 1000)
    if as_json:
        document = {
            "tables": [_status_json(s, now) for s in statuses],
            "lease": lease_json(leases[0]) if leases else None,
        }
        click.echo(json.dumps(document, indent=2, sort_keys=True))
        return
    view = RichTable(title="lake tiering")
    for column in ("table", "state", "epoch", "lake snapshot", "last tiered", "lag", "freshness", "failures"):
        view.add_column(column)
    for s in statuses:
        view.add_row(
            str(s.table_path), s.state, str(s.tiering_epoch),
            str(s.lake_snapshot_id) if s.lake_snapshot_id is not None else "-",
            format_time(s.last_tiered_time) if s.last_tiered_time else "never",
            _lag(s, now), f"{s.freshness_ms / 1000:g} s", str(s.failures),
        )
    console = Console() if sys.stdout.isatty() else Console(width=160)  # scripts and logs get whole rows
    console.print(view)
    if leases:
        console.print(f"lease {leases[0].lease_id}: {len(leases[0].snapshots)} snapshots pinned, "
                      f"expires {format_time(leases[0].expiration_ms)}")
    else:
        console.print(f"lease {tiering_lease_id(job_id)}: none held")


def _lag(status: Any, now: int) -> str:
    if not status.last_tiered_time:
        return "-"
    return f"{max(0, now - status.last_tiered_time) / 1000:.1f} s"


def _status_json(status: Any, now: int) -> dict[str, Any]:
    document = dataclasses.asdict(status)
    document["table_path"] = str(status.table_path)
    document["bucket_offsets"] = [
        {"partition_id": b.partition_id, "bucket": b.bucket, "offset": o}
        for b, o in sorted(status.bucket_offsets.items(), key=lambda i: (i[0].partition_id or -1, i[0].bucket))
    ]
    document["lag_ms"] = now - status.last_tiered_time if status.last_tiered_time else None
    return document
