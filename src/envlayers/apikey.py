"""The API key file (SERVER_API_KEY_FILE): what a usable key is, checked on the login node, and reading it.

A key is its file's text with surrounding whitespace stripped. It must be 8 to 512 characters from
``A-Z a-z 0-9 . _ ~ + / = -`` (the URL-safe and base64 alphabets): the engines print their
arguments escaped (Python's repr turns ``'`` and ``\\`` into ``\\'`` and ``\\\\``), and with only
these characters every form a log can show is the key itself, so masking it in the logs is exact;
8 characters at least, so masking never blanks ordinary words of a log. A file others can read
(mode wider than 0600) is a warning, as ssh gives one; a missing or empty file is refused.

``SERVER_API_KEY_FILE=generate`` asks for a per-job key instead: the launcher generates it inside the
job (:func:`write_generated`, ``secrets.token_urlsafe``: within the safe set), writes it to
``$RUN_DIR/api-key`` created with mode 0600, and records that path in endpoint.json
(``api_key_file``). The key itself never enters a layer, a render, the job script or the job output
(docs/keys.md).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from .errors import EnvLayersError

KEY_CHARS = "A-Za-z0-9._~+/=-"
MIN_LEN, MAX_LEN = 8, 512
_KEY_RE = re.compile(f"[{KEY_CHARS}]+")
_FIX = "put one key of 8 to 512 characters from A-Z a-z 0-9 . _ ~ + / = - in it, e.g. `openssl rand -hex 32 > FILE`"


def read_key(path: "str | os.PathLike[str]", where: str | None = None) -> str:
    """The key in ``path`` (surrounding whitespace stripped); EnvLayersError when it is unusable.
    ``where`` (e.g. the layer's file:line that names the file) leads the error."""
    where = f"{where + ': ' if where else ''}SERVER_API_KEY_FILE {path}"
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise EnvLayersError("the key file does not exist", where=where, hint=_FIX) from None
    except OSError as err:
        raise EnvLayersError(f"cannot read the key file: {err.strerror or err}", where=where,
                             hint="make it a file you can read (chmod 600)") from None
    try:
        key = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise EnvLayersError("the key file is not text (not UTF-8)", where=where, hint=_FIX) from None
    if not key:
        raise EnvLayersError("the key file is empty", where=where, hint=_FIX)
    bad = sorted(set(_KEY_RE.sub("", key)))
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])  # the characters only, never the key
        raise EnvLayersError(f"the key holds characters outside the safe set ({shown})", where=where,
                             hint=_FIX + "; the engines print other characters escaped, which log masking "
                                         "could miss")
    if not MIN_LEN <= len(key) <= MAX_LEN:
        raise EnvLayersError(f"the key is {len(key)} characters long", where=where, hint=_FIX)
    if key.startswith("-"):
        raise EnvLayersError("the key starts with '-': an engine that takes it as an argument (SGLang's "
                             "--api-key KEY) reads it as an option and refuses to start", where=where,
                             hint=_FIX)
    return key


def check_key_file(path: "str | os.PathLike[str]", where: str | None = None) -> list[str]:
    """Refuse an unusable key file (EnvLayersError); return warnings (a file others can read)."""
    read_key(path, where)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        return [f"SERVER_API_KEY_FILE {path} is readable or writable by others (mode {mode:04o}); "
                f"run `chmod 600 {path}`"]
    return []


GENERATE = "generate"  # SERVER_API_KEY_FILE=generate: a per-job key, made in the job


def wants_generated(value: str | None) -> bool:
    """Whether SERVER_API_KEY_FILE asks for a per-job key rather than naming a file."""
    return (value or "").strip() == GENERATE


def generate_key() -> str:
    """A fresh key: 32 random bytes, URL-safe base64 (43 characters, all in the safe set), never starting
    with '-' (one key in 64 did, and SGLang's parser took ``--api-key -xyz...`` for a missing value)."""
    import secrets  # here: the dry run imports this module for its checks, and makes no key

    while True:
        key = secrets.token_urlsafe(32)
        if not key.startswith("-"):
            return key


def write_generated(run_dir: "str | os.PathLike[str]") -> tuple[Path, str]:
    """Generate a key and write it to ``run_dir/api-key`` (:func:`write_key`). Returns (path, key)."""
    key = generate_key()
    return write_key(run_dir, key), key


def write_key(run_dir: "str | os.PathLike[str]", key: str) -> Path:
    """Write ``key`` to ``run_dir/api-key``, created with mode 0600 (never wider, whatever the umask; an
    earlier file there is replaced). Returns the path."""
    from .rundir import API_KEY  # inside the job only: checking a key file on the login node needs no run directory

    path = Path(run_dir) / API_KEY
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (key + "\n").encode())
    finally:
        os.close(fd)
    return path
