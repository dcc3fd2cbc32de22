"""Writing files: atomically (a reader sees the old file or the new one, never a partial one), and
the ``-o PATH`` of a command, which may also name a device, a FIFO or a symlink; the name of a
file's owner (:func:`user_name`); and whether a folder is safe to write a job's files in on a shared file
system (:func:`unsafe_folder`, the rule the job script applies to its run folder).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:  # pathlib only where a path is made: a render reads its layers through this module's checks
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


def user_name(uid: int) -> str:
    """The login name of ``uid`` (the number as text when the system does not know it)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def unsafe_folder(path: Path, uid: int) -> str | None:
    """Why ``path`` is no place for a job's files on a shared file system, or None when it is (or does
    not exist yet, and nothing above it stops it from being made safely). The rule the job script applies
    to RUN_ROOT and its run folder (templates/serve-only.sh.j2): the folder is no symbolic link, belongs to
    ``uid`` and is writable by nobody else; no folder above it is writable by everyone without the sticky
    bit (another user could rename it away and put their own in its place)."""
    from pathlib import Path

    path = Path(os.path.abspath(path))
    try:
        st = path.lstat()
    except OSError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            return f"{path} is a symbolic link (to {os.readlink(path)})"
        if st.st_uid != uid:
            return f"{path} belongs to {user_name(st.st_uid)}, not to {user_name(uid)}"
        if st.st_mode & 0o022:
            return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    found = _open_to_everyone_above(str(path))
    if found is not None:
        return (f"{found[0]} above it is writable by everyone without the sticky bit "
                f"(mode {stat.S_IMODE(found[1]):o}): another user could put a folder of theirs in its place")
    return None


def _open_to_everyone_above(path: str) -> "tuple[str, int] | None":
    """The first folder above ``path`` (up to /) that everyone can write without the sticky bit, with its
    mode; folders not there yet are skipped (whoever makes them owns them). Another user could rename what
    lies below such a folder away and put one of theirs in its place."""
    below, above = path, os.path.dirname(path)
    while above != below:
        try:
            mode = os.stat(above).st_mode
        except OSError:
            mode = 0
        if mode & 0o002 and not mode & stat.S_ISVTX:
            return above, mode
        below, above = above, os.path.dirname(above)
    return None


def untrusted_config(path: "str | os.PathLike[str]", st: os.stat_result, uid: int,
                     harm: str = "change what this job runs") -> "tuple[str, str] | None":
    """(why, fix) when another user could change the configuration file ``path`` (``st``: its stat, taken
    from the open file; ``harm``: what they could do with it), else None: the rule OpenSSH applies to
    authorized_keys. The file must belong to
    ``uid`` or root and be writable by nobody else, and so must the folder holding it (the name as given,
    and the file's real folder when it is a link), unless that folder has the sticky bit (``/tmp``) and the
    file is ``uid``'s: then nobody else can replace it. No folder further up may be writable by everyone without
    the sticky bit (the rule of :func:`unsafe_folder`): another user could rename the user's folder away and put
    one of theirs in its place."""
    if st.st_uid not in (uid, 0):
        return (f"belongs to {user_name(st.st_uid)}: another user could {harm}",
                f"copy it to a file of your own (cp {path} NEW) and name that one")
    if st.st_mode & 0o022:
        return (f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): another user could {harm}",
                f"chmod go-w {path}")
    folders = {os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.realpath(path))}
    for folder in sorted(folders):
        try:
            fst = os.stat(folder)
        except OSError:
            continue
        if fst.st_mode & 0o022 and not (fst.st_mode & stat.S_ISVTX and st.st_uid == uid):
            return (f"is in {folder}, which others can write (mode {stat.S_IMODE(fst.st_mode):04o}): another user "
                    "could put a file of theirs in its place", f"keep it in a folder only you can write (chmod go-w "
                    f"{folder}, or move it)")
    for folder in sorted(folders):
        found = _open_to_everyone_above(folder)
        if found is not None:
            above, mode = found
            return (f"is under {above}, which everyone can write without the sticky bit (mode "
                    f"{stat.S_IMODE(mode):04o}): another user could put a folder of theirs in its place",
                    f"keep it under folders only you can write (chmod o-w {above}, or move it)")
    return None

