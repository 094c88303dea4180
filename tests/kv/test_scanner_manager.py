"""ScannerManager with a manual clock: limits, expiry, closing, in-use protection."""

from __future__ import annotations

import pytest

from strom.clock import ManualClock
from strom.errors import ScannerExpiredError, TooManyScannersError, UnknownScannerIdError
from strom.ids import TableBucket
from strom.kv.scan import ScannerConfig, ScannerManager
from strom.records.kv_batch import parse_value_batch

B0 = TableBucket(1, 0)
B1 = TableBucket(1, 1)
CONFIG = ScannerConfig(
    ttl_ms=1000, expiration_interval_ms=100, scanners_per_bucket_max=2, scanners_per_server_max=3,
    batch_size_bytes_max=1 << 20,
)


def values(count: int) -> list[bytes]:
    return [b"\x01\x00" + f"row-{i:04d}".encode() for i in range(count)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_limits_are_enforced_per_bucket_and_per_server_without_changing_counts(clock: ManualClock) -> None:
    manager = ScannerManager(CONFIG, clock)
    manager.register(B0, iter(values(3)), 10, None)
    manager.register(B0, iter(values(3)), 10, None)
    with pytest.raises(TooManyScannersError, match="per-bucket limit of 2"):
        manager.register(B0, iter(values(3)), 10, None)
    manager.register(B1, iter(values(3)), 10, None)
    with pytest.raises(TooManyScannersError, match="server-wide limit of 3"):
        manager.register(B1, iter(values(3)), 10, None)
    assert manager.session_count == 3
    assert manager.bucket_session_count(B0) == 2 and manager.bucket_session_count(B1) == 1


def test_batches_respect_the_byte_size_but_always_carry_one_row(clock: ManualClock) -> None:
    manager = ScannerManager(CONFIG, clock)
    session = manager.register(B0, iter(values(5)), 10, None)
    first = session.next_batch(1)
    assert first.record_count == 1 and first.has_more
    rest = session.next_batch(1 << 20)
    assert rest.record_count == 4 and not rest.has_more
    assert parse_value_batch(first.records) + parse_value_batch(rest.records) == values(5)


def test_the_limit_caps_rows_across_batches(clock: ManualClock) -> None:
    manager = ScannerManager(CONFIG, clock)
    session = manager.register(B0, iter(values(10)), 10, 3)
    counts = []
    while True:
        batch = session.next_batch(1)
        counts.append(batch.record_count)
        if not batch.has_more:
            break
    assert counts == [1, 1, 1]


def test_get_does_not_refresh_the_idle_timer_but_mark_accessed_does(clock: ManualClock) -> None:
    manager = ScannerManager(CONFIG, clock)
    kept = manager.register(B0, iter(values(2)), 10, None)
    idle = manager.register(B1, iter(values(2)), 10, None)
    clock.advance(ms=800)
    manager.get(idle.scanner_id)
    manager.mark_accessed(manager.get(kept.scanner_id))
    clock.advance(ms=300)
    assert manager.expire_idle() == 1
    assert manager.get(kept.scanner_id) is kept
    with pytest.raises(ScannerExpiredError):
        manager.get(idle.scanner_id)
    assert idle.closed


def test_expired_ids_are_remembered_for_twice_the_ttl_then_become_unknown(clock: ManualClock) -> None:
    manager = ScannerManager(CONFIG, clock)
    session = manager.register(B0, iter(values(2)), 10, None)
    clock.advance(ms=1001)
    manager.expire_idle()
    assert manager.is_recently_expired(session.scanner_id)
    clock.advance(ms=2001)
    manager.expire_idle()
    with pytest.raises(UnknownScannerIdError):
        manager.get(session.scanner_id)


def test_closing_a_bucket_marks_its_sessions_expired_and_frees_their_slots(clock: ManualClock) -> None:
    manager = ScannerManager(CONFIG, clock)
    a = manager.register(B0, iter(values(2)), 10, None)
    b = manager.register(B0, iter(values(2)), 10, None)
    other = manager.register(B1, iter(values(2)), 10, None)
    assert manager.close_scanners_for_bucket(B0) == 2
    assert a.closed and b.closed and not other.closed
    assert manager.bucket_session_count(B0) == 0 and manager.session_count == 1
    with pytest.raises(ScannerExpiredError):
        manager.get(a.scanner_id)
    manager.register(B0, iter(values(1)), 10, None)  # the slots are free again


def test_a_close_during_use_is_deferred_to_the_request_using_the_session(clock: ManualClock) -> None:
    manager = ScannerManager(CONFIG, clock)
    session = manager.register(B0, iter(values(3)), 10, None)
    session.in_use = True
    manager.close_scanners_for_bucket(B0)
    assert not session.closed  # the iterator stays valid while the request uses it
    batch = session.next_batch(1)
    assert batch.record_count == 1
    manager.finish_use(session)
    assert session.closed and session.values is None


def test_closing_twice_and_shutdown_are_safe(clock: ManualClock) -> None:
    manager = ScannerManager(CONFIG, clock)
    session = manager.register(B0, iter(values(2)), 10, None)
    manager.close(session)
    manager.close(session)
    assert manager.session_count == 0 and manager.bucket_session_count(B0) == 0
    manager.register(B1, iter(values(2)), 10, None)
    manager.shutdown()
    assert manager.session_count == 0
