"""Prometheus metrics, read live from the components when scraped (nothing to keep in sync).

Served on ``metrics.reporter.prometheus.port`` (0 disables the endpoint) from a registry of this server's
own. The HTTP endpoint runs in its own thread, so a scrape reads the components on the event loop (which
owns them) through ``run_coroutine_threadsafe`` rather than racing with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import GC_COLLECTOR, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strom.clock import Clock
from strom.coordinator.kv_leader_capacity import KvLeaderCapacity
from strom.coordinator.kv_snapshot_leases import KvSnapshotLeaseManager
from strom.coordinator.kv_snapshot_store import KvSnapshotStore
from strom.coordinator.lake_tiering import UNKNOWN, LakeTableTieringManager
from strom.kv import rocksdb
from strom.rpc.api_keys import ApiKey
from strom.rpc.server import RpcServer
from strom.tablet.remote_log_manager import RemoteLogManager
from strom.tablet.replica import Replica, ReplicaManager

SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CoordinatorParts:
    """What the active coordinator's metrics read: leases, snapshot records, lake tiering, the KV leader
    replica capacity."""

    leases: KvSnapshotLeaseManager
    snapshots: KvSnapshotStore
    lake_tiering: LakeTableTieringManager
    kv_leader_capacity: KvLeaderCapacity | None = None


def _api_name(key: int) -> str:
    try:
        return ApiKey(key).name
    except ValueError:
        return str(key)


class StromCollector(Collector):
    """The metrics of one server process: its tablet server's buckets (``replicas``) and, while it is the
    active coordinator, the coordinator's bookkeeping (``coordinator()``); a cluster's processes have one
    of the two, the one-process server both."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        coordinator: Callable[[], CoordinatorParts | None],
        replicas: ReplicaManager | None,
        rpc: Callable[[], RpcServer | None],
        table_name: Callable[[int], str],
        clock: Clock,
        remote_logs: Callable[[], RemoteLogManager | None] = lambda: None,
    ) -> None:
        self._loop = loop
        self._coordinator = coordinator
        self._replicas = replicas
        self._rpc = rpc
        self._table_name = table_name
        self._clock = clock
        self._remote_logs = remote_logs

    def collect(self) -> Iterator[Metric]:
        future = asyncio.run_coroutine_threadsafe(self._gather(), self._loop)
        return iter(future.result(SCRAPE_TIMEOUT_S))

    async def _gather(self) -> list[Metric]:
        return list(self._families())

    def _families(self) -> Iterator[Metric]:
        binding = GaugeMetricFamily("strom_kv_rocksdb_binding_info",
                                    "The RocksDB binding this server opens its buckets with (value 1).",
                                    labels=["binding", "rocksdb_version"])
        binding.add_metric([rocksdb.binding(), rocksdb.rocksdb_version()], 1)
        yield binding
        coordinator = self._coordinator()
        if coordinator is not None:
            yield from self._coordinator_families(coordinator)
        if self._replicas is not None:
            yield from self._tablet_families(self._replicas)
        rpc = self._rpc()
        if rpc is not None:
            yield GaugeMetricFamily("strom_rpc_requests", "RPC requests handled.", value=rpc.stats.requests)
            yield GaugeMetricFamily(
                "strom_rpc_error_responses", "RPC requests answered with an error.", value=rpc.stats.error_responses
            )
            by_api = CounterMetricFamily("strom_rpc_api_requests", "RPC requests routed, by API.", labels=["api"])
            for key, count in sorted(rpc.stats.requests_by_api.items()):
                by_api.add_metric([_api_name(key)], count)
            yield by_api

    def _coordinator_families(self, parts: CoordinatorParts) -> Iterator[Metric]:
        leases = parts.leases
        yield GaugeMetricFamily("strom_kv_snapshot_lease_count", "KV snapshot leases held.", value=leases.lease_count)
        yield GaugeMetricFamily(
            "strom_kv_snapshot_unreadable_lease_count",
            "Leases unreadable at start-up: while any is in force, no snapshot is deleted (drop it to resume).",
            value=len(leases.unreadable_lease_ids),
        )
        yield GaugeMetricFamily(
            "strom_kv_snapshot_leased_snapshot_count",
            "Snapshot pins across all leases (one per lease and bucket).",
            value=leases.pin_count,
        )
        retained = GaugeMetricFamily(
            "strom_kv_snapshot_retained_count", "Completed KV snapshots kept per table.", labels=["table"]
        )
        retained_bytes = GaugeMetricFamily(
            "strom_kv_snapshot_retained_bytes", "Remote bytes of the KV snapshots kept per table.", labels=["table"]
        )
        for table_id, (count, size) in sorted(parts.snapshots.retained_per_table().items()):
            name = self._table_name(table_id)
            retained.add_metric([name], count)
            retained_bytes.add_metric([name], size)
        yield retained
        yield retained_bytes
        capacity = parts.kv_leader_capacity
        if capacity is not None:
            yield GaugeMetricFamily(
                "strom_kv_leader_replica_count",
                "KV leader replicas of the cluster: the buckets of primary-key tables and their partitions.",
                value=capacity.count(),
            )
            yield GaugeMetricFamily(
                "strom_kv_leader_replica_capacity",
                "KV leader replicas the cluster may hold (kv.leader-replica.memory-reserved); -1: unlimited.",
                value=capacity.capacity(),
            )
        yield from self._lake_families(parts.lake_tiering)

    def _tablet_families(self, replicas: ReplicaManager) -> Iterator[Metric]:
        open_buckets = [r for r in replicas.hosted() if r.is_open and not r.stopped]
        yield GaugeMetricFamily("strom_open_buckets", "Buckets whose storage is open.", value=len(open_buckets))
        cache = replicas.row_cache
        yield GaugeMetricFamily("strom_kv_row_cache_size_bytes", "Bytes the row cache holds (kv.row-cache.size).",
                                value=cache.size_bytes)
        yield GaugeMetricFamily("strom_kv_row_cache_capacity_bytes", "The row cache's bound.",
                                value=cache.capacity_bytes)
        yield GaugeMetricFamily("strom_kv_row_cache_entries",
                                "Entries the row cache holds, per generation (a row used again since the last "
                                "rotation counts twice).", value=cache.entries)
        yield CounterMetricFamily("strom_kv_row_cache_hits", "Old-value reads and lookups the row cache answered.",
                                  value=cache.hits)
        yield CounterMetricFamily("strom_kv_row_cache_misses", "Old-value reads and lookups that went to RocksDB.",
                                  value=cache.misses)
        yield CounterMetricFamily("strom_kv_row_cache_bypasses",
                                  "Times a bucket whose existing keys mostly missed started bypassing the cache.",
                                  value=cache.bypassed)
        yield from self._backpressure_families(open_buckets)
        yield from self._standby_families(open_buckets)
        yield from self._remote_log_families(open_buckets)

    def _backpressure_families(self, open_buckets: list[Replica]) -> Iterator[Metric]:
        """Per primary-key table: the highest pressure its buckets last answered, the puts refused for
        their write budget, what their pre-write buffers hold (strom/kv/backpressure.py), and the puts
        whose old values were read ahead."""
        pressure = GaugeMetricFamily(
            "strom_kv_backpressure_pressure",
            "The highest back-pressure signal a bucket of the table last answered a put with (0 to 1).",
            labels=["table"],
        )
        rejections = CounterMetricFamily(
            "strom_kv_backpressure_rejections",
            "Puts refused with StorageBackpressure (72) since the buckets opened.", labels=["table"],
        )
        buffered = GaugeMetricFamily(
            "strom_kv_prewrite_buffer_bytes",
            "Bytes of changelog batches appended and not in RocksDB yet (waiting for the high watermark).",
            labels=["table"],
        )
        reads_ahead = CounterMetricFamily(
            "strom_kv_reads_ahead",
            "Puts whose old values the row cache lacked, read from RocksDB on a writer thread before their turn "
            "(strom/kv/read_ahead.py), since the buckets opened.", labels=["table"],
        )
        per_table: dict[int, tuple[float, int, int, int]] = {}
        for replica in open_buckets:
            kv = replica.kv_if_open
            if kv is None or kv.standby:
                continue
            high, refused, held, read = per_table.get(replica.table.table_id, (0.0, 0, 0, 0))
            per_table[replica.table.table_id] = (max(high, kv.backpressure.last_pressure),
                                                 refused + kv.backpressure.rejections, held + kv.buffered_bytes,
                                                 read + kv.reads_ahead.read)
        for table_id, (high, refused, held, read) in sorted(per_table.items()):
            name = self._table_name(table_id)
            pressure.add_metric([name], high)
            rejections.add_metric([name], refused)
            buffered.add_metric([name], held)
            reads_ahead.add_metric([name], read)
        yield pressure
        yield rejections
        yield buffered
        yield reads_ahead

    def _standby_families(self, open_buckets: list[Replica]) -> Iterator[Metric]:
        """Per primary-key table with standby replicas: the followers here that keep its state warm, and how
        far their states are behind what their logs hold committed (0: a failover serves at once)."""
        warm = GaugeMetricFamily("strom_kv_standby_buckets",
                                 "Buckets this server follows with a warm KV state (table.kv.standby-replica.enabled).",
                                 labels=["table"])
        lag = GaugeMetricFamily("strom_kv_standby_lag_records",
                                "Committed changelog records of followed buckets not in their warm KV state yet.",
                                labels=["table"])
        per_table: dict[int, tuple[int, int]] = {}
        for replica in open_buckets:
            kv = replica.kv_if_open
            if kv is None or not kv.standby or replica.is_leader:
                continue
            count, behind = per_table.get(replica.table.table_id, (0, 0))
            per_table[replica.table.table_id] = (count + 1, behind + max(kv.log.high_watermark - kv.applied_offset, 0))
        for table_id, (count, behind) in sorted(per_table.items()):
            name = self._table_name(table_id)
            warm.add_metric([name], count)
            lag.add_metric([name], behind)
        yield warm
        yield lag

    def _remote_log_families(self, open_buckets: list[Replica]) -> Iterator[GaugeMetricFamily]:
        manager = self._remote_logs()
        if manager is None or not manager.enabled:
            return
        size = GaugeMetricFamily(
            "strom_remote_log_size_bytes", "Bytes of a bucket's log in remote storage.", labels=["table", "bucket"]
        )
        lag = GaugeMetricFamily(
            "strom_remote_log_lag_offsets",
            "Offsets of a led bucket's log below its high watermark not yet in remote storage (the active "
            "segment is never copied).",
            labels=["table", "bucket"],
        )
        for replica in open_buckets:
            if not replica.is_leader:
                continue
            bucket = replica.bucket
            name = str(bucket.bucket) if bucket.partition_id is None else f"p{bucket.partition_id}/{bucket.bucket}"
            labels = [self._table_name(bucket.table_id), name]
            size.add_metric(labels, manager.remote_size_bytes(replica.bucket))
            end = manager.remote_end_offset(replica.bucket)
            lag.add_metric(labels, max(0, replica.log.high_watermark - (end or 0)))
        yield size
        yield lag
        yield GaugeMetricFamily("strom_remote_log_uploaded_bytes", "Bytes copied to remote storage since start.",
                                value=manager.uploaded_bytes)

    def _lake_families(self, lake_tiering: LakeTableTieringManager) -> Iterator[GaugeMetricFamily]:
        states = GaugeMetricFamily(
            "strom_lake_tiering_tables", "Lake-enabled tables per tiering state.", labels=["state"]
        )
        for state, count in lake_tiering.counts_by_state().items():
            states.add_metric([state.value], count)
        yield states
        lag = GaugeMetricFamily(
            "strom_lake_tiering_lag_seconds",
            "Time since a table's last tiering round ended (since the lake was enabled, before the first).",
            labels=["table"],
        )
        data_lag = GaugeMetricFamily(
            "strom_lake_tiering_data_lag_seconds",
            "Time since the newest record timestamp the lake holds, per table (once a commit reported one).",
            labels=["table"],
        )
        failures = GaugeMetricFamily(
            "strom_lake_tiering_failures", "Failed or timed-out tiering rounds per table.", labels=["table"]
        )
        now = self._clock.now_ms()
        for table in lake_tiering.tables():
            name = str(table.path)
            lag.add_metric([name], table.lag_ms(now) / 1000)
            if table.newest_timestamp_ms != UNKNOWN:
                data_lag.add_metric([name], max(0, now - table.newest_timestamp_ms) / 1000)
            failures.add_metric([name], table.failures)
        yield lag
        yield data_lag
        yield failures


def serve_metrics(host: str, port: int, collector: StromCollector) -> tuple[WSGIServer, int]:
    """Start the HTTP endpoint in a daemon thread; returns the server and its bound port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    registry.register(GC_COLLECTOR)  # python_gc_*: the cycle collector's work (strom.server.collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
