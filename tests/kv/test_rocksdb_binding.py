"""The RocksDB bindings behind strom's KV tablet: one interface, the same files.

Each test here runs once per binding (tests/kv/conftest.py); the cross-binding tests open with one binding
what the other wrote, with strom's exact options, both ways, checkpoints included.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import rocksdict

from strom.kv import rocksdb
from strom.kv.rocksdb import META_COLUMN_FAMILY, RocksDbOptions, destroy_rocksdb, open_rocksdb

ROWS = {i.to_bytes(8, "big"): f"value-{i}".encode() * 3 for i in range(5_000)}
native_only = pytest.mark.skipif(not rocksdb.NATIVE_AVAILABLE, reason="the native binding is not built here")


def _fill(db: rocksdb.KvDatabase, rows: dict[bytes, bytes] = ROWS) -> None:
    db.write(list(rows), list(rows.values()), [b"applied_log_offset"], [b"\x07" * 8])


def test_writes_reads_and_deletes_in_one_atomic_batch(tmp_path: Path, rocksdb_binding: str) -> None:
    db = open_rocksdb(tmp_path / "db")
    try:
        _fill(db)
        key = next(iter(ROWS))
        # a later write of a key in the same batch wins, None deletes
        db.write([b"k", b"k", key], [b"first", b"second", None], [], [])
        assert db.get(b"k") == b"second"
        assert db.get(key) is None
        keys = [*reversed(list(ROWS)[1:50]), b"missing", key]
        assert db.multi_get(keys) == [*(ROWS[k] for k in reversed(list(ROWS)[1:50])), None, None]
        current = {**ROWS, b"k": b"second"}
        del current[key]
        assert db.multi_get(sorted(keys), sorted=True) == [current.get(k) for k in sorted(keys)]
        assert db.multi_get([]) == []
        assert db.get_meta(b"applied_log_offset") == b"\x07" * 8
        assert db.get(b"applied_log_offset") is None  # the families are apart
        db.put_meta(b"instance_id", b"abc")
        assert db.get_meta(b"instance_id") == b"abc"
    finally:
        db.close()


def test_iterators_step_in_key_order_from_a_fixed_view(tmp_path: Path, rocksdb_binding: str) -> None:
    db = open_rocksdb(tmp_path / "db")
    try:
        _fill(db)
        rows = db.iterator()
        db.write([b"\x00late"], [b"written after the iterator was made"], [], [])
        seen = []
        while chunk := rows.next(700):
            seen += chunk
        assert seen == sorted(ROWS.items())
        assert rows.next(10) == []
        rows.close()
        # from a start key, with a prefix bound (the iterator stays put before the first key outside it)
        prefix = (3).to_bytes(8, "big")[:7]  # keys 0..255 share their first seven bytes
        rows = db.iterator(prefix)
        first = rows.next(100, prefix=prefix, keys=False)
        assert first == [ROWS[k] for k in sorted(ROWS) if k.startswith(prefix)][:100]
        rest = rows.next(1_000, prefix=prefix, keys=False)
        assert len(first) + len(rest) == 256
        assert rows.next(5, prefix=prefix) == []
        assert rows.next(1) == [(b"\x00\x00\x00\x00\x00\x00\x01\x00", ROWS[(256).to_bytes(8, "big")])]
        rows.close()
        # a byte bound: the row that passes it ends the step and is included
        rows = db.iterator()
        size = len(ROWS[next(iter(sorted(ROWS)))])
        assert len(rows.next(100, bytes_max=size * 3 + 1, keys=False)) == 4
        rows.close()
    finally:
        db.close()


def test_close_closes_open_iterators_and_frees_the_directory(tmp_path: Path, rocksdb_binding: str) -> None:
    db = open_rocksdb(tmp_path / "db")
    _fill(db)
    rows = db.iterator()
    assert rows.next(1)
    db.close()
    db.close()  # idempotent
    with pytest.raises(OSError, match="closed"):
        rows.next(1)
    again = open_rocksdb(tmp_path / "db")  # the LOCK is released: the same process opens it again
    try:
        assert again.get(next(iter(ROWS))) == ROWS[next(iter(ROWS))]
    finally:
        again.close()
    destroy_rocksdb(tmp_path / "db")
    fresh = open_rocksdb(tmp_path / "db")
    try:
        assert fresh.get(next(iter(ROWS))) is None
    finally:
        fresh.close()


def test_flush_and_checkpoint_keep_writes_made_without_a_wal(tmp_path: Path, rocksdb_binding: str) -> None:
    db = open_rocksdb(tmp_path / "db")
    try:
        _fill(db)
        db.flush()
        db.checkpoint(str(tmp_path / "checkpoint"))
    finally:
        db.close()
    reader = open_rocksdb(tmp_path / "checkpoint", read_only=True)
    try:
        rows = reader.iterator()
        assert len(rows.next(len(ROWS) + 1)) == len(ROWS)
        rows.close()
        assert reader.get_meta(b"applied_log_offset") == b"\x07" * 8
        with pytest.raises(Exception):  # noqa: B017  # each binding raises its own error type
            reader.write([b"k"], [b"v"], [], [])
    finally:
        reader.close()


def test_a_database_opens_its_sst_files_with_a_thread_each_up_to_rocksdbs_default(
        tmp_path: Path, rocksdb_binding: str) -> None:
    """RocksDB starts and joins every file-opening thread on each open, files or not: a new database opens
    with one, a database of files with one per file, at most RocksDB's default, and reads back every row."""
    path = tmp_path / "db"
    assert rocksdb.file_opening_threads(path) == 1  # not there yet
    db = open_rocksdb(path)
    try:
        assert rocksdb.file_opening_threads(path) == 1
        parts = [dict(list(ROWS.items())[i::3]) for i in range(3)]
        for part in parts:  # one SST file each
            _fill(db, part)
            db.flush()
    finally:
        db.close()
    files = len(list(path.glob("*.sst")))
    assert files >= 1 and rocksdb.file_opening_threads(path) == min(files, rocksdb.FILE_OPENING_THREADS_MAX)
    db = open_rocksdb(path)
    try:
        assert db.multi_get(sorted(ROWS), sorted=True) == [ROWS[key] for key in sorted(ROWS)]
    finally:
        db.close()
    many = tmp_path / "many"
    many.mkdir()
    for number in range(rocksdb.FILE_OPENING_THREADS_MAX + 4):
        (many / f"{number:06d}.sst").touch()
    assert rocksdb.file_opening_threads(many) == rocksdb.FILE_OPENING_THREADS_MAX


@native_only
def test_the_native_binding_refuses_no_file_opening_thread(tmp_path: Path) -> None:
    import strom.kv._rocksdb as native

    with pytest.raises(ValueError, match="max_file_opening_threads"):
        native.Database(str(tmp_path / "db"), max_file_opening_threads=0)
    assert not (tmp_path / "db" / "CURRENT").exists()


def test_bad_input_raises_and_loses_nothing(tmp_path: Path, rocksdb_binding: str) -> None:
    db = open_rocksdb(tmp_path / "db")
    try:
        _fill(db)
        with pytest.raises((TypeError, ValueError)):
            db.write([b"a", "not bytes"], [b"1", b"2"], [], [])  # type: ignore[list-item]
        with pytest.raises(ValueError):
            db.write([b"a", b"b"], [b"1"], [], [])
        with pytest.raises(TypeError):
            db.multi_get([b"a", 5])  # type: ignore[list-item]
        assert db.get(b"a") is None
        assert db.multi_get(list(ROWS)[:3]) == list(ROWS.values())[:3]
    finally:
        db.close()


def test_threads_read_and_write_while_the_database_closes(tmp_path: Path, rocksdb_binding: str) -> None:
    """Calls racing with close() end with an error or a result, never a crash."""
    db = open_rocksdb(tmp_path / "db")
    _fill(db)
    keys = list(ROWS)
    outcomes: list[str] = []
    start = threading.Barrier(4)

    def hammer(kind: int) -> None:
        start.wait()
        for _ in range(2_000):
            try:
                if kind == 0:
                    db.write(keys[:200], [b"x"] * 200, [], [])
                elif kind == 1:
                    db.multi_get(keys[:200])
                else:
                    rows = db.iterator()
                    rows.next(50)
                    rows.close()
            except Exception as exc:  # the database closed under us
                outcomes.append(f"{kind}: {exc}")
                return
        outcomes.append(f"{kind}: done")

    threads = [threading.Thread(target=hammer, args=(kind,)) for kind in range(3)]
    for thread in threads:
        thread.start()
    start.wait()
    db.close()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 3


@native_only
def test_each_binding_opens_what_the_other_wrote(tmp_path: Path) -> None:
    options = RocksDbOptions(block_cache_size_bytes=1 << 20, write_buffer_size_bytes=1 << 20)
    for writer, reader in (("rocksdict", "native"), ("native", "rocksdict")):
        path = tmp_path / f"{writer}-written"
        before = rocksdb.binding()
        try:
            rocksdb.use_binding(writer)
            db = open_rocksdb(path, options)
            _fill(db)  # 1 MiB memtables: most of it is in SST files already
            db.flush()
            db.checkpoint(str(tmp_path / f"{writer}-checkpoint"))
            db.close()
            rocksdb.use_binding(reader)
            for directory, read_only in ((path, False), (tmp_path / f"{writer}-checkpoint", True)):
                db = open_rocksdb(directory, options, read_only=read_only)
                try:
                    assert db.multi_get(list(ROWS)) == list(ROWS.values())
                    assert db.get_meta(b"applied_log_offset") == b"\x07" * 8
                    if not read_only:
                        db.write([b"by-" + reader.encode()], [b"1"], [], [])
                        db.flush()
                finally:
                    db.close()
        finally:
            rocksdb.use_binding(before)
    # rocksdict's own API reads what the native binding wrote, column family included
    raw = rocksdict.Rdict(str(tmp_path / "native-written"), rocksdict.Options(raw_mode=True),
                          column_families={META_COLUMN_FAMILY: rocksdict.Options(raw_mode=True)})
    try:
        assert raw[next(iter(ROWS))] == ROWS[next(iter(ROWS))]
        assert raw.get_column_family(META_COLUMN_FAMILY)[b"applied_log_offset"] == b"\x07" * 8
    finally:
        raw.close()


@native_only
def test_the_native_binding_names_its_rocksdb() -> None:
    before = rocksdb.binding()
    try:
        assert rocksdb.use_binding("native") == "native"
        assert rocksdb.rocksdb_version() == "9.10.0"
        assert "native binding" in rocksdb.describe_binding()
        assert rocksdb.use_binding("rocksdict") == "rocksdict"
        assert rocksdb.rocksdb_version() == rocksdb.ROCKSDICT_ROCKSDB_VERSION
        with pytest.raises(ValueError, match="unknown RocksDB binding"):
            rocksdb.use_binding("leveldb")
    finally:
        rocksdb.use_binding(before)


def test_without_the_native_binding_rocksdict_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a build without a compiler or the cached RocksDB gets (setup.py then leaves the extension out)."""
    before = rocksdb.binding()
    monkeypatch.setattr(rocksdb, "_native", None)
    monkeypatch.setattr(rocksdb, "NATIVE_AVAILABLE", False)
    monkeypatch.delenv(rocksdb.BINDING_ENVIRONMENT, raising=False)
    try:
        assert rocksdb.use_binding("auto") == "rocksdict"
        with pytest.raises(ValueError, match="not built here"):
            rocksdb.use_binding("native")
        monkeypatch.setenv(rocksdb.BINDING_ENVIRONMENT, "rocksdict")
        assert rocksdb.use_binding("auto") == "rocksdict"
    finally:
        monkeypatch.undo()
        rocksdb.use_binding(before)
