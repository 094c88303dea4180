"""Log reads by offset range: one bucket's records (a log table's appends, a primary-key table's changelog).

A read is bounded twice, so that no request makes the gateway hold an unbounded answer: by ``limit``
records (at most :data:`MAX_LOG_RECORDS`) and by ``end_offset``, which may not pass the bucket's high
watermark (what is not written yet is not waited for). ``next_offset`` is where the next read goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

from fastapi import APIRouter, Query, Request

from strom.client.admin import Admin, OffsetSpec
from strom.client.changelog import CHANGE_TYPE_NAMES
from strom.client.log_scanner import ScanBatch
from strom.gateway.errors import LimitExceededError
from strom.gateway.state import gateway_state
from strom.gateway.tables import CachedTable
from strom.gateway.values import to_json
from strom.records.log_batch import ChangeType

router = APIRouter(tags=["log"])

DEFAULT_LOG_RECORDS = 1_000
MAX_LOG_RECORDS = 10_000
READ_IDLE_TIMEOUT_MS = 10_000
"""How long a read waits for records the high watermark says exist (a leader moving) before it gives up."""
_APPEND_ONLY = CHANGE_TYPE_NAMES[ChangeType.APPEND_ONLY]


@router.get("/v1/databases/{db}/tables/{name}/log")
async def read_log(
    request: Request, db: str, name: str,
    bucket: int = Query(ge=0, description="the bucket to read"),
    partition: str | None = Query(None, description="the partition's name (partitioned tables only)"),
    start_offset: int | None = Query(None, ge=0, description="the first offset; default the log's start"),
    end_offset: int | None = Query(None, ge=0, description="the offset to stop before; default the high watermark"),
    limit: int = Query(DEFAULT_LOG_RECORDS, ge=1, description=f"at most this many records (up to {MAX_LOG_RECORDS})"),
) -> dict[str, Any]:
    if limit > MAX_LOG_RECORDS:
        raise LimitExceededError(f"limit {limit} is above the most records one read answers ({MAX_LOG_RECORDS})")

    async def use(entry: CachedTable) -> dict[str, Any]:
        return await _read(entry, bucket, partition, start_offset, end_offset, limit)

    return await gateway_state(request).on_table(request, db, name, use, idempotent=True)


async def _read(
    entry: CachedTable, bucket_id: int, partition: str | None, start_offset: int | None, end_offset: int | None,
    limit: int,
) -> dict[str, Any]:
    table = entry.table
    layout = table.layout
    info = layout.info
    if bucket_id >= layout.bucket_count:
        raise ValueError(f"table {info.path} has buckets 0 to {layout.bucket_count - 1}; there is no bucket {bucket_id}")
    partition_id = None
    if layout.partition_keys:
        if partition is None:
            raise ValueError(f"table {info.path} is partitioned: name the partition to read (partition=...)")
        partition_id = await table.connection.metadata.partition_id(info, partition)
    elif partition is not None:
        raise ValueError(f"table {info.path} is not partitioned")
    admin = Admin(table.connection)

    async def offset(spec: OffsetSpec) -> int:
        return (await admin.list_bucket_offsets(info.table_id, partition_id, [bucket_id], spec))[bucket_id]

    if start_offset is None:
        high_watermark, start = await asyncio.gather(offset(OffsetSpec.latest()), offset(OffsetSpec.earliest()))
    else:
        high_watermark, start = await offset(OffsetSpec.latest()), start_offset
    end = high_watermark if end_offset is None else end_offset
    if end > high_watermark:
        raise ValueError(f"end_offset {end} is past the bucket's high watermark {high_watermark}")
    if start > end:
        raise ValueError(f"start_offset {start} is after the end of the read, {end}")

    records: list[dict[str, Any]] = []
    next_offset = end
    scanner = table.new_scan().create_log_scanner()
    reading = cast(AsyncGenerator[ScanBatch, None], scanner.read_range(
        table.bucket(bucket_id, partition_id), start, end, idle_timeout_ms=READ_IDLE_TIMEOUT_MS))
    async with aclosing(reading) as batches:
        async for scanned in batches:
            rows = scanned.batch.slice(0, limit - len(records)).to_pylist()
            change_types = scanned.change_types
            for index, row in enumerate(rows):
                records.append({
                    "offset": scanned.base_offset + index,
                    "timestamp": scanned.commit_timestamp,
                    "change_type": _APPEND_ONLY if change_types is None else CHANGE_TYPE_NAMES[change_types[index]],
                    "row": {column: to_json(value) for column, value in row.items()},
                })
            if len(records) >= limit:
                next_offset = scanned.base_offset + len(rows)
                break
    return {"records": records, "next_offset": next_offset, "high_watermark": high_watermark}
