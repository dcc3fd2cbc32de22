"""``report``: where the GPU-hours of the endpoint jobs went, per model and per shape, and the largest waste.

Thin: ``envlayers.ops.report`` gathers the run directories' ``accounting.json`` and ``sacct``;
this module prints it (or ``--json``) and draws the optional PNG chart (matplotlib, the ``report``
extra: imported only for ``--chart``).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import EnvLayersError
from .params import terminal_text

INSTALL_HINT = "pip install 'envlayers[report]' (matplotlib draws the chart)"
SKIPPED_SHOWN = 10  # accounting.json files left out, named one a line; --json has them all


@click.command()
@click.option("--since", default="7d", show_default=True, help="Window start: 7d, 12h, 30m, 2w or a date.")
@click.option("--user", default=None, help="Only this user's jobs (default: everyone's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--run-root", "run_roots", multiple=True, type=click.Path(file_okay=False),
              help="Where the run directories are (<RUN_ROOT>/<jobid>/); repeatable. Default: as `status` finds them.")
@click.option("--chart", type=click.Path(dir_okay=False), default=None,
              help="Also draw the split per model as a PNG here (needs the `report` extra).")
@click.option("--idle-stop", "suggest_stop_s", type=float, default=1800.0, show_default=True,
              help="The IDLE_STOP_AFTER_S to price the idle time after the last request with.")
@click.option("--no-sacct", is_flag=True, help="Do not ask Slurm's accounting; run directories only.")
def report(since: str, user: str | None, as_json: bool, run_roots: tuple[str, ...], chart: str | None,
           suggest_stop_s: float, no_sacct: bool) -> None:
    """Sum the GPU-hours of the endpoint jobs since --since: allocated, to live (rank start, weight load,
    graph capture), serving, idle, idle after the last request, after the server died; per model and
    per shape, with the largest waste named (docs/operating.md).

    Exit 0 with the report (also when no job is in the window); 2 on bad input."""
    import os
    import time

    from .. import rundir
    from ..ops.report import build_report, parse_since

    if not suggest_stop_s > 0:
        raise EnvLayersError(f"{suggest_stop_s:g} is not a positive number of seconds",
                             where="--idle-stop", hint="e.g. --idle-stop 1800")
    if chart:
        _matplotlib()  # before any work: a missing extra is said at once
    now = time.time()
    roots = [Path(r) for r in run_roots] or rundir.run_root_candidates(os.environ, Path.cwd())
    rep = build_report(roots, parse_since(since, now), user, now=now, suggest_stop_s=suggest_stop_s,
                       use_sacct=not no_sacct)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=2))
    else:
        click.echo(format_report(rep), nl=False)
    if chart:
        draw_chart(rep.by_model, "model", Path(chart))
        if not as_json:
            click.echo(f"chart: {chart}")


def format_report(rep) -> str:
    from ..accounting import fmt_h
    from ..durations import compact

    t = terminal_text  # model names, run directories and reasons come from other users' files too
    since = time_text(rep.since)
    lines = [f"GPU-hours of endpoint jobs since {since}: {len(rep.jobs)} job run(s) with an accounting record"]
    if rep.slurm_accounting == "sacct":
        if rep.missing:
            lost = sum(m["gpu_hours"] or 0 for m in rep.missing)
            lines.append(f"  Slurm accounting: {len(rep.missing)} more job(s) ran ({fmt_h(lost)} GPU-hours) with no "
                         "accounting record (launcher killed, or run directory gone): "
                         + ", ".join(f"{t(m['job_id'])} ({t(m['state'])}, {compact(m['elapsed_s'])})"
                                     for m in rep.missing[:8]))
        else:
            lines.append("  Slurm accounting: every endpoint job it lists has an accounting record here")
    else:
        lines.append(f"  Slurm accounting not available ({t(rep.slurm_accounting)}): run directories only; jobs whose "
                     "launcher was killed or whose run directory is gone are missing")
    for why in rep.skipped[:SKIPPED_SHOWN]:
        lines.append(f"  skipped {t(why)}")
    if len(rep.skipped) > SKIPPED_SHOWN:
        lines.append(f"  skipped {len(rep.skipped) - SKIPPED_SHOWN} more accounting.json file(s) (--json lists them all)")
    if not rep.jobs:
        lines.append(f"  no accounting.json under {t(', '.join(rep.roots))}")
        return "\n".join(lines) + "\n"
    for key, groups in (("model", rep.by_model), ("shape", rep.by_shape), ("site", rep.by_site)):
        if not groups:
            continue
        lines.append(f"by {key}:")
        for g in groups:
            lines.append(f"  {t(g[key])}: {g['jobs']} run(s), {fmt_h(g['allocated_gpu_hours'])} GPU-hours allocated")
            lines.append("    " + split_text(g))
    for pool in rep.pools:
        lines.append(f"elastic pool of job {t(pool['job_id'])}: {fmt_h(pool['gpu_hours_total'])} GPU-hours with its "
                     f"replica job(s) {t(', '.join(pool['replica_jobs']) or 'none')} "
                     f"({fmt_h(pool['gpu_hours_replica_jobs'])} of them)")
        for d in pool["decisions"]:
            lines.append(f"  {t(str(d.get('action')))}{' ' + t(str(d['job'])) if d.get('job') else ''}: "
                         f"{t(str(d.get('why')))}")
    if rep.largest_waste:
        lines.append(f"largest waste: {t(rep.largest_waste)}")
    return "\n".join(lines) + "\n"


def split_text(g: dict) -> str:
    from ..accounting import fmt_h

    h, share = g["gpu_hours"], g["share"]
    to_live = sum(h[k] for k in ("rank_start", "weight_load", "graph_capture", "startup_other"))
    parts = [f"to live {fmt_h(to_live)} ({_pct(to_live, g)}: rank start {_pct(h['rank_start'], g)}, weight load "
             f"{_pct(h['weight_load'], g)}, graph capture {_pct(h['graph_capture'], g)})"]
    for seg, label in (("serving", "serving"), ("idle", "idle between requests"),
                       ("idle_after_last_request", "idle after the last request"),
                       ("live_unmeasured", "live, not measured"), ("after_server_died", "after the server died")):
        if h[seg] > 0 or seg in ("serving", "idle_after_last_request"):
            parts.append(f"{label} {fmt_h(h[seg])} ({share[seg] * 100:.0f}%)")
    return "; ".join(parts)


def _pct(hours: float, g: dict) -> str:
    total = g["allocated_gpu_hours"]
    return f"{hours / total * 100:.0f}%" if total else "0%"


def time_text(epoch: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M")


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise EnvLayersError("needs matplotlib, which is not installed", where="--chart",
                             hint=INSTALL_HINT) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_chart(groups: list[dict], key: str, path: Path) -> None:
    """A stacked horizontal bar per group: the GPU-hours of each segment."""
    from ..accounting import LABELS, SEGMENTS

    plt = _matplotlib()
    names = [g[key] for g in groups] or ["(no jobs)"]
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.5 * len(names)))
    left = [0.0] * len(names)
    for seg in SEGMENTS:
        values = [g["gpu_hours"][seg] for g in groups] or [0.0]
        if any(values):
            ax.barh(names, values, left=left, label=LABELS[seg])
            left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel("GPU-hours")
    ax.set_title(f"Where the GPU-hours went, per {key}")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    tmp.replace(path)
