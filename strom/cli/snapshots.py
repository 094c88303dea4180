"""``strom lease …`` and ``strom snapshot …``: inspect KV snapshots and leases of a running server."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table as RichTable

from strom.errors import StromError
from strom.ids import TablePath

T = TypeVar("T")

bootstrap_option = click.option(
    "--bootstrap-servers", "-b", default="127.0.0.1:9123", show_default=True, help="HOST:PORT of a strom server."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")


def _run(bootstrap: str, action: Callable[[Any], Awaitable[T]]) -> T:
    """Connect, run ``action(connection)``, close; errors become one clear line (exit code 1)."""
    from strom.client import Connection

    async def main() -> T:
        async with await Connection.create(bootstrap) as connection:
            return await action(connection)

    try:
        return asyncio.run(main())
    except StromError as exc:
        raise click.ClickException(f"{type(exc).__name__} (code {exc.code}): {exc}") from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _time(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _lease_json(lease: Any) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "expiration_ms": lease.expiration_ms,
        "snapshots": [
            {"table_id": b.table_id, "partition_id": b.partition_id, "bucket": b.bucket, "snapshot_id": s}
            for b, s in sorted(lease.snapshots.items(), key=lambda item: (item[0].table_id, item[0].partition_id or -1, item[0].bucket))
        ],
    }


@click.group()
def lease() -> None:
    """KV snapshot leases (FIP-22) held by the coordinator."""


@lease.command("list")
@bootstrap_option
@json_option
def lease_list(bootstrap_servers: str, as_json: bool) -> None:
    """Every lease with its expiry and number of pinned snapshots."""
    leases = _run(bootstrap_servers, lambda c: c.get_admin().list_kv_snapshot_leases())
    if as_json:
        click.echo(json.dumps([_lease_json(lease) for lease in leases], indent=2))
        return
    table = RichTable(title=f"{len(leases)} KV snapshot lease(s)")
    for column in ("lease id", "expires", "pinned snapshots"):
        table.add_column(column)
    for item in leases:
        table.add_row(item.lease_id, _time(item.expiration_ms), str(len(item.snapshots)))
    Console().print(table)


@lease.command("show")
@click.argument("lease_id")
@bootstrap_option
@json_option
def lease_show(lease_id: str, bootstrap_servers: str, as_json: bool) -> None:
    """One lease and every snapshot it pins."""
    leases = _run(bootstrap_servers, lambda c: c.get_admin().list_kv_snapshot_leases(lease_id))
    if not leases:
        raise click.ClickException(f"no lease {lease_id!r}")
    item = leases[0]
    if as_json:
        click.echo(json.dumps(_lease_json(item), indent=2))
        return
    table = RichTable(title=f"lease {item.lease_id}, expires {_time(item.expiration_ms)}")
    for column in ("table id", "partition id", "bucket", "snapshot id"):
        table.add_column(column, justify="right")
    for entry in _lease_json(item)["snapshots"]:
        partition = "-" if entry["partition_id"] is None else str(entry["partition_id"])
        table.add_row(str(entry["table_id"]), partition, str(entry["bucket"]), str(entry["snapshot_id"]))
    Console().print(table)


@lease.command("drop")
@click.argument("lease_id")
@bootstrap_option
def lease_drop(lease_id: str, bootstrap_servers: str) -> None:
    """Drop a lease (its snapshots become eligible for cleanup). Dropping an unknown lease succeeds."""
    _run(bootstrap_servers, lambda c: c.get_admin().create_kv_snapshot_lease(lease_id, 1).drop())
    click.echo(f"dropped lease {lease_id}")


@click.group()
def snapshot() -> None:
    """KV snapshots of primary-key tables."""


@snapshot.command("list")
@click.argument("table")
@click.option("--partition", default=None, help="Partition name, for partitioned tables.")
@bootstrap_option
@json_option
def snapshot_list(table: str, partition: str | None, bootstrap_servers: str, as_json: bool) -> None:
    """Retained and leased snapshots of DB.TABLE, and each bucket's latest."""
    path = TablePath.parse(table)

    async def gather(connection: Any) -> tuple[Any, list[tuple[int, int, int]]]:
        admin = connection.get_admin()
        latest = await admin.get_latest_kv_snapshots(path, partition)
        active = await admin.list_kv_snapshots(latest.table_id, latest.partition_id)
        return latest, active

    latest, active = _run(bootstrap_servers, gather)
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
