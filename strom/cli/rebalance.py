"""``strom server-tag`` and ``strom rebalance``: take tablet servers out of service and even out the cluster."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from strom.cli.common import bootstrap_option, client_config, credential_options, json_option, run_on_server
from strom.client.rebalance import RebalanceProgress
from strom.metadata.rebalance_plan import GoalType, RebalanceStatus, ServerTag

TAGS = click.Choice([tag.name for tag in ServerTag], case_sensitive=False)
GOALS = click.Choice([goal.name for goal in GoalType], case_sensitive=False)


@click.group("server-tag")
def server_tag() -> None:
    """Tag tablet servers: PERMANENT_OFFLINE (decommission: a rebalance moves their replicas away) or
    TEMPORARY_OFFLINE (maintenance: a rebalance moves their leaderships away)."""


@server_tag.command("add")
@click.argument("server_ids", nargs=-1, type=int, required=True)
@click.option("--tag", type=TAGS, required=True)
@bootstrap_option
@credential_options
def server_tag_add(server_ids: tuple[int, ...], tag: str, bootstrap_servers: str, username: str | None,
                   password: str | None) -> None:
    async def add(connection: Any) -> None:
        await connection.get_admin().add_server_tag(server_ids, ServerTag[tag.upper()])

    run_on_server(client_config(bootstrap_servers, username, password), add)
    click.echo(f"tagged servers {', '.join(map(str, server_ids))} {tag.upper()}")


@server_tag.command("remove")
@click.argument("server_ids", nargs=-1, type=int, required=True)
@click.option("--tag", type=TAGS, required=True)
@bootstrap_option
@credential_options
def server_tag_remove(server_ids: tuple[int, ...], tag: str, bootstrap_servers: str, username: str | None,
                      password: str | None) -> None:
    async def remove(connection: Any) -> None:
        await connection.get_admin().remove_server_tag(server_ids, ServerTag[tag.upper()])

    run_on_server(client_config(bootstrap_servers, username, password), remove)
    click.echo(f"removed {tag.upper()} from servers {', '.join(map(str, server_ids))}")


@click.group("rebalance", invoke_without_command=False)
def rebalance_group() -> None:
    """Move replicas and leaderships so every tablet server carries its share (one bucket at a time)."""


@rebalance_group.command("start")
@click.option("--goal", "goals", multiple=True, type=GOALS,
              help="By priority (repeatable); default RACK_AWARE, REPLICA_DISTRIBUTION, LEADER_DISTRIBUTION.")
@click.option("--wait", is_flag=True, help="Wait until it finishes; exit 1 unless it COMPLETED.")
@bootstrap_option
@credential_options
@json_option
def rebalance_start(goals: tuple[str, ...], wait: bool, bootstrap_servers: str, username: str | None,
                    password: str | None, as_json: bool) -> None:
    """Plan and start a rebalance; prints its id (and, with --wait, how it ended)."""
    config = client_config(bootstrap_servers, username, password)

    async def start(connection: Any) -> str:
        return await connection.get_admin().rebalance([GoalType[g.upper()] for g in goals])

    rebalance_id = run_on_server(config, start)
    if not wait:
        click.echo(json.dumps({"rebalance_id": rebalance_id}) if as_json else f"rebalance {rebalance_id} started")
        return
    while True:
        progress = _progress(config, rebalance_id)
        if progress is None or progress.status.is_final:
            break
        time.sleep(0.5)
    _print(progress, as_json)
    if progress is None or progress.status is not RebalanceStatus.COMPLETED:
        sys.exit(1)


@rebalance_group.command("progress")
@click.option("--id", "rebalance_id", default=None, help="The rebalance to show (default: the current or last).")
@bootstrap_option
@credential_options
@json_option
def rebalance_progress(rebalance_id: str | None, bootstrap_servers: str, username: str | None,
                       password: str | None, as_json: bool) -> None:
    """The current (or last) rebalance: its status and each bucket's move."""
    _print(_progress(client_config(bootstrap_servers, username, password), rebalance_id), as_json)


@rebalance_group.command("cancel")
@click.option("--id", "rebalance_id", default=None)
@bootstrap_option
@credential_options
def rebalance_cancel(rebalance_id: str | None, bootstrap_servers: str, username: str | None,
                     password: str | None) -> None:
    """Stop after the bucket being moved now; the moves done stay."""

    async def cancel(connection: Any) -> None:
        await connection.get_admin().cancel_rebalance(rebalance_id)

    run_on_server(client_config(bootstrap_servers, username, password), cancel)
    click.echo("rebalance cancelled")


def _progress(config: Any, rebalance_id: str | None) -> RebalanceProgress | None:
    async def ask(connection: Any) -> RebalanceProgress | None:
        return await connection.get_admin().list_rebalance_progress(rebalance_id)

    return run_on_server(config, ask)


def _print(progress: RebalanceProgress | None, as_json: bool) -> None:
    if progress is None:
        click.echo(json.dumps(None) if as_json else "no rebalance was ever started")
        return
    if as_json:
        click.echo(json.dumps({
            "rebalance_id": progress.rebalance_id, "status": progress.status.name, "progress": progress.progress,
            "buckets": [{"table_id": m.bucket.table_id, "partition_id": m.bucket.partition_id,
                         "bucket": m.bucket.bucket, "original_replicas": list(m.original_replicas),
                         "new_replicas": list(m.new_replicas), "original_leader": m.original_leader,
                         "new_leader": m.new_leader, "status": m.status.name} for m in progress.moves],
        }))
        return
    click.echo(f"rebalance {progress.rebalance_id}: {progress.status.name}, "
               f"{progress.progress:.0%} of {len(progress.moves)} buckets")
    for move in progress.moves:
        click.echo(f"  {move.bucket}: replicas {list(move.original_replicas)} -> {list(move.new_replicas)}, "
                   f"leader {move.original_leader} -> {move.new_leader}  [{move.status.name}]")


__all__ = ["rebalance_group", "server_tag"]
