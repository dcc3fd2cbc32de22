"""``wait``, ``status``, ``logs``, ``stop``: operate an endpoint job from its id, on the login node.

Thin click wrappers around ``envlayers.ops`` (imported when a command runs). Exit statuses:
0 done (``wait``: live), 1 the job ended / could not be stopped cleanly, 2 bad input (no such job,
no log yet), 3 ``wait`` ran out of time while the job goes on.
"""

from __future__ import annotations

import json

import click

from ..errors import EnvLayersError

_RUN_DIR_HELP = "The job's run directory, when it is not where the job output says (or the output is gone)."


def _dump(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.command()
@click.argument("job_id")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=None, metavar="S",
              help="Give up after S seconds (exit 3; the job goes on). Default: as long as the job lives.")
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.05), default=1.0, show_default=True, metavar="S",
              help="Seconds between Slurm queries (files are checked at least every 0.25 s).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout.")
@click.option("--progress", type=click.Choice(["auto", "tty", "plain", "none"]), default="auto", show_default=True,
              help="Progress on stderr: one live line (tty), timestamped lines (plain), or none.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
@click.pass_context
def wait(ctx: click.Context, job_id: str, timeout_s: float | None, poll_s: float, as_json: bool, progress: str,
         run_dir: str | None) -> None:
    """Wait until JOB_ID's endpoint is live, the job ends, or --timeout passes.

    \b
    Exit 0 with the endpoint block (or --json) once endpoint.json exists;
    1 when the job ended first (with its last ENVLAYERS-ERROR and a diagnosis);
    3 when --timeout passed (the job goes on); 2 when there is no such job.
    A downstream job can depend on it:  env_layers wait 1234 --timeout 3600 && run-bench
    """
    from .. import ops

    printer = ops.Progress(mode=None if progress == "auto" else progress)
    try:
        result = ops.wait_for(job_id, timeout_s=timeout_s, poll_s=poll_s, progress=printer, run_dir=run_dir)
    finally:
        printer.close()
    if as_json:
        _dump(result.to_dict())
    elif result.outcome == "live":
        click.echo(_block(result), nl=False)
    elif result.outcome == "ended":
        for line in ops.describe_end(result):
            click.echo(line, err=True)
    else:
        for line in ops.describe_timeout(result, timeout_s or 0):
            click.echo(line, err=True)
    ctx.exit(result.exit_code)


def _block(result) -> str:
    from ..readiness import Endpoint

    data = dict(result.endpoint or {})
    try:
        endpoint = Endpoint.from_json(json.dumps(data))
        return endpoint.block()
    except (TypeError, ValueError, KeyError, IndexError):
        if result.report.endpoint_block:
            return result.report.endpoint_block
        return json.dumps(data, indent=2) + "\n"


@click.command()
@click.argument("job_id", required=False)
@click.option("--all", "all_users", is_flag=True, help="Every user's endpoint jobs, not only yours.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--no-probe", is_flag=True, help="With JOB_ID: do not ask the endpoint whether it answers.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
def status(job_id: str | None, all_users: bool, as_json: bool, no_probe: bool, run_dir: str | None) -> None:
    """Without JOB_ID: your endpoint jobs (id, state, nodes, time left, model, endpoint).
    With JOB_ID: the full record (state, reason, nodes, run dir, last startup phase, endpoint, errors)."""
    from .. import ops

    if job_id is None:
        import getpass

        rows = ops.list_rows(None if all_users else getpass.getuser())
        if as_json:
            _dump(rows)
        elif rows:
            click.echo(ops.format_table(rows), nl=False)
        else:
            click.echo("no endpoint jobs (job name serve-only) in the queue" + ("" if all_users else " for you"))
        return
    job = ops.find_job(job_id, run_dir=run_dir)
    record = ops.job_record(job, probe_endpoint=not no_probe)
    if as_json:
        _dump(record)
    else:
        click.echo(ops.format_record(record), nl=False)


def _rank_choice(value: str) -> str | int:
    if value in ("job", "out"):
        return "job"
    try:
        rank = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give a rank number or 'job' (the job output)") from None
    if rank < 0:
        raise click.BadParameter("a rank is 0 or more")
    return rank


@click.command()
@click.argument("job_id")
@click.option("--rank", "rank_text", default="0", show_default=True, metavar="N|job",
              help="Which log: server-N.log of rank N, or 'job' for serve-only-<jobid>.out.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends (Ctrl-C stops).")
@click.option("--tail", "-n", "tail_n", type=click.IntRange(min=0), default=None, metavar="N",
              help="Only the last N lines (with --follow: then the new ones).")
@click.option("--json", "as_json", is_flag=True, help="JSON: one object with the lines (with --follow: one per line).")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
def logs(job_id: str, rank_text: str, follow: bool, tail_n: int | None, as_json: bool, run_dir: str | None) -> None:
    """Print a job's server log (rank 0 by default) or its job output."""
    import time
    from pathlib import Path

    from .. import ops, rundir, slurm

    rank = _rank_choice(rank_text)
    job = ops.find_job(job_id, run_dir=run_dir)
    path = _log_path(job, rank)
    if path is None or not path.is_file():
        if not follow:
            raise _no_log(job, rank, path)
        # --follow on a job that has not written it yet: wait for it while the job lives
        while path is None or not path.is_file():
            info = slurm.job_info(job.job_id, run=slurm.run)
            if info is None or info.finished:
                raise _no_log(job, rank, path)
            job.info = info
            job.files = rundir.locate(job.job_id, info, run_dir=run_dir)
            path = _log_path(job, rank)
            time.sleep(1.0)

    def emit(lines: list[str]) -> None:
        for line in lines:
            if as_json and follow:
                click.echo(json.dumps({"job_id": job.job_id, "rank": rank, "line": line}))
            elif not as_json:
                click.echo(line)

    if tail_n is not None:
        first = rundir.tail_lines(Path(path), tail_n)
        reader = rundir.Tail(Path(path))
        reader.offset = Path(path).stat().st_size
    else:
        reader = rundir.Tail(Path(path))
        first = reader.read().splitlines()
    if as_json and not follow:
        _dump({"job_id": job.job_id, "rank": rank, "path": str(path), "lines": first})
        return
    emit(first)
    if not follow:
        return
    partial = ""
    next_slurm = 0.0
    try:
        while True:
            text = partial + reader.read()
            lines = text.split("\n")
            partial = lines.pop()
            emit(lines)
            now = time.monotonic()
            if now >= next_slurm:
                info = slurm.job_info(job.job_id, run=slurm.run)
                if info is None or info.finished:
                    text = partial + reader.read()
                    emit([ln for ln in text.split("\n") if ln] if text else [])
                    return
                next_slurm = now + 2.0
            time.sleep(0.25)
    except KeyboardInterrupt:
        return


def _log_path(job, rank):
    if rank == "job":
        return job.files.job_out
    return job.files.server_log(rank)


def _no_log(job, rank, path) -> EnvLayersError:
    info = job.info
    if rank == "job":
        what = f"no job output for job {job.job_id} at {path}"
    elif job.files.run_dir is None:
        what = f"no run directory for job {job.job_id} yet"
    else:
        have = sorted(job.files.server_logs())
        what = f"no server-{rank}.log in {job.files.run_dir}" + (f" (ranks with logs: {have})" if have else "")
    if info is not None and info.pending:
        hint = f"the job is PENDING ({info.reason}); logs appear once it runs: `env_layers wait {job.job_id}`"
    elif info is not None and not info.finished:
        hint = f"the launcher writes it as the ranks start; `env_layers logs {job.job_id} --follow` waits for it"
    else:
        hint = f"`env_layers logs {job.job_id} --rank job` shows what the job itself printed"
    return EnvLayersError(what, hint=hint)


@click.command()
@click.argument("job_id")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=60.0, show_default=True, metavar="S",
              help="How long to wait for Slurm to say the job ended.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
@click.pass_context
def stop(ctx: click.Context, job_id: str, timeout_s: float, as_json: bool, run_dir: str | None) -> None:
    """Cancel JOB_ID, wait until Slurm says it ended, and confirm its endpoint no longer answers.

    Exit 0 when stopped and silent; 1 when the job did not end in time or an endpoint still answers."""
    from .. import ops

    result = ops.stop_job(job_id, timeout_s=timeout_s, run_dir=run_dir)
    if as_json:
        _dump(result.to_dict())
        ctx.exit(0 if result.ok else 1)
    jid = result.job_id
    if result.cancelled:
        click.echo(f"job {jid}: scancel sent ({result.state_before})")
    else:
        click.echo(f"job {jid}: already ended ({result.state_before or 'forgotten by Slurm'}); nothing to cancel")
    if not result.ended:
        click.echo(f"job {jid}: still {result.state_after} after {ops.fmt_duration(result.waited_s)}", err=True)
        click.echo(f"  Slurm has not ended it yet; check `squeue -j {jid}` and run `env_layers stop {jid}` again",
                   err=True)
        ctx.exit(1)
    if result.cancelled:
        click.echo(f"job {jid}: ended ({result.state_after or 'gone from Slurm'}) after "
                   f"{ops.fmt_duration(result.waited_s)}")
    for p in result.probes:
        word = "STILL ANSWERS" if p["answers"] else "no longer answers"
        click.echo(f"endpoint {p['url']}: {word} ({p['detail']})", err=p["answers"])
    if not result.probes:
        click.echo("endpoint: none recorded (the job never went live)")
    if result.still_answers:
        click.echo("  a server outlived its job: find it on the node (`ps -ef | grep serve`) and tell the admins",
                   err=True)
        ctx.exit(1)
    click.echo(f"job {jid}: stopped")
