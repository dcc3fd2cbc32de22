"""``sbatch cluster/serve-only.sbatch``: run the serve-only job inside the allocation it was given.

The wrapper is named like a batch script, so operators submit it with sbatch. Inside that job it calls
``env_layers serve --in-allocation``, which lands here: the job script ``serve`` would submit (rendered by
``jobscript.prepare``) runs as this job when the allocation fits the plan (:mod:`envlayers.allocation`:
nodes, GPUs per node, partition); when it does not, the job ends at once with one line that names the
command that works.
"""

from __future__ import annotations

import os
import sys

import click

from ..errors import EnvLayersError

BASH = "/bin/bash"


def _partition(job) -> str | None:
    for arg in job.sbatch_args:
        if arg.startswith("--partition="):
            return arg.split("=", 1)[1] or None
    return None


def run_here(job, environ: dict[str, str], *, dry_run: bool = False) -> None:
    """Run ``job``'s script as the batch job this process is in (``exec``: does not return), or end
    with one line and exit 2 when the allocation does not fit; ``dry_run`` prints the script instead."""
    from .. import allocation

    alloc = allocation.from_environ(environ)
    if alloc is None:
        raise EnvLayersError("not inside a Slurm job (SLURM_JOB_ID is not set)", where="SLURM_JOB_ID",
                             hint=f"run {allocation.WRAPPER} directly: it submits the job itself")
    nodes, gpus, partition = job.plan.nodes, job.plan.gpus_per_node, _partition(job)
    problems = allocation.misfits(alloc, nodes, gpus, partition)
    if problems:
        click.echo(allocation.wrong_way_line(job.target, alloc, problems, nodes, gpus, partition, environ), err=True)
        sys.exit(2)
    if job.blockers:
        raise EnvLayersError(job.blockers[0], where=job.target, hint="SUBMIT=0 shows the job without running it")
    for w in job.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(f"serve-only.sbatch: running {job.target} as job {alloc.job_id} itself (the allocation fits: "
               f"{alloc.describe()})")
    if dry_run:
        click.echo(job.script, nl=False)
        return
    path = _write_script(job.script, alloc.job_id, environ)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(BASH, [BASH, path])  # $0 is the script: the job copies itself into its run directory


def _write_script(script: str, job_id: str, environ: dict[str, str]) -> str:
    """The job script in a private file of the node's temporary folder (it copies itself to job.sh)."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f"serve-only-{job_id}-", suffix=".sh",
                                dir=environ.get("TMPDIR") or None)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(script)
    return path
