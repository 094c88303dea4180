"""The atheris targets in fuzz/ stay runnable: each entry function runs over its seed corpus, a few
hundred random mutations of it, and every crash input the fuzzers found (tests/fuzz/crashes/<target>/,
each fixed in the source since). Needs no atheris: without it the targets import uninstrumented."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from fuzz.common import corpus, replay

pytestmark = pytest.mark.timeout(120)

TARGETS = ("frames", "log_batch", "kv_batch", "compacted_row", "indexed_row")
CRASHES = Path(__file__).parent / "crashes"
MUTATIONS = int(os.environ.get("STROM_FUZZ_EXAMPLES", "150")) * 2


def _crash_inputs(target: str) -> list[tuple[str, bytes]]:
    directory = CRASHES / target
    if not directory.is_dir():
        return []
    return [(path.name, path.read_bytes()) for path in sorted(directory.iterdir()) if path.is_file()]


@pytest.mark.parametrize("target", TARGETS)
def test_target_runs_over_its_seed_corpus_and_mutations(target: str) -> None:
    module = importlib.import_module(f"fuzz.fuzz_{target}")
    seeds = corpus(target)
    assert len(seeds) >= 5, f"fuzz/corpus/{target} lost its seeds: rerun python -m fuzz.make_corpus"
    assert replay(module.test_one_input, seeds, MUTATIONS, seed=TARGETS.index(target)) == len(seeds) + MUTATIONS


@pytest.mark.parametrize(
    ("target", "name"), [(t, name) for t in TARGETS for name, _ in _crash_inputs(t)] or [("none", "none")]
)
def test_crash_inputs_found_by_the_fuzzers_stay_fixed(target: str, name: str) -> None:
    if target == "none":
        pytest.skip("no crash inputs recorded")
    module = importlib.import_module(f"fuzz.fuzz_{target}")
    data = dict(_crash_inputs(target))[name]
    module.test_one_input(data)
