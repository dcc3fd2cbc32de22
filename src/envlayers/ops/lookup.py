"""From a job id to a ``TrackedJob``: Slurm's record and the files of the run Slurm runs now, asked
patiently when the caller allows it (a controller that does not answer is retried for ``outage_s``).

A requeued job's run directory may still hold the previous run's files at its top (until the new run
starts and moves them into ``run-<n>/``); ``current_files`` hides them, so no operation shows an old
run's ranks, exits or endpoint as current.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping, TypeVar

from .. import rundir, slurm
from ..durations import parse_time
from ..errors import SlurmUnreachable
from ..jobid import not_found, parse_job_id

EXIT_LIVE = 0
EXIT_ENDED = 1  # the job ended (or was never going to be live)
EXIT_TIMEOUT = 3  # the wait budget ran out; the job goes on
SLURM_OUTAGE_S = 300.0  # how long `wait` and `status` retry a controller that does not answer
OUTAGE_ENV = "ENVLAYERS_SLURM_OUTAGE_S"  # the environment's say on it (docs/operating.md)
OUTAGE_RETRY_S = 1.0  # pause between two asks while Slurm does not answer (each ask itself takes its time)

_T = TypeVar("_T")


@dataclass
class Clock:
    """Time as the operations see it; tests pass a fake whose ``sleep`` advances ``monotonic``."""

    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def outage_error(err: SlurmUnreachable, silent_s: float) -> SlurmUnreachable:
    """The error that ends a command after Slurm did not answer for ``silent_s`` seconds."""
    return SlurmUnreachable(
        f"Slurm did not answer for {silent_s:.0f}s, giving up: {err.message}",
        hint=f"`scontrol ping` says whether slurmctld is up; the job itself runs on without it: ask again once "
             f"it answers (--slurm-outage S or {OUTAGE_ENV} sets how long to keep trying)")


def patiently(ask: Callable[[], _T], *, outage_s: float, clock: Clock | None = None,
              on_silent: Callable[[str], None] | None = None, retry_s: float = OUTAGE_RETRY_S) -> _T:
    """``ask()``, asked again while Slurm does not answer (``SlurmUnreachable``), until it answers or it
    has been silent for ``outage_s`` seconds. ``on_silent(why)`` is called once, at the first silence.
    With ``outage_s`` 0 the first silence is the error as it is. Any other error ends it at once."""
    clock = clock or Clock()
    start = clock.monotonic()
    said = False
    while True:
        try:
            return ask()
        except SlurmUnreachable as err:
            if outage_s <= 0:
                raise
            silent_s = clock.monotonic() - start
            if silent_s >= outage_s:
                raise outage_error(err, silent_s) from None
            if not said and on_silent is not None:
                on_silent(err.message)
                said = True
            clock.sleep(min(retry_s, outage_s - silent_s))



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
             cwd: Path | None = None, outage_s: float = 0.0, clock: Clock | None = None,
             on_silent: Callable[[str], None] | None = None) -> TrackedJob:
    """Slurm's record and the files of ``job_id``; an ``EnvLayersError`` when neither exists.

    A controller that does not answer is asked again for ``outage_s`` seconds (``patiently``); with the
    default 0 it is a ``SlurmUnreachable`` at once (exit 75, never "no such job" or bad input)."""
    job_id = check_job_id(job_id)
    info = patiently(lambda: slurm.job_info(job_id, run=slurm.run), outage_s=outage_s, clock=clock,
                     on_silent=on_silent)
    files = rundir.locate(job_id, info, environ=environ, cwd=cwd, run_dir=run_dir)
    if info is None and not (files.job_out and files.job_out.is_file()) and files.run_dir is None:
        raise not_found(job_id)
    return TrackedJob(job_id, info, current_files(files, info))


def since(iso: str | None, now: datetime | None = None) -> float | None:
    """Seconds since a Slurm timestamp (local time, ``2026-12-02T09:52:00``), ``None`` if unknown or future."""
    then = parse_time(iso)
    if then is None:
        return None
    delta = (now or datetime.now()).timestamp() - then
    return delta if delta >= 0 else None
