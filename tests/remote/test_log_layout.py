"""Fluss's remote log layout: paths, the manifest document, the offset index, and manifest changes."""

from __future__ import annotations

import json

import pytest

from strom.ids import TableBucket
from strom.remote import log_layout
from strom.remote.log_layout import RemoteLogManifest, RemoteLogManifestHandle, RemoteLogSegment


def segment(start: int, end: int, segment_id: str | None = None) -> RemoteLogSegment:
    return RemoteLogSegment(segment_id or f"s{start}", start, end, 1_000 + start, 100 * (end - start))


def test_paths_follow_flusss_remote_layout() -> None:
    bucket = TableBucket(7, 3)
    tablet = log_layout.tablet_dir("shop", "orders", bucket)
    assert tablet == "log/shop/orders-7/3"
    assert log_layout.tablet_dir("shop", "orders", TableBucket(7, 3, 12), "2024") == "log/shop/orders-7/2024-p12/3"
    assert log_layout.segment_log_file(tablet, "abc", 42) == "log/shop/orders-7/3/abc/00000000000000000042.log"
    assert log_layout.segment_index_file(tablet, "abc", 42).endswith("/abc/00000000000000000042.index")
    manifest = log_layout.new_manifest_file(tablet)
    assert manifest.startswith("log/shop/orders-7/3/metadata/") and manifest.endswith(".manifest")


def test_the_manifest_is_flusss_version_1_document() -> None:
    manifest = RemoteLogManifest("shop", "orders", TableBucket(7, 3, 12), "2024", (segment(0, 10), segment(10, 25)))
    document = json.loads(manifest.to_bytes())
    assert document == {
        "version": 1, "database": "shop", "table": "orders", "partition_name": "2024", "table_id": 7,
        "partition_id": 12, "bucket_id": 3,
        "remote_log_segments": [
            {"segment_id": "s0", "start_offset": 0, "end_offset": 10, "max_timestamp": 1000, "size_in_bytes": 1000},
            {"segment_id": "s10", "start_offset": 10, "end_offset": 25, "max_timestamp": 1010, "size_in_bytes": 1500},
        ],
    }
    assert RemoteLogManifest.from_bytes(manifest.to_bytes()) == manifest
    assert (manifest.start_offset, manifest.end_offset, manifest.size_bytes) == (0, 25, 2500)
    unpartitioned = json.loads(RemoteLogManifest("shop", "orders", TableBucket(7, 0)).to_bytes())
    assert "partition_id" not in unpartitioned and "partition_name" not in unpartitioned
    handle = RemoteLogManifestHandle("/r/log/shop/orders-7/3/metadata/x.manifest", 25, 0)
    assert json.loads(handle.to_bytes())["remote_log_manifest_path"] == handle.manifest_path
    assert RemoteLogManifestHandle.from_bytes(handle.to_bytes()) == handle


def test_manifest_changes_stay_contiguous() -> None:
    manifest = RemoteLogManifest("shop", "orders", TableBucket(7, 0), None, (segment(0, 10), segment(10, 20)))
    changed = manifest.changed([manifest.segments[0]], [segment(20, 30)])
    assert [(s.start_offset, s.end_offset) for s in changed.segments] == [(10, 20), (20, 30)]
    with pytest.raises(ValueError, match="not be contiguous"):
        manifest.changed([], [segment(25, 30)])
    assert [s.start_offset for s in changed.segments_from(25)] == [20]
    assert [s.start_offset for s in changed.segments_from(10)] == [10, 20]
    assert changed.segments_from(30) == [] and changed.segments_from(5) == []


def test_the_offset_index_points_at_or_before_the_batch_holding_an_offset() -> None:
    # batches of 10 offsets from base 100, 1000 bytes each
    batches = [(100 + 10 * i + 9, 1000 * i) for i in range(10)]
    dense = log_layout.encode_offset_index(100, batches, interval_bytes=1)
    assert len(dense) == 8 * 10
    assert log_layout.lookup_position(dense, 100, 100) == 0  # no batch ends before it: the start
    assert log_layout.lookup_position(dense, 100, 135) == 2000  # batch 2 (120-129) ended; batch 3 holds it
    sparse = log_layout.encode_offset_index(100, batches, interval_bytes=2500)
    assert len(sparse) == 8 * 4  # batches 0, 3, 6, 9
    position = log_layout.lookup_position(sparse, 100, 175)
    assert position == 6000  # batch 6 (160-169) is the last indexed one ending at or before 175: read on from it
