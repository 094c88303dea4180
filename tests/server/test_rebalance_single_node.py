"""Server tags and rebalance on `strom server` (one process hosts every bucket, so nothing can move):
Fluss's answers and refusals, and tags and the last rebalance kept across a restart."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, RebalanceStatus, Schema, ServerTag, TableDescriptor, TablePath
from strom.config import Configuration
from strom.errors import (
    NoRebalanceInProgressError,
    RebalanceFailureError,
    ServerNotExistError,
    ServerTagNotExistError,
)
from strom.server.node import StromServer

pytestmark = pytest.mark.asyncio


async def test_a_single_server_plans_nothing_and_refuses_to_drain_itself(tmp_path: Path) -> None:
    config = Configuration({"kv.snapshot.interval": "0s"})
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, config)
    await server.start()
    try:
        async with await Connection.create(f"127.0.0.1:{server.port}") as connection:
            admin = connection.get_admin()
            assert await admin.list_rebalance_progress() is None
            with pytest.raises(NoRebalanceInProgressError):
                await admin.cancel_rebalance()
            schema = Schema.from_arrow(pa.schema([pa.field("id", pa.int64(), nullable=False)]), primary_key=["id"])
            await admin.create_table(TablePath("fluss", "t"), TableDescriptor(schema, bucket_count=2))

            rebalance_id = await admin.rebalance()
            progress = await admin.list_rebalance_progress(rebalance_id)
            assert progress is not None and progress.status is RebalanceStatus.COMPLETED and progress.moves == []
            assert progress.progress == 1.0
            with pytest.raises(NoRebalanceInProgressError, match="not the current"):
                await admin.list_rebalance_progress("another")

            server_id = next(n.id for n in await admin.get_server_nodes() if n.server_type == "TabletServer")
            with pytest.raises(ServerNotExistError):
                await admin.add_server_tag([server_id + 1], ServerTag.TEMPORARY_OFFLINE)
            await admin.add_server_tag([server_id], ServerTag.PERMANENT_OFFLINE)
            await admin.add_server_tag([server_id], ServerTag.PERMANENT_OFFLINE)  # the same tag again is fine
            with pytest.raises(RebalanceFailureError, match="no eligible tablet server"):
                await admin.rebalance()
            with pytest.raises(ServerTagNotExistError):
                await admin.remove_server_tag([server_id], ServerTag.TEMPORARY_OFFLINE)
            kept = await admin.list_rebalance_progress()
            assert kept is not None and kept.rebalance_id == rebalance_id, "a refused plan replaces nothing"
    finally:
        await server.stop()

    restarted = StromServer(tmp_path / "data", "127.0.0.1", 0, config)
    await restarted.start()
    try:
        async with await Connection.create(f"127.0.0.1:{restarted.port}") as connection:
            admin = connection.get_admin()
            progress = await admin.list_rebalance_progress()
            assert progress is not None and progress.rebalance_id == rebalance_id
            with pytest.raises(RebalanceFailureError):
                await admin.rebalance()  # the tag survived the restart
            await admin.remove_server_tag([server_id], ServerTag.PERMANENT_OFFLINE)
            assert (await admin.list_rebalance_progress(await admin.rebalance())).status is RebalanceStatus.COMPLETED
    finally:
        await restarted.stop()
