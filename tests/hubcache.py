"""A Hugging Face hub cache folder for tests: the layout the hub client writes, without real weights."""

from __future__ import annotations

import os
from pathlib import Path


def fake_snapshot(hub: Path, model: str, files=("model.safetensors",), rev: str = "0123abcd") -> Path:
    """A snapshot as the hub client leaves it: the content in blobs/, the snapshot file a relative link."""
    repo = hub / ("models--" + model.replace("/", "--"))
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    for i, name in enumerate(files):
        blob = repo / "blobs" / f"blob{i}"
        blob.write_bytes(b"\0" * 16)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    return snap
