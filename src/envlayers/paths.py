"""Where the catalog lives: the folder holding experiments/ and containers/."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import CatalogError

MARKER = Path("experiments") / "setups.yaml"


def find_root(explicit: str | os.PathLike | None = None, cwd: Path | None = None) -> Path:
    """Resolve the catalog root.

    Order: ``explicit`` (``--root``), ``ENVLAYERS_ROOT``, the nearest folder upward from
    ``cwd`` holding experiments/setups.yaml, then the catalog shipped with the package.
    """
    given = explicit if explicit is not None else os.environ.get("ENVLAYERS_ROOT") or None
    if given is not None:
        root = Path(given).expanduser().resolve()
        if not (root / MARKER).is_file():
            raise CatalogError(
                f"no {MARKER} under {root}",
                where="--root" if explicit is not None else "ENVLAYERS_ROOT",
                hint="point it at the folder that holds experiments/ and containers/",
            )
        return root
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / MARKER).is_file():
            return folder
    for packaged in _packaged_roots():
        if (packaged / MARKER).is_file():
            return packaged
    raise CatalogError(
        f"no {MARKER} found above {here}",
        hint="run inside a checkout, or pass --root DIR / set ENVLAYERS_ROOT",
    )


def _packaged_roots() -> tuple[Path, ...]:
    pkg = Path(__file__).resolve().parent
    # a wheel ships the catalog inside the package; an editable install points at the checkout
    return (pkg / "_catalog", pkg.parents[1])
