"""The tiering driver's heartbeats and lease, against a real server (no Spark: these paths run on the
driver alone). Each test is a defect an audit found: a failed release left pins that every renewal kept
alive; a server without lease RPCs was detected silently; a long poll interval made rounds time out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.client.lake import TieringAssignment
from strom.errors import NetworkError, UnsupportedVersionError
from strom.tiering.driver import TieringDriver, TieringOptions, _Round
from tests.conftest import unique_name
from tests.integration.snapshot_support import wait_for_snapshot_ids
from tests.server_process import ServerProcess


@pytest.fixture
def driver(server_factory: Callable[..., ServerProcess]) -> Iterator[TieringDriver]:
    server = server_factory({"kv.snapshot.interval": "200ms"})
    driver = TieringDriver(None, TieringOptions(server.address, job_id=unique_name("job")))
    driver._connection = driver._loop.call(Connection.create(driver._options.client_config))
    yield driver
    driver._loop.call(driver._connection.close())
    driver._loop.close()


class _Failing:
    """The driver's lease handle, with calls named in ``failing`` raising ``error`` once each."""

    def __init__(self, lease: Any, failing: set[str], error: Exception) -> None:
        self._lease, self._failing, self._error = lease, failing, error

    def __getattr__(self, name: str) -> Any:
        if name in self._failing:
            self._failing.discard(name)

            async def fail(*_args: object) -> None:
                raise self._error

            return fail
        return getattr(self._lease, name)


def test_a_long_poll_interval_never_spaces_heartbeats_past_the_coordinator_s_timeout() -> None:
    options = TieringOptions("127.0.0.1:1", poll_interval_ms=10 * 60_000)
    assert options.heartbeat_interval_s <= 10, "the coordinator fails a round after 2 min without a heartbeat"


def test_a_release_that_failed_is_retried_so_renewals_do_not_keep_the_pins(
    driver: TieringDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def pinned_table() -> tuple[Any, int]:
        async with await Connection.create(driver._options.client_config) as connection:
            path = TablePath("fluss", unique_name("pinned"))
            schema = Schema.from_arrow(pa.schema([("id", pa.int64())]), primary_key=["id"])
            await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
            table = await connection.get_table(path)
            await table.new_upsert().create_writer().upsert_batch(pa.table({"id": list(range(10))}))
            snapshot = (await wait_for_snapshot_ids(connection.get_admin(), path, 0)).snapshots[0]
            assert snapshot is not None
            return table.bucket(0), snapshot.snapshot_id

    bucket, snapshot_id = asyncio.run(pinned_table())
    driver._loop.call(driver._lease.acquire_snapshots({bucket: snapshot_id}))
    current = _Round(TieringAssignment(bucket.table_id, TablePath("fluss", "x"), 1), {bucket})
    real_lease = type(driver)._lease
    flaky = _Failing(real_lease.fget(driver), {"release_snapshots"}, NetworkError("coordinator unreachable"))  # type: ignore[attr-defined]
    monkeypatch.setattr(type(driver), "_lease", property(lambda _self: flaky))
    driver._release(current)  # fails: the pin is still held

    def pinned() -> list[Any]:
        return driver._loop.call(driver._admin.list_kv_snapshot_leases(driver._options.lease_id))

    assert pinned() and pinned()[0].snapshots, "the failed release left the pin"
    driver.release_leftovers()  # the next heartbeat's work
    assert pinned() == [], "the leftover pin was released (and with it the emptied lease)"


def test_a_server_without_lease_rpcs_is_said_once_and_leases_are_not_tried_again(
    driver: TieringDriver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_lease = type(driver)._lease
    flaky = _Failing(real_lease.fget(driver), {"drop"}, UnsupportedVersionError("no DropKvSnapshotLease"))  # type: ignore[attr-defined]
    monkeypatch.setattr(type(driver), "_lease", property(lambda _self: flaky))
    with caplog.at_level(logging.WARNING, logger="strom.tiering.driver"):
        driver._drop_lease("clearing what an earlier run of this job left pinned")
    assert "the server has no KV snapshot lease RPCs" in caplog.text
    assert not driver._leases_supported
