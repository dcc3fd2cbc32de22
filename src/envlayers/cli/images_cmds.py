"""``images save|load``: a pinned podman image to and from shared storage (runtimes/images.py)."""

from __future__ import annotations

import os
from pathlib import Path

import click


def _root() -> Path | None:
    from ..paths import find_root

    try:
        return Path(find_root())
    except Exception:  # no catalog here: SPEC must be an image reference
        return None


@click.group()
def images() -> None:
    """Move pinned podman images through shared storage (CONTAINER_RUNTIME=podman, docs/podman.md)."""


@images.command()
@click.argument("spec", metavar="ROLE|IMAGE")
@click.option("--to", "to_dir", required=True, type=click.Path(file_okay=False), help="The shared directory.")
def save(spec: str, to_dir: str) -> None:
    """Save ROLE's pinned image (or IMAGE) into DIR with podman save (pulled first if missing here)."""
    from ..runtimes import images as im

    image = im.resolve_image(spec, _root())
    path, pulled = im.save(image, Path(to_dir))
    click.echo(f"{'pulled and ' if pulled else ''}saved {image} to {path}")
    click.echo(f"jobs load it from there: CONTAINER_IMAGE_DIR={os.path.abspath(to_dir)}")


@images.command()
@click.argument("spec", metavar="ROLE|IMAGE")
@click.option("--from", "from_dir", required=True, type=click.Path(file_okay=False), help="The shared directory.")
def load(spec: str, from_dir: str) -> None:
    """Load ROLE's pinned image (or IMAGE) from DIR with podman load."""
    from ..runtimes import images as im

    image = im.resolve_image(spec, _root())
    path = im.load(image, Path(from_dir))
    click.echo(f"loaded {image} from {path}")
