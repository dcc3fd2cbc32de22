"""A pinned podman image moved through shared storage, offline: ``env_layers images save|load``. Acts: runs
podman and writes the archive.

``save`` writes ``DIR/<archive name>`` with ``podman save`` (pulling the image first where the image is not on
this host and a registry is reachable); ``load`` reads it back with ``podman load``. The archive name comes from
the image reference (``runtimes.podman.archive_name``), the same name ranks.sh loads from ``CONTAINER_IMAGE_DIR``
on a node that lacks the image.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .errors import EnvLayersError
from .runtimes.images import unpinned
from .runtimes.podman import archive_name


def resolve_image(spec: str, root: Path | None) -> str:
    """SPEC is a catalog role (containers/edfs: its pinned remote image) or an image reference;
    either must be pinned (a tag that is not ``latest``, or a digest)."""
    image = spec
    if root is not None:
        from . import edf

        try:
            roles = edf.roles(root)
        except EnvLayersError:
            roles = []
        if spec in roles:
            from .edf.schema import source

            image = source(spec, root).remote_image
    if "/" not in image and ":" not in image and "@" not in image:
        raise EnvLayersError(f"{spec!r} is neither a catalog role nor an image reference", where="ROLE",
                             hint="a role from containers/edfs/ (env_layers edf list) or IMAGE:TAG")
    why = unpinned(image)
    if why:
        raise EnvLayersError(f"image {image!r} {why}", where=spec,
                             hint="pin a release tag or a digest (IMAGE:TAG or IMAGE@sha256:<digest>)")
    return image


def _podman(*args: str, timeout_s: float = 3600) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise EnvLayersError("podman is not installed here", hint="install podman (Debian: apt-get install podman)") \
            from None


def _fail(what: str, proc: subprocess.CompletedProcess) -> EnvLayersError:
    last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
    return EnvLayersError(f"{what} failed (exit {proc.returncode}): {last}")


def save(image: str, to_dir: Path) -> tuple[Path, bool]:
    """Write the image's archive into ``to_dir``; (path, pulled: whether it had to be pulled first)."""
    to_dir.mkdir(parents=True, exist_ok=True)
    pulled = False
    if _podman("image", "exists", image).returncode != 0:
        proc = _podman("pull", image)
        if proc.returncode != 0:
            raise _fail(f"image {image} is not on this host; podman pull", proc)
        pulled = True
    path = to_dir / archive_name(image)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    proc = _podman("save", "-o", str(tmp), image)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise _fail(f"podman save {image}", proc)
    os.replace(tmp, path)  # a node never loads a half-written archive
    return path, pulled


def load(image: str, from_dir: Path) -> Path:
    """Load the image's archive from ``from_dir``."""
    path = from_dir / archive_name(image)
    if not path.is_file():
        raise EnvLayersError(f"no archive of {image} in {from_dir} (looked for {path.name})",
                             hint=f"`env_layers images save {image} --to {from_dir}` on a host that has the image")
    proc = _podman("load", "-i", str(path))
    if proc.returncode != 0:
        raise _fail(f"podman load -i {path}", proc)
    return path
