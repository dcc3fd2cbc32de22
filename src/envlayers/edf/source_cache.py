"""The parse cache of the container sources (``containers/edfs/*.yaml``): a validated :class:`RoleSource` as
JSON, and back.

A dry run reads every source to name the EDF it runs with; a source whose very text this very code validated
before is taken from the cache, without PyYAML (docs/layers.md, "Start-up"). The rules are
:mod:`envlayers.catalog_cache`'s: keyed by the exact text, the source's path and the parsing code's
fingerprint; only a source that validated is stored; ``ENVLAYERS_NO_CACHE=1`` turns it off; a broken or
foreign entry is ignored (the source is parsed) and replaced.
"""

from __future__ import annotations

# the code that parses and validates a source, in the package: an edit to any of them misses the cache
CODE = ("catalog_cache.py", "yamlpos.py", "edf/schema.py", "edf/source_cache.py")
KIND = "edf"


def read(path: str, text: str, file: str):
    """The RoleSource validated from ``text`` (the file at ``path``, named ``file`` in errors), when the cache
    holds it; else None."""
    import os

    from .. import catalog_cache

    path = os.path.abspath(path)
    data = catalog_cache.load(KIND, path, text, CODE)
    if data is None or data.get("path") != path:
        return None
    try:
        return _source(data["source"], file)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None  # broken: parse


def write(path: str, text: str, src) -> None:
    """Store ``src``, validated from ``text`` (the file at ``path``)."""
    import os

    from .. import catalog_cache

    path = os.path.abspath(path)
    plain = {"role": src.role, "name": src.name, "engine": src.engine, "remote_image": src.remote_image,
             "fabric_env": src.fabric_env, "edf": src.edf, "lines": [[list(k), v] for k, v in src.lines.items()]}
    catalog_cache.store(KIND, path, text, {"path": path, "source": plain}, CODE)


def _text(value) -> str:
    if type(value) is not str:
        raise TypeError("not a string")
    return value


def _strings(value) -> dict[str, str]:
    if type(value) is not dict:
        raise TypeError("not a table")
    return {_text(k): _text(v) for k, v in value.items()}


def _edf_value(value):
    """What a validated ``edf`` key holds: a string, a boolean, a list of strings, a table of strings."""
    if type(value) in (str, bool):
        return value
    if type(value) is list:
        return [_text(v) for v in value]
    return _strings(value)


def _line(value) -> int:
    if type(value) is not int:
        raise TypeError("not a line")
    return value


def _key(part):
    if type(part) not in (str, int):
        raise TypeError("not a key")
    return part


def _source(data: dict, file: str):
    from .schema import RoleSource

    edf = data["edf"]
    if type(edf) is not dict:
        raise TypeError("not a table")
    return RoleSource(role=_text(data["role"]), name=_text(data["name"]), engine=_text(data["engine"]),
                      remote_image=_text(data["remote_image"]), fabric_env=_strings(data["fabric_env"]),
                      edf={_text(k): _edf_value(v) for k, v in edf.items()}, file=file,
                      lines={tuple(_key(p) for p in k): _line(v) for k, v in data["lines"]})
