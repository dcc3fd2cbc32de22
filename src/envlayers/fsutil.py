"""Writing files: atomically (a reader sees the old file or the new one, never a partial one), and
the ``-o PATH`` of a command, which may also name a device, a FIFO or a symlink. Acts: every file the
login node or the launcher writes through it. Whether a file or folder is safe from other users is
``filetrust.py``, which writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:  # pathlib only where a path is made
    from pathlib import Path

from .errors import EnvLayersError


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
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if tmp_prefix is None:
        _reap_stale_temps(path)
    import tempfile  # here: most importers of this module never write a file

    fd, tmp = tempfile.mkstemp(prefix=tmp_prefix or _temp_prefix(path), suffix=".tmp", dir=path.parent)
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


def _temp_prefix(path: Path) -> str:
    # host and pid in the name: a later write can tell a killed writer's leftover from a live one's
    return f".{path.name}.{os.uname().nodename}-{os.getpid()}."


def _reap_stale_temps(path: Path) -> None:
    """Remove temp files a writer on this host left when it was killed (SIGKILL) mid-write."""
    head = f".{path.name}.{os.uname().nodename}-"
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        if not (name.startswith(head) and name.endswith(".tmp")):
            continue
        pid = name[len(head):].split(".", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path.parent / name)


def pid_alive(pid: int) -> bool:
    """Whether a process of this host has that PID (one owned by someone else counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit while a write runs, so its temp file is removed."""
    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    saved = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            saved[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: signals stay as they are
        pass
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def write_output(path: "str | os.PathLike[str]", text: str, option: str = "--output") -> None:
    """Write ``text`` to the ``-o PATH`` a user named.

    A character device or FIFO (``/dev/null``, ``/dev/stdout``, a named pipe) is written through,
    never replaced. A symlink is followed: the file it points to is replaced atomically and the
    link stays. A regular or new file is replaced atomically. Anything else (a folder, a block
    device, a socket), or a write the OS refuses, is an EnvLayersError naming the path.
    """
    from pathlib import Path

    path = Path(path)

    def fail(why: str, hint: str = "name a writable file") -> EnvLayersError:
        return EnvLayersError(f"cannot write {path}: {why}", where=option, hint=hint)

    try:
        st = os.stat(path)  # follows a symlink
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise fail(err.strerror or str(err)) from None
    try:
        if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            fd = os.open(path, os.O_WRONLY)
            try:
                _write_all(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
            return
        if st is not None and not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file, a character device or a FIFO"
            raise fail(f"it is {kind}")
        target = Path(os.path.realpath(path))
        if not target.parent.is_dir():
            raise fail(f"the folder {target.parent} does not exist", hint="create the folder first")
        with _signals_raise():
            atomic_write(target, text)
    except OSError as err:
        raise fail(err.strerror or str(err)) from None
