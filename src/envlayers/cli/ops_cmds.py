"""``wait``, ``status``, ``logs``, ``stop``: operate an endpoint job from its id, on the login node.

Thin click wrappers: ``envlayers.ops`` does the work and returns records (imported when a command runs),
``cli.ops_format`` turns them into lines. Exit statuses: 0 done (``wait``: live), 1 the job ended /
could not be stopped cleanly, 2 bad input (no such job, no log yet, a number that is not one),
3 ``wait`` ran out of time while the job goes on, 75 Slurm did not answer (never called bad input).
"""

from __future__ import annotations

import json

import click

from ..errors import EnvLayersError
from .params import Count, Seconds

_RUN_DIR_HELP = "The job's run directory, when it is not where the job output says (or the output is gone)."
MAX_POLL_S = 600.0


_TIMEOUT_HINT = "leave --timeout-s out to wait as long as the job lives"
OUTAGE_ENV = "ENVLAYERS_SLURM_OUTAGE_S"  # = envlayers.job.OUTAGE_ENV (a test holds them equal)
_OUTAGE_HELP = ("How long Slurm may go without answering (slurmctld stopped or restarting) before giving up "
                "with exit 75; 0: not at all. Default 300.")


def _outage_default() -> str:
    """The environment's ENVLAYERS_SLURM_OUTAGE_S, else the default window; a callable, so that it holds also
    when another command invokes this one (``serve --wait``), where click reads no environment variable."""
    import os

    from ..job import SLURM_OUTAGE_S

    return os.environ.get(OUTAGE_ENV) or f"{SLURM_OUTAGE_S:g}"


def _outage_option(f):
    return click.option("--slurm-outage", "outage_s", type=Seconds(zero_ok=True, hint="e.g. --slurm-outage 600"),
                        default=_outage_default, show_envvar=True, envvar=OUTAGE_ENV, metavar="S",
                        help=_OUTAGE_HELP)(f)


def _dump(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option("--timeout-s", "--timeout", "timeout_s", type=Seconds(zero_ok=True, hint=_TIMEOUT_HINT), default=None, metavar="S",
              help="Give up after S seconds (exit 3; the job goes on). Default: as long as the job lives.")
@click.option("--poll", "poll_s", type=Seconds(zero_ok=False, maximum=MAX_POLL_S), default=1.0, show_default=True,
              metavar="S", help="Seconds between Slurm queries (files are checked at least every 0.25 s).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout.")
@click.option("--progress", type=click.Choice(["auto", "tty", "plain", "none"]), default="auto", show_default=True,
              help="Progress on stderr: one live line (tty), timestamped lines (plain), or none.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
@_outage_option
@click.pass_context
def wait(ctx: click.Context, job_id: str, timeout_s: float | None, poll_s: float, as_json: bool, progress: str,
         run_dir: str | None, outage_s: float) -> None:
    """Wait until JOBID's endpoint is live, the job ends, or --timeout-s passes.

    \b
    Exit 0 with the endpoint block (or --json) once endpoint.json exists;
    1 when the job ended first (with its last ENVLAYERS-ERROR and a diagnosis);
    3 when --timeout-s passed (the job goes on); 2 when there is no such job;
    75 when Slurm did not answer for --slurm-outage seconds (the job goes on).
    A downstream job can depend on it:  env_layers wait 1234 --timeout-s 3600 && run-bench
    """
    from .. import ops
    from . import ops_format as fmt

    printer = fmt.Progress(mode=None if progress == "auto" else progress)
    try:
        result = ops.wait_for(job_id, timeout_s=timeout_s, poll_s=poll_s, on_event=printer, run_dir=run_dir,
                              outage_s=outage_s)
    finally:
        printer.close()
    if as_json:
        _dump(result.to_dict())
    elif result.outcome == "live":
        click.echo(fmt.endpoint_block(result), nl=False)
    elif result.outcome == "ended":
        for line in fmt.describe_end(result):
            click.echo(line, err=True)
    else:
        for line in fmt.describe_timeout(result, timeout_s or 0):
            click.echo(line, err=True)
    ctx.exit(result.exit_code)


@click.command()
@click.argument("job_id", metavar="JOBID", required=False)
@click.option("--all", "all_users", is_flag=True, help="Every user's endpoint jobs, not only yours.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--no-probe", is_flag=True, help="With JOBID: do not ask the endpoint whether it answers.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
@_outage_option
def status(job_id: str | None, all_users: bool, as_json: bool, no_probe: bool, run_dir: str | None,
           outage_s: float) -> None:
    """Without JOBID: your endpoint jobs (id, state, nodes, time left, target, model id, served name,
    phase, URL). With JOBID: the full record (state, reason, nodes, target, model id, served name, run
    dir, how the launcher ended, the furthest startup phase of every rank, URLs, errors, earlier runs).

    JOBID: 1234, or a step of it (1234.0, 1234.batch). Exit 0 with the list or the record; 2 when there is
    no such job; 75 when Slurm did not answer for --slurm-outage seconds."""
    from .. import ops
    from ..job import find_job
    from . import ops_format as fmt

    patience = {"outage_s": outage_s,
                "on_silent": lambda text: click.echo(fmt.slurm_silent_line(text, outage_s), err=True)}
    if job_id is None:
        import getpass

        rows = ops.list_rows(None if all_users else getpass.getuser(), **patience)
        if as_json:
            _dump(rows)
        elif rows:
            click.echo(fmt.format_table(rows), nl=False)
        else:
            click.echo("no endpoint jobs (job name serve-only) in the queue" + ("" if all_users else " for you"))
        return
    job = find_job(job_id, run_dir=run_dir, **patience)
    record = ops.job_record(job, probe_endpoint=not no_probe)
    if as_json:
        _dump(record)
    else:
        click.echo(fmt.format_record(record), nl=False)


def _rank_choice(value: str) -> str | int:
    if value in ("job", "out"):
        return "job"
    try:
        rank = int(value)
    except ValueError:
        raise EnvLayersError(f"{value!r} is not a rank: give a rank number or 'job' (the job output)",
                             where="--rank", hint="e.g. --rank 0 (the API rank) or --rank job") from None
    if rank < 0:
        raise EnvLayersError(f"{value!r} is not a rank: a rank is 0 or more", where="--rank",
                             hint="e.g. --rank 0 (the API rank) or --rank job")
    return rank


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option("--rank", "rank_text", default="0", show_default=True, metavar="N|job",
              help="Which log: server-N.log of rank N, or 'job' for serve-only-<jobid>.out.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends (Ctrl-C stops).")
@click.option("--tail", "-n", "tail_n", type=Count(), default=None, metavar="N",
              help="Only the last N lines (with --follow: then the new ones).")
@click.option("--json", "as_json", is_flag=True, help="JSON: one object with the lines (with --follow: one per line).")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
def logs(job_id: str, rank_text: str, follow: bool, tail_n: int | None, as_json: bool, run_dir: str | None) -> None:
    """Print a job's server log (rank 0 of the current run by default) or its job output.

    Exit 0 with the log; 2 when there is no such job or no such log (bad input)."""
    from ..job import find_job
    from ..ops import logs as oplogs

    rank = _rank_choice(rank_text)
    job = find_job(job_id, run_dir=run_dir)
    path = oplogs.log_path(job, rank)
    if path is None or not path.is_file():
        if not follow:
            raise oplogs.no_log_error(job, rank, path)
        path = oplogs.wait_for_log(job, rank, run_dir=run_dir)  # --follow: wait for it while the job lives
    log = oplogs.read_log(path, tail_n)
    if as_json and not follow:
        _dump({"job_id": job.job_id, "rank": rank, "path": str(path), "lines": log.lines})
        return

    def emit(line: str) -> None:
        click.echo(json.dumps({"job_id": job.job_id, "rank": rank, "line": line}) if as_json else line)

    for line in log.lines:
        emit(line)
    if not follow:
        return
    try:
        for line in oplogs.follow(job, log):
            emit(line)
    except KeyboardInterrupt:
        return


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option("--timeout-s", "--timeout", "timeout_s", type=Seconds(zero_ok=True), default=60.0, show_default=True, metavar="S",
              help="How long to wait for Slurm to say the job ended.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
@click.pass_context
def stop(ctx: click.Context, job_id: str, timeout_s: float, as_json: bool, run_dir: str | None) -> None:
    """Cancel JOBID, wait until Slurm says it ended, and confirm its endpoint no longer answers.

    Exit 0 when stopped and silent; 1 when the job did not end in time or an endpoint still answers; 2 when
    there is no such job or it is not yours."""
    from .. import ops
    from . import ops_format as fmt

    result = ops.stop_job(job_id, timeout_s=timeout_s, run_dir=run_dir)
    if as_json:
        _dump(result.to_dict())
    else:
        for text, to_err in fmt.describe_stop(result):
            click.echo(text, err=to_err)
    ctx.exit(0 if result.ok else 1)
