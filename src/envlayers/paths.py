"""Where the catalog lives: the folder holding experiments/ and containers/.

Plain ``os.path`` on ``str`` paths, as in :mod:`envlayers.catalog` and :mod:`envlayers.layers`: a render reads
a few files and never needs :mod:`pathlib`, whose import (``urllib.parse`` with it) is a sizeable part of
a render's start-up (docs/layers.md, "Start-up"). A command that wants a ``Path`` makes one of the root.
"""

from __future__ import annotations

import os

from .errors import CatalogError

MARKER = os.path.join("experiments", "setups.yaml")


def find_root(explicit: str | os.PathLike | None = None, cwd: str | os.PathLike | None = None) -> str:
    """Resolve the catalog root: an absolute path, symbolic links resolved.

    Order: ``explicit`` (``--root``), ``ENVLAYERS_ROOT``, the nearest folder upward from
    ``cwd`` holding experiments/setups.yaml, then the catalog shipped with the package.
    """
    given = explicit if explicit is not None else os.environ.get("ENVLAYERS_ROOT") or None
    if given is not None:
        root = os.path.realpath(os.path.expanduser(os.fspath(given)))
        if not os.path.isfile(os.path.join(root, MARKER)):
            raise CatalogError(
                f"no {MARKER} under {root}",
                where="--root" if explicit is not None else "ENVLAYERS_ROOT",
                hint="point it at the folder that holds experiments/ and containers/",
            )
        return root
    here = os.path.realpath(os.getcwd() if cwd is None else os.fspath(cwd))
    folder = here
    while True:
        if os.path.isfile(os.path.join(folder, MARKER)):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for packaged in _packaged_roots():
        if os.path.isfile(os.path.join(packaged, MARKER)):
            return packaged
    raise CatalogError(
        f"no {MARKER} found above {here}",
        hint="run inside a checkout, or pass --root DIR / set ENVLAYERS_ROOT",
    )


def _packaged_roots() -> tuple[str, ...]:
    pkg = os.path.dirname(os.path.realpath(__file__))
    # a wheel ships the catalog inside the package; an editable install points at the checkout
    return (os.path.join(pkg, "_catalog"), os.path.dirname(os.path.dirname(pkg)))
