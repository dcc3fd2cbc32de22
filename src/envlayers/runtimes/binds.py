"""Host paths bound into a container, resolved to where they really are.

A cache relocated by a symbolic link (``~/.cache/huggingface -> /scratch/u/hf``, to escape a home
quota) dangles inside a container that binds the link's folder but not its target. So every path a
runtime binds is resolved first (:func:`real`), on the machine that binds it:

- a bind's source becomes its real path (``REAL:PATH``: the container still sees it where the
  variables say);
- a cache variable (:func:`is_cache_key`: ``HF_HOME``, ``TRITON_CACHE_DIR``, ...) whose path goes
  through a link is bound at its real path, and the variable names that path (the EDF's ``[env]``).

Used by ``edf.render`` (the EDF's ``mounts`` and ``[env]``, when ``install-edfs`` writes them) and the
wrapping runtimes (podman's ``-v`` options, pyxis's and charliecloud's binds). Reads the file system
(``realpath``), nothing else.
"""

from __future__ import annotations

import os
import re

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
