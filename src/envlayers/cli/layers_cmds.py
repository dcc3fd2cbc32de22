"""render, explain, check, list: the layer commands."""

from __future__ import annotations

import os
import sys

import click

from . import get_root, site_option
from ..defaults import DEFAULT_EXPERIMENT
from ..errors import EnvLayersError

RENDERS_DIR = os.path.join("experiments", "renders")


def _target_env(ctx, target: str, extra: tuple[str, ...] = (), strict: bool = False, launch=None, site=None):
    from ..layers import load_env

    root = get_root(ctx)
    return root, load_env(root, target, extra, strict=strict, launch=launch, site=site or None)


@click.command()
@click.argument("target", metavar="EXPERIMENT:MODEL")
@click.option("--format", "fmt", type=click.Choice(["sh", "env", "json"]), default="sh", show_default=True,
              help="sh: bash-sourceable exports; env: dotenv (also bash-sourceable); json: key -> value.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write to FILE instead of stdout: a file is replaced atomically; a symlink is followed (the "
                   "file it points to is replaced, the link stays); a device or FIFO (/dev/null, a pipe) is "
                   "written through, never replaced.")
@click.option("--layer", "extra", multiple=True, type=click.Path(dir_okay=False),
              help="Append an env file on top of the stack (repeatable; later wins).")
@click.option("--strict", is_flag=True, help="Fail on references no layer assigns ($SCRATCH, $USER, ...).")
@site_option
@click.pass_context
def render(ctx, target, fmt, output, extra, strict, site):
    """Print the merged environment of EXPERIMENT:MODEL.

    Stack, lowest first: experiments/layers/common.env < the site (SITE) < the experiment in setups.yaml
    < model-<m>.env < the model in setups.yaml < --layer files. Last assignment wins;
    KEY= stays present and empty; references to keys no earlier layer assigns are left
    for the shell that sources the render.
    """
    from ..shell import render as render_env

    _, env = _target_env(ctx, target, extra, strict, site=site)
    text = render_env(env, fmt)
    if output:
        from ..fsutil import write_output

        write_output(output, text)
    else:
        click.echo(text, nl=False)


@click.command()
@click.argument("target", metavar="EXPERIMENT:MODEL")
@click.argument("keys", nargs=-1)
@click.option("--layer", "extra", multiple=True, type=click.Path(dir_okay=False),
              help="Append an env file on top of the stack (repeatable).")
@click.option("--serve", "launcher", is_flag=True,
              help="Explain the launcher's environment, as `env_layers serve` merges it: adds "
                   "experiments/serve-only.env, then SERVE_ENV_FILE; SERVE_BASE_ENV replaces the catalog layers.")
@click.option("--env-file", type=click.Path(dir_okay=False),
              help="As serve's --env-file (SERVE_ENV_FILE), sourced last; implies --serve.")
@click.option("--base-env", type=click.Path(dir_okay=False),
              help="As serve's --base-env (SERVE_BASE_ENV), used instead of the catalog layers; implies --serve.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@site_option
@click.pass_context
def explain(ctx, target, keys, extra, launcher, env_file, base_env, as_json, site):
    """Show each key's final value, the file:line that set it, and what it overrode.

    With KEYs, only those (exit 1 if one is absent: no layer assigns it). With --serve
    (or --env-file / --base-env) the stack is the launcher's, so a launch key's origin is
    shown exactly as `env_layers serve` would use it; SERVE_ENV_FILE and SERVE_BASE_ENV are
    read from the environment under --serve unless the options name files.
    """
    from ..layers import LaunchSources, deferred_in
    from ..envfile import value_text
    from ..shell import bash_value

    launch = None
    if launcher or env_file or base_env:
        env_file = env_file or (os.environ.get("SERVE_ENV_FILE") if launcher else None) or None
        base_env = base_env or (os.environ.get("SERVE_BASE_ENV") if launcher else None) or None
        launch = LaunchSources(base_env, env_file)
    from ..layers import merge, stack_sources

    sources = stack_sources(get_root(ctx), target, extra, launch, site=site or None)
    env = merge(sources, target)
    wanted = list(keys) or list(env.bindings)
    plan_pp = _derived_pp(sources, env) if "PIPELINE_PARALLEL_SIZE" in wanted else None
    records = []
    for key in wanted:
        b = env.bindings.get(key)
        if b is None:
            records.append({"key": key, "present": False})
            continue
        records.append({
            "key": key, "present": True, "value": value_text(b.value), "empty": not b.value,
            # names the job's shell expands in "value" (a literal '${X}' from single quotes is not listed)
            "deferred": sorted({d.name for d in deferred_in(b.value)}),
            "origin": str(b.origin),
            "overridden": [{"value": value_text(v), "origin": str(o)} for v, o in b.overridden],
        })
        if key == "PIPELINE_PARALLEL_SIZE" and plan_pp:
            records[-1]["derived"] = plan_pp  # what the plan uses instead, and from what
    if as_json:
        import json

        click.echo(json.dumps({"target": target, "sources": list(env.sources), "keys": records}, indent=2))
    else:
        for r, key in zip(records, wanted):
            if not r["present"]:
                click.echo(f"{key}: absent (no layer assigns it)")
                continue
            b = env.bindings[key]
            note = "  (present, empty)" if r["empty"] else ""
            click.echo(f"{key}={bash_value(b.value)}  {r['origin']}{note}")
            if r.get("derived"):
                click.echo(f"    derived for the plan: {r['derived']}")
            for v, o in reversed(b.overridden):
                click.echo(f"    overrode {bash_value(v)}  {o}")
    if any(not r["present"] for r in records):
        sys.exit(1)


def _derived_pp(sources, env) -> str | None:
    """The plan's ``pp=N (...)`` when it derives PIPELINE_PARALLEL_SIZE over the layers' value, because a
    higher layer set INFERENCE_NODES (docs/topology.md); None otherwise, or when the stack cannot be planned."""
    from .. import topology

    layered = topology.stacking(sources, env)
    if layered is None or not layered.nodes_above:
        return None
    try:
        p = topology.plan(env.text(), layered)
    except EnvLayersError:
        return None  # explain explains the layers; `env_layers plan` says what is wrong with the plan
    # PP is present, so the planner's only pp= entry is the one derived over it
    return next((d for d in p.derived if d.startswith("pp=")), None)


def _render_path(root, experiment: str, model: str):
    """The committed render of EXPERIMENT:MODEL under ``root`` (a ``Path``)."""
    return root / RENDERS_DIR / f".env.{experiment}.{model}"


def _all_targets(cat) -> list[tuple[str, str]]:
    return [(e, m) for e in cat.experiments for m in cat.models]


def _models_summary(cat) -> str:
    """'2 experiment(s) x 5 model(s): 1 in setups.yaml, 4 from a layer file alone'."""
    from ..catalog import FROM_LAYER_FILE

    alone = sum(1 for m in cat.models.values() if m.source == FROM_LAYER_FILE)
    return (f"{len(cat.experiments)} experiment(s) x {len(cat.models)} model(s): {len(cat.models) - alone} in "
            f"setups.yaml, {alone} from a layer file alone")


@click.command()
@click.option("--update", is_flag=True, help="Rewrite stale or missing renders instead of failing.")
@click.pass_context
def check(ctx, update):
    """Regenerate every committed render (experiments/renders/.env.EXPERIMENT.MODEL) and compare;
    check every site x experiment x model.

    The committed renders are the default site's (setups.yaml's site:). Every site file must state
    what a site decides and nothing a model does; on every site, every target is planned, and a setting
    only the other GPU vendor understands is an error naming its line (docs/sites.md).

    A stale render is shown as a diff and the exit status is 1. `--update` rewrites them
    (the one command that regenerates the golden renders). Targets whose shape the launcher
    would refuse (e.g. a 16-GPU model as one-node replicas) are listed as notes.
    """
    import difflib
    from pathlib import Path

    from ..fsutil import atomic_write
    from ..layers import merge, stack_sources
    from ..shell import render as render_env

    from .. import catalog, keys
    from ..topology import plan, stacking

    root = Path(get_root(ctx))
    cat = catalog.load(root)
    expected = {}
    unknown: dict[str, str] = {}  # a key no one reads, once per layer line (a typo of a launch key, most often)
    problems: list[str] = []  # a site file's rules broken, a setting for the other vendor's GPUs
    notes = [f"note: {file} is not a model: {why}" for file, why in cat.skipped]
    from .. import sites
    from ..envfile import parse_file
    from ..layers import site_source

    default = cat.site[0] if cat.site else None
    site_names = sorted(catalog.sites(root), key=lambda n: n != default) or [None]  # the default site first
    for name in site_names:  # a site file holds what a site decides, and every one of them
        if name is not None:
            rel = catalog.site_file(name)
            problems.extend(sites.site_file_problems(parse_file(root / rel, rel)))
    for site in site_names:
        on = f" on site {site}" if site and site != default else ""
        for exp, model in _all_targets(cat):
            sources = stack_sources(root, f"{exp}:{model}", site=site)
            env = merge(sources, f"{exp}:{model}")
            if site == default or site is None:  # the committed renders are the default site's
                expected[_render_path(root, exp, model)] = render_env(env, "sh")
            unknown.update({str(b.origin): f"{b.origin}: {said}" for key, b in env.bindings.items()
                            if (said := keys.unknown_key(key))})
            layer = site_source(sources)
            try:
                text = env.text()
                keys.check(text)
                problems.extend(p for p in sites.foreign_settings(env, keys.value(text, "GPU_VENDOR"),
                                                                   layer.label if layer else None)
                                if p not in problems)
                plan(text, stacking(sources, env))  # as serve plans it (a PP derived over a lower layer's)
            except EnvLayersError as err:
                notes.append(f"note: {exp}:{model}{on} renders but cannot launch: {err}")
    committed = set((root / RENDERS_DIR).glob(".env.*")) if (root / RENDERS_DIR).is_dir() else set()
    bad = 0
    for path in sorted(committed | set(expected)):
        rel = path.relative_to(root)
        want = expected.get(path)
        if want is None:
            click.echo(f"{rel}: orphan render: its target is not in the catalog (delete it)")
            bad += 1
            continue
        have = path.read_text(encoding="utf-8") if path.exists() else None
        if have == want:
            continue
        if update:
            atomic_write(path, want)
            click.echo(f"{rel}: {'written' if have is None else 'updated'}")
            continue
        bad += 1
        if have is None:
            click.echo(f"{rel}: missing (run `env_layers check --update`)")
            continue
        click.echo(f"{rel}: stale; fix the layer, then run `env_layers check --update`")
        diff = difflib.unified_diff(have.splitlines(True), want.splitlines(True), f"{rel} (committed)",
                                    f"{rel} (rendered now)")
        click.echo("".join(diff), nl=False)
    for line in [*unknown.values(), *problems]:
        click.echo(line)
        bad += 1
    for note in notes:
        click.echo(note)
    if bad:
        sys.exit(1)
    click.echo(f"ok: {len(expected)} render(s) up to date ({_models_summary(cat)}); "
               f"{len(site_names) * len(expected)} site x target stack(s) checked")


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@site_option
@click.pass_context
def list_cmd(ctx, as_json, site):
    """List sites, experiments and models, with each model's engine and node count on the site
    (SITE, else setups.yaml's site:).

    FROM says where a model is defined: `setups.yaml` (an entry under models:) or `layer-file`
    (experiments/layers/model-<MODEL>.env alone, described by its first comment line).
    """
    from .. import catalog
    from ..layers import merge, stack_sources
    from ..topology import plan, stacking

    root = get_root(ctx)
    cat = catalog.load(root)
    default = cat.site[0] if cat.site else None
    site_rows = [{"name": n, "description": d, "default": n == default, "file": catalog.site_file(n)}
                 for n, d in catalog.sites(root).items()]
    models = []
    for name, entry in cat.models.items():
        row = {"name": name, "description": entry.description, "from": entry.source,
               "defined_in": str(entry.origin)}
        try:
            sources = stack_sources(root, f"{DEFAULT_EXPERIMENT}:{name}", site=site or None)
            env = merge(sources, f"{DEFAULT_EXPERIMENT}:{name}")
            text = env.text()
            try:
                nodes = str(plan(text, stacking(sources, env)).nodes)
            except EnvLayersError:
                nodes = "-"  # `env_layers plan` says why
            row.update(engine=text.get("INFERENCE_ENGINE"), nodes=nodes,
                       model=text.get("INFERENCE_MODEL"), partition=text.get("SLURM_PARTITION"))
        except EnvLayersError as err:
            row["error"] = str(err)
        models.append(row)
    experiments = [{"name": n, "layers": [f for f, _ in e.layers], "description": e.description}
                   for n, e in cat.experiments.items()]
    if as_json:
        import json

        click.echo(json.dumps({"site": site or default, "sites": site_rows, "experiments": experiments,
                               "models": models}, indent=2))
        return
    if site_rows:
        click.echo("SITES")
        w = max(len(r["name"]) for r in site_rows)
        for r in site_rows:
            mark = (" (default)" if r["default"] else "") + (" (nodes below)" if site and r["name"] == site else "")
            click.echo(f"  {r['name']:<{w}}  {r['description']}{mark}")
    click.echo("EXPERIMENTS")
    w = max((len(e["name"]) for e in experiments), default=4)
    for e in experiments:
        extra = f"  [{', '.join(e['layers'])}]" if e["layers"] else ""
        click.echo(f"  {e['name']:<{w}}  {e['description']}{extra}")
    click.echo("MODELS")
    w = max((len(m["name"]) for m in models), default=4)
    click.echo(f"  {'NAME':<{w}}  {'FROM':<12} {'ENGINE':<7} {'NODES':<5} {'PARTITION':<9} MODEL")
    for m in models:
        if "error" in m:
            click.echo(f"  {m['name']:<{w}}  {m['from']:<12} error: {m['error']}")
            continue
        click.echo(f"  {m['name']:<{w}}  {m['from']:<12} {m['engine'] or '-':<7} {m['nodes']:<5} "
                   f"{m['partition'] or '-':<9} {m['model'] or '-'}")
    for file, why in cat.skipped:
        click.echo(f"note: {file} is not a model: {why}")
