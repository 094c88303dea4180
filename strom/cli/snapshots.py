"""``strom lease …`` and ``strom snapshot …``: inspect KV snapshots and leases of a running server."""

from __future__ import annotations

import json
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
    lease_json,
    run_on_server,
)
from strom.ids import TablePath


@click.group()
def lease() -> None:
    """KV snapshot leases (FIP-22) held by the coordinator."""


@lease.command("list")
@bootstrap_option
@credential_options
@json_option
def lease_list(bootstrap_servers: str, username: str | None, password: str | None, as_json: bool) -> None:
    """Every lease with its expiry and number of pinned snapshots."""
    leases = run_on_server(client_config(bootstrap_servers, username, password), lambda c: c.get_admin().list_kv_snapshot_leases())
    if as_json:
        click.echo(json.dumps([lease_json(lease) for lease in leases], indent=2))
        return
    table = RichTable(title=f"{len(leases)} KV snapshot lease(s)")
    for column in ("lease id", "expires", "pinned snapshots"):
        table.add_column(column)
    for item in leases:
        table.add_row(item.lease_id, format_time(item.expiration_ms), str(len(item.snapshots)))
    Console().print(table)


@lease.command("show")
@click.argument("lease_id")
@bootstrap_option
@credential_options
@json_option
def lease_show(lease_id: str, bootstrap_servers: str, username: str | None, password: str | None,
               as_json: bool) -> None:
    """One lease and every snapshot it pins."""
    leases = run_on_server(client_config(bootstrap_servers, username, password), lambda c: c.get_admin().list_kv_snapshot_leases(lease_id))
    if not leases:
        raise click.ClickException(f"no lease {lease_id!r}")
    item = leases[0]
    if as_json:
        click.echo(json.dumps(lease_json(item), indent=2))
        return
    table = RichTable(title=f"lease {item.lease_id}, expires {format_time(item.expiration_ms)}")
    for column in ("table id", "partition id", "bucket", "snapshot id"):
        table.add_column(column, justify="right")
    for entry in lease_json(item)["snapshots"]:
        partition = "-" if entry["partition_id"] is None else str(entry["partition_id"])
        table.add_row(str(entry["table_id"]), partition, str(entry["bucket"]), str(entry["snapshot_id"]))
    Console().print(table)


@lease.command("drop")
@click.argument("lease_id")
@bootstrap_option
@credential_options
def lease_drop(lease_id: str, bootstrap_servers: str, username: str | None, password: str | None) -> None:
    """Drop a lease (its snapshots become eligible for cleanup). Dropping an unknown lease succeeds."""
    run_on_server(client_config(bootstrap_servers, username, password), lambda c: c.get_admin().create_kv_snapshot_lease(lease_id, 1).drop())
    click.echo(f"dropped lease {lease_id}")


@click.group()
def snapshot() -> None:
    """KV snapshots of primary-key tables."""


@snapshot.command("list")
@click.argument("table")
@click.option("--partition", default=None, help="Partition name, for partitioned tables.")
@bootstrap_option
@credential_options
@json_option
def snapshot_list(table: str, partition: str | None, bootstrap_servers: str, username: str | None,
                  password: str | None, as_json: bool) -> None:
    """Retained and leased snapshots of DB.TABLE, and each bucket's latest."""
    path = TablePath.parse(table)

    async def gather(connection: Any) -> tuple[Any, list[tuple[int, int, int]]]:
        admin = connection.get_admin()
        latest = await admin.get_latest_kv_snapshots(path, partition)
        active = await admin.list_kv_snapshots(latest.table_id, latest.partition_id)
        return latest, active

    latest, active = run_on_server(client_config(bootstrap_servers, username, password), gather)
    rows = [
        {
            "bucket": bucket,
            "snapshot_id": snapshot_id,
            "log_offset": log_offset,
            "latest": latest.snapshots.get(bucket) is not None and latest.snapshots[bucket].snapshot_id == snapshot_id,
        }
        for bucket, snapshot_id, log_offset in active
    ]
    if as_json:
        click.echo(json.dumps({"table": str(path), "table_id": latest.table_id, "snapshots": rows}, indent=2))
        return
    view = RichTable(title=f"KV snapshots of {path} (table id {latest.table_id})")
    for column in ("bucket", "snapshot id", "log offset", "latest"):
        view.add_column(column, justify="right")
    for row in rows:
        view.add_row(str(row["bucket"]), str(row["snapshot_id"]), str(row["log_offset"]), "yes" if row["latest"] else "")
    Console().print(view)
    without = [b for b, info in latest.snapshots.items() if info is None]
    if without:
        click.echo(f"buckets without a snapshot yet: {', '.join(map(str, sorted(without)))}")
