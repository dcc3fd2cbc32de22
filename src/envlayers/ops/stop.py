"""``stop``: scancel a job, wait until Slurm says it ended, then check that no endpoint URL still answers.

A job of a chain of successors (``SUCCESSORS``) is stopped with the later jobs of its chain, latest first:
left pending, a successor would start once this job ends (Slurm's ``after:`` counts a cancelled job as
started) and bring the endpoint back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from .. import rundir, slurm
from ..job import find_job, locate_job
from .probe import probe_all
from .watch import Clock


@dataclass
class StopResult:
    job_id: str
    state_before: str | None
    cancelled: bool
    ended: bool
    state_after: str | None
    waited_s: float
    probes: list[dict]
    successors: list["StopResult"] = field(default_factory=list)  # the chain's later jobs, latest first
    error: str | None = None  # why a later job of the chain could not be stopped

    @property
    def still_answers(self) -> list[str]:
        return [p["url"] for p in self.probes if p["answers"]]

    @property
    def ok(self) -> bool:
        return self.ended and not self.still_answers and all(r.ok for r in self.successors)

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "state_before": self.state_before, "cancelled": self.cancelled,
                "ended": self.ended, "state_after": self.state_after, "waited_s": round(self.waited_s, 2),
                "probes": self.probes, "successors": [r.to_dict() for r in self.successors], "error": self.error,
                "ok": self.ok}


def stop_job(job_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.25, probe_window_s: float = 5.0,
             run_dir: str | None = None, environ: Mapping[str, str] | None = None, cwd: Path | None = None,
             clock: Clock | None = None, chain: bool = True) -> StopResult:
    """scancel, wait until Slurm says the job ended, then check that no endpoint URL answers (the
    endpoint of any run: a server of an earlier run outliving it is as bad). With ``chain``, the later
    jobs of its chain of successors are stopped first, latest first."""
    clock = clock or Clock()
    job = find_job(job_id, run_dir=run_dir, environ=environ, cwd=cwd)
    later: list[StopResult] = []
    if chain and job.files.run_dir is not None:
        from ..rundir import chain_links

        from ..errors import EnvLayersError

        for jid, folder in reversed(chain_links(job.job_id, job.files.run_dir)[1:]):
            try:
                later.append(stop_job(jid, timeout_s=timeout_s, poll_s=poll_s, probe_window_s=probe_window_s,
                                      run_dir=str(folder), environ=environ, cwd=cwd, clock=clock, chain=False))
            except EnvLayersError as err:  # one link Slurm cannot say of: still stop the rest and this job
                later.append(StopResult(jid, None, False, False, None, 0.0, [], error=err.message))
    before = job.state
    cancelled = False
    t0 = clock.monotonic()
    info = job.info
    if info is not None and not info.finished:
        slurm.cancel(job.job_id, run=slurm.run)
        cancelled = True
        while True:
            info = slurm.job_info(job.job_id, run=slurm.run)
            if info is None or info.finished or clock.monotonic() - t0 >= timeout_s:
                break
            clock.sleep(poll_s)
    ended = info is None or info.finished
    files = job.files
    if files.run_dir is None:
        files = locate_job(job.job_id, info or job.info, environ=environ, cwd=cwd, run_dir=run_dir).files
    top = rundir.JobFiles(job.job_id, files.job_out, files.run_dir)  # whichever run wrote it
    ep = top.endpoint()
    served = ep.served_model_name if ep is not None and ep.served_model_name is not None else ""
    probes: list[dict] = []
    if ended:
        deadline = clock.monotonic() + probe_window_s
        while True:
            probes = [{k: p[k] for k in ("url", "answers", "detail")} for p in probe_all(ep, served, 1.0)]
            if not any(p["answers"] for p in probes) or clock.monotonic() >= deadline:
                break
            clock.sleep(poll_s)
    return StopResult(job.job_id, before, cancelled, ended, info.state if info else None,
                      clock.monotonic() - t0, probes, later)
