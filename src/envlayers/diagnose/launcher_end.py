"""The finding of a launcher that died without reporting, from how a run directory says it ended
(``rundir.JobFiles.launcher_ended``, the one reading of it): no ``launch-end.json`` record, and no word of it.

On every orderly end the launcher writes ``launch-end.json`` (``{"restart", "code", "reason",
"ended_at"}``) into the run directory ``$RUN_ROOT/<jobid>/``. A job that Slurm reports as ended whose
run directory has no such record lost its launcher without a word: killed by SIGKILL, the node's OOM
killer or a node failure. :func:`launcher_end_finding` turns that into a finding that quotes what
Slurm reported (state and exit code).

After a requeue, the earlier runs of a job sit in ``run-<n>/`` folders of the run directory and the
current run's files stay at the top: only the top level is the current run (:func:`current_run_files`),
``rundir.earlier_run_dirs`` lists the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..rundir import LAUNCH_END, JobFiles, job_output_path
from .evidence import Finding

RULE_ID = "launcher-died"


def current_run_files(run_dir: Path, patterns: Iterable[str]) -> list[Path]:
    """The current run's files matching ``patterns`` (globs): the top level only, never ``run-<n>/``."""
    return sorted({p for pattern in patterns for p in Path(run_dir).glob(pattern) if p.is_file()})


def _exit_text(exit_code: str | None) -> str:
    """Slurm's ``code:signal`` in words: ``0:9`` -> ``0:9 (killed by signal 9)``."""
    if not exit_code:
        return "not reported"
    code, _, signal = exit_code.partition(":")
    if signal.isdigit() and int(signal):
        return f"{exit_code} (killed by signal {signal})"
    if code.isdigit():
        return f"{exit_code} (exit status {code})"
    return exit_code


def launcher_end_finding(run_dir: Path | None, info: Any, job_id: str) -> Finding | None:
    """A finding when the job has ended (by Slurm's record ``info``, a ``slurm.JobInfo``) and its launcher did
    not report its end (``rundir.JobFiles.launcher_ended``: no ``launch-end.json``, and no line in the job
    output saying it could not write one); ``None`` when it did, when the job has not ended, or when Slurm's
    record or the run directory is not available (nothing can be said)."""
    if info is None or not getattr(info, "finished", False) or run_dir is None or not Path(run_dir).is_dir():
        return None
    files = JobFiles(str(job_id), job_output_path(str(job_id), info, Path.cwd()), Path(run_dir))
    if files.launcher_ended()[0] not in ("died", "never started"):
        return None
    state = info.state or "unknown"
    slurm_said = f"Slurm: State={state}, ExitCode={_exit_text(info.exit_code)}"
    if getattr(info, "reason", None):
        slurm_said += f", Reason={info.reason}"
    return Finding(
        rule_id=RULE_ID,
        title="The launcher died without reporting",
        severity="error",
        status="open",
        cause=("The job ended, but its launcher never wrote launch-end.json, which it writes on every orderly "
               "end: it was killed (SIGKILL, the node's out-of-memory killer, or a node failure) before it could "
               "say why."),
        fix=(f"Read what Slurm recorded (`sacct -j {job_id} --format=JobID,State,ExitCode,MaxRSS,NodeList`). "
             "OUT_OF_MEMORY or signal 9 on the batch step: the node ran out of host memory (lower "
             "MEM_FRACTION_STATIC, or check --mem=0); NODE_FAIL: resubmit; CANCELLED: someone ran scancel."),
        see="docs/operating.md#the-lifecycle",
        evidence=(),
        detail=f"no {LAUNCH_END} in {run_dir}; {slurm_said}",
    )
