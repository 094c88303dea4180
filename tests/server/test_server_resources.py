"""The memory a tablet server registers: the advertised size wins, then the cgroup's limit, then the
machine's memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.config import Configuration
from strom.server.resources import advertised_memory_bytes, cgroup_memory_bytes, physical_memory_bytes

MB = 1 << 20


def _v2(root: Path, value: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.max").write_text(value + "\n")
    return root


def _v1(root: Path, value: str) -> Path:
    (root / "memory").mkdir(parents=True, exist_ok=True)
    (root / "memory" / "memory.limit_in_bytes").write_text(value + "\n")
    return root


def test_the_advertised_size_wins(tmp_path: Path) -> None:
    root = _v2(tmp_path, str(512 * MB))
    config = Configuration({"tablet-server.advertised-resource.memory-size": "64mb"})
    assert advertised_memory_bytes(config, root, lambda: 1 << 40) == 64 * MB


def test_an_advertised_zero_falls_back_to_what_is_found(tmp_path: Path) -> None:
    config = Configuration({"tablet-server.advertised-resource.memory-size": "0"})
    assert advertised_memory_bytes(config, _v2(tmp_path, str(512 * MB)), lambda: 1 << 40) == 512 * MB


def test_a_cgroup_v2_limit_then_v1_then_the_machine(tmp_path: Path) -> None:
    config = Configuration({})
    assert advertised_memory_bytes(config, _v2(tmp_path / "v2", str(256 * MB)), lambda: 1 << 40) == 256 * MB
    assert advertised_memory_bytes(config, _v1(tmp_path / "v1", str(128 * MB)), lambda: 1 << 40) == 128 * MB
    assert advertised_memory_bytes(config, tmp_path / "none", lambda: 1 << 40) == 1 << 40
    assert advertised_memory_bytes(config, tmp_path / "none", lambda: None) is None


@pytest.mark.parametrize("value", ["max", "", "lots", "-1", "0", "9223372036854771712"])
def test_a_cgroup_without_a_numeric_limit_is_no_limit(tmp_path: Path, value: str) -> None:
    """``max`` (v2), v1's 'unlimited' (2^63 rounded down to a page), and what does not parse."""
    assert cgroup_memory_bytes(_v2(tmp_path, value)) is None
    both = _v1(_v2(tmp_path / "both", value), str(96 * MB))
    assert cgroup_memory_bytes(both) == 96 * MB, "v1's file is read when v2's gives no limit"


def test_the_machine_memory_is_known_here() -> None:
    found = physical_memory_bytes()
    assert found is not None and found > 64 * MB
