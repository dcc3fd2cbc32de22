"""The API key file (SERVER_API_KEY_FILE): what a usable key is, checked on the login node, and reading it:
:func:`read_key` is the one reader of a key file, for the server's side and for the clients' (``connect``,
``ping``, ``bench``, ``verify``), with what differs between them as its parameters. (``gateway_app.py``, which
runs in the container with the standard library only, keeps its own few lines for the file the launcher
checked.)

A key is its file's text with surrounding whitespace stripped. It must be 8 to 512 characters from
``A-Z a-z 0-9 . _ ~ + / = -`` (the URL-safe and base64 alphabets): the engines print their
arguments escaped (Python's repr turns ``'`` and ``\\`` into ``\\'`` and ``\\\\``), and with only
these characters every form a log can show is the key itself, so masking it in the logs is exact;
8 characters at least, so masking never blanks ordinary words of a log. A file others can read
(mode wider than 0600) is a warning, as ssh gives one; a missing or empty file is refused.

``SERVER_API_KEY_FILE=generate`` asks for a per-job key instead: the launcher generates it inside the job
(:func:`generate_key`, ``secrets.token_urlsafe``: within the safe set), writes it to ``$RUN_DIR/api-key``
created with mode 0600 (``rundir.write_api_key``), and records that path in endpoint.json (``api_key_file``).
This module writes nothing. The key itself never enters a layer, a render, the job script or the job output
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


def read_key(path: "str | os.PathLike[str]", where: str | None = None, *, named_by: str = "SERVER_API_KEY_FILE",
             serving: bool = True, owner: int | None = None) -> str:
    """THE reader of an API key file: the key in ``path`` (surrounding whitespace stripped), or an
    EnvLayersError naming the file (``[where: ]named_by path: what is wrong; hint: the fix``).

    Every key file must exist, be readable UTF-8 text and hold one non-empty line. What differs, said
    by the caller:

    - ``serving``: the key a server is started with (the login node's check before submission, the
      launcher, a successor taking its chain's key): also the safe character set, 8 to 512 characters and
      no leading ``-`` (the module's docstring says why), and the path as written (no ``~``: the job's
      shell would not expand it either). ``False`` for a client's copy (``connect``, ``ping``, ``bench``,
      ``verify``): any key a server may take, and ``~`` expanded as the operator typed it;
    - ``owner``: the uid that must own the file, or ``None`` for no such check. The clients pass their own
      uid (a key is printed or used only from a file of one's own). A server's key (``serving``) comes only
      from a file no other user could write, nor put in its place: the user's or root's, not writable by group
      or others, in a folder they cannot write (:func:`envlayers.filetrust.untrusted_config`, the rule OpenSSH
      applies to authorized_keys), or another user would choose the key the server accepts; a file others
      may read is a warning (:func:`mode_warning`);
    - ``where`` leads the error (the layer's ``file:line`` naming the file), ``named_by`` says what named
      it (``SERVER_API_KEY_FILE``, ``--api-key-file``, a record's field).
    """
    p = Path(path) if serving else Path(path).expanduser()
    where = f"{where + ': ' if where else ''}{named_by} {p}"
    fix = _FIX if serving else "give the file that holds the endpoint's key, alone on its one line"
    try:
        st = p.stat()
    except FileNotFoundError:
        raise EnvLayersError("the key file does not exist", where=where, hint=fix) from None
    except OSError as err:
        raise EnvLayersError(f"cannot read the key file: {err.strerror or err}", where=where,
                             hint="make it a file you can read (chmod 600)") from None
    if owner is not None and st.st_uid != owner:
        from .filetrust import user_name  # a client's copy only: the dry run never checks an owner

        raise EnvLayersError(f"the key file belongs to {user_name(st.st_uid)}, not to you ({user_name(owner)})",
                             where=where, hint="only the key file's owner may print or use the key")
    if serving:
        from .filetrust import untrusted_config

        found = untrusted_config(p, st, os.getuid(), harm="choose the key this server accepts")
        if found is not None:
            raise EnvLayersError(found[0], where=where, hint=found[1])
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise EnvLayersError(f"cannot read the key file: {err.strerror or err}", where=where,
                             hint="make it a file you can read (chmod 600)") from None
    try:
        key = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise EnvLayersError("the key file is not text (not UTF-8)", where=where, hint=fix) from None
    if not key:
        raise EnvLayersError("the key file is empty", where=where, hint=fix)
    if "\n" in key or "\r" in key:
        raise EnvLayersError("the key file holds more than one line", where=where,
                             hint="put the key alone on the file's one line")
    if serving:
        _check_serving(key, where)
    return key


def _check_serving(key: str, where: str) -> None:
    """A key a server can be started with, and its logs masked exactly (the module's docstring)."""
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


def mode_warning(path: "str | os.PathLike[str]", named_by: str = "SERVER_API_KEY_FILE") -> str | None:
    """The line for a key file others may read or write (mode wider than 0600, as ssh warns); ``None``
    when it is private or cannot be looked at (reading it says why)."""
    try:
        mode = stat.S_IMODE(os.stat(Path(path).expanduser()).st_mode)
    except OSError:
        return None
    if mode & 0o077:
        return f"{named_by} {path} is readable or writable by others (mode {mode:04o}); run `chmod 600 {path}`"
    return None


def check_key_file(path: "str | os.PathLike[str]", where: str | None = None) -> list[str]:
    """Refuse an unusable key file for a server, or one another user could write (:func:`read_key`, serving),
    with an EnvLayersError; return warnings (a file others can read)."""
    read_key(path, where)
    warning = mode_warning(path)
    return [warning] if warning else []


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
