"""From a job id to a ``TrackedJob``: Slurm's record and the files of the run Slurm runs now.

A requeued job's run directory may still hold the previous run's files at its top (until the new run
starts and moves them into ``run-<n>/``); ``current_files`` hides them, so no operation shows an old
run's ranks, exits or endpoint as current.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Mapping

from .. import rundir, slurm
from ..jobid import not_found, parse_job_id

EXIT_LIVE = 0
EXIT_ENDED = 1  # the job ended (or was never going to be live)
EXIT_TIMEOUT = 3  # the wait budget ran out; the job goes on



def check_job_id(job_id: str) -> str:
    """The job id every command takes, read by the one parser (``envlayers.jobid``)."""
    return parse_job_id(job_id)


@dataclass
class TrackedJob:
    """A job as the operator commands see it: Slurm's record (``None`` once Slurm forgot it) and the
    current run's files (``files.previous_at_top`` when the top-level files are an earlier run's)."""

    job_id: str
    info: slurm.JobInfo | None
    files: rundir.JobFiles

    @property
    def state(self) -> str | None:
        return self.info.state if self.info else None

    @property
    def restart(self) -> int:
        """Which run Slurm runs now: 0 for the first, N after N requeues (0 when Slurm did not say)."""
        return (self.info.restarts or 0) if self.info else 0

    @property
    def requeued(self) -> bool:
        """Slurm requeued the job and the run it will start (or started) has not written its files yet."""
        return self.files.previous_at_top and self.restart > 0

    def update(self, info: slurm.JobInfo | None, files: rundir.JobFiles | None = None) -> None:
        """A new Slurm record (and files): which run is current is decided again."""
        self.info = info
        self.files = current_files(files or self.files, info)


def waiting_to_start(info: slurm.JobInfo | None) -> bool:
    """Pending, or on its way back to pending (Slurm's ``REQUEUED``, ``REQUEUE_HOLD``, ``REQUEUE_FED``)."""
    return info is not None and (info.pending or (info.state or "").startswith("REQUEUE"))


def current_files(files: rundir.JobFiles, info: slurm.JobInfo | None) -> rundir.JobFiles:
    """``files`` with ``previous_at_top`` set from Slurm's record and the top-level launch.json."""
    if info is None:
        stale = False  # Slurm forgot the job: the files are all there is
    else:
        stale = rundir.top_is_previous(files.recorded_restart(), info.restarts, waiting_to_start(info))
    if stale == files.previous_at_top:
        return files
    return rundir.JobFiles(files.job_id, files.job_out, files.run_dir, previous_at_top=stale)


def find_job(job_id: str, *, run_dir: str | None = None, environ: Mapping[str, str] | None = None,
             cwd: Path | None = None) -> TrackedJob:
    """Slurm's record and the files of ``job_id``; an ``EnvLayersError`` when neither exists."""
    job_id = check_job_id(job_id)
    info = slurm.job_info(job_id, run=slurm.run)
    files = rundir.locate(job_id, info, environ=environ, cwd=cwd, run_dir=run_dir)
    if info is None and not (files.job_out and files.job_out.is_file()) and files.run_dir is None:
        raise not_found(job_id)
    return TrackedJob(job_id, info, current_files(files, info))


def since(iso: str | None, now: datetime | None = None) -> float | None:
    """Seconds since a Slurm timestamp (local time, ``2026-12-02T09:52:00``), ``None`` if unknown or future."""
    if not iso:
        return None
    try:
        then = datetime.fromisoformat(iso)
    except ValueError:
        return None
    delta = ((now or datetime.now()) - then).total_seconds()
    return delta if delta >= 0 else None
