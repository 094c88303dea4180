"""Run every benchmark, one process each, and print their reports (``make bench``).

Pass ``--quick`` for smaller data sets (a smoke run, not numbers to quote).
"""

from __future__ import annotations

import subprocess
import sys

BENCHES = [
    ("bench.ingest_bench", ["--rows", "1000000"], ["--rows", "100000", "--rounds", "1"]),
    ("bench.peers_bench", [], ["--rows", "100000", "--lookups", "20000", "--singles", "2000"]),
    ("bench.small_writers_bench", ["--wal"], ["--connections", "20", "--seconds", "3", "--warmup", "1"]),
    ("bench.lookup_bench", [], ["--rows", "50000", "--lookups", "20000", "--singles", "2000"]),
    ("bench.lookup_isolation_bench", [], ["--rows", "200000", "--singles", "2000", "--rounds", "1"]),
    ("bench.first_write_bench", [], ["--tables", "2"]),
    ("bench.crash_recovery_bench", [], ["--rows", "200000"]),
    ("bench.log_bench", [], ["--rows", "100000", "--rounds", "1"]),
    ("bench.remote_log_bench", [], ["--rows", "200000", "--rounds", "1"]),
    ("bench.kv_write_path_bench", [], ["--rows", "50000", "--rounds", "1"]),
    ("bench.kv_close_bench", [], ["--rows", "100000", "--rounds", "1"]),
    ("bench.row_cache_soak", [], ["--keys", "100000", "--rows", "100000", "--cache", "2mb"]),
    ("bench.scan_bench", [], ["--rows", "200000"]),
    ("bench.lease_bench", [], []),
    ("bench.auto_increment_bench", [], ["--rows", "50000", "--lookups", "5000"]),
    ("bench.schema_evolution_bench", [], ["--rows", "50000", "--lookups", "5000"]),
    ("bench.cluster_bench", [], ["--rows", "100000"]),
    ("bench.workers_bench", [], ["--rows", "100000"]),
    ("bench.idle_bench", [], ["--seconds", "3"]),
    ("bench.rebalance_bench", [], ["--mb", "50", "--baseline-seconds", "2"]),
    ("bench.spark_bench", [], ["--rows", "200000"]),
    ("bench.spark_exactly_once_bench", [], ["--rows", "100000", "--repeat", "1"]),
    ("bench.spark_pushdown_bench", [], ["--rows", "200000", "--repeat", "1"]),
    ("bench.tiering_bench", [], ["--rows", "200000", "--lag-seconds", "30", "--freshness", "5s"]),
    ("bench.memory_soak", [], ["--seconds", "30", "--sample-seconds", "5"]),
    ("bench.login_bench", [], ["--logins", "300", "--rows", "50000", "--lookups", "10000"]),
    ("bench.metadata_bench", [], ["--coordinator-requests", "50", "--tablet-server-requests", "2"]),
]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failures = 0
    for module, full_args, quick_args in BENCHES:
        print(f"\n### {module}", flush=True)
        result = subprocess.run([sys.executable, "-m", module, *(quick_args if quick else full_args)], check=False)
        failures += result.returncode != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
