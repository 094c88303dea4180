"""One log segment: a file of v0 batches, named after the first offset it holds.

The batch index (base offset, file position and commit timestamp of every batch) lives in memory and is
rebuilt from the batch headers when the segment is opened, so a crash can never leave an index that
disagrees with the data. A torn tail — a batch cut short or failing its CRC — is cut off on open.
"""

from __future__ import annotations

import logging
import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from pathlib import Path

import crc32c

from strom.errors import LogStorageError
from strom.fsync import fsync_path
from strom.records import log_batch

log = logging.getLogger(__name__)

FILE_SUFFIX = ".log"
_READ_CHUNK_BYTES = 8 << 20


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{FILE_SUFFIX}"


class LogSegment:
    """Owned by one LogTablet; not thread-safe except :meth:`fsync`, which only touches the descriptor."""

    def __init__(self, path: Path, base_offset: int, fd: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._fd = fd
        self.size_bytes = 0
        self.next_offset = base_offset
        self._offsets = array("q")
        self._positions = array("q")
        self._timestamps = array("q")

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> LogSegment:
        path = directory / segment_file_name(base_offset)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        fsync_path(directory)
        return cls(path, base_offset, fd)

    @classmethod
    def open(
        cls, path: Path, *, is_last: bool, on_batch: Callable[[log_batch.LogBatchHeader], None] | None = None
    ) -> LogSegment:
        """Open an existing segment and index it; the last segment's tail is CRC-checked and repaired.

        ``on_batch`` sees the header of every batch kept, in order (to rebuild writer state).
        """
        base_offset = int(path.name[: -len(FILE_SUFFIX)])
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        segment = cls(path, base_offset, fd)
        try:
            segment._recover(is_last, on_batch)
        except BaseException:
            os.close(fd)
            raise
        return segment

    def _recover(self, is_last: bool, on_batch: Callable[[log_batch.LogBatchHeader], None] | None) -> None:
        file_size = os.fstat(self._fd).st_size
        position = 0
        expected_offset = self.base_offset
        buffer = b""
        buffer_start = 0
        while position < file_size:
            if position + log_batch.HEADER_SIZE_BYTES_MAX > buffer_start + len(buffer):
                buffer = os.pread(self._fd, _READ_CHUNK_BYTES, position)
                buffer_start = position
            relative = position - buffer_start
            problem = None
            left = len(buffer) - relative
            magic = buffer[relative + log_batch.MAGIC_OFFSET] if left > log_batch.MAGIC_OFFSET else None
            if magic is not None and magic not in log_batch.MAGICS:
                problem = "bad magic"
            elif magic is None or left < log_batch.header_size(magic):
                problem = "truncated header"
            else:
                header = log_batch.read_header(buffer, relative)
                size = header.size_bytes
                if position + size > file_size:
                    problem = "truncated batch"
                elif size < header.records_offset or header.statistics_length < 0:
                    problem = "bad length"
                elif header.base_offset != expected_offset:
                    problem = f"offset {header.base_offset} where {expected_offset} was expected"
                elif is_last:
                    data = buffer[relative : relative + size] if relative + size <= len(buffer) else os.pread(
                        self._fd, size, position
                    )
                    if crc32c.crc32c(memoryview(data)[header.crc_start :]) != header.crc:
                        problem = "CRC mismatch"
            if problem is not None:
                if not is_last:
                    raise LogStorageError(f"log segment {self.path} is corrupt at byte {position}: {problem}")
                # never acknowledged: an append is acknowledged after its fsync (docs/cluster.md, "No
                # acknowledged write is lost")
                log.warning("truncating %s at byte %d (%d bytes): %s", self.path, position, file_size - position, problem)
                os.ftruncate(self._fd, position)
                os.fsync(self._fd)
                break
            self._index(position, header.base_offset, header.commit_timestamp)
            if on_batch is not None:
                on_batch(header)
            position += size
            expected_offset = header.next_offset
            self.next_offset = expected_offset
            if relative + size > len(buffer):
                buffer = b""
        self.size_bytes = position

    def _index(self, position: int, base_offset: int, commit_timestamp: int) -> None:
        self._offsets.append(base_offset)
        self._positions.append(position)
        self._timestamps.append(commit_timestamp)

    # ---- writing ----
    def append(self, data: bytes | bytearray, batches: list[tuple[int, int, int, int]]) -> None:
        """Write ``data`` at the end; ``batches`` lists ``(relative position, base offset, next offset, ts)``."""
        assert batches and batches[0][1] == self.next_offset, (batches[:1], self.next_offset)
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(self._fd, view[written:])
        for relative, base_offset, next_offset, timestamp in batches:
            self._index(self.size_bytes + relative, base_offset, timestamp)
            self.next_offset = next_offset
        self.size_bytes += len(data)

    def fsync(self) -> None:
        os.fdatasync(self._fd)

    def truncate_to(self, offset: int) -> None:
        """Drop every batch that does not end at or below ``offset`` (a follower's log giving up what its
        leader does not have); the file is cut and fsynced."""
        keep = bisect_right(self._offsets, offset - 1)  # batches starting below offset ...
        while keep > 0 and (self._offsets[keep] if keep < len(self._offsets) else self.next_offset) > offset:
            keep -= 1  # ... that also end at or below it
        position = self._position(keep)
        os.ftruncate(self._fd, position)
        os.fsync(self._fd)
        self.next_offset = self._offsets[keep] if keep < len(self._offsets) else self.next_offset
        del self._offsets[keep:], self._positions[keep:], self._timestamps[keep:]
        self.size_bytes = position

    # ---- reading ----
    @property
    def last_timestamp(self) -> int:
        return self._timestamps[-1] if self._timestamps else -1

    def batch_index_for(self, offset: int) -> int:
        """Index of the batch containing ``offset``, or the number of batches if the offset is past the end."""
        index = bisect_right(self._offsets, offset) - 1
        if index < 0:
            return 0
        batch_next = self._offsets[index + 1] if index + 1 < len(self._offsets) else self.next_offset
        return index if offset < batch_next else index + 1

    def read(self, batch_index: int, max_bytes: int, end_offset: int) -> bytes:
        """Whole batches from ``batch_index`` on, below ``end_offset``, at least one if any, up to ``max_bytes``."""
        if batch_index >= len(self._offsets) or self._offsets[batch_index] >= end_offset:
            return b""
        start = self._positions[batch_index]
        stop_index = bisect_left(self._offsets, end_offset)
        end = self._position(stop_index)
        if end - start > max_bytes:
            # Batches batch_index..k-1 fit when position(k) - start <= max_bytes; always send at least one.
            fitting = bisect_right(self._positions, start + max_bytes, lo=batch_index + 1, hi=stop_index)
            end = self._position(max(fitting - 1, batch_index + 1))
        return os.pread(self._fd, end - start, start)

    def batch_at(self, base_offset: int) -> bytes | None:
        """The bytes of the batch that starts at ``base_offset``; None when no batch starts there."""
        index = bisect_left(self._offsets, base_offset)
        if index >= len(self._offsets) or self._offsets[index] != base_offset:
            return None
        start = self._positions[index]
        return os.pread(self._fd, self._position(index + 1) - start, start)

    def batch_ends(self) -> list[tuple[int, int]]:
        """Every batch's ``(last offset, position)``, in order (what a remote offset index is built from)."""
        nexts = [*self._offsets[1:], self.next_offset]
        return [(following - 1, position) for following, position in zip(nexts, self._positions, strict=True)]

    def _position(self, batch_index: int) -> int:
        return self._positions[batch_index] if batch_index < len(self._positions) else self.size_bytes

    def first_offset_at_or_after(self, timestamp: int) -> int | None:
        """Base offset of the first batch committed at or after ``timestamp`` (timestamps never decrease)."""
        index = bisect_left(self._timestamps, timestamp)
        return self._offsets[index] if index < len(self._offsets) else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
