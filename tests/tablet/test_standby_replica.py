"""A follower's standby KV state that cannot open (its log starts past what any local state holds and no
snapshot exists) leaves the follower replicating its log, is not tried again on every use of the replica
(each follower fetch opens it), and is tried again once the replica's KV state is dropped (a role change)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from strom.config import Configuration
from strom.ids import TableBucket
from strom.tablet.replica import ReplicaManager
from tests.kv.test_kv_tablet import table_info


@pytest.mark.asyncio
async def test_a_standby_that_cannot_open_is_not_retried_on_every_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = table_info({"table.kv.standby-replica.enabled": "true"})
    bucket = TableBucket(table.table_id, 0)
    replicas = ReplicaManager(tmp_path / "data", Configuration())
    try:
        replicas.become_leader(table, [bucket])
        replica = replicas.replica(bucket)
        replica.is_leader = False  # a follower
        await replica.open_log().start_at(5)  # its leader's older segments went to remote storage
        with caplog.at_level(logging.WARNING, logger="strom.tablet.replica"):
            for _ in range(3):
                replica.open()
        failures = [r for r in caplog.records if "no standby KV state" in r.getMessage()]
        assert len(failures) == 1 and replica.kv_if_open is None and replica.is_open
        replica.close_kv()  # a role change drops the KV state: the next use tries the standby again
        with caplog.at_level(logging.WARNING, logger="strom.tablet.replica"):
            replica.open()
        assert len([r for r in caplog.records if "no standby KV state" in r.getMessage()]) == 2
    finally:
        replicas.close()
