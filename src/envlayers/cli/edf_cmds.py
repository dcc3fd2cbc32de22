"""``env_layers install-edfs`` and ``env_layers edf ...``: container definitions.

Only click is imported at module level; the library (and with it PyYAML and tomli-w) is imported
when a command runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from . import get_root, site_option

from ..topology_checks import MODES as _TOPOLOGY_CHOICES  # == envlayers.edf.TOPOLOGIES
from ..errors import EnvLayersError
from .. import shell


def _site_roles(root: Path, site: str | None) -> "set[str] | None":
    """The roles of the site's targets (layers.role_stacks); None (every role) for a catalog with no site,
    as before sites existed, or a folder of EDF sources alone."""
    from .. import catalog
    from ..layers import role_stacks

    try:
        cat = catalog.load(root)
    except EnvLayersError:
        if site:
            raise
        return None
    if not site and cat.site is None:
        return None
    return set(role_stacks(root, site or None))


@click.command("install-edfs")
@click.option(
    "--dest",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder to install into (default: the first folder of EDF_PATH, else ~/.edf).",
)
@click.option("--force", is_flag=True, help="Replace EDFs that differ from what env_layers renders.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--all", "every_role", is_flag=True, help="Every role of containers/edfs/, not only the site's.")
@site_option
@click.pass_context
def install_edfs(ctx: click.Context, dest: str | None, force: bool, as_json: bool, every_role: bool,
                 site: str | None) -> None:
    """Install the container definitions (EDFs) the site's models run, and report missing images.

    The roles are those of every experiment x model on the site (SITE, else setups.yaml's site:), so
    an AMD site installs no NVIDIA image's EDF; --all installs every role of containers/edfs/.

    \b
    Per EDF: written, unchanged, differs (a file env_layers did not write, or that was edited
    since; kept, with the diff) or overwritten (--force). Exit status 1 when an EDF differs and
    was kept.
    """
    from .. import edf
    from ..edfinstall import install

    root = Path(get_root(ctx))
    folder = Path(dest).expanduser() if dest is not None else edf.edf_search_dir(os.environ)
    results = install(root, folder, force=force, roles=None if every_role else _site_roles(root, site))
    missing = _missing_images(results)
    kept = [r for r in results if r.status == "differs"]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dest": str(folder),
                    "results": [r.to_json() for r in results],
                    "missing_images": missing,
                    "images_unchecked": sorted({r.image for r in results if r.image_present is None}),
                    "ok": not kept,
                },
                indent=2,
            )
        )
    else:
        _print_report(folder, results, missing)
    if kept:
        ctx.exit(1)


def _missing_images(results) -> list[dict]:
    seen: dict[str, dict] = {}
    for r in results:
        if r.image_present is not False:
            continue
        entry = seen.setdefault(
            r.image,
            {
                "image": r.image,
                "path": str(r.image_path),
                "remote_image": r.remote_image,
                "roles": [],
                "fetch_command": r.fetch_command,
            },
        )
        if r.role not in entry["roles"]:
            entry["roles"].append(r.role)
    return list(seen.values())


def _print_report(folder: Path, results, missing: list[dict]) -> None:
    click.echo(f"EDFs in {folder}:")
    width = max(len(r.path.name) for r in results)
    for r in results:
        line = f"  {r.status:<11} {r.path.name:<{width}}  {', '.join(r.topologies)}"
        if r.status == "differs":
            line += f": {r.reason}" + ("; kept (--force replaces it)" if r.force_replaces else "")
        elif r.reason:
            line += f": {r.reason}"
        click.echo(line)
        if r.status in ("differs", "overwritten") and r.diff:
            for diff_line in r.diff.splitlines():
                click.echo(f"      {diff_line}")

    unchecked = sorted({r.image for r in results if r.image_present is None})
    if missing:
        click.echo("Missing images (each fetched by its command):")
        for m in missing:
            click.echo(f"  {m['path']}  ({', '.join(m['roles'])}: {m['remote_image']})")
            click.echo(f"    {m['fetch_command']}")
    elif not unchecked:
        click.echo("All images present.")
    for image in unchecked:
        click.echo(f"Not checked (a variable in the path is not set): {image}")

    kept = sum(r.status == "differs" and r.force_replaces for r in results)
    if kept:
        noun = "EDF differs" if kept == 1 else "EDFs differ"
        click.echo(f"{kept} {noun} from what env_layers renders and {'was' if kept == 1 else 'were'} kept; "
                   "rerun with --force to replace (the diff above shows what would change).")
    links = sum(r.status == "differs" and not r.force_replaces for r in results)
    if links:
        noun = "EDF is a symbolic link" if links == 1 else "EDFs are symbolic links"
        click.echo(f"{links} {noun} that env_layers does not replace, with or without --force: remove "
                   f"{'it' if links == 1 else 'them'}, or install with --dest.")


@click.group("edf")
def edf() -> None:
    """Inspect container definitions (EDFs)."""


@edf.command("show")
@click.argument("role")
@click.option(
    "--topology",
    type=click.Choice(_TOPOLOGY_CHOICES),
    default="pipeline",
    show_default=True,
    help="single and replicas get the -intranode variant, pipeline the base EDF.",
)
@click.pass_context
def show(ctx: click.Context, role: str, topology: str) -> None:
    """Print the TOML that install-edfs writes for ROLE (cache folders relocated by a symbolic link
    named by their real path, as install-edfs writes them)."""
    import os

    from .. import edf as lib

    click.echo(lib.render_edf(role, topology, Path(get_root(ctx)), os.environ), nl=False)


@edf.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool) -> None:
    """List roles, their EDF names per topology and their pinned images."""
    from .. import edf as lib

    root = Path(get_root(ctx))
    rows = []
    for role, src in sorted(lib.load_catalog(root).items()):
        rows.append(
            {
                "role": role,
                "engine": src.engine,
                "edfs": {t: lib.edf_name(role, t, root) for t in lib.TOPOLOGIES} if src.edf else {},
                "remote_image": src.remote_image,
                "image": src.edf.get("image"),  # None: a role without edf: (no EDF, the image only)
                "source": src.file,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        click.echo(f"{row['role']}  ({row['engine']}, {row['source']})")
        click.echo(f"  image:     {row['remote_image']}")
        if not row["edfs"]:
            click.echo("  no EDF: an image for podman, apptainer, charliecloud and pyxis (docs/sites.md)")
            continue
        click.echo(f"  squashfs:  {row['image']}")
        click.echo(f"  pipeline:  {row['edfs']['pipeline']}")
        click.echo(f"  single, replicas: {row['edfs']['single']}")


@edf.command("name", hidden=True)
@click.argument("role")
@click.option("--topology", type=click.Choice(_TOPOLOGY_CHOICES), required=True)
@click.pass_context
def name_cmd(ctx: click.Context, role: str, topology: str) -> None:
    """Print the EDF name for ROLE and TOPOLOGY (for shell launchers)."""
    from .. import edf as lib

    click.echo(lib.edf_name(role, topology, Path(get_root(ctx))))


@edf.command("image", hidden=True)
@click.argument("role")
@click.option("--json", "fmt", flag_value="json", help="Print as JSON.")
@click.option("--shell", "fmt", flag_value="shell", help="Print shell assignments (for registry.sbatch).")
@click.pass_context
def image_cmd(ctx: click.Context, role: str, fmt: str | None) -> None:
    """Print ROLE's pinned image and the SquashFS path its EDF names (used by registry.sbatch)."""
    from .. import edf as lib

    info = lib.image_info(role, Path(get_root(ctx)), os.environ)
    if fmt == "json":
        click.echo(json.dumps(info, indent=2))
    elif fmt == "shell":
        for key in ("role", "remote_image", "enroot_uri", "squashfs", "root"):
            click.echo(f"{key}={shell.word(str(info[key]))}")
        click.echo(f"roles_sharing={shell.word(' '.join(info['roles_sharing']))}")
    else:
        click.echo(f"{info['remote_image']} -> {info['squashfs']}")
