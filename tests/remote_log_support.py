"""Reading the remote log manifest that the coordinator names, as the tests of remote log storage do."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

MANIFEST_READS_MAX = 20


def read_listed_manifest(list_manifests: Callable[[], Any]) -> tuple[Any, dict[str, Any]] | None:
    """The first entry a ListRemoteLogManifests response (``list_manifests()``) names and the manifest's
    content; None while none is committed. The leader deletes a manifest once it committed the next, so the
    one named may be gone when it is read: then the coordinator is asked again."""
    for _ in range(MANIFEST_READS_MAX):
        response = list_manifests()
        if not response.manifests:
            return None
        entry = response.manifests[0]
        try:
            return entry, json.loads(Path(entry.remote_log_manifest_path).read_bytes())
        except FileNotFoundError:
            continue
    raise AssertionError(f"no manifest named could be read in {MANIFEST_READS_MAX} tries")
