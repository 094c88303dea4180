"""Helpers shared by the acceptance tests that drive a real strom server with the official pyfluss client.

Every wait here is a poll with a bounded deadline: a test that waits for records either gets them or fails
with what it got, it never sleeps for a fixed time hoping the server caught up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import fluss
import pyarrow as pa

from tests.conftest import unique_name

DATABASE = "fluss"
POLL_DEADLINE_S = 15.0
POLL_TIMEOUT_MS = 500
QUIET_POLL_MS = 300


async def create_table(
    connection: Any,
    fields: Sequence[pa.Field],
    *,
    primary_keys: list[str] | None = None,
    prefix: str = "t",
    database: str = DATABASE,
    **descriptor: Any,
) -> tuple[fluss.TablePath, Any]:
    """Create a table with a unique name through the admin API; returns its path and FlussTable."""
    path = fluss.TablePath(database, unique_name(prefix))
    schema = fluss.Schema(pa.schema(list(fields)), primary_keys=primary_keys)
    await connection.get_admin().create_table(path, fluss.TableDescriptor(schema, **descriptor))
    return path, await connection.get_table(path)


async def poll_records(scanner: Any, count: int, *, deadline_s: float = POLL_DEADLINE_S) -> list[Any]:
    """Poll a record scanner until ``count`` records arrived (or the deadline passed); then poll once
    more briefly so that records beyond ``count`` show up in the result instead of going unnoticed."""
    collected: list[Any] = []
    deadline = time.monotonic() + deadline_s
    while len(collected) < count and time.monotonic() < deadline:
        collected.extend(await scanner.poll(POLL_TIMEOUT_MS))
    collected.extend(await scanner.poll(QUIET_POLL_MS))
    return collected


async def poll_arrow(scanner: Any, count: int, *, deadline_s: float = POLL_DEADLINE_S) -> pa.Table:
    """Poll a batch scanner with ``poll_arrow`` until ``count`` rows arrived; returns them as one table."""
    tables: list[pa.Table] = []
    rows = 0
    deadline = time.monotonic() + deadline_s
    while rows < count and time.monotonic() < deadline:
        table = await scanner.poll_arrow(POLL_TIMEOUT_MS)
        if table.num_rows:
            tables.append(table)
            rows += table.num_rows
    extra = await scanner.poll_arrow(QUIET_POLL_MS)
    if extra.num_rows:
        tables.append(extra)
    if not tables:
        return extra
    return pa.concat_tables(tables)


async def poll_batches(scanner: Any, count: int, *, deadline_s: float = POLL_DEADLINE_S) -> list[Any]:
    """Poll a batch scanner with ``poll_record_batch`` until the batches hold ``count`` rows."""
    batches: list[Any] = []
    rows = 0
    deadline = time.monotonic() + deadline_s
    while rows < count and time.monotonic() < deadline:
        for batch in await scanner.poll_record_batch(POLL_TIMEOUT_MS):
            batches.append(batch)
            rows += batch.batch.num_rows
    return batches


async def lookup_many(table: Any, keys: Sequence[Any], *, lookuper_count_max: int = 32) -> list[Any]:
    """Look up many keys, in key order. One pyfluss Lookuper serialises its lookups and holds each for its
    batch timeout (100 ms, not configurable from Python), so the keys are spread over several lookupers
    that run concurrently."""
    lookupers = [table.new_lookup().create_lookuper() for _ in range(min(len(keys), lookuper_count_max))]
    results: list[Any] = [None] * len(keys)

    async def run(worker: int) -> None:
        for index in range(worker, len(keys), len(lookupers)):
            results[index] = await lookupers[worker].lookup(keys[index])

    await asyncio.gather(*(run(worker) for worker in range(len(lookupers))))
    return results


async def changelog(table: Any, count: int, *, buckets: int = 1) -> list[Any]:
    """The first ``count`` changelog records of a (non-partitioned) table from the earliest offset of
    every bucket, in the order the scanner delivered them (offset order within a bucket)."""
    scanner = await table.new_scan().create_log_scanner()
    scanner.subscribe_buckets({bucket: fluss.EARLIEST_OFFSET for bucket in range(buckets)})
    return await poll_records(scanner, count)


def change_types(records: Sequence[Any]) -> list[str]:
    return [record.change_type.short_string() for record in records]
