"""experiments/setups.yaml -> the experiments and models of the catalog, with line numbers.

The precedence of the layers is written once, in :func:`stack_sources`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from .envfile import Assignment, Origin
from .errors import CatalogError

SETUPS = Path("experiments") / "setups.yaml"
LAYERS_DIR = Path("experiments") / "layers"
DEFAULT_EXPERIMENT = "experiment"

_ENTRY_KEYS = {"description", "layers", "env"}
_ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MODEL_KEYS = _ENTRY_KEYS | {"model_layer"}


class Entry(NamedTuple):
    """An experiment or a model: extra layer files and inline keys."""

    kind: str  # "experiments" | "models"
    name: str
    origin: Origin
    description: str = ""
    layers: tuple = ()  # ((file name, origin), ...)
    env: tuple = ()  # (Assignment, ...)
    model_layer: "tuple[str, Origin] | None" = None


class Catalog(NamedTuple):
    root: Path
    experiments: dict
    models: dict

    def experiment(self, name: str) -> Entry:
        return _lookup(self.experiments, name, "experiment")

    def model(self, name: str) -> Entry:
        return _lookup(self.models, name, "model")


def _lookup(table: dict[str, Entry], name: str, what: str) -> Entry:
    if name in table:
        return table[name]
    valid = ", ".join(sorted(table)) or "(none)"
    import difflib

    near = difflib.get_close_matches(name, list(table), n=1)
    hint = f"did you mean '{near[0]}'?" if near else f"add it to {SETUPS}"
    raise CatalogError(f"unknown {what} '{name}' (valid: {valid})", where=str(SETUPS), hint=hint)


def parse_target(target: str) -> tuple[str, str]:
    """'EXPERIMENT:MODEL' -> (experiment, model)."""
    exp, sep, model = target.partition(":")
    if not sep or not exp or not model or ":" in model:
        raise CatalogError(
            f"target '{target}' is not EXPERIMENT:MODEL",
            where="target",
            hint="for example experiment:qwen38; `env_layers list` shows the names",
        )
    return exp, model


def load(root: Path) -> Catalog:
    path = root / SETUPS
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError("file not found", where=str(SETUPS), hint="pass --root DIR or set ENVLAYERS_ROOT") from None
    cached = _cache_read(path, text)
    if cached is not None:
        return Catalog(root, *cached)
    catalog = _parse(root, text)
    _cache_write(path, text, catalog)
    return catalog


# -- a parse cache: yaml is a third of `env_layers render`'s start-up; the cache is used only when it
#    holds the very text of setups.yaml and was written by this very code ---------------------------------

_CACHE_FORMAT = 1


def _cache_file(path: Path) -> Path | None:
    import os

    if os.environ.get("ENVLAYERS_NO_CACHE") == "1":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = str(path.resolve()).replace("/", "%")
    return Path(base) / "envlayers" / f"setups{key}.json"


def _code_fingerprint() -> str:
    """The parse depends on this code too: a cache written by another envlayers (an upgrade, a second
    install sharing ~/.cache) is not used."""
    import os

    from . import __version__, envfile

    stats = [os.stat(f) for f in (__file__, envfile.__file__)]
    return __version__ + "".join(f":{st.st_size}:{st.st_mtime_ns}" for st in stats) + f":{__file__}"


def _cache_read(path: Path, text: str):
    import json

    cache = _cache_file(path)
    try:
        data = json.loads(cache.read_text(encoding="utf-8")) if cache else None
        if (not data or data.get("format") != _CACHE_FORMAT or data.get("code") != _code_fingerprint()
                or data.get("text") != text):
            return None
        return tuple({name: _entry_from(e) for name, e in data[kind].items()} for kind in ("experiments", "models"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_write(path: Path, text: str, catalog: Catalog) -> None:
    import json

    cache = _cache_file(path)
    if cache is None:
        return
    data = {"format": _CACHE_FORMAT, "code": _code_fingerprint(), "text": text,
            "experiments": catalog.experiments, "models": catalog.models}
    try:
        from .fsutil import atomic_write

        atomic_write(cache, json.dumps(data))
    except OSError:
        pass  # a read-only home: parse every time


def _entry_from(e: list) -> Entry:
    kind, name, origin, description, layers, env, model_layer = e
    return Entry(kind, name, Origin(*origin), description, tuple((f, Origin(*o)) for f, o in layers),
                 tuple(Assignment(k, tuple(v), Origin(*o), t) for k, v, o, t in env),
                 (model_layer[0], Origin(*model_layer[1])) if model_layer else None)


def _parse(root: Path, text: str) -> Catalog:
    import yaml  # imported here: the CLI starts without it

    display = str(SETUPS)
    try:
        doc = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{display}:{mark.line + 1}" if mark else display
        problem = getattr(err, "problem", None) or str(err)
        raise CatalogError(f"invalid YAML: {problem}", where=where, hint="fix the YAML syntax") from None
    if doc is None:
        raise CatalogError("empty file", where=display, hint="it needs 'experiments:' and 'models:'")
    top = _mapping(doc, display, "")
    unknown = set(top) - {"version", "experiments", "models"}
    if unknown:
        key = sorted(unknown)[0]
        raise CatalogError(f"unknown key '{key}'", where=_at(display, top[key][0]),
                           hint="top-level keys are version, experiments, models")
    if "version" in top:
        vnode = top["version"][1]
        if getattr(vnode, "value", None) != "1":
            raise CatalogError(f"unsupported version {getattr(vnode, 'value', '?')!r}", where=_at(display, vnode),
                               hint="this envlayers reads version: 1")
    tables = {}
    for kind in ("experiments", "models"):
        if kind not in top:
            raise CatalogError(f"missing '{kind}:'", where=display, hint=f"add a '{kind}:' mapping")
        knode, vnode = top[kind]
        entries = {}
        for name, (nnode, enode) in _mapping(vnode, display, kind).items():
            if not _ENTRY_NAME.fullmatch(name):
                raise CatalogError(f"{kind} name '{name}' cannot be used in a target", where=_at(display, nnode),
                                   hint="use letters, digits, '-', '_' and '.'; ':' separates EXPERIMENT:MODEL")
            entries[name] = _entry(kind, name, nnode, enode, display)
        tables[kind] = entries
    return Catalog(root, tables["experiments"], tables["models"])


def _at(display: str, node) -> str:
    return f"{display}:{node.start_mark.line + 1}"


def _mapping(node, display: str, keypath: str) -> dict:
    import yaml

    if not isinstance(node, yaml.MappingNode):
        raise CatalogError(f"{keypath or 'the document'} must be a mapping", where=_at(display, node),
                           hint="write 'key: value' lines")
    out: dict = {}
    for knode, vnode in node.value:
        if not isinstance(knode, yaml.ScalarNode):
            raise CatalogError("keys must be plain names", where=_at(display, knode), hint="quote the key")
        if knode.value in out:
            raise CatalogError(f"duplicate key '{keypath + '.' if keypath else ''}{knode.value}'",
                               where=_at(display, knode), hint="each key once")
        out[knode.value] = (knode, vnode)
    return out


def _scalar_str(node, display: str, keypath: str, allow_int: bool) -> str:
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        raise CatalogError(f"{keypath} must be a string", where=_at(display, node), hint="write a plain value")
    tag = node.tag.rsplit(":", 1)[-1]
    if tag == "str":
        return node.value
    if tag == "int" and allow_int:
        return node.value  # as written: 010 stays 010, as it would in an env file
    if tag == "null":
        raise CatalogError(f"{keypath} has no value", where=_at(display, node),
                           hint="write '' for a present, empty key; leave the key out for absent")
    raise CatalogError(f"{keypath} is a YAML {tag} ({node.value!r}), not a string", where=_at(display, node),
                       hint=f"quote it: '{node.value}'")


def _entry(kind: str, name: str, nnode, node, display: str) -> Entry:
    import yaml

    keypath = f"{kind}.{name}"
    if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
        return Entry(kind, name, Origin(display, nnode.start_mark.line + 1))
    fields = _mapping(node, display, keypath)
    allowed = _MODEL_KEYS if kind == "models" else _ENTRY_KEYS
    for key, (knode, _) in fields.items():
        if key not in allowed:
            raise CatalogError(f"unknown key '{keypath}.{key}'", where=_at(display, knode),
                               hint="allowed: " + ", ".join(sorted(allowed)))
    description = ""
    if "description" in fields:
        description = _scalar_str(fields["description"][1], display, f"{keypath}.description", False)
    layers: list[tuple[str, Origin]] = []
    if "layers" in fields:
        lnode = fields["layers"][1]
        if not isinstance(lnode, yaml.SequenceNode):
            raise CatalogError(f"{keypath}.layers must be a list of file names", where=_at(display, lnode),
                               hint=f"for example: layers: [replicas.env] (files in {LAYERS_DIR})")
        for i, item in enumerate(lnode.value):
            fname = _scalar_str(item, display, f"{keypath}.layers[{i}]", False)
            layers.append((fname, Origin(display, item.start_mark.line + 1)))
    env: list[Assignment] = []
    if "env" in fields:
        for key, (knode, vnode) in _mapping(fields["env"][1], display, f"{keypath}.env").items():
            from .envfile import _NAME, RESERVED

            if not _NAME.fullmatch(key) or key in RESERVED:
                raise CatalogError(f"'{keypath}.env.{key}' is not a valid variable name", where=_at(display, knode),
                                   hint="letters, digits and '_', not starting with a digit")
            value = _scalar_str(vnode, display, f"{keypath}.env.{key}", True)
            origin = Origin(display, knode.start_mark.line + 1)
            env.append(Assignment(key, (value,) if value else (), origin, f"{key}: {vnode.value!r}"))
    model_layer = None
    if "model_layer" in fields:
        mnode = fields["model_layer"][1]
        model_layer = (_scalar_str(mnode, display, f"{keypath}.model_layer", False),
                       Origin(display, mnode.start_mark.line + 1))
    return Entry(kind, name, Origin(display, nnode.start_mark.line + 1), description, tuple(layers), tuple(env),
                 model_layer)
