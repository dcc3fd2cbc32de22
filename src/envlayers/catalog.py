"""The catalog: its sites, experiments and models, from experiments/setups.yaml, the site files and the
model layer files.

A site is a file ``experiments/sites/<SITE>.env``: what a cluster decides (partition, GPUs, container
runtime, fabric), described by its first comment line; setups.yaml's ``site:`` names the one used when
``SITE`` names none.

A model is either an entry under ``models:`` in ``experiments/setups.yaml`` (for one that needs more than
its layer file: extra layers, inline keys, another ``model_layer``) or just a file
``experiments/layers/model-<MODEL>.env``: such a file is a model by itself, described by its first
comment line. setups.yaml is read with the shared reader (:mod:`envlayers.yamlpos`), so every error names
file:line and the key path. The precedence of the layers is written once, in ``layers.stack_sources``.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from .envfile import Assignment, Origin
from .errors import CatalogError

SETUPS = os.path.join("experiments", "setups.yaml")  # str paths, as in paths.py: a render needs no pathlib
LAYERS_DIR = os.path.join("experiments", "layers")
SITES_DIR = os.path.join("experiments", "sites")
SITE_SUFFIX = ".env"

_ENTRY_KEYS = {"description", "layers", "env"}
_ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MODEL_KEYS = _ENTRY_KEYS | {"model_layer"}
MODEL_FILE_PREFIX, MODEL_FILE_SUFFIX = "model-", ".env"
FROM_SETUPS, FROM_LAYER_FILE = "setups.yaml", "layer-file"  # Entry.source
_DESCRIPTION_MAX = 200  # characters of a description taken from a layer file's comment


class Entry(NamedTuple):
    """An experiment or a model: extra layer files and inline keys."""

    kind: str  # "experiments" | "models"
    name: str
    origin: Origin
    description: str = ""
    layers: tuple = ()  # ((file name, origin), ...)
    env: tuple = ()  # (Assignment, ...)
    model_layer: "tuple[str, Origin] | None" = None
    source: str = FROM_SETUPS  # FROM_SETUPS, or FROM_LAYER_FILE: a model that is only its layer file


class Catalog(NamedTuple):
    root: str | os.PathLike
    experiments: dict
    models: dict  # by name: setups.yaml's models and the layer-file-only ones
    skipped: tuple = ()  # (file, why) of model-*.env files whose name cannot be a model's
    site: "tuple[str, Origin] | None" = None  # setups.yaml's ``site:``: the default site, where it is written

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
    if what == "model":
        where = str(model_file(name)) if _ENTRY_NAME.fullmatch(name) else str(LAYERS_DIR)
        hint = (f"did you mean '{near[0]}'?" if near else
                f"a model is a layer file {LAYERS_DIR}/{MODEL_FILE_PREFIX}<MODEL>{MODEL_FILE_SUFFIX}, or an entry "
                f"under models: in {SETUPS}")
    else:
        where = str(SETUPS)
        hint = f"did you mean '{near[0]}'?" if near else f"add it to {SETUPS}"
    raise CatalogError(f"unknown {what} {_clip(name)} (valid: {valid})", where=where, hint=hint)


def site_file(name: str) -> str:
    """experiments/sites/<name>.env: a site's layer file."""
    return os.path.join(SITES_DIR, f"{name}{SITE_SUFFIX}")


def is_site_path(site: str) -> bool:
    """``SITE`` names a file (a path, or a name ending in .env) rather than a site of the catalog."""
    return "/" in site or site.endswith(SITE_SUFFIX)


def sites(root: str | os.PathLike) -> dict[str, str]:
    """name -> description (the first comment line) of every experiments/sites/<name>.env, by name."""
    folder = os.path.join(root, SITES_DIR)
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return {}
    out = {}
    for file in entries:
        name = file[:-len(SITE_SUFFIX)]
        path = os.path.join(folder, file)
        if file.endswith(SITE_SUFFIX) and _ENTRY_NAME.fullmatch(name) and os.path.isfile(path):
            out[name] = _first_comment(path)
    return out


def unknown_site(root: str | os.PathLike, name: str, where: str) -> CatalogError:
    """The error for a site name no file of experiments/sites/ carries."""
    import difflib

    known = sites(root)
    near = difflib.get_close_matches(name, list(known), n=1)
    return CatalogError(f"unknown site {_clip(name)} (valid: {', '.join(known) or '(none)'})", where=where,
                        hint=f"did you mean '{near[0]}'?" if near else
                        f"a site is a file {SITES_DIR}/<SITE>{SITE_SUFFIX}; SITE also takes a file's path")


def model_file(name: str) -> str:
    """experiments/layers/model-<name>.env: the layer file that is a model by itself."""
    return os.path.join(LAYERS_DIR, f"{MODEL_FILE_PREFIX}{name}{MODEL_FILE_SUFFIX}")


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


def load(root: str | os.PathLike) -> Catalog:
    """Read and validate ``experiments/setups.yaml`` under ``root``; every error names file:line."""
    from . import yamlpos

    setups = os.path.join(root, SETUPS)
    text = yamlpos.read_text(setups, SETUPS, CatalogError, missing_hint="pass --root DIR or set ENVLAYERS_ROOT")
    catalog = _parse(root, yamlpos.parse(text, SETUPS, CatalogError))
    models = dict(catalog.models)
    skipped = []
    for name, path in _model_files(root):
        rel = os.path.join(LAYERS_DIR, os.path.basename(path))
        if not _ENTRY_NAME.fullmatch(name):
            shown = rel if rel.isprintable() else _clip(rel)  # a control character is never printed raw
            skipped.append((shown, f"{_clip(name)} cannot be a model name: use letters, digits, '-', '_' and '.'"))
        elif name not in models:
            models[name] = Entry("models", name, Origin(rel, 1), _first_comment(path), source=FROM_LAYER_FILE)
    return catalog._replace(models=dict(sorted(models.items())), skipped=tuple(skipped))


def _model_files(root: str | os.PathLike) -> list[tuple[str, str]]:
    """(name, path) of every experiments/layers/model-<name>.env (a regular file), by name."""
    folder = os.path.join(root, LAYERS_DIR)
    try:
        entries = os.listdir(folder)
    except OSError:  # no folder (or not one): no model files
        return []
    out = []
    for file in entries:
        if not (file.startswith(MODEL_FILE_PREFIX) and file.endswith(MODEL_FILE_SUFFIX)):
            continue
        name = file[len(MODEL_FILE_PREFIX):-len(MODEL_FILE_SUFFIX)]
        path = os.path.join(folder, file)
        if name and os.path.isfile(path):
            out.append((name, path))
    return sorted(out)


def _first_comment(path: str) -> str:
    """The text of the file's first comment line, when a comment comes before any assignment; else ""."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16384)
    except OSError:
        return ""  # reading the stack will say what is wrong with the file
    lines = head.decode("utf-8", "replace").splitlines()
    if len(head) == 16384:
        lines = lines[:-1]  # possibly cut
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            text = " ".join(line.lstrip("#").split())
            return text if len(text) <= _DESCRIPTION_MAX else text[:_DESCRIPTION_MAX - 3] + "..."
        return ""
    return ""


def _parse(root: str | os.PathLike, doc) -> Catalog:
    if doc.root is None:
        doc.fail((), "empty file", "it needs 'experiments:' and 'models:'")
    top = doc.mapping(doc.root, (), "a mapping of version, experiments and models")
    for key, (knode, _) in top.items():
        if key not in ("version", "site", "experiments", "models"):
            doc.fail((key,), "unknown key", "top-level keys are version, site, experiments, models", node=knode)
    if "version" in top:
        vnode = top["version"][1]
        if getattr(vnode, "value", None) != "1":
            doc.fail(("version",), f"unsupported version {_clip(getattr(vnode, 'value', '?'))}",
                     "this envlayers reads version: 1", node=vnode)
    tables = {}
    for kind in ("experiments", "models"):
        if kind not in top:
            doc.fail((), f"missing '{kind}:'", f"add a '{kind}:' mapping")
        entries = {}
        for name, (nnode, enode) in doc.mapping(top[kind][1], (kind,)).items():
            if not _ENTRY_NAME.fullmatch(name):
                doc.fail((kind,), f"name {_clip(name)} cannot be used in a target", node=nnode,
                         hint="use letters, digits, '-', '_' and '.'; ':' separates EXPERIMENT:MODEL")
            entries[name] = _entry(doc, kind, name, nnode, enode)
        tables[kind] = entries
    site = None
    if "site" in top:
        snode = top["site"][1]
        name = _scalar_str(doc, snode, ("site",), False)
        if not _ENTRY_NAME.fullmatch(name):
            doc.fail(("site",), f"{_clip(name)} is not a site name", node=snode,
                     hint=f"the name of a file {SITES_DIR}/<SITE>{SITE_SUFFIX}, without the folder and .env")
        site = (name, _origin(doc, snode))
    return Catalog(root, tables["experiments"], tables["models"], site=site)


def _clip(value) -> str:
    from .yamlpos import clip

    return clip(value)


def _origin(doc, node) -> Origin:
    return Origin(doc.file, node.start_mark.line + 1)


def _scalar_str(doc, node, path: tuple, allow_int: bool) -> str:
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        doc.fail(path, "must be a string", "write a plain value", node=node)
    tag = node.tag.rsplit(":", 1)[-1]
    if tag == "str":
        return node.value
    if tag == "int" and allow_int:
        return node.value  # as written: 010 stays 010, as it would in an env file
    if tag == "null":
        doc.fail(path, "has no value", "write '' for a present, empty key; leave the key out for absent", node=node)
    doc.fail(path, f"is a YAML {tag} ({_clip(node.value)}), not a string", f"quote it: '{node.value[:80]}'",
             node=node)


def _entry(doc, kind: str, name: str, nnode, node) -> Entry:
    import yaml

    path = (kind, name)
    if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
        return Entry(kind, name, _origin(doc, nnode))
    fields = doc.mapping(node, path)
    allowed = _MODEL_KEYS if kind == "models" else _ENTRY_KEYS
    for key, (knode, _) in fields.items():
        if key not in allowed:
            doc.fail(path + (key,), "unknown key", "allowed: " + ", ".join(sorted(allowed)), node=knode)
    description = ""
    if "description" in fields:
        description = _scalar_str(doc, fields["description"][1], path + ("description",), False)
    layers: list[tuple[str, Origin]] = []
    if "layers" in fields:
        lnode = fields["layers"][1]
        if not isinstance(lnode, yaml.SequenceNode):
            doc.fail(path + ("layers",), "must be a list of file names", node=lnode,
                     hint=f"for example: layers: [replicas.env] (files in {LAYERS_DIR})")
        for i, item in enumerate(lnode.value):
            layers.append((_scalar_str(doc, item, path + ("layers", i), False), _origin(doc, item)))
    env: list[Assignment] = []
    if "env" in fields:
        from .envfile import _NAME, refusal

        for key, (knode, vnode) in doc.mapping(fields["env"][1], path + ("env",)).items():
            if not _NAME.fullmatch(key):
                doc.fail(path + ("env", key), "is not a valid variable name", node=knode,
                         hint="letters, digits and '_', not starting with a digit")
            why = refusal(key)
            if why:
                doc.fail(path + ("env", key), why[0], why[1], node=knode)
            value = _scalar_str(doc, vnode, path + ("env", key), True)
            env.append(Assignment(key, (value,) if value else (), _origin(doc, knode), f"{key}: {vnode.value!r}"))
    model_layer = None
    if "model_layer" in fields:
        mnode = fields["model_layer"][1]
        model_layer = (_scalar_str(doc, mnode, path + ("model_layer",), False), _origin(doc, mnode))
    return Entry(kind, name, _origin(doc, nnode), description, tuple(layers), tuple(env), model_layer)
