"""A disk that fills up and frees again, under a real ``strom server`` whose data directory is a small tmpfs:
writes fail clearly while it is full, reads go on, writes are accepted again once space returns — without a
restart — every acknowledged row is intact, and the server still shuts down cleanly."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.errors import StromError
from tests.disk_support import fill
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

DISK_SIZE = "48m"
RECOVERY_DEADLINE_S = 60.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MB tmpfs: needs the right to mount (root, as in CI); elsewhere the test cannot run."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _rows(ids: range, tag: str) -> pa.Table:
    return pa.table({"id": list(ids), "v": [f"{tag}-{i}-" + "x" * 200 for i in ids]})


async def _lookup_all(table: object, expected: dict[int, str]) -> None:
    lookuper = table.new_lookup().create_lookuper()  # type: ignore[attr-defined]
    for key, value in expected.items():
        row = await lookuper.lookup({"id": key})
        assert row is not None and row["v"] == value, (key, row)


async def test_writes_resume_without_a_restart_once_a_full_disk_has_room_again(small_disk: Path) -> None:
    # the write protection (server.data-disk.write-limit-ratio) off: this test is about a disk that does fill
    # up (tests/integration/test_server_table_options.py has the protection)
    server = ServerProcess(small_disk / "data", {"kv.snapshot.interval": "1s",
                                                 "server.data-disk.write-limit-ratio": "1.0"}).start()
    try:
        path = TablePath("fluss", "filled")
        async with await Connection.create(server.address) as connection:
            schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
            await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2))
            table = await connection.get_table(path)
            writer = table.new_upsert().create_writer()
            expected: dict[int, str] = {}
            first = _rows(range(500), "a")
            await writer.upsert_batch(first)
            expected.update(zip(first["id"].to_pylist(), first["v"].to_pylist(), strict=True))

            ballast = await asyncio.to_thread(fill, small_disk)
            refused = None
            for round_ in range(20):  # the first writes may still fit in pages the log already holds
                attempt = _rows(range(1_000 + 100 * round_, 1_100 + 100 * round_), "full")
                try:
                    await writer.upsert_batch(attempt)
                except StromError as exc:
                    refused = exc
                    break
                expected.update(zip(attempt["id"].to_pylist(), attempt["v"].to_pylist(), strict=True))
            assert refused is not None, "writes to a full disk must fail"
            assert "No space left" in str(refused) or "space" in str(refused), refused
            await _lookup_all(table, expected)  # reads go on while the disk is full

            await asyncio.to_thread(ballast.unlink)
            recovered = _rows(range(5_000, 5_300), "b")
            deadline = time.monotonic() + RECOVERY_DEADLINE_S
            while True:
                try:
                    await writer.upsert_batch(recovered)
                    break
                except StromError:
                    if time.monotonic() > deadline:
                        raise
            expected.update(zip(recovered["id"].to_pylist(), recovered["v"].to_pylist(), strict=True))
            await _lookup_all(table, expected)
        assert "reopening after a storage failure" in server.log_text()
    finally:
        code = server.stop()
    assert code == 0, server.log_text()[-3000:]
    assert "Traceback" not in server.log_text(), server.log_text()[-5000:]
    assert not server.internal_errors()
