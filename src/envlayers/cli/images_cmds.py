"""``images list|save|load``: the images a site's jobs run and the step that makes each; a pinned podman image
to and from shared storage (imagearchive.py)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from . import site_option


def _root() -> Path | None:
    from ..paths import find_root

    try:
        return Path(find_root())
    except Exception:  # no catalog here: SPEC must be an image reference
        return None


@click.group()
def images() -> None:
    """The images a site's jobs run, and moving pinned podman images through shared storage (docs/sites.md,
    docs/podman.md)."""


@images.command("list")
@site_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(site: str | None, as_json: bool) -> None:
    """Each image the site's models run (SITE, else setups.yaml's site:): where the job looks for it under
    the site's runtime, whether it is there, and the command that makes it (apptainer pull, enroot import,
    ch-convert, images save, or the Container Engine's registry.sbatch pull). Exit 1 when one is missing."""
    import json

    from ..errors import EnvLayersError
    from ..paths import find_root
    from ..runtimes import runtime_name

    root = Path(find_root())
    rows = []
    from .. import edf
    from ..edf.schema import source
    from ..layers import expand, role_stacks

    for role, stack in role_stacks(root, site or None).items():
        text = stack.text()
        runtime = runtime_name(text)
        src = source(role, root)
        env = {k: v if (v := expand(b.value, os.environ)) is not None else text[k] for k, b in stack.bindings.items()}
        if runtime == "ce":
            try:
                where = edf.image_info(role, root, os.environ)["squashfs"]
            except EnvLayersError:  # a variable of its path not set here: the path as written, not checked
                where = src.edf.get("image")
            command = edf.fetch_command(role, root)
        else:
            from ..runtimes import image_step

            where, command = image_step(runtime, env, src.remote_image)
        there = None if where is None or "$" in where else os.path.exists(where)
        rows.append({"role": role, "runtime": runtime, "image": src.remote_image, "at": where, "there": there,
                     "make": command})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            state = {True: "there", False: "MISSING", None: "not checked"}[r["there"]]
            click.echo(f"{r['role']} ({r['runtime']}): {r['image']}")
            click.echo(f"  at:   {r['at'] or '(each node pulls it)'}  [{state}]")
            if r["make"]:
                click.echo(f"  make: {r['make']}")
    if any(r["there"] is False for r in rows):
        raise SystemExit(1)


@images.command()
@click.argument("spec", metavar="ROLE|IMAGE")
@click.option("--to", "to_dir", required=True, type=click.Path(file_okay=False), help="The shared directory.")
def save(spec: str, to_dir: str) -> None:
    """Save ROLE's pinned image (or IMAGE) into DIR with podman save (pulled first if missing here)."""
    from .. import imagearchive as im

    image = im.resolve_image(spec, _root())
    path, pulled = im.save(image, Path(to_dir))
    click.echo(f"{'pulled and ' if pulled else ''}saved {image} to {path}")
    click.echo(f"jobs load it from there: CONTAINER_IMAGE_DIR={os.path.abspath(to_dir)}")


@images.command()
@click.argument("spec", metavar="ROLE|IMAGE")
@click.option("--from", "from_dir", required=True, type=click.Path(file_okay=False), help="The shared directory.")
def load(spec: str, from_dir: str) -> None:
    """Load ROLE's pinned image (or IMAGE) from DIR with podman load."""
    from .. import imagearchive as im

    image = im.resolve_image(spec, _root())
    path = im.load(image, Path(from_dir))
    click.echo(f"loaded {image} from {path}")
