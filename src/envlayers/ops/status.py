"""``status``: a job's record as data (Slurm's state, the current run's files, earlier runs of a requeued
job, how the launcher ended) and the list of endpoint jobs Slurm still queues or runs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from .. import rundir, slurm
from ..job import Clock, Job, locate_job, newest_live, patiently
from .probe import probe_all
from .progress import RankProgress, read_run, run_total, serving_ranks

def job_accounting(files: rundir.JobFiles, running: bool, now: float | None = None,
                   slurm_end: float | None = None) -> dict | None:
    """The run's ``accounting.json`` with its split recomputed up to ``now`` while the job runs (the
    launcher rewrites the file every few seconds); ``None`` before the launcher wrote one.

    A job that ended without the launcher's final record (it could not write it: a full or read-only file
    system; or it was killed) is counted up to Slurm's end time ``slurm_end`` when Slurm says it, and
    marked ``"end_from": "slurm"``: the record's last rewrite would leave out everything after it."""
    import time

    from ..accounting import split

    record = files.accounting()
    if record is None or record.job_start is None:
        return None
    data = record.to_dict()
    try:
        if running and not data.get("ended_at"):
            data["split"] = split(data, now=time.time() if now is None else now)
        elif not running and not data.get("ended_at") and slurm_end is not None:
            data["ended_at"] = slurm_end
            data["end_from"] = "slurm"
            data["split"] = split(data, now=slurm_end)
    except ValueError:  # not a record split can sum (accounting.problem): shown as it was written
        pass
    return data


def slurm_end_time(info) -> float | None:
    """Slurm's EndTime of an ended job as epoch seconds (``None`` when it does not say)."""
    from ..durations import parse_time

    if info is None or not info.finished:
        return None
    return parse_time(info.end_time)


def run_progress(files: rundir.JobFiles, report: rundir.LauncherReport, nodes: int | None) -> RankProgress | None:
    """The furthest startup phase of the run and how many ranks reached it, read from every rank's log."""
    launch = files.launch()
    total = run_total(report, launch, nodes)
    return read_run(files, total, serving_ranks(launch.shape if launch is not None else None, total or 1))


def list_rows(user: str | None, *, environ: Mapping[str, str] | None = None, cwd: Path | None = None,
              outage_s: float = 0.0, clock: Clock | None = None,
              on_silent: Callable[[str], None] | None = None) -> list[dict]:
    """One row per endpoint job Slurm lists, in the shared words: job id, state, nodes, time left, target,
    model id, served name, phase, url (``urls``: every replica's). A controller that does not answer is
    asked again for ``outage_s`` seconds (``job.patiently``)."""
    rows = []
    listed = patiently(lambda: slurm.list_jobs(user=user, run=slurm.run), outage_s=outage_s, clock=clock,
                       on_silent=on_silent)
    for info in listed:
        job = locate_job(info.job_id, info, environ=environ, cwd=cwd)
        files = job.files
        ep = files.endpoint() if info.running else None
        state = info.state or "?"
        if info.pending and info.reason and info.reason != "None":
            state += f" ({info.reason})"
        progress = None
        if info.running and files.run_dir is not None:
            progress = run_progress(files, files.read_job_output(), info.nodes)
        urls = ep.base_urls if ep is not None else []
        rows.append({"job_id": info.job_id, "state": state, "nodes": info.nodes, "nodelist": info.nodelist,
                     "time_left_s": info.time_left_s, **job.identity(),
                     "phase": "live" if urls else (progress.text(details=False) if progress
                                                   else "starting" if info.running else None),
                     "url": urls[0] if urls else None, "urls": urls, "user": info.user,
                     "run_dir": str(files.run_dir) if files.run_dir else None})
    return rows


def earlier_run_records(job: Job) -> list[dict]:
    """The runs before the current one: ``run-<n>/`` folders, and the top-level files while they are
    still a previous run's (a requeued job not started again)."""
    runs = []
    for n, path in job.files.earlier_runs().items():
        sub = rundir.JobFiles(job.job_id, None, path)
        runs.append(_run_summary(sub, str(path), n))
    if job.files.previous_at_top and job.files.run_dir is not None and job.files.recorded_restart() is not None:
        top = rundir.JobFiles(job.job_id, None, job.files.run_dir)
        runs.append(_run_summary(top, str(job.files.run_dir), None))
    return runs


def _run_summary(files: rundir.JobFiles, where: str, folder: int | None) -> dict:
    launch = files.launch()
    how, said = files.launcher_ended()
    return {"folder": folder, "path": where, "restart": launch.restart if launch is not None else None,
            "rank_exits": {str(k): v for k, v in files.rank_exits().items()},
            "live": files.endpoint() is not None, "launcher": how, "reason": said.get("reason")}


def job_record(job: Job, *, probe_endpoint: bool = True) -> dict:
    """Everything ``status JOBID`` shows, as data."""
    job.update(job.info)
    info, files = job.info, job.files
    report = files.read_job_output()
    progress = run_progress(files, report, info.nodes if info is not None else None)
    names = job.identity()
    ep = files.endpoint()
    urls = ep.base_urls if ep is not None else []
    probes = []
    if ep is not None and probe_endpoint and info is not None and info.running:
        probes = probe_all(ep, names["served_name"] or "", timeout_s=2.0)
    return {
        "job_id": job.job_id,
        "slurm": info.to_dict() if info else None,
        "state": info.state if info else None,
        "restart": job.restart,
        "requeued": job.requeued,
        "job_output": str(files.job_out) if files.job_out else None,
        "run_dir": str(files.run_dir) if files.run_dir else None,
        **names,
        "launcher": report.to_dict(),
        "launcher_end": job.launcher_end(),
        "phase": progress.to_dict() if progress else None,
        "url": urls[0] if urls else None, "urls": urls,
        "rank_exits": {str(k): v for k, v in files.rank_exits().items()},
        "endpoint": ep.to_dict() if ep is not None else None,
        "probes": probes,
        "earlier_runs": earlier_run_records(job),
        "accounting": job_accounting(files, bool(info is not None and info.running), slurm_end=slurm_end_time(info)),
        "chain": _chain(job.job_id, files.run_dir),
    }


def _chain(job_id: str, run_dir) -> dict | None:
    """chain.json (launch.successor) and, under ``moved``, the newest successor that serves now
    (job.newest_live: ``from``, ``to``, ``links``, ``state``, ``base_urls``; ``None`` while none does)."""
    chain = rundir.chain_of(run_dir)
    if chain is None:
        return None
    return {**chain.to_dict(), "moved": newest_live(job_id, run_dir)}
