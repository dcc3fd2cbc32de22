"""Whether another user could change a file or a folder, as the job and its readers check it: the name of a
file's owner (:func:`user_name`), whether a folder is safe for a job's files on a shared file system
(:func:`unsafe_folder`, the rule the job script applies to its run folder), and whether a configuration file is
only its owner's to change (:func:`untrusted_config`, OpenSSH's rule for authorized_keys). Reads ``stat``
only; writes nothing.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pathlib only where a path is made: a render reads its layers through this module's checks
    from pathlib import Path


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

