"""How strom opens a bucket's RocksDB: the options a live tablet and a read-only snapshot reader share.

Its own module so that readers of snapshot files (strom's client, the tiering service's tasks) open a
checkpoint exactly as the tablet that wrote it, without reaching into the tablet.
"""

from __future__ import annotations

from pathlib import Path

import rocksdict

META_COLUMN_FAMILY = "strom_meta"


def open_rocksdb(path: Path, block_cache_size_bytes: int, *, read_only: bool = False) -> rocksdict.Rdict:
    """Open a bucket's RocksDB in raw mode (rocksdict pickles values by default)."""
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_compression_type(rocksdict.DBCompressionType.lz4())
    table_options = rocksdict.BlockBasedOptions()
    table_options.set_block_cache(rocksdict.Cache(block_cache_size_bytes))
    table_options.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table_options)
    column_families = {META_COLUMN_FAMILY: rocksdict.Options(raw_mode=True)}
    access = rocksdict.AccessType.read_only() if read_only else rocksdict.AccessType.read_write()
    return rocksdict.Rdict(str(path), options, column_families=column_families, access_type=access)
