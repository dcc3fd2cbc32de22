"""The SquashFS images the EDFs name: the path as the Container Engine expands it, whether it is on
disk, and the command that fetches a missing one (``containers/registry.sbatch pull <role>``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from ..errors import EdfError
from .schema import FETCH_SCRIPT, RoleSource, load_catalog, source
from .. import shell

_VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_vars(text: str, environ: Mapping[str, str] | None = None, *, where: str | None = None) -> str:
    """Expand ``${VAR}``, ``${VAR:-default}`` and ``$$`` the way the Container Engine does;
    an undefined variable without a default is an error, as it is for the CE."""
    env = os.environ if environ is None else environ

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, default = m.group(1), m.group(2)
        value = env.get(name)
        if default is not None and not value:
            return default
        if value is None:
            raise EdfError(
                f"${{{name}}} is not set",
                where=where,
                hint=f"export {name} (the Container Engine expands it the same way)",
            )
        return value

    return _VAR_RE.sub(repl, text)


def referenced_vars(text: str) -> list[tuple[str, bool]]:
    """Each ``${VAR}`` or ``${VAR:-default}`` of ``text`` as (name, has a default), in order."""
    return [(m.group(1), m.group(2) is not None) for m in _VAR_RE.finditer(text) if m.group(1)]


def fetch_command(role: str, root: Path, cwd: Path | None = None) -> str:
    """The exact command that imports ``role``'s pinned image to the SquashFS its EDF names."""
    here = (cwd or Path.cwd()).resolve()
    script = (Path(root).resolve() / FETCH_SCRIPT)
    try:
        shown = script.relative_to(here).as_posix()
    except ValueError:
        shown = str(script)
    return f"sbatch {shell.word(shown)} pull {shell.word(role)}"


def image_info(role: str, root: Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What ``registry.sbatch pull <role>`` needs: the pinned reference and the SquashFS path."""
    src = source(role, root)
    image = src.edf["image"]
    path = expand_vars(image, environ, where=f"{src.file}: edf.image")
    return {
        "role": src.role,
        "remote_image": src.remote_image,
        "enroot_uri": "docker://" + src.remote_image,
        "image": image,
        "squashfs": path,
        "roles_sharing": sorted(s.role for s in load_catalog(root).values() if s.edf.get("image") == image),
        "root": str(Path(root).resolve()),
    }


def _image_state(src: RoleSource, environ: Mapping[str, str]) -> tuple[Path | None, bool | None]:
    try:
        path = Path(expand_vars(src.edf["image"], environ))
    except EdfError:
        return None, None
    return path, path.is_file()
