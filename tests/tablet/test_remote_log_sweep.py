"""A new leader deletes the remote files no committed manifest references (what a killed leader uploaded
and never committed) before its first upload — also when its leadership began while it was still loading
the remote log as a follower (the load then must not count as that leadership's sweep)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from strom.clock import ManualClock
from strom.ids import TableBucket
from strom.records.types import IntType
from strom.remote import log_layout
from strom.remote.storage import RemoteStorage
from strom.tablet.remote_log_manager import RemoteLogManager, RemoteLogSettings
from strom.tablet.retained_offsets import RetainedOffsets
from tests.lake.support import table_info


@dataclass
class _Log:
    high_watermark: int = 0

    def closed_segments(self, end_offset: int) -> list[Any]:
        return []


@dataclass
class _Replica:
    """What the remote log manager reads of a hosted bucket."""

    bucket: TableBucket
    table: Any
    leader_epoch: int
    log: _Log = field(default_factory=_Log)
    is_kv: bool = False
    stopped: bool = False


def test_a_leadership_that_begins_during_a_followers_load_still_sweeps_the_orphans(tmp_path: Path) -> None:
    info = table_info(tmp_path, [("id", IntType())], lake="delta", table_id=7)
    bucket = TableBucket(7, 0)
    storage = RemoteStorage(str(tmp_path / "remote"))
    tablet = log_layout.tablet_dir("fluss", "orders", bucket)
    orphan = log_layout.segment_dir(tablet, "killed-leaders-upload")
    (tmp_path / "remote" / orphan).mkdir(parents=True)
    (tmp_path / "remote" / orphan / "00000000000000000000.log").write_bytes(b"half a segment")
    replica = _Replica(bucket, info, leader_epoch=1)

    def read_handle(_bucket: TableBucket) -> bytes | None:
        replica.leader_epoch = 2  # the leadership arrives while the follower's load waits for the record
        return None  # nothing committed yet

    async def scenario() -> None:
        manager = RemoteLogManager(  # of the replicas it reads only what was retained
            SimpleNamespace(retained=RetainedOffsets()), storage,
            RemoteLogSettings(interval_ms=0, max_upload_segments=1, index_interval_bytes=4096,
                              default_ttl=timedelta(days=7)),
            ManualClock(0), read_handle=read_handle, commit=None, partition_name=lambda _p: None,  # type: ignore[arg-type]
            oldest_snapshot=None,  # type: ignore[arg-type]
        )
        await manager._load(replica, sweep=False)  # type: ignore[arg-type]  # as a follower's round loads it
        assert (tmp_path / "remote" / orphan).exists(), "a follower never deletes"
        await manager._tier(replica)  # type: ignore[arg-type]  # the new leader's first round
        assert not (tmp_path / "remote" / orphan).exists(), "the new leader swept the killed leader's upload"

    asyncio.run(scenario())
