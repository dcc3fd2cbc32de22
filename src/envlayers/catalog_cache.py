"""The parse caches of the catalog's YAML files: ``experiments/setups.yaml`` (its parsed entries, here) and the
container sources ``containers/edfs/*.yaml`` (their validated form, :mod:`envlayers.edf.source_cache`), as
JSON, keyed by the file's exact text and a fingerprint of the code that parses it.

Importing PyYAML is most of what a plain ``env_layers render`` spends on setups.yaml, and a dry run on the
sources (docs/layers.md, "Start-up"); a cache hit skips it. A hit is used only when the cache holds the very
text of the file and was written by this very code: an edit, an upgrade of envlayers or of PyYAML, or
another install sharing the cache folder all miss, so a hit never differs from a parse. Only a text that
parsed is stored: a text with an error is parsed, and fails with its file:line, every time. The models that
are only a layer file (``experiments/layers/model-*.env``) are found by the catalog on every run, never here.

The files are ``${XDG_CACHE_HOME:-~/.cache}/envlayers/catalog/<kind>-<crc32 of the path>.json``, written
atomically. ``ENVLAYERS_NO_CACHE=1`` turns the caches off; a broken or foreign file is ignored (and
replaced); a folder that cannot be written (a read-only home) means no cache.
"""

from __future__ import annotations

import os
import sys

FORMAT = 1
_CODE = ("catalog.py", "catalog_cache.py", "envfile.py", "yamlpos.py")  # the parse's code, in this package


def cache_file(source: str, kind: str = "setups") -> str | None:
    """Where the cache of the file at ``source`` lives; None when ENVLAYERS_NO_CACHE=1. It is
    ``${XDG_CACHE_HOME:-~/.cache}/envlayers/catalog/<kind>-<crc of the path>.json``."""
    if os.environ.get("ENVLAYERS_NO_CACHE") == "1":
        return None
    import zlib

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = zlib.crc32(os.path.abspath(source).encode("utf-8", "surrogateescape"))
    return os.path.join(base, "envlayers", "catalog", f"{kind}-{key:08x}.json")


def fingerprint(code: tuple[str, ...] = _CODE) -> str:
    """The parsing code's identity: envlayers' version and its files ``code`` (paths in this package), and
    the PyYAML this interpreter would import (found without importing it), each by path, size and
    modification time."""
    from . import __version__

    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, name) for name in code]
    for folder in sys.path:
        candidate = os.path.join(folder or os.getcwd(), "yaml", "__init__.py")
        if os.path.isfile(candidate):
            files.append(candidate)
            break
    parts = [__version__]
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            parts.append(f"{path}:?")
        else:
            parts.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def load(kind: str, source: str, text: str, code: tuple[str, ...] = _CODE) -> dict | None:
    """The cache of ``source`` (a JSON object) when it holds exactly ``text``, parsed by ``code``; else None."""
    path = cache_file(source, kind)
    if path is None:
        return None
    import json

    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO put there must not block
        with open(fd, encoding="utf-8") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = json.load(fh)
    except (OSError, ValueError):
        return None  # absent, unreadable or broken: parse
    if (type(data) is not dict or data.get("format") != FORMAT or data.get("text") != text
            or data.get("code") != fingerprint(code)):
        return None  # not ours
    return data


def store(kind: str, source: str, text: str, parsed: dict, code: tuple[str, ...] = _CODE) -> None:
    """Store ``parsed`` (JSON-able) as the parse of ``text``; a cache that cannot be written is no cache."""
    path = cache_file(source, kind)
    if path is None:
        return
    import json

    from .fsutil import atomic_write

    try:
        atomic_write(path, json.dumps({"format": FORMAT, "code": fingerprint(code), "text": text, **parsed}))
    except OSError:
        pass


def read(setups: str, text: str):
    """(experiments, models) as parsed from ``text``, when the cache holds them; else None."""
    data = load("setups", setups, text)
    if data is None:
        return None
    try:
        return tuple({name: _entry(e) for name, e in data[kind].items()} for kind in ("experiments", "models"))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None  # broken: parse


def write(setups: str, text: str, experiments: dict, models: dict) -> None:
    """Store a parse of ``text``; a cache that cannot be written is no cache."""
    if all(_plain(e) for e in (*experiments.values(), *models.values())):
        store("setups", setups, text, {"experiments": experiments, "models": models})


def _plain(entry) -> bool:
    """An entry JSON carries exactly: its inline values are literal text (setups.yaml has no references)."""
    return all(type(part) is str for a in entry.env for part in a.value)


def _origin(o):
    from .envfile import Origin

    path, line = o
    if type(path) is not str or type(line) is not int:
        raise TypeError("not an origin")
    return Origin(path, line)


def _text(value) -> str:
    if type(value) is not str:
        raise TypeError("not a string")
    return value


def _entry(e):
    from .catalog import Entry
    from .envfile import Assignment

    kind, name, origin, description, layers, env, model_layer, source = e
    return Entry(_text(kind), _text(name), _origin(origin), _text(description),
                 tuple((_text(f), _origin(o)) for f, o in layers),
                 tuple(Assignment(_text(k), tuple(_text(p) for p in v), _origin(o), _text(t)) for k, v, o, t in env),
                 (_text(model_layer[0]), _origin(model_layer[1])) if model_layer is not None else None,
                 _text(source))
