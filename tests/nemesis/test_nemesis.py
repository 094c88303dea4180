"""The nemesis's short profile, run with the suite: a few fixed seeds, each a real cluster (ZooKeeper, two
coordinators, three tablet servers) under strom's client and pyfluss while faults are scheduled from the
seed; the checkers then compare what the cluster holds with what the clients were told. The long profile
is ``make nemesis`` (docs/reliability.md). A failure prints the seed, its schedule and the faults as done:
``python -m tests.nemesis.run --seeds SEED --faults N`` replays it."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.zk.zookeeper_server import unavailable_reason
from tests.nemesis.faults import KINDS, schedule
from tests.nemesis.run import run_seed

pytestmark = [pytest.mark.timeout(400), pytest.mark.xdist_group("nemesis")]

SHORT_PROFILE = (0, 3, 440)
FAULTS = 5
PACE_S = 0.1
"""Slower writes than the long profile's: the suite runs other tests beside these on two cores."""


def test_the_short_profile_covers_every_kind_of_fault() -> None:
    """The fixed seeds are chosen so that the suite exercises each fault at least once, and several of them
    for longer than the ZooKeeper session (a partition or a stop that gets a server expired)."""
    faults = [fault for seed in SHORT_PROFILE for fault in schedule(seed, FAULTS, [1, 2, 3])]
    assert {fault.kind for fault in faults} == set(KINDS), f"not drawn: {set(KINDS) - {f.kind for f in faults}}"
    assert len({fault.kind for fault in faults if fault.duration_s > 4.0}) >= 3


@pytest.mark.parametrize("seed", SHORT_PROFILE)
def test_no_acknowledged_write_is_lost_under_the_nemesis(tmp_path: Path, seed: int) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    report = run_seed(tmp_path / "cluster", seed, FAULTS, pace_s=PACE_S)
    assert report.ok, report.describe()
    assert report.acknowledged_writes > 1000, report.describe()
