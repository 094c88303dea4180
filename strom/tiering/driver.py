"""The tiering service's driver: takes tables from the coordinator and tiers them, one round at a time.

The main thread asks the coordinator for a table (``LakeTieringHeartbeat`` with ``request_table``),
plans the round, leases the KV snapshots it will read, runs one Spark job (one task per split), commits
the round (:mod:`strom.tiering.commit`) and reports it finished or failed in its next request. A
heartbeat thread meanwhile renews the round's tiering epoch and the lease, and cancels the Spark job if
the coordinator says the table is no longer this job's (fenced, dropped).

The service keeps no state of its own: progress lives in the coordinator and the lake, and the lease id
is derived from the job id, so a restarted driver finds its own lease (and clears what a crashed
predecessor pinned) instead of leaving an orphan behind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from strom.client import Connection
from strom.client.admin import Admin
from strom.client.lake import FinishedTiering, HeartbeatResult, TieringAssignment, tiering_lease_id
from strom.client.snapshots import KvSnapshotLease
from strom.config import parse_duration
from strom.errors import StromError, UnsupportedVersionError
from strom.ids import TableBucket
from strom.lake.formats import lake_format
from strom.metadata.table_info import TableInfo
from strom.tiering.commit import (
    RoundOutcome,
    commit_round,
    latest_lake_snapshot,
    register_missing_lake_commit,
)
from strom.tiering.gates import pass_gate
from strom.tiering.splits import SplitKind, TieringSplit, bucket_positions, plan_splits
from strom.tiering.tasks import RESULT_SCHEMA, RoundContext, decode_results, split_runner

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_JOB_ID = "strom-tiering"
DEFAULT_FRESHNESS = "3min"
LEASE_REPLAN_ATTEMPTS = 3
ONCE_FAILURES_MAX = 5
"""With ``once``, a table whose rounds fail this many times in a row is given up (the run then fails)."""
RESULT_DDL = "split_index int, write_result binary, log_end_offset long, max_timestamp long, forced boolean"
assert [f.name for f in RESULT_SCHEMA] == [c.split()[0] for c in RESULT_DDL.split(", ")]


def _summary(exc: BaseException) -> str:
    """One line for the log: a Spark task failure's Python error rather than the JVM's stack."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    python_errors = [line for line in lines if not line[0].isspace() and ("Error" in line or "Exception" in line)
                     and not line.startswith(("org.", "SQLSTATE", "\tat"))]
    return python_errors[-1] if python_errors else (lines[0] if lines else type(exc).__name__)


HEARTBEAT_INTERVAL_MAX_MS = 10_000
"""However long ``tiering.poll.table.interval`` is, a round's heartbeats are at most this far apart."""


@dataclass(frozen=True, slots=True)
class TieringOptions:
    bootstrap_servers: str
    job_id: str = DEFAULT_JOB_ID
    poll_interval_ms: int = 30_000
    """``tiering.poll.table.interval``: how often an idle driver asks for a table, and the heartbeat
    period while a round runs (kept well under the coordinator's heartbeat timeout)."""
    lease_duration_ms: int = 6 * 3600 * 1000
    """``lake.tiering.kv-snapshot-lease.duration``; renewed on every heartbeat while anything is pinned."""
    min_round_duration_ms: int = 60_000
    """``tiering.round.min-duration``: a round is cut at ``max(table.datalake.freshness, this)`` after it
    starts, so a freshness of seconds does not cut every round before Spark has started its tasks."""
    once: bool = False
    """Stop once every lake-enabled table that existed at start has finished one round."""
    gate_dir: str | None = None
    """``testing.tiering.gate-dir``: see :mod:`strom.tiering.gates`."""
    client_options: tuple[tuple[str, str], ...] = ()
    """``client.*`` options for strom's client on the driver and in tasks, e.g. Fluss's
    ``client.security.*`` credentials for a SASL listener."""

    @property
    def client_config(self) -> dict[str, str]:
        return {**dict(self.client_options), "bootstrap.servers": self.bootstrap_servers}

    @property
    def lease_id(self) -> str:
        return tiering_lease_id(self.job_id)

    @property
    def heartbeat_interval_s(self) -> float:
        """A round's heartbeat period: the poll interval, but never so long that the coordinator's heartbeat
        timeout (2 min by default) or the lease could run out between two."""
        return min(self.poll_interval_ms, self.lease_duration_ms / 3, HEARTBEAT_INTERVAL_MAX_MS) / 1000


class _Loop:
    """An asyncio loop on its own thread that owns the client connection; other threads submit to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="strom-tiering-loop", daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@dataclass
class _Round:
    assignment: TieringAssignment
    pinned: set[TableBucket] = field(default_factory=set)
    lost: StromError | None = None
    """Set by the heartbeat thread when the coordinator took the table away (fenced, dropped)."""

    @property
    def job_group(self) -> str:
        return f"strom-tiering-{self.assignment.table_id}-{self.assignment.tiering_epoch}"


class TieringDriver:
    """Runs rounds until stopped (``stop()`` from any thread, e.g. a signal handler) or, with
    ``once``, until every lake table known at start has been tiered once."""

    def __init__(self, spark: Any, options: TieringOptions) -> None:
        self._spark = spark
        self._options = options
        self._loop = _Loop()
        self._connection: Connection | None = None
        self._stopping = threading.Event()
        self._round: _Round | None = None
        self._round_lock = threading.Lock()
        self._finished: list[FinishedTiering] = []
        self._failed: dict[int, int] = {}
        self._failure_reasons: dict[int, str] = {}
        """Why each round in ``_failed`` failed: told to the coordinator (DescribeLakeTiering shows it)."""
        self._leases_supported = True
        self._unreleased: set[TableBucket] = set()
        """Pins a round could not release (the coordinator was unreachable): released again at every
        heartbeat until it works, so that renewals do not keep them alive."""
        self.outcomes: list[tuple[TieringAssignment, RoundOutcome]] = []
        """Every committed round of this run, in order (for callers and tests)."""
        self.given_up: set[int] = set()
        """Tables a ``once`` run stopped retrying after ONCE_FAILURES_MAX failed rounds."""

    # ---- lifecycle ----
    def run(self) -> None:
        self._connection = self._loop.call(Connection.create(self._options.client_config))
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="strom-tiering-heartbeat", daemon=True)
        try:
            self._loop.call(self._admin.lake_tiering_heartbeat())  # registration: fails fast if unreachable
            self._drop_lease("clearing what an earlier run of this job left pinned")
            heartbeat.start()
            self._serve()
        finally:
            self._stopping.set()
            self._report_pending()
            self._drop_lease("shutting down")
            self._loop.call(self._connection.close())
            self._loop.close()

    def stop(self) -> None:
        """Ask the driver to stop; a running round is cancelled and reported failed. Safe to call from a
        signal handler: the cancellation goes to Spark from its own thread, not from inside the main
        thread's pending call into the JVM."""
        self._stopping.set()
        with self._round_lock:
            current = self._round
        if current is not None:
            threading.Thread(
                target=self._spark.sparkContext.cancelJobGroup, args=(current.job_group,),
                name="strom-tiering-cancel", daemon=True,
            ).start()

    @property
    def _admin(self) -> Admin:
        assert self._connection is not None
        return self._connection.get_admin()

    @property
    def _lease(self) -> KvSnapshotLease:
        """The job's lease handle (creating one sends nothing)."""
        return self._admin.create_kv_snapshot_lease(self._options.lease_id, self._options.lease_duration_ms)

    # ---- the main loop ----
    def _serve(self) -> None:
        remaining = self._tables_to_tier_once() if self._options.once else None
        failures: dict[int, int] = {}
        while not self._stopping.is_set():
            if remaining is not None:
                remaining &= self._tables_to_tier_once()  # forget tables dropped or no longer lake-enabled
                if not remaining:
                    log.info("every lake table has been tiered once; stopping (--once)")
                    return
            try:
                result = self._request_table()
            except (StromError, OSError) as exc:
                log.warning("heartbeat to the coordinator failed (%s); retrying", exc)
                self._stopping.wait(self._options.poll_interval_ms / 1000)
                continue
            if result.assignment is None:
                self._stopping.wait(self._options.poll_interval_ms / 1000)
                continue
            table_id = result.assignment.table_id
            outcome = self._tier(result.assignment)
            if remaining is None:
                continue
            failures[table_id] = 0 if outcome is not None else failures.get(table_id, 0) + 1
            if outcome is not None or failures[table_id] >= ONCE_FAILURES_MAX:
                remaining.discard(table_id)
                if outcome is None:
                    log.error("giving up on %s after %d failed rounds (--once)", result.assignment.table_path,
                              failures[table_id])
                    self.given_up.add(table_id)

    def _tables_to_tier_once(self) -> set[int]:
        statuses = self._loop.call(self._admin.describe_lake_tiering())
        return {status.table_id for status in statuses}

    def _request_table(self) -> HeartbeatResult:
        finished, failed, reasons = list(self._finished), dict(self._failed), dict(self._failure_reasons)
        result = self._loop.call(self._admin.lake_tiering_heartbeat(
            finished=finished, failed=failed, request_table=True, failure_reasons=reasons))
        self._finished.clear()
        self._failed.clear()
        self._failure_reasons.clear()
        for table_id, error in result.errors.items():
            log.warning("coordinator refused the report of table %d: %s", table_id, error)
        return result

    def _report_pending(self) -> None:
        if not (self._finished or self._failed):
            return
        try:
            self._loop.call(
                self._admin.lake_tiering_heartbeat(finished=list(self._finished), failed=dict(self._failed),
                                                   failure_reasons=dict(self._failure_reasons)), 10
            )
        except Exception as exc:
            log.warning("could not report the last round to the coordinator: %s", exc)

    # ---- one round ----
    def _tier(self, assignment: TieringAssignment) -> RoundOutcome | None:
        current = _Round(assignment)
        with self._round_lock:
            self._round = current
        started = time.monotonic()
        try:
            outcome = self._run_round(current)
        except Exception as exc:
            reason = current.lost or exc
            log.warning("tiering round of %s (epoch %d) failed: %s", assignment.table_path,
                        assignment.tiering_epoch, _summary(reason))
            log.debug("tiering round failure", exc_info=exc)
            if current.lost is None:
                self._failed[assignment.table_id] = assignment.tiering_epoch
                self._failure_reasons[assignment.table_id] = _summary(reason)
            return None
        finally:
            with self._round_lock:
                self._round = None
            self._release(current)
        stats = outcome.stats
        self._finished.append(
            FinishedTiering(
                assignment.table_id, assignment.tiering_epoch, outcome.forced,
                stats.file_size if stats else None, stats.record_count if stats else None,
            )
        )
        self.outcomes.append((assignment, outcome))
        seconds = time.monotonic() - started
        log.info(
            "tiered %s (epoch %d): %d buckets, %d rows, %d files, %d bytes in %.1f s; lake snapshot %s%s",
            assignment.table_path, assignment.tiering_epoch, len(outcome.offsets), outcome.record_count,
            outcome.file_count, outcome.file_size, seconds, outcome.lake_snapshot_id,
            " (cut at the freshness deadline; the rest follows at once)" if outcome.forced else "",
        )
        return outcome

    def _run_round(self, current: _Round) -> RoundOutcome:
        assignment = current.assignment
        admin = self._admin
        table: TableInfo = self._loop.call(admin.get_table_info(assignment.table_path))
        if table.table_id != assignment.table_id:
            raise StromError(f"table '{assignment.table_path}' was re-created (id {table.table_id}, "
                             f"assigned {assignment.table_id})")
        lake_table = lake_format(table).table(table)
        known = self._loop.call(latest_lake_snapshot(admin, table))
        known = self._loop.call(
            register_missing_lake_commit(admin, table, lake_table, known, assignment.tiering_epoch)
        )
        base_snapshot_id = lake_table.latest_snapshot_id()
        splits = self._plan_and_lease(current, table, known)
        if not splits:
            return RoundOutcome(None, {}, False, None, 0, 0, 0)
        own_freshness_ms = table.options.datalake_freshness_ms
        freshness_ms = own_freshness_ms if own_freshness_ms is not None else int(
            parse_duration(DEFAULT_FRESHNESS).total_seconds() * 1000)
        context = RoundContext(
            self._options.bootstrap_servers, table, base_snapshot_id,
            int(time.time() * 1000) + max(freshness_ms, self._options.min_round_duration_ms), self._options.gate_dir,
            self._options.client_options,
        )
        pass_gate(self._options.gate_dir, "planned")
        results = decode_results(self._run_spark_job(current, context, splits))
        if current.lost is not None:
            raise current.lost
        return self._loop.call(
            commit_round(admin, table, lake_table, assignment.tiering_epoch, base_snapshot_id, splits, results,
                         self._options.gate_dir)
        )

    def _plan_and_lease(self, current: _Round, table: TableInfo, known: Any) -> list[TieringSplit]:
        """Plan the splits; pin every snapshot split's snapshot before any task reads it. A snapshot
        reported unavailable (deleted since it was listed) is planned again from fresh positions."""
        for _attempt in range(LEASE_REPLAN_ATTEMPTS):
            positions = self._loop.call(bucket_positions(self._admin, table))
            splits = plan_splits(positions, known)
            pins = {s.bucket: s.snapshot_id for s in splits if s.kind is SplitKind.SNAPSHOT and s.snapshot_id is not None}
            if not pins or not self._leases_supported:
                return splits
            try:
                result = self._loop.call(self._lease.acquire_snapshots(pins))
            except UnsupportedVersionError:
                log.warning("the server has no KV snapshot lease RPCs; snapshots are read without a lease")
                self._leases_supported = False
                return splits
            current.pinned.update(bucket for bucket in pins if bucket not in result.unavailable_snapshots)
            if not result.unavailable_snapshots:
                return splits
            log.info("%d snapshots of %s were deleted before they could be leased; planning again",
                     len(result.unavailable_snapshots), table.path)
        raise StromError(f"could not lease the KV snapshots of '{table.path}' after {LEASE_REPLAN_ATTEMPTS} attempts")

    def _run_spark_job(self, current: _Round, context: RoundContext, splits: list[TieringSplit]) -> Any:
        context_spark = self._spark.sparkContext
        context_spark.setJobGroup(
            current.job_group,
            f"strom tiering {current.assignment.table_path} (epoch {current.assignment.tiering_epoch}): "
            f"{len(splits)} splits",
            interruptOnCancel=True,
        )
        frame = self._spark.range(0, len(splits), 1, numPartitions=len(splits)).selectExpr("cast(id as int) as split")
        return frame.mapInArrow(split_runner(context, splits), RESULT_DDL).toArrow()

    # ---- heartbeats and the lease ----
    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(self._options.heartbeat_interval_s):
            self.release_leftovers()
            with self._round_lock:
                current = self._round
            if current is None:
                continue
            assignment = current.assignment
            try:
                result = self._loop.call(
                    self._admin.lake_tiering_heartbeat(tiering={assignment.table_id: assignment.tiering_epoch})
                )
                if current.pinned and self._leases_supported:
                    self._loop.call(self._lease.renew())
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            error = result.errors.get(assignment.table_id)
            if error is not None:
                log.warning("the coordinator took %s away from this job: %s; cancelling its round",
                            assignment.table_path, error)
                current.lost = error
                self._spark.sparkContext.cancelJobGroup(current.job_group)

    def _release(self, current: _Round) -> None:
        if not current.pinned:
            return
        try:
            self._loop.call(self._lease.release_snapshots(current.pinned), 30)
        except Exception as exc:
            log.warning("could not release the snapshots of %s: %s; trying again", current.assignment.table_path, exc)
            self._unreleased |= current.pinned

    def release_leftovers(self) -> None:
        """Release the pins an earlier round failed to release (called from the heartbeat thread)."""
        if not self._unreleased or not self._leases_supported:
            return
        leftovers = set(self._unreleased)
        try:
            self._loop.call(self._lease.release_snapshots(leftovers), 30)
        except Exception as exc:
            log.warning("could not release %d leftover snapshots yet: %s", len(leftovers), exc)
            return
        self._unreleased -= leftovers
        log.info("released %d snapshots an earlier round left pinned", len(leftovers))

    def _drop_lease(self, why: str) -> None:
        if not self._leases_supported or self._connection is None:
            return
        try:
            self._loop.call(self._lease.drop(), 30)
            log.info("dropped lease %s (%s)", self._options.lease_id, why)
        except UnsupportedVersionError:
            log.warning("the server has no KV snapshot lease RPCs; snapshots are read without a lease")
            self._leases_supported = False
        except (StromError, OSError, concurrent.futures.TimeoutError) as exc:
            log.warning("could not drop lease %s: %s", self._options.lease_id, exc)
