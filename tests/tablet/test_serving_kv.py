"""A lookup reads a bucket's KV state at once (``ReplicaManager.serving_kv``) only where the general path
(``get(bucket).kv``) would read that same state without opening, promoting, recovering or refusing
anything: every other case is left to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.config import Configuration
from strom.errors import KvStorageError, NotLeaderOrFollowerError
from strom.ids import TableBucket
from strom.tablet.replica import ReplicaManager
from tests.kv.test_kv_tablet import table_info


def test_only_an_open_healthy_leader_serves_lookups_at_once(tmp_path: Path) -> None:
    table = table_info({})
    bucket = TableBucket(table.table_id, 0)
    replicas = ReplicaManager(tmp_path / "data", Configuration())
    try:
        assert replicas.serving_kv(bucket) is None  # not hosted: get() refuses it
        replicas.become_leader(table, [bucket])
        assert replicas.serving_kv(bucket) is None  # hosted, its KV state not open: get().kv opens it
        kv = replicas.get(bucket).kv
        assert replicas.serving_kv(bucket) is kv
        replica = replicas.replica(bucket)

        replica.is_leader = False  # a follower: refused by get()
        assert replicas.serving_kv(bucket) is None
        with pytest.raises(NotLeaderOrFollowerError):
            replicas.get(bucket)
        replica.is_leader = True

        kv.failed = KvStorageError("a write failed")  # get() tries to recover it first
        assert replicas.serving_kv(bucket) is None
        kv.failed = None
        log = replica.open_log()
        log._failed = OSError("no space left")  # a failed append took the log offline
        assert replicas.serving_kv(bucket) is None
        log._failed = None

        kv.standby = True  # a follower's warm state: get().kv promotes it first
        assert replicas.serving_kv(bucket) is None
        kv.standby = False
        assert replicas.serving_kv(bucket) is kv

        replica.stopped = True
        assert replicas.serving_kv(bucket) is None
        replica.stopped = False
    finally:
        replicas.close()
