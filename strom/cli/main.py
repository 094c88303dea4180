"""The ``strom`` command line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from strom.cli.acl import acl
from strom.cli.common import (
    bootstrap_option,
    client_config,
    credential_options,
    json_option,
    key_value_pairs,
    run_on_server,
)
from strom.cli.gateway import GATEWAY_KEY_PREFIX, EmbeddedGateway, gateway
from strom.cli.rebalance import rebalance_group, server_tag
from strom.cli.remote_log import log_group
from strom.cli.snapshots import lease, snapshot
from strom.cli.stats import health, table_group
from strom.cli.tiering import tiering
from strom.config import (
    ALL_OPTIONS,
    BIND_LISTENERS,
    DATA_DIR,
    TABLET_SERVER_ID,
    ZOOKEEPER_AUTH_DIGEST,
    Configuration,
    options_markdown,
    zookeeper_location,
)
from strom.errors import InvalidConfigError, StromError


def _parse_address(text: str) -> tuple[str, int]:
    """The main (first) listener's address; Fluss's ``NAME://HOST:PORT`` names it (security.protocol.map)."""
    text = text.split(",")[0].strip()
    text = text.partition("://")[2] or text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _load_config(config_file: Path | None, defines: tuple[str, ...]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            loaded = yaml.safe_load(config_file.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise click.BadParameter(f"cannot read {config_file}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise click.BadParameter(f"{config_file} must hold a mapping of config keys to values")
        values.update({str(k): v for k, v in loaded.items()})
    values.update(key_value_pairs(defines, "-D"))
    return values


@click.group()
@click.version_option("0.1.0", prog_name="strom")
def main() -> None:
    """strom: primary-key table storage that speaks Apache Fluss's protocol."""


def _node_options(function: Any) -> Any:
    """The options every server process takes."""
    for option in reversed([
        click.option("--bind", "bind", default=None,
                     help="HOST:PORT (or NAME://HOST:PORT) to listen on (default 127.0.0.1:9123; port 0: any free one)."),
        click.option("--data-dir", type=click.Path(path_type=Path), default=None,
                     help="Directory for all server data (default: data.dir from --config or -D, else "
                          "./strom-data)."),
        click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     default=None, help="YAML file of config keys (Fluss names)."),
        click.option("-D", "defines", multiple=True, metavar="KEY=VALUE",
                     help="Set a config key, e.g. -D kv.snapshot.interval=1s."),
        click.option("--log-level", default="INFO", show_default=True,
                     type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False)),
    ]):
        function = option(function)
    return function


def _workers(_context: click.Context, _param: click.Parameter, value: str) -> int:
    if value == "auto":
        return os.cpu_count() or 1
    if not value.isdigit() or not 1 <= int(value) <= 256:
        raise click.BadParameter(f"a count of processes from 1 to 256, or auto (one per core), not {value!r}")
    return int(value)


@main.command()
@click.option("--workers", default="1", show_default=True, callback=_workers, metavar="N|auto",
              help="Tablet-server processes behind one coordinator on the embedded metadata store, to serve from "
                   "N cores; auto: one per core. 1: one process holds both roles.")
@click.option("--gateway", "gateway_bind", default=None, metavar="HOST:PORT",
              help="Also serve the REST gateway and its console here (docs/gateway.md; the `gateway` extra); "
                   "-D gateway.* keys configure it.")
@_node_options
def server(workers: int, gateway_bind: str | None, bind: str | None, data_dir: Path | None,
           config_file: Path | None, defines: tuple[str, ...], log_level: str) -> None:
    """Run a single-node cluster (coordinator and tablet server) in the foreground until SIGTERM/SIGINT."""
    from strom.server.node import StromServer
    from strom.server.workers import check_layout

    server_defines = tuple(d for d in defines if not d.startswith(GATEWAY_KEY_PREFIX))
    gateway_defines = tuple(d for d in defines if d.startswith(GATEWAY_KEY_PREFIX))
    if gateway_defines and gateway_bind is None:
        raise click.BadParameter("gateway.* keys configure the gateway: give --gateway HOST:PORT too")
    embedded = None if gateway_bind is None else EmbeddedGateway(gateway_bind, key_value_pairs(gateway_defines, "-D"))
    if workers == 1:
        _run_node(StromServer, "strom", bind, data_dir, config_file, server_defines, log_level,
                  check_data_dir=lambda directory: check_layout(directory, 1), embedded_gateway=embedded)
        return
    if embedded is not None:
        raise click.BadParameter("--gateway serves beside one process (--workers 1); run `strom gateway` "
                                 "in front of the workers instead")
    _run_workers(workers, bind, data_dir, config_file, defines, log_level)


def _run_workers(workers: int, bind: str | None, data_dir: Path | None, config_file: Path | None,
                 defines: tuple[str, ...], log_level: str) -> None:
    from strom.server.workers import run_workers

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, (host, port), directory = _node_config(bind, data_dir, config_file, defines)
    settings = {key: str(value) for key, value in config.to_dict().items()
                if key not in (BIND_LISTENERS.key, DATA_DIR.key)}
    try:
        code = run_workers(directory, workers, host, port, settings, lambda line: click.echo(line, err=True))
    except (ValueError, RuntimeError) as exc:
        raise click.ClickException(f"cannot start: {exc}") from exc
    sys.exit(code)


@main.command()
@_node_options
def coordinator(bind: str | None, data_dir: Path | None, config_file: Path | None, defines: tuple[str, ...],
                log_level: str) -> None:
    """Run a cluster's coordinator (needs -D zookeeper.address=HOST:PORT) until SIGTERM/SIGINT."""
    from strom.server.cluster_node import CoordinatorNode

    _run_node(CoordinatorNode, "strom coordinator", bind, data_dir, config_file, defines, log_level)


@main.command("tablet-server")
@click.option("--server-id", type=int, default=None, help="This tablet server's id (tablet-server.id).")
@_node_options
def tablet_server(server_id: int | None, bind: str | None, data_dir: Path | None, config_file: Path | None,
                  defines: tuple[str, ...], log_level: str) -> None:
    """Run one tablet server of a cluster (needs -D zookeeper.address and a running coordinator)."""
    from strom.server.cluster_node import TabletServerNode

    if server_id is not None:
        defines = (*defines, f"{TABLET_SERVER_ID.key}={server_id}")
    _run_node(TabletServerNode, "strom tablet server", bind, data_dir, config_file, defines, log_level)


def _node_config(bind: str | None, data_dir: Path | None, config_file: Path | None,
                 defines: tuple[str, ...]) -> tuple[Configuration, tuple[str, int], Path]:
    """The settings of a server process from its options: the configuration, the main listener's address
    and the data directory."""
    values = _load_config(config_file, defines)
    if bind is not None:
        configured = str(values.get(BIND_LISTENERS.key) or "")
        if "://" not in bind and "://" in configured:
            # a bare --bind address replaces the main (first) listener's, keeping its name and the others
            first, sep, others = configured.partition(",")
            bind = f"{first.partition('://')[0]}://{bind}{sep}{others}"
        values[BIND_LISTENERS.key] = bind
    if data_dir is not None:
        values[DATA_DIR.key] = str(data_dir)
    try:
        config = Configuration(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    address = _parse_address(config.get(BIND_LISTENERS) or "127.0.0.1:9123")
    return config, address, Path(config.get(DATA_DIR) or "strom-data")


def _run_node(node_class: Any, what: str, bind: str | None, data_dir: Path | None, config_file: Path | None,
              defines: tuple[str, ...], log_level: str, check_data_dir: Callable[[Path], None] | None = None,
              embedded_gateway: EmbeddedGateway | None = None) -> None:
    """``check_data_dir``: refuses (ValueError) a data directory this kind of server must not open;
    ``embedded_gateway``: served beside the node once it listens, stopped before it."""
    from strom.server.collector import tune_for_serving
    from strom.server.workers import watch_supervisor

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, (host, port), directory = _node_config(bind, data_dir, config_file, defines)
    if check_data_dir is not None:
        try:
            check_data_dir(directory)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    unknown = sorted(k for k in config.to_dict() if k not in ALL_OPTIONS and not k.startswith("datalake."))
    if unknown:
        logging.getLogger("strom").warning("ignoring unknown config keys: %s", ", ".join(unknown))

    exit_codes: list[int] = []

    async def run() -> None:
        node = node_class(directory, host, port, config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, node.request_stop)
        try:
            await node.start()
        except OSError as exc:
            await node.stop()
            raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        except InvalidConfigError as exc:
            await node.stop()
            raise click.ClickException(f"invalid configuration: {exc}") from exc
        except StromError as exc:
            await node.stop()
            raise click.ClickException(f"cannot start: {exc}") from exc
        click.echo(f"{what} listening on {host}:{node.port}, data in {directory}", err=True)
        tune_for_serving()
        if embedded_gateway is not None:
            where = embedded_gateway.bind
            try:
                await asyncio.to_thread(embedded_gateway.start, f"{host}:{node.port}", log_level)
            except (ValueError, OSError, RuntimeError) as exc:
                await asyncio.to_thread(embedded_gateway.stop)
                await node.stop()
                raise click.ClickException(f"cannot serve the gateway on {where}: {exc}") from exc
            click.echo(f"gateway listening on http://{where} (console: http://{where}/console/)", err=True)
        supervisor = asyncio.create_task(watch_supervisor(node.request_stop))
        try:
            await node.serve_forever()
        finally:
            supervisor.cancel()
            if embedded_gateway is not None:
                await asyncio.to_thread(embedded_gateway.stop)
            await node.stop()
            exit_codes.append(getattr(node, "exit_code", 0))

    _run_event_loop(run())
    if exit_codes and exit_codes[0]:
        sys.exit(exit_codes[0])  # e.g. a coordinator that was deposed: its supervisor should restart it


@main.group()
def cluster() -> None:
    """A local cluster for development: ZooKeeper, a coordinator and tablet servers as processes."""


@cluster.command("start")
@click.option("--tablet-servers", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--coordinators", type=click.IntRange(1, 8), default=1, show_default=True,
              help="One is active, the others are standbys that take over.")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="Where every process keeps its data.")
@click.option("-D", "defines", multiple=True, metavar="KEY=VALUE", help="A config key for every server process.")
@click.option("--secure", is_flag=True,
              help="Clients log in (SASL/PLAIN) over TLS with a generated CA, the servers too, ACLs are enforced and "
                   "ZooKeeper speaks TLS and requires a login; prints the super user admin's password.")
@click.option("--sasl-listener", is_flag=True,
              help="With --secure: every server also listens with SASL but without TLS (for pyfluss, which has no "
                   "TLS), on a port of its own; passwords cross it in clear.")
@click.option("--racks", default=None, metavar="RACK,RACK,...",
              help="Each tablet server's tablet-server.rack, in server id order (as many as --tablet-servers).")
def cluster_start(tablet_servers: int, coordinators: int, data_dir: Path, defines: tuple[str, ...], secure: bool,
                  sasl_listener: bool, racks: str | None) -> None:
    """Start the processes in the background; prints the addresses to bootstrap clients from."""
    from strom.server.local_cluster import LocalCluster

    rack_list = [rack.strip() for rack in racks.split(",")] if racks else []
    if rack_list and len(rack_list) != tablet_servers:
        raise click.BadParameter(f"{len(rack_list)} racks for {tablet_servers} tablet servers", param_hint="--racks")
    if sasl_listener and not secure:
        raise click.BadParameter("goes with --secure (without it every listener is open anyway)",
                                 param_hint="--sasl-listener")
    try:
        local = LocalCluster(data_dir, tablet_servers, key_value_pairs(defines, "-D"), coordinators=coordinators,
                             detached=True, secure=secure, sasl_listener=sasl_listener, racks=rack_list)
        local.start()
    except (RuntimeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"strom cluster running: bootstrap.servers={local.bootstrap}, ZooKeeper {local.zookeeper_address}, "
               f"{tablet_servers} tablet servers (stop: strom cluster stop --data-dir {data_dir})")
    if secure:
        client = local.client_config()
        click.echo(f"clients log in: user admin (a super user), password {local.admin_password()} "
                   f"(also in {local.config_path}, readable by you only)")
        if "client.security.ssl.truststore" in client:
            click.echo(f"over TLS ({client['client.security.protocol']}), trusting the cluster's CA: "
                       f"client.security.ssl.truststore={client['client.security.ssl.truststore']}")
        if sasl_listener:
            click.echo(f"pyfluss (no TLS) logs in with SASL on bootstrap.servers={local.pyfluss_bootstrap} "
                       "(passwords cross that listener in clear)")


@cluster.command("stop")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True)
def cluster_stop(data_dir: Path) -> None:
    """Stop the processes ``start`` left in DATA_DIR (by their pids)."""
    from strom.server.local_cluster import LocalCluster

    local = LocalCluster.attach(data_dir)
    if local is None:
        raise click.ClickException(f"no cluster was started from {data_dir}")
    local.stop()
    click.echo("strom cluster stopped")


@cluster.command("status")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def cluster_status(data_dir: Path, as_json: bool) -> None:
    """Each process of the cluster in DATA_DIR and whether it is up."""
    import json as json_module

    from strom.server.local_cluster import LocalCluster

    local = LocalCluster.attach(data_dir)
    if local is None:
        raise click.ClickException(f"no cluster was started from {data_dir}")
    members = local.status()
    rows = [
        {"role": member.role, "server_id": member.server_id, "address": member.address, "pid": member.pid, "up": up,
         "listeners": member.listeners}
        for member, up in members
    ]
    if as_json:
        click.echo(json_module.dumps(rows))
        return
    for row, (member, _up) in zip(rows, members, strict=True):
        name = row["role"] if row["server_id"] is None else f"{row['role']} {row['server_id']}"
        others = "".join(f" ({listener} {address})" for listener, address in member.listeners.items())
        click.echo(f"{name:<18} {row['address']:<22} pid {row['pid']:<8} {'up' if row['up'] else 'DOWN'}{others}")
    if not all(row["up"] for row in rows):
        sys.exit(1)


def _run_event_loop(main_coroutine: Any) -> None:
    """Run the server on uvloop when it is installed (about a third less latency per round trip than
    the standard loop, measured in shared/research/deps-lab.md), else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main_coroutine)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main_coroutine)


@main.group()
def zookeeper() -> None:
    """The cluster's ZooKeeper tree."""


@zookeeper.command("secure")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="YAML file of config keys (a cluster's cluster.yaml).")
@click.option("-D", "defines", multiple=True, metavar="KEY=VALUE",
              help="A config key: zookeeper.address, zookeeper.auth.digest and zookeeper.ssl.* are read.")
def zookeeper_secure(config_file: Path | None, defines: tuple[str, ...]) -> None:
    """Close an existing tree to strangers: every node under zookeeper.address's root gets the ACL of
    zookeeper.auth.digest alone (what servers started with that key give the nodes they create)."""
    from strom.zk.login import ZooKeeperLogin
    from strom.zk.session import connect_kazoo, parse_location, secure_tree

    values = Configuration(_load_config(config_file, defines))
    address, digest = zookeeper_location(values), values.get(ZOOKEEPER_AUTH_DIGEST)
    if not address or not digest:
        raise click.UsageError("set zookeeper.address and zookeeper.auth.digest (-D or --config)")
    hosts, root = parse_location(address)
    client = connect_kazoo(hosts, 30_000, login=ZooKeeperLogin.from_config(values))
    try:
        changed = secure_tree(client, root, digest)
    finally:
        client.stop()
        client.close()
    click.echo(f"{changed} nodes under {root} are now {digest.partition(':')[0]}'s alone")


@main.group()
def config() -> None:
    """Configuration reference, and a running cluster's settings (describe, alter)."""


@config.command("docs")
def config_docs() -> None:
    """Print the configuration reference (Markdown)."""
    sys.stdout.write(options_markdown())


@config.command("table-docs")
def config_table_docs() -> None:
    """Print the table options reference (Markdown)."""
    from strom.coordinator.service import ALTERABLE_TABLE_OPTIONS
    from strom.metadata import table_options

    sys.stdout.write(table_options.options_markdown(ALTERABLE_TABLE_OPTIONS))


@config.command("describe")
@bootstrap_option
@credential_options
@json_option
def config_describe(bootstrap_servers: str, username: str | None, password: str | None, as_json: bool) -> None:
    """The cluster's settings (DescribeClusterConfigs): those set at start and those changed at run time."""

    async def ask(connection: Any) -> Any:
        return await connection.get_admin().describe_cluster_configs()

    entries = run_on_server(client_config(bootstrap_servers, username, password), ask)
    if as_json:
        click.echo(json.dumps([{"key": e.key, "value": e.value, "source": e.source} for e in entries]))
        return
    for entry in entries:
        value = "(secret)" if entry.value is None else entry.value
        click.echo(f"{entry.key} = {value}  [{entry.source}]")


@config.command("alter")
@click.option("--set", "set_pairs", multiple=True, metavar="KEY=VALUE", help="Set a setting (repeatable).")
@click.option("--reset", "reset_keys", multiple=True, metavar="KEY", help="Back to the value set at start (repeatable).")
@bootstrap_option
@credential_options
def config_alter(set_pairs: tuple[str, ...], reset_keys: tuple[str, ...], bootstrap_servers: str,
                 username: str | None, password: str | None) -> None:
    """Change settings of a running cluster (AlterClusterConfigs), all or none; they persist across restarts.
    `strom config docs` marks the settings that can change at run time."""
    changes = key_value_pairs(set_pairs, "--set")

    async def alter(connection: Any) -> None:
        await connection.get_admin().alter_cluster_configs(changes, reset_keys)

    run_on_server(client_config(bootstrap_servers, username, password), alter)
    click.echo(f"altered {len(changes) + len(reset_keys)} cluster configs")


main.add_command(acl)
main.add_command(gateway)
main.add_command(lease)
main.add_command(log_group)
main.add_command(snapshot)
main.add_command(health)
main.add_command(rebalance_group)
main.add_command(server_tag)
main.add_command(table_group)
main.add_command(tiering)


if __name__ == "__main__":
    main()
