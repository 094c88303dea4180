"""How strom opens a bucket's RocksDB: the options a live tablet and a read-only snapshot reader share, and
the binding that opens it.

Two bindings serve the same :class:`KvDatabase` interface:

* ``native`` — strom's own binding over RocksDB's C API (``strom.kv._rocksdb``, RocksDB 9.10 built by
  ``scripts/build-rocksdb.sh``): writes, multi-gets, iterator steps, flushes and checkpoints run without the
  GIL, so a bucket's write overlaps the event loop's next request;
* ``rocksdict`` — the PyPI binding (RocksDB 9.8), where the native one is not built (no compiler at install).

Both open the same files with the same options: data written by one opens with the other. The binding is
chosen once per process (:func:`use_binding`, from ``kv.rocksdb.binding``, or the environment variable
``STROM_ROCKSDB_BINDING``); the server names it in its start-up line and its metrics.

Its own module so that readers of snapshot files (strom's client, the tiering service's tasks) open a
checkpoint exactly as the tablet that wrote it, without reaching into the tablet.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol

import rocksdict

from strom import config as cfg

try:
    import strom.kv._rocksdb as _native
except ImportError:  # built without RocksDB (scripts/build-rocksdb.sh could not run): rocksdict serves
    _native = None

NATIVE_AVAILABLE = _native is not None
BINDINGS = ("native", "rocksdict")
BINDING_ENVIRONMENT = "STROM_ROCKSDB_BINDING"

META_COLUMN_FAMILY = "strom_meta"
META_WRITE_BUFFER_SIZE_BYTES = 64 << 20
"""Memtable size of the metadata column family (the applied offset and row count, rewritten by every write)."""
MEMTABLE_BLOOM_RATIO = 0.1
"""Share of a memtable's size given to its whole-key bloom filter (RocksDB's memtable_prefix_bloom_size_ratio).
It makes reading a key the memtable lacks ~6x cheaper and every insert ~0.3 µs dearer; a vector memtable,
which nothing reads, has none (:func:`open_rocksdb`)."""
UNLIMITED_RATE = (1 << 63) - 1
"""``kv.rocksdb.shared-rate-limiter.bytes-per-sec`` at this (Fluss's default, Long.MAX_VALUE): no limiter."""
INFO_LOG_LEVELS = ("debug_level", "info_level", "warn_level", "error_level", "fatal_level", "header_level")
"""RocksDB's InfoLogLevel values in order (the native binding passes the index)."""
COMPACTION_STYLES = ("level", "universal", "fifo", "none")
"""RocksDB's CompactionStyle values in order (the native binding passes the index)."""
COMPRESSIONS = {"no": 0, "snappy": 1, "lz4": 4, "zstd": 7}
"""``kv.rocksdb.compression.per.level``'s names and RocksDB's CompressionType values."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RocksDbOptions:
    """The per-bucket RocksDB options strom exposes, under Fluss's ``kv.rocksdb.*`` names."""

    block_cache_size_bytes: int = 8 << 20
    """``kv.rocksdb.block.cache-size``."""
    write_buffer_size_bytes: int = 64 << 20
    """``kv.rocksdb.writebuffer.size``: one memtable's size before it is flushed to an SST file."""
    write_buffer_count: int = 2
    """``kv.rocksdb.writebuffer.count``: memtables held at most (the active one and those being flushed)."""
    block_size_bytes: int = 4 << 10
    """``kv.rocksdb.block.blocksize``."""
    use_bloom_filter: bool = True
    """``kv.rocksdb.use-bloom-filter``: a bloom filter per SST file, and (strom) a whole-key bloom filter
    over each skip-list memtable, so the old-value read of a new key — every row of a load — skips the
    memtable's skip-list search (measured: ~2.3 µs → ~0.4 µs per missing key with the data in a 64 MB
    memtable). A vector memtable, which nothing reads, has none (:func:`open_rocksdb`)."""
    bloom_filter_bits_per_key: float = 10.0
    """``kv.rocksdb.bloom-filter.bits-per-key``."""
    background_jobs: int = 2
    """``kv.rocksdb.thread.num``: RocksDB's max_background_jobs."""
    max_open_files: int = -1
    """``kv.rocksdb.files.open``; -1: no limit."""
    log_max_file_size_bytes: int = 25 << 20
    """``kv.rocksdb.log.max-file-size``; 0: one info log file that grows."""
    log_file_num: int = 4
    """``kv.rocksdb.log.file-num``: info log files kept."""
    log_dir: str | None = None
    """``kv.rocksdb.log.dir``; None: ``LOG`` in the database's directory."""
    log_level: str = "info_level"
    """``kv.rocksdb.log.level``, one of :data:`INFO_LOG_LEVELS` (the native binding only: rocksdict cannot set it)."""
    shared_rate_limit_bytes_per_sec: int | None = None
    """``kv.rocksdb.shared-rate-limiter.bytes-per-sec``: the rate of the process's one flush and compaction rate
    limiter, which every database opened with this rate shares; None: no limiter."""
    compaction_style: str = "level"
    """``kv.rocksdb.compaction.style``, one of :data:`COMPACTION_STYLES`."""
    level_dynamic_size: bool = False
    """``kv.rocksdb.compaction.level.use-dynamic-size``: RocksDB's level_compaction_dynamic_level_bytes."""
    compression_per_level: tuple[str, ...] = ("lz4", "lz4", "lz4", "lz4", "lz4", "zstd", "zstd")
    """``kv.rocksdb.compression.per.level``, names of :data:`COMPRESSIONS`; levels past it use its last entry."""
    target_file_size_base_bytes: int = 64 << 20
    """``kv.rocksdb.compaction.level.target-file-size-base``."""
    max_size_level_base_bytes: int = 256 << 20
    """``kv.rocksdb.compaction.level.max-size-level-base``: RocksDB's max_bytes_for_level_base."""
    write_buffer_number_to_merge: int = 1
    """``kv.rocksdb.writebuffer.number-to-merge``: RocksDB's min_write_buffer_number_to_merge."""
    metadata_block_size_bytes: int = 4 << 10
    """``kv.rocksdb.block.metadata-blocksize`` (partitioned index and filter blocks, which strom does not build)."""
    cache_index_and_filter_blocks: bool = False
    """``kv.rocksdb.block.cache-index-and-filter-blocks``."""
    cache_index_and_filter_blocks_with_high_priority: bool = False
    """``kv.rocksdb.block.cache-index-and-filter-blocks-with-high-priority`` (the native binding only)."""
    pin_l0_filter_and_index_blocks_in_cache: bool = False
    """``kv.rocksdb.block.pin-l0-filter-and-index-blocks-in-cache``."""
    pin_top_level_index_and_filter: bool = False
    """``kv.rocksdb.block.pin-top-level-index-and-filter``."""
    mmap_reads: bool = True
    """``kv.rocksdb.mmap-reads`` (strom): RocksDB's allow_mmap_reads."""

    @classmethod
    def from_config(cls, config: cfg.Configuration) -> RocksDbOptions:
        """The options of the server's ``kv.rocksdb.*`` keys.

        ``kv.rocksdb.write-batch-size`` has no field: each committed group is written as one atomic batch
        (its rows with the applied offset), never split. ``kv.rocksdb.bloom-filter.block-based-mode`` has none
        either: RocksDB 7 removed block-based filters (a warning says so when it is set).
        """
        if config.get(cfg.KV_ROCKSDB_BLOOM_FILTER_BLOCK_BASED_MODE):
            _log.warning("kv.rocksdb.bloom-filter.block-based-mode has no effect: RocksDB %s builds full filters "
                         "only (block-based filters were removed in RocksDB 7)", rocksdb_version())
        rate = config.get(cfg.KV_ROCKSDB_SHARED_RATE_LIMITER_BYTES_PER_SEC)
        return cls(
            block_cache_size_bytes=config.get(cfg.KV_ROCKSDB_BLOCK_CACHE_SIZE),
            write_buffer_size_bytes=config.get(cfg.KV_ROCKSDB_WRITE_BUFFER_SIZE),
            write_buffer_count=config.get(cfg.KV_ROCKSDB_WRITE_BUFFER_COUNT),
            block_size_bytes=config.get(cfg.KV_ROCKSDB_BLOCK_SIZE),
            use_bloom_filter=config.get(cfg.KV_ROCKSDB_USE_BLOOM_FILTER),
            bloom_filter_bits_per_key=config.get(cfg.KV_ROCKSDB_BLOOM_FILTER_BITS_PER_KEY),
            background_jobs=config.get(cfg.KV_ROCKSDB_THREAD_NUM),
            max_open_files=config.get(cfg.KV_ROCKSDB_FILES_OPEN),
            log_max_file_size_bytes=config.get(cfg.KV_ROCKSDB_LOG_MAX_FILE_SIZE),
            log_file_num=config.get(cfg.KV_ROCKSDB_LOG_FILE_NUM),
            log_dir=config.get(cfg.KV_ROCKSDB_LOG_DIR) or None,
            log_level=config.get(cfg.KV_ROCKSDB_LOG_LEVEL),
            shared_rate_limit_bytes_per_sec=None if rate >= UNLIMITED_RATE else rate,
            compaction_style=config.get(cfg.KV_ROCKSDB_COMPACTION_STYLE),
            level_dynamic_size=config.get(cfg.KV_ROCKSDB_COMPACTION_LEVEL_USE_DYNAMIC_SIZE),
            compression_per_level=config.get(cfg.KV_ROCKSDB_COMPRESSION_PER_LEVEL),
            target_file_size_base_bytes=config.get(cfg.KV_ROCKSDB_COMPACTION_LEVEL_TARGET_FILE_SIZE_BASE),
            max_size_level_base_bytes=config.get(cfg.KV_ROCKSDB_COMPACTION_LEVEL_MAX_SIZE_LEVEL_BASE),
            write_buffer_number_to_merge=config.get(cfg.KV_ROCKSDB_WRITE_BUFFER_NUMBER_TO_MERGE),
            metadata_block_size_bytes=config.get(cfg.KV_ROCKSDB_BLOCK_METADATA_BLOCKSIZE),
            cache_index_and_filter_blocks=config.get(cfg.KV_ROCKSDB_BLOCK_CACHE_INDEX_AND_FILTER_BLOCKS),
            cache_index_and_filter_blocks_with_high_priority=config.get(
                cfg.KV_ROCKSDB_BLOCK_CACHE_INDEX_AND_FILTER_BLOCKS_WITH_HIGH_PRIORITY),
            pin_l0_filter_and_index_blocks_in_cache=config.get(
                cfg.KV_ROCKSDB_BLOCK_PIN_L0_FILTER_AND_INDEX_BLOCKS_IN_CACHE),
            pin_top_level_index_and_filter=config.get(cfg.KV_ROCKSDB_BLOCK_PIN_TOP_LEVEL_INDEX_AND_FILTER),
            mmap_reads=config.get(cfg.KV_ROCKSDB_MMAP_READS),
        )


class RowIterator(Protocol):
    """Rows of the default column family in key order, as of the iterator's creation."""

    def next(self, count: int, prefix: bytes | None = None, bytes_max: int = 0, keys: bool = True) -> list:  # type: ignore[type-arg]
        """Up to ``count`` rows from the current position: ``(key, value)`` tuples, or values when ``keys``
        is false; stops before a key without ``prefix`` and after the row whose value passes ``bytes_max``
        bytes read by this call (0: no bound). An empty list at the end."""

    def close(self) -> None:
        """Release the iterator's view of the database now."""


class KvDatabase(Protocol):
    """A bucket's RocksDB: the rows (default column family) and ``strom_meta``."""

    def get(self, key: bytes) -> bytes | None: ...

    def multi_get(self, keys: Sequence[bytes], sorted: bool = False) -> list[bytes | None]:
        """Values of ``keys`` in the order given (``sorted``: the keys are in byte order already)."""

    def get_meta(self, key: bytes) -> bytes | None: ...

    def put_meta(self, key: bytes, value: bytes) -> None: ...

    def write(self, keys: Sequence[bytes], values: Sequence[bytes | None], meta_keys: Sequence[bytes],
              meta_values: Sequence[bytes]) -> None:
        """One atomic batch, in order (a later write of a key wins; a None value deletes the key), without
        RocksDB's WAL (the changelog is the write-ahead record)."""

    def iterator(self, start: bytes | None = None) -> RowIterator:
        """Rows from ``start`` (the first row without it), as of now."""

    def flush(self) -> None:
        """Both column families' memtables to SST files, together, waiting for it."""

    def property(self, name: str) -> str | None:
        """A RocksDB property of the rows' column family (``rocksdb.num-files-at-level0``, …); None if
        RocksDB does not know it."""

    def checkpoint(self, directory: str) -> None:
        """A consistent copy in the new ``directory`` (SST files hard-linked)."""

    def close(self) -> None:
        """Close (open iterators first); idempotent."""


def _automatic_binding() -> str:
    """``auto``: the environment's choice, else the native binding where it is built."""
    return os.environ.get(BINDING_ENVIRONMENT) or ("native" if NATIVE_AVAILABLE else "rocksdict")


_binding = _automatic_binding()


def use_binding(name: str) -> str:
    """Choose the binding for databases opened from now on in this process; returns the one in use.

    ``auto`` keeps the environment's choice (``STROM_ROCKSDB_BINDING``), else the native binding where it
    is built. Raises ValueError for an unknown name, or ``native`` where it is not built.
    """
    global _binding
    if name == "auto":
        name = _automatic_binding()
    if name not in BINDINGS:
        raise ValueError(f"unknown RocksDB binding {name!r}; one of auto, {', '.join(BINDINGS)}")
    if name == "native" and not NATIVE_AVAILABLE:
        raise ValueError("the native RocksDB binding is not built here (scripts/build-rocksdb.sh, then reinstall)")
    _binding = name
    return name


def binding() -> str:
    """The binding databases are opened with now: ``native`` or ``rocksdict``."""
    return _binding


def _native_in_use() -> ModuleType | None:
    """The native binding's module while it is the one in use."""
    return _native if _binding == "native" else None


def rocksdb_version() -> str:
    """The version of RocksDB behind the binding in use."""
    native = _native_in_use()
    return ROCKSDICT_ROCKSDB_VERSION if native is None else str(native.ROCKSDB_VERSION)


def describe_binding() -> str:
    """The binding and its RocksDB, for the server's start-up line."""
    return f"RocksDB {rocksdb_version()} through the {_binding} binding"


ROCKSDICT_ROCKSDB_VERSION = "9.8.4"
"""The RocksDB rocksdict 0.3.29 bundles (its databases' LOG files name it)."""


def open_rocksdb(path: Path, options: RocksDbOptions | None = None, *, read_only: bool = False,
                 vector_memtable: bool = False) -> KvDatabase:
    """Open (creating it unless ``read_only``) a bucket's RocksDB with strom's options.

    ``vector_memtable``: the rows' memtables are RocksDB's vector memtable instead of its skip list, without
    a bloom filter. An insert is an append and each memtable is sorted once, when it is flushed, which made
    a loaded server's RocksDB writes ~8x cheaper (docs/benchmarks.md); but every read of a vector memtable
    sorts a copy of it. Only for a database that nothing reads until it is reopened without it (a new bucket
    whose row cache holds all of its keys, kv_tablet.py); where :func:`vector_memtable_supported` is false.
    """
    options = options or RocksDbOptions()
    if vector_memtable and not vector_memtable_supported(options):
        raise ValueError("rocksdict cannot open a vector memtable beside its shared rate limiter")
    if not read_only:
        path.mkdir(parents=True, exist_ok=True)  # RocksDB creates the last directory only
    if options.log_dir is not None and not read_only:
        Path(options.log_dir).mkdir(parents=True, exist_ok=True)  # RocksDB logs nowhere if it is missing
    native = _native_in_use()
    if native is not None:
        database: KvDatabase = native.Database(
            str(path),
            block_cache_size=options.block_cache_size_bytes,
            write_buffer_size=options.write_buffer_size_bytes,
            write_buffer_count=options.write_buffer_count,
            block_size=options.block_size_bytes,
            bloom_bits_per_key=options.bloom_filter_bits_per_key if options.use_bloom_filter else 0.0,
            memtable_bloom_ratio=MEMTABLE_BLOOM_RATIO,
            meta_write_buffer_size=META_WRITE_BUFFER_SIZE_BYTES,
            read_only=read_only,
            max_background_jobs=options.background_jobs,
            max_open_files=options.max_open_files,
            max_log_file_size=options.log_max_file_size_bytes,
            keep_log_file_num=options.log_file_num,
            db_log_dir=options.log_dir,
            info_log_level=INFO_LOG_LEVELS.index(options.log_level),
            rate_limit_bytes_per_sec=options.shared_rate_limit_bytes_per_sec or 0,
            compaction_style=COMPACTION_STYLES.index(options.compaction_style),
            dynamic_level_bytes=options.level_dynamic_size,
            compression_per_level=[COMPRESSIONS[name] for name in options.compression_per_level],
            target_file_size_base=options.target_file_size_base_bytes,
            max_bytes_for_level_base=options.max_size_level_base_bytes,
            min_write_buffer_number_to_merge=options.write_buffer_number_to_merge,
            metadata_block_size=options.metadata_block_size_bytes,
            cache_index_and_filter_blocks=options.cache_index_and_filter_blocks,
            cache_index_and_filter_blocks_with_high_priority=options.cache_index_and_filter_blocks_with_high_priority,
            pin_l0_filter_and_index_blocks_in_cache=options.pin_l0_filter_and_index_blocks_in_cache,
            pin_top_level_index_and_filter=options.pin_top_level_index_and_filter,
            allow_mmap_reads=options.mmap_reads,
            vector_memtable=vector_memtable,
            max_file_opening_threads=file_opening_threads(path),
        )
        return database
    return RocksdictDatabase(path, options, read_only=read_only, vector_memtable=vector_memtable)


FILE_OPENING_THREADS_MAX = 16
"""RocksDB's default ``max_file_opening_threads``."""


def file_opening_threads(path: Path) -> int:
    """Threads to open the SST files of the database at ``path`` with: one per file, at most RocksDB's
    default. RocksDB starts and joins every one of them on each open, files or not: 16 threads cost a new
    bucket's open ~2 ms of its ~7 ms here (docs/benchmarks.md), for no file to open."""
    try:
        files = sum(1 for entry in os.scandir(path) if entry.name.endswith(".sst"))
    except OSError:
        files = 0
    return min(FILE_OPENING_THREADS_MAX, max(1, files))


def vector_memtable_supported(options: RocksDbOptions) -> bool:
    """Whether :func:`open_rocksdb` can open a vector memtable with ``options``: the native binding can;
    rocksdict cannot beside its shared rate limiter, since it has no setter that puts the skip list back on
    the one Options object every rate-limited database opens from."""
    return _native_in_use() is not None or options.shared_rate_limit_bytes_per_sec is None


def destroy_rocksdb(path: Path) -> None:
    """Remove a closed database's files."""
    native = _native_in_use()
    if native is not None:
        native.destroy(str(path))
    else:
        rocksdict.Rdict.destroy(str(path))


def reads_off_loop_safe(database: KvDatabase) -> bool:
    """Whether ``database`` may be read on another thread while the event loop goes on: the native binding
    reads without the GIL, and its close waits for a read in progress (a read after it raises). rocksdict
    promises neither."""
    return not isinstance(database, RocksdictDatabase)


class RocksdictDatabase:
    """:class:`KvDatabase` over rocksdict (its put and write hold the GIL; multi-get does not)."""

    def __init__(self, path: Path, options: RocksDbOptions, *, read_only: bool = False,
                 vector_memtable: bool = False) -> None:
        self._db = _open_rocksdict(path, options, read_only, vector_memtable)
        self._meta = self._db.get_column_family(META_COLUMN_FAMILY)
        self._meta_handle = self._db.get_column_family_handle(META_COLUMN_FAMILY)
        self._write_options = rocksdict.WriteOptions()
        self._write_options.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at runtime
        self._iterators: list[_RocksdictRows] = []

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)  # type: ignore[no-any-return]

    def multi_get(self, keys: Sequence[bytes], sorted: bool = False) -> list[bytes | None]:
        try:
            return self._db.get(list(keys))  # type: ignore[no-any-return,return-value]  # get of a list is a multi-get
        except KeyError as exc:
            raise TypeError(f"keys must be bytes: {exc}") from None

    def get_meta(self, key: bytes) -> bytes | None:
        return self._meta.get(key)  # type: ignore[no-any-return]

    def put_meta(self, key: bytes, value: bytes) -> None:
        self._meta.put(key, value)

    def write(self, keys: Sequence[bytes], values: Sequence[bytes | None], meta_keys: Sequence[bytes],
              meta_values: Sequence[bytes]) -> None:
        if len(keys) != len(values) or len(meta_keys) != len(meta_values):
            raise ValueError("keys and values differ in length")
        batch = rocksdict.WriteBatch(raw_mode=True)
        try:
            for key, value in zip(keys, values, strict=True):
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            for key, value in zip(meta_keys, meta_values, strict=True):
                batch.put(key, value, self._meta_handle)
        except KeyError as exc:  # rocksdict's answer to a key or value that is not bytes
            raise TypeError(f"keys and values must be bytes: {exc}") from None
        self._db.write(batch, self._write_options)

    def iterator(self, start: bytes | None = None) -> _RocksdictRows:
        rows = _RocksdictRows(self, start)
        self._iterators.append(rows)
        return rows

    def flush(self) -> None:
        self._db.flush(True)
        self._meta.flush(True)

    def checkpoint(self, directory: str) -> None:
        rocksdict.Checkpoint(self._db).create_checkpoint(directory)

    def property(self, name: str) -> str | None:
        return self._db.property_value(name)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._meta is None:
            return
        # a live iterator or column-family handle keeps RocksDB open (and its LOCK held) after close()
        for rows in list(self._iterators):
            rows.close()
        self._iterators.clear()
        self._meta = self._meta_handle = None  # type: ignore[assignment]
        self._db.close()


class _RocksdictRows:
    """Steps rocksdict's ``items()`` (one C call per row, several times faster than valid/key/value/next)."""

    def __init__(self, owner: RocksdictDatabase, start: bytes | None) -> None:
        self._owner: RocksdictDatabase | None = owner
        self._items: Iterator[tuple[bytes, bytes]] | None = iter(owner._db.items(from_key=start))  # type: ignore[assignment]
        self._held: tuple[bytes, bytes] | None = None  # read, but stopped before (outside the prefix)

    def next(self, count: int, prefix: bytes | None = None, bytes_max: int = 0, keys: bool = True) -> list:  # type: ignore[type-arg]
        items = self._items
        if items is None:
            raise KvDatabaseClosedError("the iterator is closed")
        rows: list = []  # type: ignore[type-arg]
        read = 0
        while len(rows) < count:
            item = self._held or next(items, None)
            self._held = None
            if item is None:
                break
            key, value = item
            if prefix is not None and not key.startswith(prefix):
                self._held = item
                break
            rows.append(item if keys else value)
            read += len(value)
            if bytes_max and read > bytes_max:
                break
        return rows

    def close(self) -> None:
        self._items = self._held = None
        if self._owner is not None:
            iterators = self._owner._iterators
            if self in iterators:
                iterators.remove(self)
            self._owner = None


class KvDatabaseClosedError(OSError):
    """A call on a closed database or iterator (rocksdict binding; the native one raises RocksDbError)."""


RATE_LIMITER_REFILL_US = 100_000
RATE_LIMITER_FAIRNESS = 10
"""RocksDB's defaults for a rate limiter (the native binding uses the same)."""


_ROCKSDICT_COMPRESSIONS = {
    "no": rocksdict.DBCompressionType.none, "snappy": rocksdict.DBCompressionType.snappy,
    "lz4": rocksdict.DBCompressionType.lz4, "zstd": rocksdict.DBCompressionType.zstd,
}
_ROCKSDICT_COMPACTION_STYLES = {
    "level": rocksdict.DBCompactionStyle.level, "universal": rocksdict.DBCompactionStyle.universal,
    "fifo": rocksdict.DBCompactionStyle.fifo,
    "none": rocksdict.DBCompactionStyle.level,  # rocksdict has no NONE: level, automatic compactions disabled
}
_rocksdict_limited: tuple[int, rocksdict.Options] | None = None
"""The rate and the one Options object that carries the process's shared rate limiter under rocksdict.

rocksdict creates a rate limiter per Options object and cannot hand one to another, while RocksDB copies an
Options object's reference to its limiter into each database it opens: so every database opened with a rate
is opened from this one object, its per-database settings applied afresh under :data:`_rocksdict_lock`."""
_rocksdict_lock = threading.Lock()


def _open_rocksdict(path: Path, options: RocksDbOptions, read_only: bool, vector_memtable: bool = False) -> rocksdict.Rdict:
    global _rocksdict_limited
    rate = options.shared_rate_limit_bytes_per_sec
    if rate is None:
        return _open_rocksdict_with(rocksdict.Options(raw_mode=True), path, options, read_only, vector_memtable)
    with _rocksdict_lock:
        if _rocksdict_limited is None or _rocksdict_limited[0] != rate:
            shared = rocksdict.Options(raw_mode=True)
            shared.set_ratelimiter(rate, RATE_LIMITER_REFILL_US, RATE_LIMITER_FAIRNESS)
            _rocksdict_limited = (rate, shared)
        return _open_rocksdict_with(_rocksdict_limited[1], path, options, read_only)


def _open_rocksdict_with(db_options: rocksdict.Options, path: Path, options: RocksDbOptions,
                         read_only: bool, vector_memtable: bool = False) -> rocksdict.Rdict:
    """Open with every setting of ``options`` applied to ``db_options`` (each one, so a shared Options object
    keeps nothing of the database opened from it before)."""
    db_options.create_if_missing(True)
    db_options.create_missing_column_families(True)
    # Writes skip RocksDB's WAL (the changelog is the write-ahead record), so after a crash each column
    # family comes back at its last flush. The metadata family's applied offset must never be flushed
    # ahead of the values it covers, or replay would start past writes RocksDB lost: flush all families
    # together.
    db_options.set_atomic_flush(True)
    db_options.set_compression_type(rocksdict.DBCompressionType.lz4())
    db_options.set_compression_per_level([_ROCKSDICT_COMPRESSIONS[name]() for name in options.compression_per_level])
    db_options.set_write_buffer_size(options.write_buffer_size_bytes)
    db_options.set_max_write_buffer_number(options.write_buffer_count)
    db_options.set_min_write_buffer_number_to_merge(options.write_buffer_number_to_merge)
    db_options.set_max_background_jobs(options.background_jobs)
    db_options.set_max_open_files(options.max_open_files)
    db_options.set_max_file_opening_threads(file_opening_threads(path))
    db_options.set_max_log_file_size(options.log_max_file_size_bytes)
    db_options.set_keep_log_file_num(options.log_file_num)
    db_options.set_stats_dump_period_sec(0)  # Fluss's DBOptions: no periodic stats dump
    db_options.set_db_log_dir(options.log_dir or "")
    # no setter for info_log_level in rocksdict 0.3.29: RocksDB's INFO_LEVEL (kv.rocksdb.log.level says so)
    db_options.set_compaction_style(_ROCKSDICT_COMPACTION_STYLES[options.compaction_style]())
    db_options.set_disable_auto_compactions(options.compaction_style == "none")
    db_options.set_level_compaction_dynamic_level_bytes(options.level_dynamic_size)
    db_options.set_target_file_size_base(options.target_file_size_base_bytes)
    db_options.set_max_bytes_for_level_base(options.max_size_level_base_bytes)
    table_options = rocksdict.BlockBasedOptions()
    table_options.set_block_cache(rocksdict.Cache(options.block_cache_size_bytes))
    table_options.set_block_size(options.block_size_bytes)
    table_options.set_metadata_block_size(options.metadata_block_size_bytes)
    table_options.set_cache_index_and_filter_blocks(options.cache_index_and_filter_blocks)
    # no setter for cache_index_and_filter_blocks_with_high_priority in rocksdict 0.3.29: RocksDB's default (true)
    table_options.set_pin_l0_filter_and_index_blocks_in_cache(options.pin_l0_filter_and_index_blocks_in_cache)
    table_options.set_pin_top_level_index_and_filter(options.pin_top_level_index_and_filter)
    if options.use_bloom_filter:
        # RocksDB takes fractional bits per key (a double), although rocksdict's stub says int
        table_options.set_bloom_filter(options.bloom_filter_bits_per_key, False)  # type: ignore[arg-type]
    if vector_memtable:  # a fresh Options object: nothing opened from it later keeps the vector memtable
        db_options.set_memtable_factory(rocksdict.MemtableFactory.vector())
        db_options.set_allow_concurrent_memtable_write(False)
    db_options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO if options.use_bloom_filter and not vector_memtable else 0.0)
    db_options.set_memtable_whole_key_filtering(options.use_bloom_filter and not vector_memtable)
    db_options.set_allow_mmap_reads(options.mmap_reads)
    db_options.set_block_based_table_factory(table_options)
    meta_options = rocksdict.Options(raw_mode=True)
    meta_options.set_write_buffer_size(META_WRITE_BUFFER_SIZE_BYTES)
    column_families = {META_COLUMN_FAMILY: meta_options}
    access = rocksdict.AccessType.read_only() if read_only else rocksdict.AccessType.read_write()
    return rocksdict.Rdict(str(path), db_options, column_families=column_families, access_type=access)
