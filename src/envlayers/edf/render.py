"""EDF rendering: a validated source and a topology -> the TOML the Container Engine reads, and the folder it
reads it from (:func:`edf_search_dir`).

Each source gives two EDFs (``VARIANTS``): the base name for a pipeline-parallel server (fabric
hooks on, ``fabric_env`` set) and ``<name>-intranode`` for single-node and replica servers (cxi and
aws_ofi_nccl hooks off, ``fabric_env`` unset). TOML comes from tomli-w; the only text this module
adds is a two-line comment header that names the source and carries the SHA-256 of the body, which
is how ``install`` recognises a file it wrote and that nobody edited since.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from ..errors import EdfError
from .schema import _EDF_KEYS, FABRIC_HOOKS, SOURCE_DIR, TOPOLOGIES, VARIANTS, RoleSource, load_catalog, source

_HEADER_RE = re.compile(r"\A# [^\n]*\n# [^\n]*envlayers-sha256: ([0-9a-f]{64})\n\n")


def roles(root: Path) -> list[str]:
    """The catalog's roles, sorted: the names of the source files (a source's role must equal its file
    name). Only names: the sources are read and validated when one is used (:func:`edf_name`...)."""
    folder = Path(root) / SOURCE_DIR
    found = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    if not found:
        load_catalog(root)  # raises the error that says what is missing
    return found


def edf_name(role: str, topology: str, root: Path) -> str:
    """The EDF a server of ``role`` in ``topology`` runs with (``srun --environment=<name>``)."""
    return source(role, root).edf_name(variant_for(topology))


def render_edf(role: str, topology: str, root: Path, environ: Mapping[str, str] | None = None) -> str:
    """The TOML text ``install`` writes for ``role`` in ``topology``, header included; with ``environ``,
    bind sources and cache folders that go through a symbolic link are resolved (``runtimes.binds``)."""
    return render_source(source(role, root), topology, environ)


def render_source(src: RoleSource, topology: str, environ: Mapping[str, str] | None = None) -> str:
    """:func:`render_edf` of a source already read (the dry run reads its role's once)."""
    return _document(src, variant_for(topology), environ)


def edf_dict(role: str, topology: str, root: Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The EDF as data (what the TOML parses back to)."""
    return _edf_data(source(role, root), variant_for(topology), environ)


def edf_search_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the Container Engine looks up ``--environment=<name>``: the first folder of
    ``EDF_PATH`` when it is set, else ``~/.edf``."""
    env = os.environ if environ is None else environ
    for folder in env.get("EDF_PATH", "").split(":"):
        if folder:
            return Path(folder).expanduser()
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".edf"


def variant_for(topology: str) -> str:
    for variant, topologies in VARIANTS.items():
        if topology in topologies:
            return variant
    raise EdfError(
        f"unknown topology {topology!r}",
        where="topology",
        hint=f"one of: {', '.join(TOPOLOGIES)}",
    )


def _edf_data(src: RoleSource, variant: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    src.require_edf()
    out: dict[str, Any] = {}
    for key in _EDF_KEYS:
        if key in src.edf and key not in ("env", "annotations"):
            value = src.edf[key]
            out[key] = list(value) if isinstance(value, list) else value
    env = dict(src.edf.get("env", {}))
    annotations = dict(src.edf.get("annotations", {}))
    if variant == "fabric":
        env.update(src.fabric_env)
    else:
        # "" unsets the variable in the container, so a value from the step's environment
        # cannot force the fabric either
        env.update({key: "" for key in src.fabric_env})
        annotations = {k: v for k, v in annotations.items() if _hook(k) not in FABRIC_HOOKS}
        # explicit "false": on some vClusters the CXI hook is on unless told otherwise
        for hook in FABRIC_HOOKS:
            annotations[f"com.hooks.{hook}.enabled"] = "false"
    if env:
        out["env"] = env
    if annotations:
        out["annotations"] = _nest(annotations)
    if environ is not None:
        # a cache relocated by a symbolic link would dangle inside the container: bind its real path
        out = resolve_edf(out, environ)
    return out


def resolve_edf(data: dict, environ: Mapping[str, str]) -> dict:
    """The EDF ``data`` with its bind sources and cache variables resolved through ``environ`` (the
    variables the Container Engine will expand; ``runtimes.binds``). A value that reads an unset variable,
    or holds no link, is left as written."""
    from ..runtimes.binds import is_cache_key, real
    from .images import expand_vars

    def expanded(text: str) -> str | None:
        try:
            return expand_vars(text, environ)
        except EdfError:
            return None

    mounts = []
    for spec in data.get("mounts") or []:
        src, dst, flags = split_mount(spec)
        to = real(expanded(src) or "")
        mounts.append(spec if to is None else ":".join([to, dst] + ([flags] if flags is not None else [])))
    env = dict(data.get("env") or {})
    for key, value in sorted(env.items()):
        to = real(expanded(value) or "") if is_cache_key(key) and value else None
        if to is not None:
            env[key] = to
            bind = f"{to}:{to}"
            if bind not in mounts:
                mounts.append(bind)
    out = dict(data)
    if mounts:
        out["mounts"] = mounts
    if env:
        out["env"] = env
    return out


def split_mount(spec: str) -> tuple[str, str, str | None]:
    """A mount ``SRC[:DST[:FLAGS]]`` -> (src, dst, flags); a bare path mounts at the same place."""
    parts = spec.split(":")
    src = parts[0]
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    flags = ":".join(parts[2:]) if len(parts) > 2 else None
    return src, dst, flags


def _hook(annotation: str) -> str | None:
    parts = annotation.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["com", "hooks"] else None


def _nest(flat: dict[str, str]) -> dict[str, Any]:
    """``{"com.hooks.cxi.enabled": "true"}`` -> ``{"com": {"hooks": {"cxi": {"enabled": "true"}}}}``:
    the CE reads annotations as nested tables; a quoted dotted key would be one odd key."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        table = out
        for part in parents:
            table = table.setdefault(part, {})
        table[leaf] = value
    return out


def _document(src: RoleSource, variant: str, environ: Mapping[str, str] | None = None) -> str:
    import hashlib

    import tomli_w

    body = tomli_w.dumps(_edf_data(src, variant, environ))
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    header = (
        f"# {src.edf_name(variant)}: rendered by env_layers from {src.file} "
        f"for {'topologies' if len(VARIANTS[variant]) > 1 else 'topology'} {' and '.join(VARIANTS[variant])}.\n"
        f"# Do not edit: change the source, then run `env_layers install-edfs`. envlayers-sha256: {digest}\n"
        "\n"
    )
    return header + body


def written_by_envlayers(text: str) -> bool | None:
    """True: our header and an unedited body. False: our header, edited since. None: no header."""
    m = _HEADER_RE.match(text)
    if not m:
        return None
    import hashlib

    body = text[m.end():]
    return hashlib.sha256(body.encode("utf-8")).hexdigest() == m.group(1)
