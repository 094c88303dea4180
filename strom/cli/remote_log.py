"""``strom log remote``: how much of a table's log lives in remote storage, and how far it lags."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table as RichTable

from strom.cli.common import bootstrap_option, client_config, credential_options, json_option, run_on_server
from strom.client.admin import OffsetSpec
from strom.ids import TablePath
from strom.remote.log_layout import RemoteLogManifest
from strom.remote.storage import read_location


@click.group("log")
def log_group() -> None:
    """Table logs: their remote part."""


@log_group.command("remote")
@click.argument("table")
@click.option("--partition", default=None, help="Partition name, for partitioned tables.")
@bootstrap_option
@credential_options
@json_option
def log_remote(table: str, partition: str | None, bootstrap_servers: str, username: str | None,
               password: str | None, as_json: bool) -> None:
    """Each bucket of DB.TABLE: its log's start and high watermark, the remote part's end, segments and
    size, and the lag (offsets below the high watermark not in remote storage yet)."""
    path = TablePath.parse(table)

    async def gather(connection: Any) -> tuple[Any, dict[int, int], dict[int, int], list[tuple[int, str, int]]]:
        admin = connection.get_admin()
        info = await admin.get_table_info(path)
        partition_id = None
        if partition is not None:
            found = [p for p in await admin.list_partition_infos(path) if p.partition_name == partition]
            if not found:
                raise click.ClickException(f"table {path} has no partition {partition!r}")
            partition_id = found[0].partition_id
        buckets = list(range(info.bucket_count))
        earliest = await admin.list_offsets(path, buckets, OffsetSpec.earliest(), partition)
        latest = await admin.list_offsets(path, buckets, OffsetSpec.latest(), partition)
        manifests = await admin.list_remote_log_manifests(info.table_id, partition_id)
        return info, earliest, latest, manifests

    info, earliest, latest, manifests = run_on_server(client_config(bootstrap_servers, username, password), gather)
    remote = {bucket: (location, end) for bucket, location, end in manifests}
    rows = []
    for bucket in range(info.bucket_count):
        location, end = remote.get(bucket, (None, None))
        segments = size = None
        if location is not None:
            try:  # the manifest is readable where remote storage is (a shared directory, an object store)
                manifest = RemoteLogManifest.from_bytes(read_location(location))
                segments, size = len(manifest.segments), manifest.size_bytes
            except (OSError, ValueError, KeyError):
                pass
        rows.append({"bucket": bucket, "log_start_offset": earliest[bucket], "high_watermark": latest[bucket],
                     "remote_end_offset": end, "remote_segments": segments, "remote_size_bytes": size,
                     "lag_offsets": latest[bucket] - (end or earliest[bucket])})
    if as_json:
        click.echo(json.dumps({"table": str(path), "table_id": info.table_id, "buckets": rows}, indent=2))
        return
    view = RichTable(title=f"remote log of {path} (table id {info.table_id})")
    for column in ("bucket", "log start", "high watermark", "remote end", "segments", "remote bytes", "lag"):
        view.add_column(column, justify="right")

    def shown(value: object) -> str:
        return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)

    for row in rows:
        view.add_row(*(shown(row[key]) for key in ("bucket", "log_start_offset", "high_watermark", "remote_end_offset",
                                                    "remote_segments", "remote_size_bytes", "lag_offsets")))
    Console().print(view)
