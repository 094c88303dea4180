"""``strom server --workers N`` for several N against PostgreSQL with the same writers, in one run: how
durable upsert ingest and batched lookups scale with the tablet-server processes of one machine.

For each N of ``--workers`` (default 1,2; ``bench/workers_scaling.sh`` runs 1,2,4,8,16 on a larger
machine): a throw-away ``strom server --workers N`` (N = 1: the one-process server), a primary-key table of
``--buckets`` buckets (default: 2 × the largest N, so every worker leads some), and ``--writers`` client
processes (default: this machine's cores) that upsert disjoint key ranges in pipelined Arrow batches
(strom's client; acknowledged = fsynced and applied), then look their keys up again with
``lookup_arrow`` of 1 000 keys, one outstanding per process; then once more from half the processes, each
with 8 lookups outstanding (the server's scaling, not its clients'). PostgreSQL (a throw-away cluster,
durable commits) takes the same rows from the same number of writer processes, one connection each, and
answers the same lookups with ``= ANY``.

Printed: rows/s and keys/s per N, over the whole phase and steady (the middle half of the acknowledgements,
without the start and the end, where the slowest of N processes leaves the others idle); the scaling against
N = 1 (the goal: ≥ 0.7 N up to 8 on a machine with enough cores for the workers *and* the writers); and
strom/PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import time
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from bench.cluster_bench import (
    PATH,
    Acks,
    Ready,
    Target,
    create,
    postgres_ingest_table,
    postgres_write_range,
    run_writers,
    run_writers_probed,
    write_range,
)
from bench.harness import (
    BenchServer,
    machine_busy_s,
    main_thread_run_and_wait_s,
    median,
    process_tree_cpu_s,
    report,
    serving_processes,
)
from strom.client import Connection, Lookuper

LOOKUP_KEYS = 1_000


def shuffled(first: int, count: int) -> np.ndarray:
    """The keys ``[first, first + count)`` in a random order (the same for strom and PostgreSQL), made in
    milliseconds: the writers' clock is running."""
    return np.random.default_rng(first).permutation(np.arange(first, first + count, dtype=np.int64))


def lookup_range(address: str, first: int, count: int, _batch: int, ready: Ready, in_flight: int = 1) -> Acks:
    """Look up ``count`` keys of ``[first, first + count)`` in random order, 1 000 per ``lookup_arrow``, with
    ``in_flight`` of them outstanding at a time."""
    keys = shuffled(first, count)
    chunks = [pa.table({"id": pa.array(keys[start:start + LOOKUP_KEYS])}) for start in range(0, len(keys), LOOKUP_KEYS)]
    acks: Acks = []

    async def run() -> None:
        async with await Connection.create(address) as connection:
            lookuper = (await connection.get_table(PATH)).new_lookup().create_lookuper()
            assert isinstance(lookuper, Lookuper)

            async def every_nth(first_chunk: int) -> None:
                for chunk in chunks[first_chunk::in_flight]:
                    found = await lookuper.lookup_arrow(chunk)
                    assert found.num_rows == chunk.num_rows
                    acks.append((time.monotonic(), chunk.num_rows))

            ready()
            await asyncio.gather(*(every_nth(i) for i in range(in_flight)))

    asyncio.run(run())
    return acks


PIPELINED_IN_FLIGHT = 8
"""Lookups outstanding per client in the pipelined lookup phase."""


def pipelined_clients(writers: int) -> int:
    """The clients of the pipelined lookup phase: half the writers, each with :data:`PIPELINED_IN_FLIGHT`
    lookups outstanding. With one lookup outstanding per client the clients' own waiting and CPU bound the
    rate long before the server does (16 of them kept 10 of 16 cores busy); fewer clients with more in
    flight leave the cores to the server, so this phase shows how the server's lookups scale."""
    return max(1, writers // 2)


def postgres_lookup_range(port: int, first: int, count: int, _batch: int, ready: Ready) -> Acks:
    import psycopg

    keys = shuffled(first, count).tolist()
    acks: Acks = []
    with psycopg.connect(host="127.0.0.1", port=port, user="bench", dbname="postgres") as connection, \
            connection.cursor() as cursor:
        ready()
        for start in range(0, len(keys), LOOKUP_KEYS):
            cursor.execute("SELECT id, name, score FROM ingest WHERE id = ANY(%s)", (keys[start:start + LOOKUP_KEYS],))
            assert len(cursor.fetchall()) == len(keys[start:start + LOOKUP_KEYS])
            acks.append((time.monotonic(), len(keys[start:start + LOOKUP_KEYS])))
    return acks


class Phase(NamedTuple):
    """A measured phase."""

    rate: float
    """Rows (or keys) per second, from when every writer was ready until the last was done."""
    steady_rate: float
    """Rows (or keys) per second over the middle half of the acknowledgements (``cluster_bench.steady_rate``):
    without the start and the end, where the slowest of N processes leaves the others idle."""
    server_cores: float
    """Cores kept busy over the measured seconds by the server's processes (all their threads)."""
    writers_cores: float
    """... by the writers' work."""
    machine_cores: float
    """... by the whole machine (those two and anything else)."""
    loop_busy_least: float
    """The least busy tablet server's event loop: the share of the seconds its main thread ran."""
    loop_busy_most: float
    """The busiest one's."""
    loop_waiting: float
    """The share of the seconds the loops waited for a CPU while they could have run, averaged over them:
    a loop that is neither busy nor waiting had no work (its clients were waiting on something else)."""


def measure_strom(workers: int, rows: int, writers: int, batch: int, buckets: int) -> tuple[Phase, Phase, Phase]:
    """(ingest, lookups, pipelined lookups) of ``strom server --workers N``."""
    with BenchServer({"kv.snapshot.interval": "0s"}, workers=workers) as server:
        asyncio.run(create(server.address, buckets))
        assert server.process is not None
        pid = server.process.pid

        loops = serving_processes(pid)

        def probe() -> list[float]:
            measured = [main_thread_run_and_wait_s(loop) for loop in loops]
            return [process_tree_cpu_s(pid), machine_busy_s(), *(run for run, _ in measured),
                    *(wait for _, wait in measured)]

        def phase(target: Target, clients: int = writers) -> Phase:
            rate, seconds, grown, steady = run_writers_probed(target, server.address, rows, clients, batch, probe)
            server_s, machine_s, writers_s = grown[0], grown[1], grown[-1]
            runs, waits = grown[2:2 + len(loops)], grown[2 + len(loops):-1]
            return Phase(rate, steady, server_s / seconds, writers_s / seconds, machine_s / seconds,
                         min(runs) / seconds, max(runs) / seconds, sum(waits) / len(waits) / seconds)

        pipelined = functools.partial(lookup_range, in_flight=PIPELINED_IN_FLIGHT)
        return phase(write_range), phase(lookup_range), phase(pipelined, pipelined_clients(writers))


def measure_postgres_lookups(rows: int, writers: int, batch: int) -> tuple[float, float] | None:
    """(ingest rows/s, lookup keys/s) of PostgreSQL with ``writers`` connections; None without it."""
    with postgres_ingest_table() as pg:
        if pg is None:
            return None
        ingest = run_writers(postgres_write_range, pg.port, rows, writers, batch)
        return ingest, run_writers(postgres_lookup_range, pg.port, rows, writers, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="the worker counts to measure, comma-separated")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=os.cpu_count() or 2, help="client processes")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--buckets", type=int, default=None, help="buckets of the table (default: 2 × the largest N)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds; medians are printed")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    buckets = args.buckets or 2 * max(counts)
    strom: dict[int, list[tuple[Phase, Phase, Phase]]] = {n: [] for n in counts}
    postgres: list[tuple[float, float]] = []
    started = time.monotonic()
    for _ in range(args.rounds):
        for n in counts:
            strom[n].append(measure_strom(n, args.rows, args.writers, args.batch, buckets))
        measured = measure_postgres_lookups(args.rows, args.writers, args.batch)
        if measured is not None:
            postgres.append(measured)
    # medians per N and phase, each of a phase's numbers on its own
    ingest, lookups, pipelined = ({n: Phase._make(median([r[which][i] for r in runs]) for i in range(len(Phase._fields)))
                                  for n, runs in strom.items()} for which in range(3))
    base = counts[0]

    def cores(phase: Phase) -> str:
        return (f"  (cores busy: server {phase.server_cores:.1f}, writers {phase.writers_cores:.1f}, machine "
                f"{phase.machine_cores:.1f} of {os.cpu_count()}; event loops busy {phase.loop_busy_least:.0%}–"
                f"{phase.loop_busy_most:.0%}, waiting for a CPU {waiting(phase)})")

    def waiting(phase: Phase) -> str:
        return "not measured (no schedstat)" if math.isnan(phase.loop_waiting) else f"{phase.loop_waiting:.0%}"

    def rates(phase: dict[int, Phase], n: int, unit: str) -> str:
        whole, steady = phase[n].rate, phase[n].steady_rate
        return (f"{whole:,.0f} {unit}  ×{whole / phase[base].rate:.2f} of workers={base}; steady {steady:,.0f} "
                f"×{steady / phase[base].steady_rate if phase[base].steady_rate else float('nan'):.2f}" + cores(phase[n]))

    lines = []
    for n in counts:
        lines.append((f"workers={n}: ingest", rates(ingest, n, "rows/s")))
        lines.append((f"workers={n}: lookup_arrow of 1 000 keys", rates(lookups, n, "keys/s")))
        lines.append((f"workers={n}: lookup_arrow, {pipelined_clients(args.writers)} clients × {PIPELINED_IN_FLIGHT} in flight",
                      rates(pipelined, n, "keys/s")))
    if postgres:
        pg_ingest, pg_lookups = median([p[0] for p in postgres]), median([p[1] for p in postgres])
        lines.append((f"PostgreSQL, {args.writers} connections: ingest", f"{pg_ingest:,.0f} rows/s"))
        lines.append((f"PostgreSQL, {args.writers} connections: = ANY of 1 000 keys", f"{pg_lookups:,.0f} keys/s"))
        for n in counts:
            lines.append((f"workers={n} / PostgreSQL",
                          f"ingest {ingest[n][0] / pg_ingest:.2f}, lookups {lookups[n][0] / pg_lookups:.2f}"))
    lines.append(("measured in", f"{time.monotonic() - started:.0f} s"))
    report(f"strom server --workers N: {args.rows:,} rows, {args.writers} writer processes, {buckets} buckets, "
           f"{os.cpu_count()} cores, {args.rounds} round(s) (same run)", lines)


if __name__ == "__main__":
    main()
