"""Producer offsets: what an exactly-once writer registers before it writes, so a restart can undo or skip.

Fluss's RegisterProducerOffsets (1053), GetProducerOffsets (1054) and DeleteProducerOffsets (1055). A
producer (a Flink job in Fluss, a Spark query or job here) registers, under its producer id, the log end
offset of every bucket it is about to write; whoever restarts it reads them back to know where its own
writes began. Registration is "create unless present": the first one for an id stores the offsets with an
expiry (``ttl_ms``, or ``coordinator.producer-offsets.ttl``) and answers CREATED; later ones answer
ALREADY_EXISTS and change nothing, until the stored offsets expire, when a registration replaces them.
The coordinator deletes expired offsets every ``coordinator.producer-offsets.cleanup-interval``.

Where strom differs from Fluss:
* the offsets are stored in the metadata store itself (Fluss keeps a small node in ZooKeeper pointing to
  files in remote storage): one document, so a registration is one atomic create and nothing can be left
  half-written; a producer of ~20 000 buckets still fits ZooKeeper's node limit;
* GetProducerOffsets answers expired offsets as absent (Fluss answers them until the cleanup ran): a
  registration would replace them anyway, so a restart must not trust them;
* a negative ``ttl_ms`` is refused (InvalidConfigError) rather than stored already expired.

Owned by the event loop (only the active coordinator serves these requests); every store call runs on a
store thread (:func:`off_loop`). The store's create is atomic on its own, so two coordinators racing
through a failover still store one registration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.clock import Clock
from strom.errors import CorruptMessageError, InvalidConfigError, StromError, UnknownTableOrBucketError
from strom.ids import TableBucket
from strom.metadata.off_loop import off_loop
from strom.metadata.store import ProducerOffsetStore
from strom.metadata.table_info import validate_producer_id
from strom.rpc.messages import add_producer_offsets, pb

log = logging.getLogger(__name__)

CREATED = 0
ALREADY_EXISTS = 1
_FORMAT_VERSION = 1
_REGISTER_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class ProducerOffsets:
    producer_id: str
    expiration_ms: int
    offsets: dict[TableBucket, int]

    def is_expired(self, now_ms: int) -> bool:
        return now_ms >= self.expiration_ms

    def table_ids(self) -> set[int]:
        return {bucket.table_id for bucket in self.offsets}

    def encode(self) -> bytes:
        tables: dict[int, list[list[int | None]]] = {}
        for bucket, offset in sorted(self.offsets.items(), key=lambda item: item[0].sort_key()):
            tables.setdefault(bucket.table_id, []).append([bucket.partition_id, bucket.bucket, offset])
        document = {
            "version": _FORMAT_VERSION,
            "expiration_time": self.expiration_ms,
            "tables": [{"table_id": table_id, "buckets": buckets} for table_id, buckets in tables.items()],
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, producer_id: str, payload: bytes) -> ProducerOffsets:
        document = json.loads(payload)
        if document.get("version") != _FORMAT_VERSION:
            raise ValueError(f"producer offsets of {producer_id!r} have unknown version {document.get('version')}")
        offsets = {
            TableBucket(table["table_id"], bucket, partition_id): offset
            for table in document["tables"]
            for partition_id, bucket, offset in table["buckets"]
        }
        return cls(producer_id, int(document["expiration_time"]), offsets)


class ProducerOffsetsManager:
    """Registers, reads, deletes and expires producer offsets in the metadata store."""

    def __init__(self, store: ProducerOffsetStore, clock: Clock, default_ttl_ms: int, cleanup_interval_ms: int) -> None:
        self._store = store
        self._clock = clock
        self.default_ttl_ms = default_ttl_ms
        self._cleanup_interval_ms = cleanup_interval_ms
        self._cleanup_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._cleanup_task = asyncio.ensure_future(self._clean_up_periodically())

    async def stop(self) -> None:
        if self._cleanup_task is not None:
            self._cleanup_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cleanup_task

    async def _clean_up_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._cleanup_interval_ms / 1000)
            try:
                await self.clean_up()
            except Exception:
                log.exception("cleaning up expired producer offsets failed; trying again next interval")

    async def register(self, producer_id: str, offsets: Mapping[TableBucket, int], ttl_ms: int | None = None) -> bool:
        """Store ``offsets`` unless the producer has unexpired ones: True if stored (CREATED).

        Raises: InvalidProducerIdError, InvalidConfigError (a negative TTL)."""
        validate_producer_id(producer_id)
        if ttl_ms is not None and ttl_ms < 0:
            raise InvalidConfigError(f"ttl_ms must not be negative, got {ttl_ms}")
        ttl = self.default_ttl_ms if ttl_ms is None else ttl_ms
        return await off_loop(self._register, producer_id, dict(offsets), ttl)

    def _register(self, producer_id: str, offsets: dict[TableBucket, int], ttl: int) -> bool:
        for _attempt in range(_REGISTER_ATTEMPTS):
            now = self._clock.now_ms()
            payload = ProducerOffsets(producer_id, now + ttl, dict(offsets)).encode()
            if self._store.create_producer_offsets(producer_id, payload):
                return True
            existing = self._read(producer_id)
            if existing is not None and not existing.is_expired(now):
                return False
            self._store.delete_producer_offsets(producer_id)  # expired (or unreadable): replace it
        return False

    async def get(self, producer_id: str) -> ProducerOffsets | None:
        """The producer's unexpired offsets, None when it has none."""
        validate_producer_id(producer_id)
        found = await off_loop(self._read, producer_id)
        return None if found is None or found.is_expired(self._clock.now_ms()) else found

    async def delete(self, producer_id: str) -> None:
        validate_producer_id(producer_id)
        await off_loop(self._store.delete_producer_offsets, producer_id)

    async def stored_table_ids(self, producer_id: str) -> set[int]:
        """The tables a producer's stored offsets (expired or not) cover; empty for an unknown or invalid id."""
        try:
            found = await off_loop(self._read, producer_id)
        except StromError:
            return set()
        return set() if found is None else found.table_ids()

    async def clean_up(self) -> int:
        """Delete every expired registration; returns how many."""
        return await off_loop(self._clean_up)

    def _clean_up(self) -> int:
        now = self._clock.now_ms()
        deleted = 0
        for producer_id in self._store.list_producer_ids():
            found = self._read(producer_id)
            if found is not None and found.is_expired(now):
                self._store.delete_producer_offsets(producer_id)
                deleted += 1
        if deleted:
            log.info("deleted %d expired producer offsets", deleted)
        return deleted

    def _read(self, producer_id: str) -> ProducerOffsets | None:
        payload = self._store.get_producer_offsets(producer_id)
        if payload is None:
            return None
        try:
            return ProducerOffsets.decode(producer_id, payload)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("producer offsets of %r do not decode (%s); treated as expired", producer_id, exc)
            return ProducerOffsets(producer_id, 0, {})


class ProducerOffsetsService:
    """The three RPCs over a :class:`ProducerOffsetsManager`."""

    def __init__(self, manager: ProducerOffsetsManager, table_exists: Callable[[int], bool] = lambda _id: True) -> None:
        """``table_exists``: whether a table id is in the catalog (offsets of an unknown table are refused)."""
        self.manager = manager
        self._table_exists = table_exists

    async def register_producer_offsets(self, request: Any, _context: object) -> Any:
        offsets: dict[TableBucket, int] = {}
        for table in request.table_offsets:
            if not self._table_exists(table.table_id):
                raise UnknownTableOrBucketError.unknown_table_id(table.table_id)
            for entry in table.bucket_offsets:
                if not entry.HasField("log_end_offset"):
                    raise CorruptMessageError(
                        f"bucket {entry.bucket_id} of table {table.table_id} has no log_end_offset"
                    )
                partition_id = entry.partition_id if entry.HasField("partition_id") else None
                offsets[TableBucket(table.table_id, entry.bucket_id, partition_id)] = entry.log_end_offset
        ttl_ms = request.ttl_ms if request.HasField("ttl_ms") else None
        created = await self.manager.register(request.producer_id, offsets, ttl_ms)
        return pb.RegisterProducerOffsetsResponse(result=CREATED if created else ALREADY_EXISTS)

    async def get_producer_offsets(self, request: Any, _context: object) -> Any:
        found = await self.manager.get(request.producer_id)
        response = pb.GetProducerOffsetsResponse()
        if found is None:
            return response
        response.producer_id = found.producer_id
        response.expiration_time = found.expiration_ms
        add_producer_offsets(response.table_offsets, found.offsets)
        return response

    async def delete_producer_offsets(self, request: Any, _context: object) -> Any:
        await self.manager.delete(request.producer_id)
        return pb.DeleteProducerOffsetsResponse()


__all__ = [
    "ALREADY_EXISTS",
    "CREATED",
    "ProducerOffsets",
    "ProducerOffsetsManager",
    "ProducerOffsetsService",
]
