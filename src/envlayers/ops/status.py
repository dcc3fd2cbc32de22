"""``status``: a job's record as data (Slurm's state, the current run's files, earlier runs of a requeued
job, how the launcher ended) and the list of endpoint jobs Slurm still queues or runs."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from .. import rundir, slurm
from ..phases import PhaseTracker
from .lookup import TrackedJob, current_files
from .probe import probe_all
from .wait import LOG_FIRST_READ


def _model_names(files: rundir.JobFiles) -> tuple[str | None, str | None, str | None]:
    """(model, served name, engine) from endpoint.json, else launch.json; tolerant of key spellings."""
    model = served = engine = None
    for data in (files.endpoint_data(), files.launch()):
        if not data:
            continue
        model = model or _first(data, "model", "model_path", "MODEL", "hf_model", "target")
        served = served or _first(data, "served_model_name", "served_name", "VLLM_SERVED_MODEL")
        engine = engine or _first(data, "engine", "engine_name", "INFERENCE_ENGINE")
    return model, served, engine


def _first(data: Mapping, *keys: str):
    for key in keys:
        value = data.get(key)
        if isinstance(value, dict):
            value = value.get("name")
        if value not in (None, ""):
            return str(value)
    return None


def list_rows(user: str | None, *, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> list[dict]:
    """One row per endpoint job Slurm lists: id, state, nodes, time left, model, endpoint."""
    rows = []
    for info in slurm.list_jobs(user=user, run=slurm.run):
        files = current_files(rundir.locate(info.job_id, info, environ=environ, cwd=cwd), info)
        model, served, _ = _model_names(files)
        data = files.endpoint_data()
        state = info.state or "?"
        if info.pending and info.reason:
            state += f" ({info.reason})"
        endpoint = None
        if data and info.running:
            bases = data.get("base_urls") or [data.get("base_url")]
            endpoint = " ".join(b for b in bases if b)
        elif info.running:
            endpoint = "starting"
        target = (files.launch() or {}).get("target")
        rows.append({"job_id": info.job_id, "state": state, "nodes": info.nodes, "nodelist": info.nodelist,
                     "time_left_s": info.time_left_s, "model": served or model, "hf_model": model, "target": target,
                     "endpoint": endpoint, "user": info.user,
                     "run_dir": str(files.run_dir) if files.run_dir else None})
    return rows


def launcher_end(job: TrackedJob) -> dict:
    """How the current run's launcher ended: ``{"launcher": ..., ...}`` with ``launcher`` one of

    - ``"running"``: the job has not ended (nothing to say yet);
    - ``"reported"``: the launcher wrote ``launch-end.json`` (its ``code``, ``reason``, ``ended_at``);
    - ``"died"``: the job ended, the launcher had started (launch.json) but wrote no launch-end.json:
      it was killed (SIGKILL, the node went away) or crashed;
    - ``"never started"``: the job ended before the current run's launcher wrote launch.json.

    ``slurm_state`` / ``slurm_exit`` are what Slurm reports (``None`` once it forgot the job)."""
    info = job.info
    out = {"launcher": "running", "slurm_state": info.state if info else None,
           "slurm_exit": info.exit_code if info else None, "restart": job.restart}
    if info is not None and not info.finished:
        return out
    end = job.files.launch_end()
    if end is not None:
        out.update(launcher="reported", code=end.get("code"), reason=end.get("reason"), ended_at=end.get("ended_at"))
    elif job.files.launch() is not None:
        out["launcher"] = "died"
    else:
        out["launcher"] = "never started"
    return out


def earlier_runs(job: TrackedJob) -> list[dict]:
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
    launch = files.launch() or {}
    end = files.launch_end()
    restart = launch.get("restart", 0) if launch else None
    return {"folder": folder, "path": where, "restart": restart,
            "rank_exits": {str(k): v for k, v in files.rank_exits().items()},
            "live": files.endpoint_data() is not None,
            "launcher": ("reported" if end else "died") if launch else "never started",
            "reason": (end or {}).get("reason")}


def job_record(job: TrackedJob, *, probe_endpoint: bool = True) -> dict:
    """Everything ``status JOBID`` shows, as data."""
    job.files = current_files(job.files, job.info)
    info, files = job.info, job.files
    report = files.read_job_output()
    phase = None
    log0 = files.server_log(0)
    if log0 is not None and log0.is_file():
        tracker = PhaseTracker()
        tracker.feed(rundir.FileTail(log0, max_first_read=LOG_FIRST_READ).read())
        tracker.flush()
        phase = tracker.last
    model, served, engine = _model_names(files)
    data = files.endpoint_data()
    probes = []
    if data and probe_endpoint and info is not None and info.running:
        probes = probe_all(data, served or "", timeout_s=2.0)
    return {
        "job_id": job.job_id,
        "slurm": info.to_dict() if info else None,
        "state": info.state if info else None,
        "restart": job.restart,
        "requeued": job.requeued,
        "job_output": str(files.job_out) if files.job_out else None,
        "run_dir": str(files.run_dir) if files.run_dir else None,
        "model": model, "served_model_name": served, "engine": engine,
        "launcher": report.to_dict(),
        "launcher_end": launcher_end(job),
        "phase": phase.to_dict() if phase else None,
        "rank_exits": {str(k): v for k, v in files.rank_exits().items()},
        "endpoint": data,
        "probes": probes,
        "earlier_runs": earlier_runs(job),
        "chain": _chain(files.run_dir),
    }


def _chain(run_dir) -> dict | None:
    from ..launch.successor import chain_of

    return chain_of(run_dir)
