"""RocksDB's column families after a crash: the applied offset is never durable ahead of the values.

Writes skip RocksDB's WAL, so after ``kill -9`` each column family is what its last flush left. A flush of
the metadata family alone (its memtable filling first) would persist an applied offset whose values were
still only in the default family's memtable; replay would then start past them and acknowledged writes
would vanish from lookups. The bucket's RocksDB flushes its families atomically, which this test checks
by filling the metadata memtable many times over before killing the process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.kv.test_kv_tablet import Bucket

ROWS = 2000
ROOT = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    f"""
    import asyncio, os, sys, time
    from pathlib import Path
    import strom.kv.rocksdb
    strom.kv.rocksdb.META_WRITE_BUFFER_SIZE_BYTES = 16 << 10  # RocksDB's minimum (64 KB): fills every ~700 writes
    from tests.kv.test_kv_tablet import Bucket

    async def main() -> None:
        bucket = Bucket(Path(sys.argv[1]))
        for id_ in range({ROWS}):
            await bucket.put((id_, ("row", id_)))  # acknowledged: in the log, fsynced, applied to RocksDB
        time.sleep(0.5)  # let background flushes finish
        os._exit(0)  # no close, no flush: as kill -9

    asyncio.run(main())
    """
)


def test_no_acknowledged_write_is_lost_when_the_metadata_family_flushed_alone(tmp_path: Path) -> None:
    directory = tmp_path / "bucket"
    subprocess.run([sys.executable, "-c", WRITER, str(directory)], cwd=ROOT, check=True, timeout=120)
    bucket = Bucket(directory)
    try:
        assert bucket.kv.applied_offset == ROWS
        missing = [id_ for id_ in range(ROWS) if bucket.lookup(id_) != (id_, "row", id_)]
        assert missing == []
    finally:
        bucket.close()
