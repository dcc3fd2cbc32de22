"""Host paths bound into a container, resolved to where they really are.

A cache relocated by a symbolic link (``~/.cache/huggingface -> /scratch/u/hf``, to escape a home
quota) dangles inside a container that binds the link's folder but not its target. So every path a
runtime binds is resolved first (:func:`real`), on the machine that binds it:

- a bind's source becomes its real path (``REAL:PATH``: the container still sees it where the
  variables say);
- a cache variable (:func:`is_cache_key`: ``HF_HOME``, ``TRITON_CACHE_DIR``, ...) whose path goes
  through a link is bound at its real path, and the variable names that path (the EDF's ``[env]``).

Used by ``edf.render`` (the EDF's ``mounts`` and ``[env]``, when ``install-edfs`` writes them) and
``runtimes.podman`` (its ``-v`` options). Reads the file system (``realpath``), nothing else.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

# the variables that name a cache or weights folder the server writes or reads
CACHE_KEYS = frozenset({"HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TORCH_HOME", "XDG_CACHE_HOME",
                        "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "MIOPEN_USER_DB_PATH",
                        "MIOPEN_CUSTOM_CACHE_DIR", "CUDA_CACHE_PATH"})
_CACHE_NAME_RE = re.compile(r"[A-Z0-9_]*_CACHE(_DIR|_ROOT|_HOME|_PATH)?\Z")


def is_cache_key(name: str) -> bool:
    return name in CACHE_KEYS or bool(_CACHE_NAME_RE.match(name))


def real(path: str) -> str | None:
    """The real path of the absolute ``path`` when a symbolic link lies on it (the path itself or a
    folder above it); None when there is none, or ``path`` is not absolute. A part that does not exist
    yet is kept as written after the last link."""
    if not path.startswith("/"):
        return None
    norm = os.path.normpath(path)
    resolved = os.path.realpath(norm)
    return resolved if resolved != norm else None


def split_mount(spec: str) -> tuple[str, str, str | None]:
    """``SRC[:DST[:FLAGS]]`` -> (src, dst, flags); a bare path mounts at the same place."""
    parts = spec.split(":")
    src = parts[0]
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    flags = ":".join(parts[2:]) if len(parts) > 2 else None
    return src, dst, flags


def resolve_edf(data: dict, environ: Mapping[str, str]) -> dict:
    """The EDF ``data`` with its bind sources and cache variables resolved through ``environ`` (the
    variables the Container Engine will expand). A value that reads an unset variable, or holds no
    link, is left as written."""
    from ..edf.images import expand_vars
    from ..errors import EnvLayersError

    def expanded(text: str) -> str | None:
        try:
            return expand_vars(text, environ)
        except EnvLayersError:
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
