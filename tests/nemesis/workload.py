"""The workload of a nemesis run, and its history: strom's client upserts into a primary-key table and
appends to a log table, and pyfluss (the official client, in processes of its own) upserts into another
primary-key table, all replicated three ways, recording each write as acknowledged or as indeterminate (it
failed or timed out: it may or may not have landed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from strom.client import Connection, Schema, TableDescriptor, TablePath

log = logging.getLogger(__name__)

KV_FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("step", pa.int64())])
LOG_FIELDS = pa.schema([("id", pa.int64())])
PYFLUSS_FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
PYFLUSS_WRITER = Path(__file__).parent.parent / "cluster" / "pyfluss_writer.py"
PYFLUSS_STALL_S = 6.0
"""pyfluss 1.0.0's writer can go silent for good after a leader change (docs/cluster.md): one silent this
long is replaced by a new process going on from its first unacknowledged key."""
PYFLUSS_CHUNK = 2000
BUCKETS = 3
KEYS = 240
BATCH = 12
WRITE_TIMEOUT_S = 45.0


@dataclass
class History:
    """What the clients were told."""

    acknowledged: dict[int, int] = field(default_factory=dict)
    """Key -> the step of its last acknowledged upsert."""
    indeterminate: dict[int, set[int]] = field(default_factory=dict)
    """Key -> steps of upserts that failed or timed out."""
    appended: list[int] = field(default_factory=list)
    """Acknowledged append ids, in the order they were acknowledged."""
    appends_indeterminate: set[int] = field(default_factory=set)
    pyfluss_acknowledged: set[int] = field(default_factory=set)
    """Keys pyfluss upserted (each once, with the value ``PYFLUSS_VALUE``) and saw acknowledged."""
    pyfluss_sent: int = 0
    """Every key below this was sent by pyfluss (acknowledged or not)."""
    failures: int = 0

    @property
    def acknowledged_writes(self) -> int:
        return self.upserts_acknowledged + len(self.appended) + len(self.pyfluss_acknowledged)

    upserts_acknowledged: int = 0


PYFLUSS_VALUE = "p"


async def create_tables(bootstrap: str, name: str) -> tuple[TablePath, TablePath, TablePath]:
    """The strom client's primary-key and log tables and pyfluss's primary-key table; the last with standby
    replicas, so a failover under faults promotes a follower's warm state, checked like the others."""
    kv, events, official = (TablePath("fluss", f"{name}_kv"), TablePath("fluss", f"{name}_log"),
                            TablePath("fluss", f"{name}_pyfluss"))
    standby = {"table.kv.standby-replica.enabled": "true"}
    async with await Connection.create(bootstrap) as connection:
        admin = connection.get_admin()
        for path, fields, key, options in ((kv, KV_FIELDS, ["id"], {}), (events, LOG_FIELDS, None, {}),
                                           (official, PYFLUSS_FIELDS, ["id"], standby)):
            descriptor = TableDescriptor(Schema.from_arrow(fields, key), bucket_count=BUCKETS,
                                         properties={"table.replication.factor": "3", **options})
            await admin.create_table(path, descriptor)
    return kv, events, official


async def write_until(bootstrap: str, kv: TablePath, events: TablePath, history: History,
                      stop: asyncio.Event, pace_s: float = 0.02) -> None:
    """Upsert a batch of keys and append a batch of ids per step, until ``stop``; a failed write is
    recorded as indeterminate and the next step uses a new connection (the old one may be stuck)."""
    step, next_id = 0, 0
    while not stop.is_set():
        try:
            async with await Connection.create(bootstrap) as connection:
                table, log_table = await connection.get_table(kv), await connection.get_table(events)
                upserter = table.new_upsert().create_writer()
                appender = log_table.new_append().create_writer()
                while not stop.is_set():
                    step += 1
                    keys = [(step * BATCH + i) % KEYS for i in range(BATCH)]
                    try:
                        await asyncio.wait_for(upserter.upsert_arrow_batch(
                            pa.table({"id": keys, "step": [step] * BATCH}, schema=KV_FIELDS)).wait(), WRITE_TIMEOUT_S)
                    except Exception:
                        for key in keys:
                            history.indeterminate.setdefault(key, set()).add(step)
                        raise
                    for key in keys:
                        history.acknowledged[key] = step
                    history.upserts_acknowledged += BATCH
                    ids = list(range(next_id, next_id + BATCH))
                    next_id += BATCH
                    try:
                        await asyncio.wait_for(appender.append_arrow_batch(pa.table({"id": ids})).wait(),
                                               WRITE_TIMEOUT_S)
                    except Exception:
                        history.appends_indeterminate.update(ids)
                        raise
                    history.appended.extend(ids)
                    await asyncio.sleep(pace_s)
        except Exception as exc:
            history.failures += 1
            log.info("a write failed (indeterminate), going on with a new connection: %s", exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


async def pyfluss_until(bootstrap: str, table: TablePath, history: History, stop: asyncio.Event) -> None:
    """pyfluss upserts one key at a time, each printed once acknowledged, in a process replaced whenever it
    falls silent or ends, until ``stop``."""
    while not stop.is_set():
        first = max(history.pyfluss_acknowledged, default=-1) + 1
        history.pyfluss_sent = max(history.pyfluss_sent, first)
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(PYFLUSS_WRITER), bootstrap, table.database_name, table.table_name, str(first),
            str(PYFLUSS_CHUNK), PYFLUSS_VALUE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        assert process.stdout is not None
        try:
            while not stop.is_set():
                try:
                    line = (await asyncio.wait_for(process.stdout.readline(), PYFLUSS_STALL_S)).decode().strip()
                except TimeoutError:
                    break
                if not line:
                    break
                if line.isdigit():
                    history.pyfluss_acknowledged.add(int(line))
                    history.pyfluss_sent = max(history.pyfluss_sent, int(line) + 1)
                elif line.startswith("attempt"):
                    history.pyfluss_sent = max(history.pyfluss_sent, int(line.split()[3].rstrip(":")) + 1)
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()
        # the key after the last acknowledged one may have been sent: it counts as sent
        history.pyfluss_sent = max(history.pyfluss_sent, max(history.pyfluss_acknowledged, default=-1) + 2)
