"""A put's old values read before its turn: RocksDB's multi-get on a writer thread, the event loop serving
meanwhile.

A FULL-changelog put (or one that merges, updates some columns, or assigns ids) needs each key's current
value. Where the row cache lacks most keys, reading them from RocksDB took ~60 % of a tablet server's event
loop in a cache-cold update (py-spy, docs/benchmarks.md), time in which it planned nothing else although
the read holds no GIL. :meth:`KvTablet.read_ahead <strom.kv.kv_tablet.KvTablet.read_ahead>` starts that read
on a writer thread when the request arrives; the request then waits for it in its bucket's arrival order
(strom/tablet/arrival_order.py) and plans its batch from the values read. Where the cache holds nearly all
of the keys nothing is read ahead: the put reads the cache at its turn, as cheaply, and keeps no applied
batches waiting for it.

Why the values are right at the put although other writes go on meanwhile: the read starts from what the
cache holds and RocksDB has, which reflects every batch below the bucket's applied offset at the start (the
*floor*); batches at or above it may or may not be in what was read. At the put, what every batch from the
floor on wrote is laid over the values, in log order: the latest write of each key applied meanwhile (kept
here while a read ahead needs it), then the pre-write buffer. A batch's values are whole stored rows, so
laying one over values that already reflect it changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

RETAINED_KEYS_MAX = 1 << 20
"""Keys of applied batches kept for the reads ahead in flight. Past it, once what no read in flight needs is
forgotten, the reads in flight are dropped (their puts read on the loop, as before): a read that never ends
must not keep a bucket's writes in memory."""


class AppliedBatch(Protocol):
    """A changelog batch whose values went into RocksDB (the pre-write buffer's entries)."""

    @property
    def next_offset(self) -> int: ...

    @property
    def keys(self) -> list[bytes]: ...

    @property
    def values(self) -> list[bytes | None]: ...


@dataclass(slots=True, eq=False)
class ReadAhead:
    """One put's old values, read ahead of its turn (:class:`ReadAheads`)."""

    owner: ReadAheads
    keys: Sequence[bytes]
    """The keys read: the put's, or a WAL image's deleted keys (the put reads the same keys, or none of these)."""
    floor: int
    """The bucket's applied offset when the read began: batches from it on are laid over :attr:`values`."""
    generation: int
    reading: asyncio.Future[Any]
    """The read on the writer thread."""
    values: list[bytes | None] | None = None
    """The keys' values as cached and read (None while read, where the read failed, or once taken)."""

    def release(self) -> None:
        """The put is planned, or will not be: the applied batches kept for this read may go."""
        self.owner.release(self)


class ReadAheads:
    """A bucket's reads ahead in flight and what was applied while they were: for each key, the batch that
    last wrote it, so that a put lays over its values only its own keys' writes since its floor, at a cost
    of its keys (laying whole batches over it cost each put all the keys applied since its floor, which grew
    with the requests in flight: 39 % of a loaded loop with 16 pipelined writers, docs/benchmarks.md).
    Owned by the event loop."""

    def __init__(self) -> None:
        self._floors: list[int] = []
        """The floors of the reads in flight, in the order they began (so ascending)."""
        self._written_by: dict[bytes, AppliedBatch] = {}
        """Each key a batch applied while a read was in flight wrote: the batch that last wrote it. Its value
        there is looked up only where a put needs it (a key written since the put's read began: rare)."""
        self._kept_keys = 0
        """The keys of the batches :attr:`_written_by` keeps alive (what the bound counts)."""
        self._generation = 0
        self.read = 0
        """Reads ahead that went to RocksDB on a writer thread (the metric ``strom_kv_reads_ahead``)."""
        self.stale = 0
        """Reads ahead dropped before their put used them (:data:`RETAINED_KEYS_MAX`)."""

    def begin(self, keys: Sequence[bytes], floor: int, reading: asyncio.Future[Any]) -> ReadAhead:
        self._floors.append(floor)
        self.read += 1
        return ReadAhead(self, keys, floor, self._generation, reading)

    def release(self, ahead: ReadAhead) -> None:
        ahead.values = None
        if ahead.generation != self._generation:
            return  # dropped already
        ahead.generation = -1
        self._floors.remove(ahead.floor)
        if not self._floors:
            self._written_by.clear()
            self._kept_keys = 0

    def applied(self, batches: Sequence[AppliedBatch]) -> None:
        """``batches`` went into RocksDB and leave the pre-write buffer: their writes are kept while a read
        ahead may not reflect them."""
        if not self._floors:
            return
        for batch in batches:
            self._written_by.update(dict.fromkeys(batch.keys, batch))
            self._kept_keys += len(batch.keys)
        if self._kept_keys > RETAINED_KEYS_MAX:
            self._forget_up_to(self._floors[0])  # what no read in flight needs any more
            if self._kept_keys > RETAINED_KEYS_MAX:
                self.stale += len(self._floors)
                self._generation += 1
                self._floors.clear()
                self._written_by.clear()
                self._kept_keys = 0

    def _forget_up_to(self, floor: int) -> None:
        """Drop the keys last written by batches ending at or below ``floor``, the lowest floor in flight."""
        self._written_by = {key: batch for key, batch in self._written_by.items() if batch.next_offset > floor}
        kept = {id(batch): batch for batch in self._written_by.values()}
        self._kept_keys = sum(len(batch.keys) for batch in kept.values())

    def take(self, ahead: ReadAhead, keys: Sequence[bytes], covered_from: int | None = None) -> list[bytes | None] | None:
        """The values of ``keys`` as of now, save the pre-write buffer (the caller lays it over them, as over
        any read): ``ahead``'s values with every write applied since its floor laid over them, unless the
        pre-write buffer's index holds every batch from ``covered_from`` on, the floor included (it then
        lays their latest writes over them itself). None where ``ahead`` is not of these keys, was dropped,
        or its read failed: the caller reads as usual."""
        values = ahead.values
        if (values is None or ahead.owner is not self or ahead.generation != self._generation
                or (ahead.keys is not keys and ahead.keys != keys)):
            return None
        ahead.values = None
        if covered_from is not None and covered_from <= ahead.floor:
            return values
        floor, written_by = ahead.floor, self._written_by
        if written_by:
            indexes: dict[int, dict[bytes, bytes | None]] = {}
            for position, key in enumerate(keys):
                batch = written_by.get(key)
                if batch is not None and batch.next_offset > floor:
                    index = indexes.get(id(batch))
                    if index is None:  # a batch holds a key once or more: its last write wins
                        index = indexes[id(batch)] = dict(zip(batch.keys, batch.values, strict=True))
                    values[position] = index[key]
        return values
