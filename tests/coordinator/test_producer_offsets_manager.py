"""Producer offsets on a manual clock, over each metadata store: create-once registration, expiry by TTL
(a registration then replaces them), cleanup, and the ids and TTLs refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.clock import ManualClock
from strom.coordinator.producer_offsets import ProducerOffsets, ProducerOffsetsManager
from strom.errors import InvalidConfigError, InvalidProducerIdError
from strom.ids import TableBucket
from strom.metadata.store import MetadataStore
from strom.server.metadata_stores import open_store

T0_MS = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000
OFFSETS = {TableBucket(7, 0): 10, TableBucket(7, 1): 0, TableBucket(9, 2, 31): 5, TableBucket(9, 0, 30): 3}


@pytest.fixture(params=["sqlite", "zookeeper"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataStore]:
    location = request.getfixturevalue("zookeeper_location") if request.param == "zookeeper" else str(
        tmp_path / "metadata.sqlite"
    )
    opened = open_store(request.param, location)
    yield opened
    opened.close()


def manager(store: MetadataStore, clock: ManualClock) -> ProducerOffsetsManager:
    return ProducerOffsetsManager(store, clock, default_ttl_ms=DAY_MS, cleanup_interval_ms=3600_000)


@pytest.mark.asyncio
async def test_the_first_registration_is_kept_until_it_expires(store: MetadataStore) -> None:
    clock = ManualClock(T0_MS)
    producers = manager(store, clock)
    assert await producers.register("query-1", OFFSETS, ttl_ms=1000)
    again = {TableBucket(7, 0): 99}
    assert not await producers.register("query-1", again)  # ALREADY_EXISTS: nothing changes
    assert await producers.get("query-1") == ProducerOffsets("query-1", T0_MS + 1000, OFFSETS)
    clock.advance(ms=999)
    assert await producers.get("query-1") is not None
    clock.advance(ms=1)
    assert await producers.get("query-1") is None  # expired offsets are not trusted
    assert await producers.stored_table_ids("query-1") == {7, 9}  # still stored until the cleanup
    assert await producers.register("query-1", again)  # an expired registration is replaced
    assert await producers.get("query-1") == ProducerOffsets("query-1", T0_MS + 1000 + DAY_MS, again)


@pytest.mark.asyncio
async def test_the_cleanup_deletes_only_expired_offsets_and_a_delete_is_idempotent(store: MetadataStore) -> None:
    clock = ManualClock(T0_MS)
    producers = manager(store, clock)
    await producers.register("short", OFFSETS, ttl_ms=10)
    await producers.register("long", OFFSETS)
    await producers.register("empty", {})
    clock.advance(ms=10)
    assert await producers.clean_up() == 1
    assert store.list_producer_ids() == ["empty", "long"]
    assert await producers.get("empty") == ProducerOffsets("empty", T0_MS + DAY_MS, {})
    await producers.delete("long")
    await producers.delete("long")
    await producers.delete("never-registered")
    assert store.list_producer_ids() == ["empty"]
    clock.advance(ms=DAY_MS)
    assert await producers.clean_up() == 1 and store.list_producer_ids() == []


@pytest.mark.asyncio
@pytest.mark.parametrize("producer_id", ["", ".", "..", "a/b", "job 1", "x" * 201, "naïve"])
async def test_ids_that_are_not_names_are_refused(store: MetadataStore, producer_id: str) -> None:
    producers = manager(store, ManualClock(T0_MS))
    for call in (lambda: producers.register(producer_id, OFFSETS), lambda: producers.get(producer_id),
                 lambda: producers.delete(producer_id)):
        with pytest.raises(InvalidProducerIdError, match="Invalid producer ID"):
            await call()
    assert store.list_producer_ids() == []


@pytest.mark.asyncio
async def test_a_negative_ttl_is_refused_and_a_zero_ttl_expires_at_once(store: MetadataStore) -> None:
    producers = manager(store, ManualClock(T0_MS))
    with pytest.raises(InvalidConfigError, match="ttl_ms"):
        await producers.register("job", OFFSETS, ttl_ms=-1)
    assert await producers.register("job", OFFSETS, ttl_ms=0)
    assert await producers.get("job") is None
    assert await producers.register("job", OFFSETS, ttl_ms=0)  # replaced, again


@pytest.mark.asyncio
async def test_offsets_that_do_not_decode_count_as_expired(store: MetadataStore) -> None:
    producers = manager(store, ManualClock(T0_MS))
    assert store.create_producer_offsets("job", b"not json")
    assert await producers.get("job") is None
    assert await producers.clean_up() == 1
    assert store.create_producer_offsets("job", b'{"version":99}')
    assert await producers.register("job", OFFSETS)
    registered = await producers.get("job")
    assert registered is not None and registered.offsets == OFFSETS
