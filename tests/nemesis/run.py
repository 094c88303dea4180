"""One nemesis run (a seed: a cluster, a workload, a fault schedule, the checkers), and the long profile.

    python -m tests.nemesis.run --seeds 1-50 --faults 12 --report nemesis-report.json   (make nemesis)

A failing run names its seed and prints its schedule and the faults as they happened; the same seed
replays the same schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from strom.client import Connection, TablePath
from strom.ids import TableBucket
from tests.nemesis import checker
from tests.nemesis.cluster import NemesisCluster
from tests.nemesis.faults import Fault, Nemesis, schedule
from tests.nemesis.workload import BUCKETS, History, create_tables, pyfluss_until, write_until

SETTLE_S = 90.0


@dataclass
class Report:
    seed: int
    faults: list[str]
    kinds: list[str]
    done: list[str] = field(default_factory=list)
    acknowledged_writes: int = 0
    indeterminate_writes: int = 0
    buckets_compared: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        lines = [f"nemesis seed {self.seed}: {'ok' if self.ok else 'FAILED'} ({self.acknowledged_writes} "
                 f"acknowledged writes, {self.indeterminate_writes} indeterminate, {self.seconds:.0f} s)",
                 "schedule:", *(f"  {f}" for f in self.faults), "as done:", *(f"  {d}" for d in self.done)]
        if self.problems:
            lines += ["problems:", *(f"  {p}" for p in self.problems[:40])]
        return "\n".join(lines)


def run_seed(data_dir: Path, seed: int, fault_count: int, tablet_servers: int = 3, pace_s: float = 0.02) -> Report:
    """One run; ``pace_s``: the pause between the strom client's write steps (longer: fewer writes, less
    CPU taken from whatever else runs on the machine)."""
    started = time.monotonic()
    cluster = NemesisCluster(data_dir, tablet_servers)
    faults = schedule(seed, fault_count, list(range(1, tablet_servers + 1)))
    report = Report(seed, [str(f) for f in faults], [f.kind for f in faults])
    history = History()
    try:
        cluster.start()
        cluster.wait_registered(SETTLE_S)
        kv, events, official = asyncio.run(create_tables(cluster.bootstrap, f"nemesis_{seed}"))
        table_ids = asyncio.run(_table_ids(cluster.bootstrap, kv, events, official))
        buckets = [TableBucket(t, b) for t in table_ids for b in range(BUCKETS)]
        cluster.wait_settled(buckets, SETTLE_S)
        nemesis = Nemesis(cluster, lambda follower: _a_leader_followed_by(cluster, buckets, follower))
        _run_workload_under(cluster, (kv, events, official), history, nemesis, faults, pace_s)
        report.done = nemesis.done
        cluster.heal_all()
        for server_id in cluster.tablet_server_ids():
            cluster.restart("tablet-server", server_id)
        for index in range(1, cluster.coordinator_count + 1):
            cluster.restart("coordinator", index)
        states = cluster.wait_settled(buckets, SETTLE_S)
        live = {s for s in cluster.tablet_server_ids() if cluster.is_running("tablet-server", s)}
        report.problems += checker.check_leadership(states, len(buckets), live)
        stored, logged, by_pyfluss = asyncio.run(checker.read_back(cluster.bootstrap, kv, events, official))
        report.problems += checker.check_upserts(history, stored)
        report.problems += checker.check_pyfluss(history, by_pyfluss)
        report.problems += checker.check_appends(history, logged)
    except Exception as exc:  # a run that could not finish is a failed run, with its schedule
        report.problems.append(f"the run failed: {exc!r}")
    finally:
        codes = cluster.stop()
        report.problems += [f"{name} exited with {code}" for name, code in codes.items()
                            if name != "zookeeper" and code not in (0, None)]
        report.problems += [f"{m.role} {m.server_id} logged a broken invariant" for m in cluster.state.members
                            if m.log and "AssertionError" in Path(m.log).read_text(errors="replace")]
    try:
        replica_problems, report.buckets_compared = checker.check_replica_logs(cluster.data_dir,
                                                                              cluster.tablet_server_ids())
    finally:
        cluster.unmount_disks()
    report.problems += replica_problems
    report.acknowledged_writes = history.acknowledged_writes
    report.indeterminate_writes = sum(len(s) for s in history.indeterminate.values()) + len(history.appends_indeterminate)
    report.seconds = time.monotonic() - started
    return report


async def _table_ids(bootstrap: str, *paths: object) -> list[int]:
    async with await Connection.create(bootstrap) as connection:
        return [(await connection.get_admin().get_table_info(path)).table_id for path in paths]  # type: ignore[arg-type]


def _a_leader_followed_by(cluster: NemesisCluster, buckets: list[TableBucket], follower: int) -> int | None:
    """The leader of a bucket ``follower`` replicates (what the pause-then-kill fault kills)."""
    for state in cluster.bucket_states().get_many(buckets).values():
        if follower in state.replicas and state.leader not in (follower, -1):
            return state.leader
    return None


def _run_workload_under(cluster: NemesisCluster, tables: tuple[TablePath, TablePath, TablePath], history: History,
                        nemesis: Nemesis, faults: list[Fault], pace_s: float) -> None:
    """The writers run on an event loop of their own while the nemesis does its faults here; the writes
    go on a few seconds past the last fault."""

    async def workload(stop: asyncio.Event, ready: threading.Event) -> None:
        ready.set()
        kv, events, official = tables
        await asyncio.gather(write_until(cluster.bootstrap, kv, events, history, stop, pace_s),
                             pyfluss_until(cluster.bootstrap, official, history, stop))

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()
    writer = threading.Thread(target=lambda: loop.run_until_complete(workload(stop, ready)), daemon=True)
    writer.start()
    ready.wait(10)
    try:
        nemesis.run(faults, time.monotonic(), lambda: not writer.is_alive())
        time.sleep(3.0)
    finally:
        loop.call_soon_threadsafe(stop.set)
        writer.join(120)


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += list(range(int(first), int(last or first) + 1))
    return seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1-20", help="seeds to run, e.g. 1-50 or 3,7,9")
    parser.add_argument("--faults", type=int, default=12, help="faults per seed")
    parser.add_argument("--tablet-servers", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep every run's directory (logs), not only failed ones")
    parser.add_argument("--report", type=Path, default=None, help="write the runs' summary here (JSON)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    reports = []
    for seed in _seeds(args.seeds):
        directory = Path(tempfile.mkdtemp(prefix=f"strom-nemesis-{seed}-"))
        report = run_seed(directory, seed, args.faults, args.tablet_servers)
        print(report.describe() if not report.ok else report.describe().splitlines()[0], flush=True)
        if report.ok and not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            print(f"  logs kept in {directory}", flush=True)
        reports.append(report)
    kinds = Counter(kind for r in reports for kind in r.kinds)
    summary = {
        "seeds": len(reports), "failed": [r.seed for r in reports if not r.ok],
        "faults_by_kind": dict(sorted(kinds.items())),
        "acknowledged_writes_checked": sum(r.acknowledged_writes for r in reports),
        "indeterminate_writes": sum(r.indeterminate_writes for r in reports),
        "seconds": round(sum(r.seconds for r in reports)),
    }
    print(json.dumps(summary, indent=2))
    if args.report is not None:
        args.report.write_text(json.dumps({"summary": summary, "runs": [asdict(r) for r in reports]}, indent=2))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
