"""Fluss's ``kv.rocksdb.*`` options reach RocksDB through both bindings.

Each test runs once per binding (tests/kv/conftest.py). What RocksDB took is read back from the ``OPTIONS-*``
file it writes into the database's directory (the effective options, after its own sanitising), and the
shared rate limiter from the options dump at the head of each database's info log.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from strom.config import Configuration
from strom.kv.rocksdb import KvDatabase, RocksDbOptions, open_rocksdb, vector_memtable_supported

SMALL = RocksDbOptions(block_cache_size_bytes=1 << 20)
"""strom's defaults, with a small block cache."""
NON_DEFAULT = replace(
    SMALL,
    background_jobs=5,
    max_open_files=321,
    log_max_file_size_bytes=3 << 20,
    log_file_num=9,
    log_level="warn_level",
    level_dynamic_size=True,
    compression_per_level=("no", "snappy", "zstd"),
    target_file_size_base_bytes=32 << 20,
    max_size_level_base_bytes=128 << 20,
    write_buffer_count=3,
    write_buffer_number_to_merge=2,
    metadata_block_size_bytes=8 << 10,
    cache_index_and_filter_blocks=True,
    cache_index_and_filter_blocks_with_high_priority=True,
    pin_l0_filter_and_index_blocks_in_cache=True,
    pin_top_level_index_and_filter=True,
    mmap_reads=False,
)
"""A value unlike both Fluss's default and RocksDB's for every option a level-style database reads."""


def _effective(path: Path) -> dict[str, dict[str, str]]:
    """The sections of the newest OPTIONS file (``DBOptions``, ``CFOptions "default"``, …) as dicts."""
    newest = max(path.glob("OPTIONS-*"), key=lambda file: int(file.name.split("-")[1]))
    sections: dict[str, dict[str, str]] = {}
    section: dict[str, str] = {}
    for line in newest.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = sections.setdefault(line[1:-1], {})
        elif "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            section[key] = value
    return sections


def _open_close(path: Path, options: RocksDbOptions) -> dict[str, dict[str, str]]:
    db = open_rocksdb(path, options)
    try:
        db.write([b"k"], [b"v"], [b"applied_log_offset"], [b"\x01" * 8])
        db.flush()
    finally:
        db.close()
    return _effective(path)


def _rate_limiter(log_file: Path) -> str:
    """The rate limiter's address in the options dump of the info log's last open (``(nil)``: none)."""
    found = re.findall(r"Options\.rate_limiter: (\S+)", log_file.read_text())
    assert found, f"no options dump in {log_file}"
    return found[-1]


def test_fluss_defaults_reach_rocksdb_where_they_differ_from_rocksdbs(tmp_path: Path, rocksdb_binding: str) -> None:
    effective = _open_close(tmp_path / "db", SMALL)
    db, cf, table = effective["DBOptions"], effective['CFOptions "default"'], \
        effective['TableOptions/BlockBasedTable "default"']
    # RocksDB's own defaults: one compression, dynamic level sizes, 1000 unbounded info logs, pinned top level
    assert cf["compression_per_level"] == ":".join(["kLZ4Compression"] * 5 + ["kZSTD"] * 2)
    assert cf["level_compaction_dynamic_level_bytes"] == "false"
    assert cf["compaction_style"] == "kCompactionStyleLevel"
    assert db["max_log_file_size"] == str(25 << 20)
    assert db["keep_log_file_num"] == "4"
    assert db["info_log_level"] == "INFO_LEVEL"
    assert db["max_background_jobs"] == "2"
    assert db["max_open_files"] == "-1"
    # Fluss's DBOptions: no periodic stats dump (RocksDB's default is every 600 s, into each bucket's LOG)
    assert db["stats_dump_period_sec"] == "0"
    assert db["allow_mmap_reads"] == "true"  # strom's kv.rocksdb.mmap-reads
    assert table["pin_top_level_index_and_filter"] == "false"
    assert table["cache_index_and_filter_blocks"] == "false"
    # rocksdict 0.3.29 cannot set it: RocksDB's true stays (documented on the key)
    assert table["cache_index_and_filter_blocks_with_high_priority"] == (
        "false" if rocksdb_binding == "native" else "true")
    assert (tmp_path / "db" / "LOG").exists()  # kv.rocksdb.log.dir unset: next to the data


def test_every_option_reaches_rocksdb(tmp_path: Path, rocksdb_binding: str) -> None:
    logs = tmp_path / "rocksdb-logs" / "not-yet-made"
    effective = _open_close(tmp_path / "db", replace(NON_DEFAULT, log_dir=str(logs)))
    db, cf, table = effective["DBOptions"], effective['CFOptions "default"'], \
        effective['TableOptions/BlockBasedTable "default"']
    assert db["max_background_jobs"] == "5"
    assert db["max_open_files"] == "321"
    assert db["allow_mmap_reads"] == "false"
    assert db["max_log_file_size"] == str(3 << 20)
    assert db["keep_log_file_num"] == "9"
    assert db["db_log_dir"] == str(logs)
    assert cf["compression_per_level"] == "kNoCompression:kSnappyCompression:kZSTD"
    assert cf["level_compaction_dynamic_level_bytes"] == "true"
    assert cf["target_file_size_base"] == str(32 << 20)
    assert cf["max_bytes_for_level_base"] == str(128 << 20)
    assert cf["max_write_buffer_number"] == "3"
    assert table["metadata_block_size"] == str(8 << 10)
    assert table["cache_index_and_filter_blocks"] == "true"
    assert table["cache_index_and_filter_blocks_with_high_priority"] == "true"
    assert table["pin_l0_filter_and_index_blocks_in_cache"] == "true"
    assert table["pin_top_level_index_and_filter"] == "true"
    # rocksdict 0.3.29 has no setter for the info log level (documented on kv.rocksdb.log.level)
    assert db["info_log_level"] == ("WARN_LEVEL" if rocksdb_binding == "native" else "INFO_LEVEL")
    # with strom's atomic flush and no WAL, RocksDB lowers min_write_buffer_number_to_merge to 1 (documented)
    assert cf["min_write_buffer_number_to_merge"] == "1"
    # the info log went to kv.rocksdb.log.dir, created, named after the database's path
    assert not (tmp_path / "db" / "LOG").exists()
    assert [file.name for file in logs.iterdir()] == [str(tmp_path / "db").strip("/").replace("/", "_") + "_LOG"]


@pytest.mark.parametrize("style", ["universal", "fifo", "none"])
def test_compaction_styles(tmp_path: Path, rocksdb_binding: str, style: str) -> None:
    effective = _open_close(tmp_path / "db", replace(SMALL, compaction_style=style))
    cf = effective['CFOptions "default"']
    if style == "none" and rocksdb_binding == "rocksdict":  # rocksdict has no NONE (documented)
        assert (cf["compaction_style"], cf["disable_auto_compactions"]) == ("kCompactionStyleLevel", "true")
    else:
        expected = {"universal": "kCompactionStyleUniversal", "fifo": "kCompactionStyleFIFO", "none": "kCompactionStyleNone"}
        assert (cf["compaction_style"], cf["disable_auto_compactions"]) == (expected[style], "false")


def test_one_rate_limiter_is_shared_by_the_databases(tmp_path: Path, rocksdb_binding: str) -> None:
    limited = replace(SMALL, shared_rate_limit_bytes_per_sec=64 << 20)
    # all open at once, so that no limiter's memory is reused for another
    opened = [open_rocksdb(tmp_path / name, options) for name, options in (
        ("a", limited), ("b", limited), ("unlimited", SMALL),
        ("other-rate", replace(SMALL, shared_rate_limit_bytes_per_sec=32 << 20)),
    )]
    for db in opened:
        db.close()
    shared = _rate_limiter(tmp_path / "a" / "LOG")
    assert shared != "(nil)"
    assert _rate_limiter(tmp_path / "b" / "LOG") == shared
    assert _rate_limiter(tmp_path / "unlimited" / "LOG") == "(nil)"
    assert _rate_limiter(tmp_path / "other-rate" / "LOG") not in ("(nil)", shared)


def test_the_rate_limiter_slows_flushes(tmp_path: Path, rocksdb_binding: str) -> None:
    """3 MiB of incompressible rows flushed at 2 MiB/s take over a second (unlimited: a few milliseconds)."""
    options = replace(SMALL, shared_rate_limit_bytes_per_sec=2 << 20)
    db = open_rocksdb(tmp_path / "db", options)
    try:
        keys = [i.to_bytes(8, "big") for i in range(3 * 1024)]
        db.write(keys, [os.urandom(1024) for _ in keys], [], [])
        started = time.monotonic()
        db.flush()
        assert time.monotonic() - started > 0.7
    finally:
        db.close()


def test_data_opens_across_old_and_new_options_both_ways(tmp_path: Path, rocksdb_binding: str) -> None:
    """Before these keys strom ran with one compression (LZ4) and RocksDB's dynamic level sizes."""
    before = replace(SMALL, write_buffer_size_bytes=256 << 10, compression_per_level=("lz4",),
                     level_dynamic_size=True, pin_top_level_index_and_filter=True)
    after = replace(NON_DEFAULT, write_buffer_size_bytes=256 << 10)
    rows: dict[bytes, bytes] = {}
    path = tmp_path / "db"
    for step, options in enumerate((before, after, before, SMALL)):
        db = open_rocksdb(path, options)
        try:
            assert _read_all(db) == rows
            batch = {f"{step}-{i:06}".encode(): os.urandom(64) * 4 for i in range(4000)}  # several memtables
            keys = list(batch)
            for start in range(0, len(keys), 500):
                db.write(keys[start:start + 500], [batch[k] for k in keys[start:start + 500]],
                         [b"applied_log_offset"], [step.to_bytes(8, "big")])
            rows.update(batch)
            db.flush()
            assert _read_all(db) == rows
        finally:
            db.close()
    db = open_rocksdb(path, before, read_only=True)
    try:
        assert _read_all(db) == rows
        assert db.get_meta(b"applied_log_offset") == (3).to_bytes(8, "big")
    finally:
        db.close()


def test_the_server_keys_fill_the_options(caplog: pytest.LogCaptureFixture, rocksdb_binding: str) -> None:
    assert RocksDbOptions.from_config(Configuration({})) == RocksDbOptions()
    configured = RocksDbOptions.from_config(Configuration({
        "kv.rocksdb.thread.num": 5,
        "kv.rocksdb.files.open": 321,
        "kv.rocksdb.log.max-file-size": "3mb",
        "kv.rocksdb.log.file-num": 9,
        "kv.rocksdb.log.dir": "/var/log/strom-rocksdb",
        "kv.rocksdb.log.level": "WARN_LEVEL",
        "kv.rocksdb.shared-rate-limiter.bytes-per-sec": "100mb",
        "kv.rocksdb.compaction.style": "UNIVERSAL",
        "kv.rocksdb.compaction.level.use-dynamic-size": True,
        "kv.rocksdb.compression.per.level": "NO,SNAPPY,ZSTD",
        "kv.rocksdb.compaction.level.target-file-size-base": "32mb",
        "kv.rocksdb.compaction.level.max-size-level-base": "128mb",
        "kv.rocksdb.writebuffer.number-to-merge": 2,
        "kv.rocksdb.block.metadata-blocksize": "8kb",
        "kv.rocksdb.block.cache-index-and-filter-blocks": "true",
        "kv.rocksdb.block.cache-index-and-filter-blocks-with-high-priority": "true",
        "kv.rocksdb.block.pin-l0-filter-and-index-blocks-in-cache": "true",
        "kv.rocksdb.block.pin-top-level-index-and-filter": "true",
        "kv.rocksdb.mmap-reads": "false",
        "kv.rocksdb.write-batch-size": "4mb",  # accepted, no field: strom never splits a committed group
    }))
    assert configured == RocksDbOptions(
        background_jobs=5, max_open_files=321, log_max_file_size_bytes=3 << 20, log_file_num=9,
        log_dir="/var/log/strom-rocksdb", log_level="warn_level", shared_rate_limit_bytes_per_sec=100 << 20,
        compaction_style="universal", level_dynamic_size=True, compression_per_level=("no", "snappy", "zstd"),
        target_file_size_base_bytes=32 << 20, max_size_level_base_bytes=128 << 20, write_buffer_number_to_merge=2,
        metadata_block_size_bytes=8 << 10, cache_index_and_filter_blocks=True,
        cache_index_and_filter_blocks_with_high_priority=True, pin_l0_filter_and_index_blocks_in_cache=True,
        pin_top_level_index_and_filter=True, mmap_reads=False,
    )
    assert RocksDbOptions.from_config(Configuration({"kv.rocksdb.log.dir": ""})).log_dir is None
    with caplog.at_level(logging.WARNING, logger="strom.kv.rocksdb"):
        RocksDbOptions.from_config(Configuration({"kv.rocksdb.bloom-filter.block-based-mode": True}))
    assert "block-based-mode has no effect" in caplog.text


def _read_all(db: KvDatabase) -> dict[bytes, bytes]:
    rows = db.iterator()
    try:
        found: dict[bytes, bytes] = {}
        while chunk := rows.next(1000):
            found.update(chunk)
        return found
    finally:
        rows.close()


def test_a_vector_memtable_is_written_sorted_at_flush_and_opens_as_a_skip_list(
    tmp_path: Path, rocksdb_binding: str,
) -> None:
    """``vector_memtable``: the rows' memtables append (no skip list, no bloom filter) and are sorted when
    flushed; the files are ordinary SST files, which a skip-list open reads in key order. Rewrites of a key
    keep the last value, within one batch and across batches."""
    path = tmp_path / "db"
    db = open_rocksdb(path, SMALL, vector_memtable=True)
    try:
        rows = {i.to_bytes(4, "little"): os.urandom(16) for i in range(5000)}  # little-endian: unsorted writes
        keys = list(rows)
        for start in range(0, len(keys), 700):
            db.write(keys[start:start + 700], [rows[k] for k in keys[start:start + 700]], [], [])
        db.write([keys[7], keys[7]], [b"first", b"second"], [], [])
        db.write([keys[8]], [None], [], [])
        rows[keys[7]] = b"second"
        del rows[keys[8]]
        db.flush()
        rows_family = _effective(path)['CFOptions "default"']
        assert "VectorRep" in rows_family["memtable_factory"]
        assert float(rows_family["memtable_prefix_bloom_size_ratio"]) == 0.0
        assert "SkipList" in _effective(path)['CFOptions "strom_meta"']["memtable_factory"]
    finally:
        db.close()
    db = open_rocksdb(path, SMALL)
    try:
        assert "SkipList" in _effective(path)['CFOptions "default"']["memtable_factory"]
        stored = _read_all(db)
        assert list(stored) == sorted(rows) and stored == rows
        assert db.get(keys[7]) == b"second" and db.get(keys[8]) is None
    finally:
        db.close()


def test_rocksdict_opens_no_vector_memtable_beside_its_shared_rate_limiter(
    tmp_path: Path, rocksdb_binding: str,
) -> None:
    limited = replace(SMALL, shared_rate_limit_bytes_per_sec=64 << 20)
    assert vector_memtable_supported(SMALL)
    if rocksdb_binding == "native":
        assert vector_memtable_supported(limited)
        open_rocksdb(tmp_path / "db", limited, vector_memtable=True).close()
    else:
        assert not vector_memtable_supported(limited)
        with pytest.raises(ValueError, match="rate limiter"):
            open_rocksdb(tmp_path / "db", limited, vector_memtable=True)
        db = open_rocksdb(tmp_path / "limited", limited)  # the shared Options object kept its skip list
        db.close()
        assert "SkipList" in _effective(tmp_path / "limited")['CFOptions "default"']["memtable_factory"]
