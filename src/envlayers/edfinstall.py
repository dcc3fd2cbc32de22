"""Installing the rendered EDFs into the Container Engine's folder (``EDF_PATH`` or ``~/.edf``,
``edf.edf_search_dir``): ``env_layers install-edfs``. Acts: writes the files.

Per file: classify what is there (missing, ours and unchanged, ours but older, edited, not ours, a
symbolic link), write atomically through a temporary file, and clean the temporary files an
interrupted install left behind. Nothing is written before the whole catalog validated and rendered.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from .edf.images import _image_state, fetch_command
from .edf.render import _document, written_by_envlayers
from .edf.schema import VARIANTS, load_catalog
from .errors import EdfError

_TMP_PREFIX = ".envlayers-tmp-"


class InstallResult(NamedTuple):
    """What ``install`` did with one EDF, and whether its image is on disk."""

    name: str
    role: str
    variant: str  # "fabric" | "intranode"
    topologies: tuple[str, ...]
    path: Path
    status: str  # "written" | "unchanged" | "differs" | "overwritten"
    reason: str | None  # why a file was kept or replaced; None for a plain write or no change
    diff: str | None  # unified diff installed -> rendered, for "differs" and "overwritten"
    remote_image: str
    image: str  # the SquashFS path as the EDF names it (unexpanded)
    image_path: Path | None  # expanded; None when a variable in it is not set
    image_present: bool | None  # None when image_path is None
    fetch_command: str | None  # the command that imports the image, when it is missing
    force_replaces: bool = True  # whether --force replaces a file that differs (never a symbolic link)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "variant": self.variant,
            "topologies": list(self.topologies),
            "path": str(self.path),
            "status": self.status,
            "reason": self.reason,
            "diff": self.diff,
            "remote_image": self.remote_image,
            "image": self.image,
            "image_path": None if self.image_path is None else str(self.image_path),
            "image_present": self.image_present,
            "fetch_command": self.fetch_command,
            "force_replaces": self.force_replaces,
        }


def install(
    root: Path,
    dest: Path,
    force: bool = False,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    roles: "set[str] | None" = None,
) -> list[InstallResult]:
    """Render every EDF of the catalog (of ``roles`` only, when given) into ``dest``.

    Each file is written to a temporary file in ``dest`` and renamed over the target, so a reader
    (or a kill -9) sees the old file or the new one, never a part. A file whose bytes already
    match is not touched. A file this tool did not write, or that was edited since (its header
    hash no longer matches its body), is kept unless ``force``; the result carries the diff.
    The catalog is validated and rendered in full before anything is written.
    """
    env = os.environ if environ is None else environ
    catalog = load_catalog(root)
    rendered = [
        (src, variant, _document(src, variant, env)) for src in catalog.values() for variant in VARIANTS
        if src.edf and (roles is None or src.role in roles)  # a role without edf: has no EDF to install
    ]
    dest = Path(dest)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EdfError(f"cannot create {dest}: {err.strerror}", where="--dest") from None
    _remove_stale_temps(dest)

    images: dict[str, tuple[Path | None, bool | None]] = {}
    results = []
    for src, variant, text in rendered:
        name = src.edf_name(variant)
        path = dest / f"{name}.toml"
        status, reason, diff = _classify(path, text)
        link = path.is_symlink()
        if status == "differs" and force and not link:
            status = "overwritten"
        if status in ("written", "overwritten"):
            import socket

            from .fsutil import atomic_write  # here: a dry run does not import tempfile

            try:
                atomic_write(path, text, mode=0o644,
                             tmp_prefix=f"{_TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{path.name}.")
            except OSError as err:
                raise EdfError(
                    f"cannot write {path}: {err.strerror or err}",
                    where=str(dest),
                    hint="check the folder's permissions and free space; EDFs already written are complete",
                ) from None
        if src.edf["image"] not in images:
            images[src.edf["image"]] = _image_state(src, env)
        image_path, present = images[src.edf["image"]]
        results.append(
            InstallResult(
                name=name,
                role=src.role,
                variant=variant,
                topologies=VARIANTS[variant],
                path=path,
                status=status,
                reason=reason,
                diff=diff,
                remote_image=src.remote_image,
                image=src.edf["image"],
                image_path=image_path,
                image_present=present,
                fetch_command=None if present is not False else fetch_command(src.role, root, cwd),
                force_replaces=not link,
            )
        )
    return results


def _classify(path: Path, text: str) -> tuple[str, str | None, str | None]:
    """(status, reason, diff) of the file at ``path`` against the rendered ``text``. A symbolic link is
    never replaced (it may point into a shared folder), so its reason says so and not more."""
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        if not path.exists():
            return ("differs", f"a symbolic link to {target}, which does not exist: never replaced; "
                    "remove the link, or install with --dest", None)
        try:
            current = path.read_bytes().decode("utf-8", errors="replace")
        except OSError as err:
            return ("differs", f"a symbolic link to {target}, which cannot be read ({err.strerror}): never "
                    "replaced; remove the link, or install with --dest", None)
        if current == text:
            return "unchanged", None, None
        return ("differs", f"a symbolic link to {target} (it may point into a shared folder): never replaced; "
                "remove the link, or install with --dest", _diff(current, text, path))
    if not path.exists():
        return "written", None, None
    try:
        current = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as err:
        return "differs", f"cannot be read ({err.strerror})", None
    if current == text:
        return "unchanged", None, None
    ours = written_by_envlayers(current)
    if ours is True:
        return "written", "replaced an older render", _diff(current, text, path)
    reason = "edited since env_layers wrote it" if ours is False else "not written by env_layers"
    return "differs", reason, _diff(current, text, path)


def _diff(current: str, new: str, path: Path) -> str:
    import difflib

    return "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"{path} (installed)",
            tofile=f"{path} (env_layers)",
        )
    )


def _remove_stale_temps(dest: Path, *, max_age_s: float = 86400.0) -> None:
    """Remove temporary files an interrupted install left: ours (by prefix), from this host with
    a process that is gone, or older than a day. The CE never reads them (they do not end in
    .toml), this only keeps the folder tidy."""
    import socket

    from .fsutil import pid_alive

    host = socket.gethostname()
    now = time.time()
    for tmp in dest.glob(f"{_TMP_PREFIX}*.tmp"):
        rest = tmp.name[len(_TMP_PREFIX):]
        stale = False
        if rest.startswith(host + "-"):
            pid_text = rest[len(host) + 1:].split("-", 1)[0]
            stale = pid_text.isdigit() and not pid_alive(int(pid_text))
        try:
            stale = stale or now - tmp.stat().st_mtime > max_age_s
            if stale:
                tmp.unlink()
        except OSError:
            pass

