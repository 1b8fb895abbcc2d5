"""Durable small-file writes: the one way `dapo` publishes a file another process or a restart will read.

`atomic_write` writes a temporary sibling, fsyncs it, renames it over the target and fsyncs the folder, so a
crash or a power loss leaves the old file or the new one, never a torn or empty one (the rename alone is atomic
but not durable: without the fsyncs a file can reach the disk after the rename that publishes it). The temporary
name carries the process id, so two processes writing the same path do not share it.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that a rename or a new file inside it is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, text: str) -> None:
    """Replace `path` with `text`, durably (see the module docstring)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
