"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Callable


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# the two steps a kill can fall between; tests slow them down to kill a writer mid-way
_replace: Callable[[str, Path], None] = os.replace


def _default_mode(path: Path) -> int:
    """An existing file keeps its mode; a new one gets 0666 less the umask, as open() would give."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: Path, text: str, mode: int | None = None, tmp_prefix: str | None = None) -> None:
    """Write ``text`` to a temporary file in the same folder, fsync it, rename it over ``path``,
    then fsync the folder so the rename itself survives a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=tmp_prefix or f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, _default_mode(path) if mode is None else mode)
            _write_all(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        _replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
