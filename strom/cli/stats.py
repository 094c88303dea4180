"""``strom health`` and ``strom table stats``: is the cluster ready, and how many rows a table holds."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table as RichTable

from strom.cli.common import bootstrap_option, client_config, credential_options, json_option, run_on_server
from strom.ids import TableBucket, TablePath
from strom.metadata.cluster_health import ClusterHealth, ClusterHealthStatus


@click.command("health")
@bootstrap_option
@credential_options
@json_option
def health(bootstrap_servers: str, username: str | None, password: str | None, as_json: bool) -> None:
    """The cluster's health (GetClusterHealth): replicas in sync and buckets with an active leader.
    Exits 0 when GREEN, 1 otherwise, for readiness checks."""

    async def ask(connection: Any) -> ClusterHealth:
        return await connection.get_admin().get_cluster_health()

    found = run_on_server(client_config(bootstrap_servers, username, password), ask)
    if as_json:
        click.echo(json.dumps({"status": found.status.name, "num_replicas": found.num_replicas,
                               "in_sync_replicas": found.in_sync_replicas,
                               "num_leader_replicas": found.num_leader_replicas,
                               "active_leader_replicas": found.active_leader_replicas}))
    else:
        click.echo(f"{found.status.name}: {found.in_sync_replicas}/{found.num_replicas} replicas in sync, "
                   f"{found.active_leader_replicas}/{found.num_leader_replicas} buckets with an active leader")
    if found.status is not ClusterHealthStatus.GREEN:
        sys.exit(1)


@click.group("table")
def table_group() -> None:
    """Tables: their statistics."""


@table_group.command("stats")
@click.argument("table")
@click.option("--partition", default=None, help="One partition's buckets (by name); all partitions by default.")
@bootstrap_option
@credential_options
@json_option
def table_stats(table: str, partition: str | None, bootstrap_servers: str, username: str | None,
                password: str | None, as_json: bool) -> None:
    """Row counts of DB.TABLE per bucket (GetTableStats): live keys of a primary-key table ("-" with a WAL
    changelog image, which cannot count them), records of a log table."""
    path = TablePath.parse(table)

    async def gather(connection: Any) -> tuple[Any, dict[TableBucket, int | None], dict[int | None, str | None]]:
        admin = connection.get_admin()
        info = await admin.get_table_info(path)
        names: dict[int | None, str | None] = {None: None}
        if info.is_partitioned:
            infos = await admin.list_partition_infos(path)
            names = {p.partition_id: p.partition_name for p in infos if partition in (None, p.partition_name)}
            if partition is not None and not names:
                raise click.ClickException(f"table {path} has no partition {partition!r}")
        elif partition is not None:
            raise click.ClickException(f"table {path} is not partitioned")
        buckets = [bucket for partition_id in names for bucket in info.buckets(partition_id)]
        return info, await admin.get_bucket_row_counts(buckets), names

    info, counts, names = run_on_server(client_config(bootstrap_servers, username, password), gather)
    ordered = sorted(counts.items(), key=lambda item: item[0].sort_key())
    rows: list[dict[str, Any]] = [
        {"partition": names[bucket.partition_id], "bucket": bucket.bucket, "row_count": count} for bucket, count in ordered
    ]
    known = [count for _, count in ordered if count is not None]
    total = sum(known) if len(known) == len(ordered) else None
    if as_json:
        click.echo(json.dumps({"table": str(path), "table_id": info.table_id, "row_count": total, "buckets": rows}))
        return
    view = RichTable(title=f"{path} (table id {info.table_id}): {'-' if total is None else f'{total:,}'} rows")
    for column in ("partition", "bucket", "rows"):
        view.add_column(column, justify="right")
    for row in rows:
        count = row["row_count"]
        view.add_row(row["partition"] or "-", str(row["bucket"]), "-" if count is None else f"{count:,}")
    Console().print(view)
