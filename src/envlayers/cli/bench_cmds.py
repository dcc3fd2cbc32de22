"""``bench``: a bounded load test of a live endpoint (thin wrapper around ``envlayers.bench``).

Exit statuses: 0 every request succeeded, 1 the endpoint failed the preflight or some requests,
2 bad input or could not run (docs/operating.md, "Load report").
"""

from __future__ import annotations

import json
import os

import click

from ..errors import EnvLayersError
from .params import Seconds

INSTALL_HINT = "install the optional extra: pip install 'envlayers[bench]' (it brings matplotlib)"


def parse_levels(text: str) -> list[int]:
    """``"1,4,16"`` -> [1, 4, 16]: positive, at most the cap, no repeats, in the order given."""
    from ..bench.load import MAX_CONCURRENCY

    levels: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_CONCURRENCY:
            raise EnvLayersError(f"--concurrency {text!r}: {part!r} is not a whole number from 1 to {MAX_CONCURRENCY}",
                                 hint="give a comma list of concurrency levels, e.g. --concurrency 1,4,16")
        if int(part) in levels:
            raise EnvLayersError(f"--concurrency {text!r}: {part} is given twice",
                                 hint="give each level once, e.g. --concurrency 1,4,16")
        levels.append(int(part))
    return levels


def check_plot_path(path: str) -> None:
    """Before any load: the PNG can be written there and matplotlib is installed."""
    import os
    from pathlib import Path

    p = Path(path)
    if p.suffix.lower() != ".png":
        raise EnvLayersError(f"--plot {path!r}: the plot is a PNG; name the file *.png", hint="e.g. --plot bench.png")
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK):
        raise EnvLayersError(f"--plot {path!r}: cannot write there ({'a folder' if p.is_dir() else f'{parent} is not a writable folder'})",
                             hint="give a file in an existing folder you can write")
    try:
        import matplotlib  # noqa: F401 - only with --plot, before any load is sent
    except ImportError:
        raise EnvLayersError("--plot needs matplotlib, which is not installed", hint=INSTALL_HINT) from None


def resolve_target(target: str, *, model: str | None, api_key_file: str | None, replica: int | None,
                   run_dir: str | None) -> tuple[str, str | None, str | None, str]:
    """(base URL, served model or None, key or None, what it is) for a job id or a URL.

    Without ``replica`` the job's first base URL (the router's, when the job has one); with it, that
    replica's own URL (behind a router too, to measure what the router adds)."""
    from ..apikey import read_key
    from ..job import owned_job
    from ..access.ping import normalize_base_url
    from ..jobid import looks_like_job_id

    key = read_key(api_key_file, named_by="--api-key-file", serving=False, owner=os.getuid()) if api_key_file else None
    if not looks_like_job_id(target):  # 1234, a step (1234.0, 1234.batch), 0 and arrays: the job-id parser says
        return normalize_base_url(target), model, key, "url"
    job = owned_job(target.strip(), run_dir=run_dir)
    job.require_live("bench")
    urls = job.reachable_urls if replica is None else job.replica_urls
    if replica is None:
        replica = 0
    elif replica >= len(urls):
        raise EnvLayersError(f"--replica {replica}: job {job.job_id} has {len(urls)} replica URL(s)",
                             hint=f"give --replica 0..{len(urls) - 1}")
    if key is None:
        key = job.client_key()
    return urls[replica], model or job.served, key, f"job {job.job_id}"


@click.command()
@click.argument("target", metavar="JOBID|URL")
@click.option("--concurrency", "concurrency", default="1,4,16", show_default=True, metavar="N,N,...",
              help="Concurrency levels (requests in flight), run in turn.")
@click.option("--requests", "requests", type=click.IntRange(min=1, max=100_000), default=32, show_default=True,
              metavar="N", help="Requests per level.")
@click.option("--duration-s", "duration_s", type=Seconds(zero_ok=False, minimum=1, maximum=3600), default=60.0, show_default=True,
              metavar="S", help="Per level: no request starts after S seconds (1 to 3600).")
@click.option("--timeout-s", "timeout_s", type=Seconds(zero_ok=False, minimum=1, maximum=600), default=60.0, show_default=True,
              metavar="S", help="Per request, from sending it to the end of its stream (1 to 600).")
@click.option("--input-tokens", type=click.IntRange(min=1, max=100_000), default=128, show_default=True, metavar="N",
              help="Prompt length in words (the report shows the tokens the engine counted for them).")
@click.option("--output-tokens", type=click.IntRange(min=1, max=100_000), default=64, show_default=True, metavar="N",
              help="Tokens asked for per request (max_tokens).")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Ask the engine to generate all N output tokens (vLLM and SGLang accept ignore_eos).")
@click.option("--model", default=None, help="The model name to ask for (default: the job's, or the first listed).")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Read the key from FILE (default with a JOBID: the job's key file, when it needs one).")
@click.option("--replica", type=click.IntRange(min=0), default=None, metavar="I",
              help="With a JOBID: load replica I's own URL (0-based) instead of the job's first base URL; "
                   "behind a router (ROUTER=smg) this bypasses it.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", "plot_file", default=None, metavar="FILE.png",
              help="Also write a PNG of latency and throughput against concurrency (needs the bench extra).")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="The job's run directory, when it is not where the job output says.")
@click.pass_context
def bench(ctx: click.Context, target: str, concurrency: str, requests: int, duration_s: float, timeout_s: float,
          input_tokens: int, output_tokens: int, ignore_eos: bool, model: str | None, api_key_file: str | None,
          replica: int, as_json: bool, plot_file: str | None, run_dir: str | None) -> None:
    """Load a live endpoint and report throughput (requests/s, output tokens/s), latency percentiles
    (time to first token, inter-token latency, end-to-end) and errors at each concurrency level.

    \b
    TARGET is a job id (its endpoint, model and key file) or a base URL (e.g. http://127.0.0.1:8001/v1).
    Bounded: at most --requests per level, none started after --duration-s, each cut at --timeout-s.
    Exit 0 when every request succeeded, 1 when the endpoint failed some, 2 when it could not run."""
    from ..access.ping import ping
    from ..bench import load, report
    from .bench_format import format_bench

    levels = parse_levels(concurrency)
    if max(levels) > requests:
        raise EnvLayersError(f"--concurrency {max(levels)} is more than --requests {requests}: that level could never "
                             f"have {max(levels)} requests in flight",
                             hint=f"give --requests {max(levels)} or more (requests per level)")
    if plot_file is not None:
        check_plot_path(plot_file)
    base_url, served, key, what = resolve_target(target, model=model, api_key_file=api_key_file,
                                                 replica=replica, run_dir=run_dir)
    pre = ping(base_url, served, key, min(timeout_s, 30.0))  # the model name, and a fast "nothing answers"
    if not pre.ok:
        bad = next(c for c in pre.checks if not c.ok)
        click.echo(f"env_layers: error: {base_url} is not ready for a load test: {bad.name}: {bad.detail}", err=True)
        ctx.exit(2)  # it could not run, as the help says (1 is for a load the endpoint failed)
    settings = load.Settings(base_url, pre.served_model_name or served or "", key, requests, duration_s, timeout_s,
                             input_tokens, output_tokens, ignore_eos)
    if not as_json:
        click.echo(f"bench: {what}: {len(levels)} level(s) {levels}, up to {requests} requests and "
                   f"{duration_s:g} s each (at most about {len(levels) * (duration_s + timeout_s):.0f} s in all)",
                   err=True)

    def progress(run: load.LevelRun) -> None:
        if not as_json:
            ok = sum(s.ok for s in run.samples)
            click.echo(f"bench: concurrency {run.concurrency}: {ok}/{len(run.samples)} ok in {run.wall_s:.1f} s",
                       err=True)

    runs = load.run(settings, levels, progress)
    data = report.report(settings, runs, {"base_url": base_url, "model": settings.model, "what": what})
    if plot_file is not None:
        report.plot(data, plot_file)
        data["plot"] = plot_file
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(format_bench(data), nl=False)
        if plot_file is not None:
            click.echo(f"plot: {plot_file}")
    ctx.exit(0 if all(lv["errors"] == 0 and lv["ok"] > 0 for lv in data["levels"]) else 1)
