"""``logs``: which file holds a job's log (a rank's server log of the current run, or the job output),
its lines, and following it as it grows until the job ends (on the shared ``JobWatcher``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from .. import rundir
from ..errors import EnvLayersError
from ..job import Job
from ..tail import Tail
from .watch import Clock, JobWatcher

FOLLOW_POLL_S = 2.0  # --follow asks Slurm this often whether the job still runs
WAIT_FOR_LOG_POLL_S = 1.0  # --follow on a log not written yet: look for it this often


def log_path(job: Job, rank: int | str) -> Path | None:
    """``rank`` ``"job"``: the job output; a number: that rank's server log of the current run."""
    if rank == "job":
        return job.files.job_out
    return job.files.server_log(int(rank))


def no_log_error(job: Job, rank: int | str, path: Path | None) -> EnvLayersError:
    """The one-line error for a log that is not there, saying when it will be (and where earlier runs' are)."""
    info = job.info
    earlier = _earlier_logs(job, rank)
    if rank == "job":
        what = f"no job output for job {job.job_id} at {path}"
    elif job.requeued:
        what = (f"job {job.job_id} was requeued (restart {job.restart}): the current run has not written "
                f"{rundir.server_log_name(rank)} yet")
    elif job.files.run_dir is None:
        what = f"no run directory for job {job.job_id} yet"
    else:
        have = sorted(job.files.server_logs())
        what = f"no {rundir.server_log_name(rank)} in {job.files.run_dir}" + (f" (ranks with logs: {have})" if have else "")
    if earlier and rank != "job":
        what += "; the previous run's: " + earlier
    if info is not None and info.pending:
        hint = f"the job is PENDING ({info.reason}); logs appear once it runs: `env_layers wait {job.job_id}`"
    elif info is not None and not info.finished:
        hint = f"the launcher writes it as the ranks start; `env_layers logs {job.job_id} --follow` waits for it"
    else:
        hint = f"`env_layers logs {job.job_id} --rank job` shows what the job itself printed"
    return EnvLayersError(what, hint=hint)


def _earlier_logs(job: Job, rank: int | str) -> str | None:
    """Where the previous run's log of ``rank`` is: in the top folder while it has not been moved yet
    (it goes to ``run-<k>/`` when the job starts again), else the last ``run-<k>/``."""
    if rank == "job" or job.files.run_dir is None:
        return None
    name = rundir.server_log_name(rank)
    runs = job.files.earlier_runs()
    if job.files.previous_at_top and (job.files.run_dir / name).is_file():
        k = next(n for n in range(len(runs) + 1) if n not in runs)
        return f"{job.files.run_dir / name} (moved to run-{k}/ when the job starts again)"
    for k in sorted(runs, reverse=True):
        if (runs[k] / name).is_file():
            return f"run-{k}/{name} ({runs[k] / name})"
    return None


@dataclass
class LogLines:
    """The lines of a log read now (the last ``tail_n`` when given) and a reader positioned after them."""

    path: Path
    lines: list[str]
    reader: Tail


def read_log(path: Path, tail_n: int | None) -> LogLines:
    reader = Tail(path)
    first = reader.last(tail_n) if tail_n is not None else reader.read().splitlines()
    return LogLines(path, first, reader)


def wait_for_log(job: Job, rank: int | str, *, environ: Mapping[str, str] | None = None,
                 run_dir: str | None = None, clock: Clock | None = None) -> Path:
    """Wait while the job lives until ``rank``'s log exists; its path, or the ``no_log_error``."""
    watcher = JobWatcher(job, poll_s=WAIT_FOR_LOG_POLL_S, step_s=WAIT_FOR_LOG_POLL_S, clock=clock or Clock(),
                         locate_kw={"environ": environ, "run_dir": run_dir})
    watcher.ask_soon()
    for _tick in watcher.ticks():
        path = log_path(job, rank)
        if path is not None and path.is_file():
            return path
        if watcher.ended:
            raise no_log_error(job, rank, path)
    raise AssertionError("unreachable")  # pragma: no cover


def follow(job: Job, log: LogLines, *, clock: Clock | None = None,
           step_s: float = 0.25) -> Iterator[str]:
    """The lines ``log`` gains until Slurm says the job ended (then what is left, to the last line)."""
    watcher = JobWatcher(job, poll_s=FOLLOW_POLL_S, step_s=step_s, clock=clock or Clock())
    watcher.ask_soon()
    for _tick in watcher.ticks():
        yield from log.reader.lines()
        if watcher.ended:  # the rest, an unfinished last line too (blank lines of this last read left out)
            yield from (ln for ln in [*log.reader.lines(), log.reader.rest()] if ln)
            return
