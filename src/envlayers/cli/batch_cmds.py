"""``batch``: run an OpenAI Batch input file through a live endpoint (thin wrapper around ``envlayers.batch``).

Exit statuses: 0 every request answered, 1 some failed for good (they are in the errors file; a rerun
retries them) or the run was interrupted, 2 bad input or no endpoint (docs/operating.md, "Batch").
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import click

from ..errors import EnvLayersError
from .params import Seconds


def job_resolver(job_id: str, run_dir: str | None, key: str | None):
    """``resolve()`` for a job: its newest live successor's URLs and key when it handed over, else its own
    (the live replicas, or the router in front of them); an error when nothing of the chain serves."""
    from ..job import serving_job

    def resolve() -> tuple[list[str], str | None]:
        job, _moved = serving_job(job_id, run_dir=run_dir)
        job.require_live("run a batch against")
        return job.reachable_urls, key if key is not None else job.client_key()

    return resolve


def gpus_of(folder: Path | None) -> int | None:
    """The GPUs the job of run directory ``folder`` holds, from its accounting record (the plan's nodes x GPUs
    per node); None for a URL (no folder) or a job without the record."""
    from .. import rundir

    data = rundir.read_json(folder / rundir.ACCOUNTING) if folder is not None else None
    gpus = data.get("gpus") if isinstance(data, dict) else None
    return gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else None


class Progress:
    """A bar with rate and ETA on a terminal (tqdm), else a plain line every 10 s and at the end."""

    def __init__(self, total: int, skipped: int, quiet: bool):
        self.total, self.skipped, self.quiet = total, skipped, quiet
        self.bar = None
        self.last_line = 0.0
        self.t0 = time.monotonic()
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=skipped, unit="req", dynamic_ncols=True, file=sys.stderr,
                            desc="batch")
        self.shown = 0
        self.lock = threading.Lock()  # the workers report from their threads

    def __call__(self, tally) -> None:
        if self.quiet:
            return
        with self.lock:
            self._show(tally)

    def _show(self, tally) -> None:
        done = tally.done
        if self.bar is not None:
            self.bar.update(done - self.shown)
            self.bar.set_postfix(failed=sum(tally.failed.values()), refresh=False)
            self.shown = done
            return
        now = time.monotonic()
        if now - self.last_line >= 10 or self.skipped + done == self.total:
            self.last_line = now
            rate = done / max(1e-9, now - self.t0)
            left = self.total - self.skipped - done
            eta = f", ETA {left / rate:.0f}s" if rate > 0 and left else ""
            click.echo(f"batch: {self.skipped + done}/{self.total} done ({sum(tally.failed.values())} failed), "
                       f"{rate:.2f} req/s{eta}", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def summary(tally, gpus: int | None, output: Path, errors: Path) -> dict:
    failed = sum(tally.failed.values())
    return {
        "total": tally.total, "skipped": tally.skipped, "answered": tally.answered, "failed": failed,
        "failed_by_kind": dict(tally.failed), "retries_by_kind": dict(tally.retries),
        "left": tally.total - tally.skipped - tally.answered - failed,
        "prompt_tokens": tally.prompt_tokens, "completion_tokens": tally.completion_tokens,
        "wall_s": round(tally.wall_s, 3),
        "requests_per_s": round(tally.done / tally.wall_s, 3) if tally.wall_s > 0 else None,
        "gpus": gpus, "gpu_hours": round(gpus * tally.wall_s / 3600, 4) if gpus else None,
        "endpoints": tally.endpoints, "output": str(output), "errors": str(errors),
        "interrupted": tally.interrupted,
    }


def format_summary(s: dict) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["failed_by_kind"].items())) or "none"
    retries = ", ".join(f"{k} {v}" for k, v in sorted(s["retries_by_kind"].items())) or "none"
    gpu = (f"{s['gpu_hours']:.4f} GPU-hours ({s['gpus']} GPUs for {s['wall_s']:.0f}s)" if s["gpu_hours"] is not None
           else "GPU-hours not known (a URL, or a job without its accounting record)")
    lines = [
        f"batch: {s['answered']} answered, {s['failed']} failed, {s['skipped']} answered before (of {s['total']})"
        + (f", {s['left']} left (interrupted)" if s["interrupted"] else ""),
        f"  tokens: {s['prompt_tokens']} prompt, {s['completion_tokens']} completion",
        f"  failed by kind: {kinds}; retries: {retries}",
        f"  {s['wall_s']:.1f}s, {s['requests_per_s'] or 0:.2f} req/s; {gpu}",
        f"  endpoint(s): {', '.join(s['endpoints'])}",
        f"  answers: {s['output']}" + (f"; failures: {s['errors']} (a rerun retries them)" if s["failed"] else ""),
    ]
    return "\n".join(lines)


@click.command()
@click.argument("target", metavar="JOBID|URL")
@click.argument("input_file", metavar="INPUT.jsonl", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False), metavar="OUTPUT.jsonl",
              help="The answers, one line each (OpenAI's batch output format); a rerun skips what it holds.")
@click.option("--errors", "errors", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="The requests that failed for good (default: OUTPUT.errors.jsonl), rewritten each run.")
@click.option("--concurrency", type=click.IntRange(min=1, max=512), default=8, show_default=True, metavar="N",
              help="Requests in flight at once.")
@click.option("--retries", type=click.IntRange(min=0, max=100), default=6, show_default=True, metavar="N",
              help="Retries of a request after HTTP 429, a 5xx, a timeout or a broken connection (backoff 1s, doubling to 30s).")
@click.option("--timeout-s", "timeout_s", type=Seconds(zero_ok=False, minimum=1, maximum=3600), default=600.0,
              show_default=True, metavar="S", help="Per attempt: how long the endpoint may stay silent.")
@click.option("--model", default=None, help="body.model for lines without one (default: the job's served name).")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Read the key from FILE (default with a JOBID: the job's key file, when it needs one).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (no progress lines).")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="The job's run directory, when it is not where the job output says.")
def batch(target: str, input_file: str, output: str, errors: str | None, concurrency: int, retries: int,
          timeout_s: float, model: str | None, api_key_file: str | None, as_json: bool, run_dir: str | None) -> None:
    """Run INPUT.jsonl (the OpenAI Batch format: custom_id, method, url, body; chat and completions) through
    a live endpoint and write each answer to OUTPUT.jsonl once.

    TARGET is a job id (its endpoint, model and key; the batch follows it to its surviving replicas and to
    its successor when it hands over) or a base URL. A rerun with the same OUTPUT skips the custom_ids it
    holds. Exit 0 when every request is answered, 1 when some failed for good (in the errors file) or the
    run was interrupted, 2 on bad input or no endpoint.

    \b
      env_layers batch 1234 prompts.jsonl -o answers.jsonl"""
    from ..apikey import read_key
    from ..access.ping import normalize_base_url
    from ..batch.records import Output, errors_path_for, read_input
    from ..batch.run import Endpoint, Settings, run
    from ..jobid import looks_like_job_id

    out_path = Path(output)
    err_path = Path(errors) if errors else errors_path_for(out_path)
    if out_path.resolve() == err_path.resolve() or out_path.resolve() == Path(input_file).resolve():
        raise EnvLayersError("the output, the errors file and the input must be three files", where="--output",
                             hint="give another -o or --errors")
    key = read_key(api_key_file, named_by="--api-key-file", serving=False, owner=os.getuid()) if api_key_file else None
    job_id = None
    if looks_like_job_id(target):
        job_id = target.strip()
        resolve = job_resolver(job_id, run_dir, key)
    else:
        url = normalize_base_url(target)

        def resolve() -> tuple[list[str], str | None]:
            return [url], key
    endpoint = Endpoint(resolve)
    served, folder = model, None
    if job_id is not None:
        from ..job import owned_job

        job = owned_job(job_id, run_dir=run_dir)  # the job named: its served name and its GPUs
        served, folder = served or job.served, job.run_dir
    requests = read_input(Path(input_file), served)
    out = Output(out_path, err_path)
    show = Progress(len(requests), sum(r.custom_id in out.answered for r in requests), quiet=as_json)
    try:
        tally = run(requests, out, endpoint, Settings(concurrency=concurrency, retries=retries, timeout_s=timeout_s),
                    progress=show)
    finally:
        show.close()
        out.close()
    s = summary(tally, gpus_of(folder), out_path, err_path)
    click.echo(json.dumps(s, indent=1) if as_json else format_summary(s))
    if s["failed"] or s["interrupted"]:
        sys.exit(1)
