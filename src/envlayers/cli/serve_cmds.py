"""serve (dry run or submit), plan, and launch (inside the job)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from . import get_root, site_option
from ..defaults import DEFAULT_EXPERIMENT, DEFAULT_MODEL, DEFAULT_TIME
from ..errors import EnvLayersError


def _prepare(ctx, model, experiment, time, base_env, env_file, site):
    from ..jobscript import prepare

    root = Path(get_root(ctx))
    return prepare(root, model, experiment, time=time, base_env=Path(base_env) if base_env else None,
                   env_file=Path(env_file) if env_file else None, environ=dict(os.environ), site=site or None)


_common = [
    click.option("--model", envvar="MODEL", default=DEFAULT_MODEL, show_default=True, help="Catalog model (env: MODEL)."),
    click.option("--experiment", envvar="EXPERIMENT", default=DEFAULT_EXPERIMENT, show_default=True,
                 help="Catalog experiment (env: EXPERIMENT), e.g. replicas."),
    click.option("--time", "time_", envvar="SERVE_TIME", default=DEFAULT_TIME, show_default=True,
                 help="Time limit (env: SERVE_TIME); overrides SBATCH_TIMELIMIT."),
    click.option("--base-env", envvar="SERVE_BASE_ENV", type=click.Path(dir_okay=False),
                 help="Env file used instead of the render of EXPERIMENT:MODEL (env: SERVE_BASE_ENV)."),
    click.option("--env-file", envvar="SERVE_ENV_FILE", type=click.Path(dir_okay=False),
                 help="Your copy of experiments/serve-only.env, sourced last so it wins (env: SERVE_ENV_FILE)."),
    site_option,
]


def common(f):
    for option in reversed(_common):
        f = option(f)
    return f


@click.command()
@common
@click.option("--dry-run", is_flag=True, help="Print the sbatch command and the exact job script; submit nothing.")
@click.option("--wait", "wait_", is_flag=True, envvar="WAIT", help="After submitting, wait until the endpoint is live.")
@click.option("--verify", "verify_", is_flag=True, envvar="VERIFY",
              help="Once live, run `env_layers verify JOBID` and print its verdict under the endpoint block; "
                   "the exit status is verify's (implies --wait; env: VERIFY).")
@click.option("--in-allocation", is_flag=True,
              help="Inside a batch job (`sbatch cluster/serve-only.sbatch`): run the job script as this job if the "
                   "allocation fits the plan, else end with one line naming the command that works.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def serve(ctx, model, experiment, time_, base_env, env_file, site, dry_run, wait_, verify_, in_allocation, as_json):
    """Submit a serve-only endpoint job (cluster/serve-only.sbatch calls this).

    Everything that can fail is checked here, on the login node, before anything is
    submitted: the layers, the topology (no idle or missing GPUs), the engine keys, the EDF.
    """
    job = _prepare(ctx, model, experiment, time_, base_env, env_file, site)
    if in_allocation:
        from .inalloc_cmds import run_here

        run_here(job, dict(os.environ), dry_run=dry_run)
        return
    if dry_run:
        if as_json:
            click.echo(json.dumps(job.to_json(), indent=2))
        else:
            click.echo(job.dry_run_text(), nl=False)
        return
    if job.blockers:
        raise EnvLayersError(job.blockers[0], where=job.target, hint="SUBMIT=0 shows the job without submitting")
    from .. import slurm
    from ..jobscript import check_partition_time

    check_partition_time(job, os.environ, run=slurm.run)  # the partition's MaxTime, which only Slurm knows
    for w in job.warnings:
        click.echo(f"warning: {w}", err=True)
    job_id = slurm.submit(job.sbatch_args, job.script)
    out = Path.cwd() / f"serve-only-{job_id}.out"
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "target": job.target, "output": str(out)}))
    else:
        click.echo(f"submitted job {job_id}: {job.target}, {job.plan.nodes} node(s), {job.plan.shape}")
        click.echo(f"output: {out}")
        click.echo(f"follow: env_layers wait {job_id}    stop: env_layers stop {job_id}")
    if wait_ or verify_:
        code = _exit_code_of(ctx, "wait", job_id=job_id)
        if code == 0 and verify_:
            code = _exit_code_of(ctx, "verify", spec=job_id)  # its report follows the endpoint block
        ctx.exit(code)


def _exit_code_of(ctx, name: str, **params) -> int:
    """Run another command of the group with ``params`` (defaults for the rest); its exit status."""
    try:
        ctx.invoke(ctx.find_root().command.get_command(ctx, name), **params)
    except click.exceptions.Exit as done:
        return done.exit_code
    return 0


@click.command()
@click.argument("target", required=False)
@common
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def plan(ctx, target, model, experiment, time_, base_env, env_file, site, as_json):
    """Show the deployment plan of TARGET (EXPERIMENT:MODEL, or --model/--experiment): the shape and
    why it was chosen, ranks, per-rank server commands. docs/topology.md says when each shape is chosen."""
    if target is not None:
        experiment, sep, model = target.partition(":")
        if not sep or not experiment or not model:
            raise EnvLayersError(f"'{target}' is not EXPERIMENT:MODEL", where="TARGET",
                                 hint="e.g. env_layers plan experiment:qwen38, or --model qwen38")
    job = _prepare(ctx, model, experiment, time_, base_env, env_file, site)
    if as_json:
        data = job.to_json()
        data.pop("script")
        click.echo(json.dumps(data, indent=2))
        return
    for line in job.reasons + job.topology:
        click.echo(line)
    if job.site:
        click.echo(f"site: {job.site}")
    click.echo(f"EDF: {job.edf or '(none: CONTAINER_RUNTIME is not ce)'}")
    click.echo(f"readiness budget: {job.ready_timeout_s}s")
    for i, line in enumerate(job.rank_lines):
        click.echo(f"rank {i}: {line}")
    for w in job.warnings + job.blockers:
        click.echo(f"warning: {w}")


@click.command(hidden=True)
@click.option("--run-dir", required=True, type=click.Path(file_okay=False))
def launch(run_dir):
    """Inside the job: start the ranks, wait for readiness, report, fail fast."""
    from ..launch.launcher import main

    sys.exit(main(Path(run_dir)))
