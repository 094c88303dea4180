"""The checkers of a nemesis run: what the cluster holds once every fault is healed, against the history.

- every acknowledged upsert is readable with its last acknowledged value (or with a later write that was
  indeterminate), and nothing is stored that was never written; the same for pyfluss's upserts;
- every acknowledged append is in the log exactly once, and in each bucket in the order acknowledged;
  indeterminate appends at most once, nothing else;
- every bucket has a live leader and all replicas back in its ISR;
- after the cluster stops, the replicas of each bucket hold the same bytes up to the shortest log.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from strom.client import Connection, OffsetSpec, TablePath
from strom.log.log_tablet import LogConfig, LogTablet
from strom.membership.contract import LeaderAndIsr
from tests.nemesis.workload import BUCKETS, PYFLUSS_VALUE, History


async def read_back(bootstrap: str, kv: TablePath, events: TablePath, official: TablePath,
                    ) -> tuple[dict[int, int], dict[int, list[int]], dict[int, str]]:
    async with await Connection.create(bootstrap) as connection:
        rows = await (await (await connection.get_table(kv)).new_scan().create_batch_scanner()).to_arrow()
        stored = dict(zip(rows.column("id").to_pylist(), rows.column("step").to_pylist(), strict=True))
        rows = await (await (await connection.get_table(official)).new_scan().create_batch_scanner()).to_arrow()
        by_pyfluss = dict(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))
        table = await connection.get_table(events)
        ends = await connection.get_admin().list_offsets(events, list(range(BUCKETS)), OffsetSpec.latest())
        logged: dict[int, list[int]] = {}
        for bucket, end in sorted(ends.items()):
            ids: list[int] = []
            async for change in table.new_scan().create_log_scanner().read_range(table.bucket(bucket), 0, end):
                ids += change.batch.column("id").to_pylist()
            logged[bucket] = ids
        return stored, logged, by_pyfluss


def check_upserts(history: History, stored: dict[int, int]) -> list[str]:
    problems = []
    for key, step in history.acknowledged.items():
        allowed = {step} | {s for s in history.indeterminate.get(key, ()) if s > step}
        if stored.get(key) not in allowed:
            problems.append(f"key {key}: acknowledged step {step}, stored {stored.get(key)}")
    written = set(history.acknowledged) | set(history.indeterminate)
    problems += [f"key {key} stored ({step}) but never written" for key, step in stored.items() if key not in written]
    return problems


def check_pyfluss(history: History, stored: dict[int, str]) -> list[str]:
    problems = [f"pyfluss key {key}: acknowledged, stored {stored.get(key)!r}" for key in sorted(history.pyfluss_acknowledged)
                if stored.get(key) != PYFLUSS_VALUE]
    problems += [f"pyfluss key {key} stored but never sent" for key in stored if key >= history.pyfluss_sent]
    return problems


def check_appends(history: History, logged: dict[int, list[int]]) -> list[str]:
    problems = []
    counts = Counter(i for ids in logged.values() for i in ids)
    acknowledged = set(history.appended)
    problems += [f"acknowledged append {i} is missing" for i in history.appended if counts[i] == 0]
    problems += [f"append {i} is there {n} times" for i, n in counts.items() if n > 1]
    problems += [f"append {i} is there but was never sent" for i in counts
                 if i not in acknowledged and i not in history.appends_indeterminate]
    for bucket, ids in logged.items():
        in_order = [i for i in ids if i in acknowledged]
        if in_order != sorted(in_order):
            problems.append(f"bucket {bucket}: acknowledged appends out of order")
    return problems


def check_leadership(states: dict[object, LeaderAndIsr], expected: int, live: set[int]) -> list[str]:
    problems = [f"{bucket}: no live leader or replicas out of the ISR once healed: {state}"
                for bucket, state in states.items() if state.leader not in live or set(state.isr) != set(state.replicas)]
    if len(states) != expected:
        problems.append(f"{expected - len(states)} buckets have no state")
    return problems


def check_replica_logs(data_dir: Path, tablet_servers: list[int]) -> tuple[list[str], int]:
    """Compare, bucket by bucket, every replica's log on disk (the cluster stopped); returns the problems
    and how many buckets were compared."""
    replicas: dict[str, list[Path]] = {}
    for server_id in tablet_servers:
        root = data_dir / f"tablet-server-{server_id}" / "tablets"
        for log_dir in root.glob("*/*/*/log"):
            replicas.setdefault(str(log_dir.relative_to(root)), []).append(log_dir)
    config = LogConfig(1 << 30, 1, 7 * 24 * 3600 * 1000)
    problems = []
    for name, directories in replicas.items():
        logs = [LogTablet.open(directory, config) for directory in directories]
        try:
            start = max(log.log_start_offset for log in logs)
            end = min(log.log_end_offset for log in logs)
            contents = {log.read_range(start, end, 1 << 40, unacknowledged=True) for log in logs}
            if len(contents) > 1:
                problems.append(f"{name}: replicas differ within offsets [{start}, {end})")
        finally:
            for log in logs:
                log.close()
    return problems, len(replicas)
