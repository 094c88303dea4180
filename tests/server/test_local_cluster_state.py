"""``cluster.json`` is replaced whole: a reader (`strom cluster status`, `cluster stop`, a test) that reads
it while the supervisor rewrites it sees the old state or the new one, never an empty or half file."""

from __future__ import annotations

import threading
from pathlib import Path

from strom.server.local_cluster import LocalClusterState, Member


def test_readers_never_see_a_half_written_state(tmp_path: Path) -> None:
    state = LocalClusterState(str(tmp_path), [Member("coordinator", 100 + i, f"127.0.0.1:{9000 + i}", i) for i in range(40)])
    state.save()
    stop = threading.Event()
    failures: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                loaded = LocalClusterState.load(tmp_path)
                assert loaded is not None and len(loaded.members) == 40
            except BaseException as exc:  # reported below
                failures.append(exc)
                return

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    for round_ in range(300):
        state.members[0].pid = round_
        state.save()
    stop.set()
    for reader in readers:
        reader.join()
    assert failures == []
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "no temporary file is left behind"
