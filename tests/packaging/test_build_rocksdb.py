"""scripts/build-rocksdb.sh: a tarball whose checksum differs is never built, a source that cannot be had
leaves strom on rocksdict, and the cache answers without building (what setup.py asks it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from strom.kv import rocksdb

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-rocksdb.sh"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, check=False)


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="the script installs its build tools with apt")
def test_a_tarball_with_another_checksum_is_refused(tmp_path: Path) -> None:
    forged = tmp_path / "rocksdb.tar.gz"
    forged.write_bytes(b"not RocksDB's source")
    cache = tmp_path / "cache"
    done = _run(STROM_CACHE_DIR=str(cache), STROM_ROCKSDB_SOURCE_URL=forged.as_uri())
    assert done.returncode == 1
    assert "checksum mismatch" in done.stderr
    assert done.stdout == ""
    assert list(cache.iterdir()) == []  # the work directory is gone, nothing is cached


def test_an_unreachable_source_leaves_strom_on_rocksdict(tmp_path: Path) -> None:
    done = _run(STROM_CACHE_DIR=str(tmp_path / "cache"), STROM_ROCKSDB_SOURCE_URL=(tmp_path / "absent").as_uri())
    assert done.returncode == 0
    assert done.stdout == ""  # no prefix: setup.py builds strom without the binding
    assert "rocksdict" in done.stderr


def test_cached_only_never_builds(tmp_path: Path) -> None:
    done = _run("--cached-only", STROM_CACHE_DIR=str(tmp_path / "empty"))
    assert (done.returncode, done.stdout) == (0, "")
    assert not (tmp_path / "empty").exists() or list((tmp_path / "empty").iterdir()) == []
    off = _run(STROM_ROCKSDB="off")
    assert (off.returncode, off.stdout) == (0, "")


@pytest.mark.skipif(not rocksdb.NATIVE_AVAILABLE, reason="the native binding is not built here")
def test_the_build_this_checkout_links_is_found_in_the_cache() -> None:
    import strom.kv._rocksdb as native

    done = _run("--cached-only")
    prefix = Path(done.stdout.strip())
    if os.environ.get("STROM_ROCKSDB_DIR"):
        prefix = Path(os.environ["STROM_ROCKSDB_DIR"])
    assert (prefix / "lib" / "librocksdb.a").is_file()
    info = (prefix / "BUILD-INFO").read_text()
    assert f"version={native.ROCKSDB_VERSION}" in info
    assert "sha256=fdccab16" in info
