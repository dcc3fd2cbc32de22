"""``report``: the GPU-hour split of every endpoint job in a time window, from the run directories and Slurm's
accounting (``sacct``), as data.

Each run directory's ``accounting.json`` (written by the launcher, ``launch.timeline``) gives a job's split;
``sacct`` (where Slurm's accounting storage is enabled) lists the endpoint jobs Slurm ran, so a job whose
launcher was killed or whose run directory is gone still counts as allocated time that nothing explains.
Where ``sacct`` does not answer, the report says so: it then covers the run directories only.
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import slurm
from ..accounting import largest_waste, split, summarize
from ..durations import SPAN_GRAMMAR, parse_span, parse_time
from ..defaults import JOB_NAME
from ..errors import EnvLayersError
from ..rundir import ACCOUNTING, LAUNCH, POOL, AccountingRecord, LaunchRecord, PoolRecord, read_record

def parse_since(text: str, now: float) -> float:
    """``--since``: a span back from ``now`` (``durations.SPAN_GRAMMAR``: ``7d``, ``12h``, ``30m``, ``2w``) or a
    date (``2026-11-25``, ``2026-11-25T08:00``, read as ``durations.parse_time`` reads Slurm's) -> epoch
    seconds."""
    span = parse_span(text)
    if span is not None:
        return now - span
    when = parse_time(text)
    if when is None:
        raise EnvLayersError(f"{text!r} is not a duration or a date", where="--since",
                             hint="e.g. --since 7d, --since 12h, --since 2026-11-25")
    return when


def sacct_jobs(since: float, user: str | None, run=None) -> tuple[list[slurm.SacctJob] | None, str]:
    """The endpoint jobs Slurm's accounting knows since ``since``; ``(None, why)`` when it cannot tell."""
    try:
        return slurm.window_jobs(JOB_NAME, since, user, run=run or slurm.run), "sacct"
    except EnvLayersError as err:
        return None, str(err)


def _owner(path: Path) -> str | None:
    try:
        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (KeyError, OSError):
        return None


def run_dir_records(roots: list[Path]) -> list[tuple[Path, AccountingRecord | None, str | None]]:
    """``(run dir, record, None)`` for every ``accounting.json`` under ``<root>/<jobid>/`` (and its earlier
    runs, ``run-<n>/``) that is an accounting record, ``(run dir, None, why)`` for every other one: a file
    that cannot be read (not a regular file, larger than 4 MiB), is not JSON (cut short, random bytes, nested
    too deep for the parser) or holds no record (``[1,2,3]``, a NaN start, a negative GPU count)."""
    from ..accounting import problem

    found: list[tuple[Path, dict | None, str | None]] = []
    for root in roots:
        try:
            entries = sorted(os.scandir(root), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            try:
                if not entry.is_dir():
                    continue
            except OSError:
                continue
            for path in [Path(entry.path)] + sorted(Path(entry.path).glob("run-*")):
                f = path / ACCOUNTING
                if not os.path.lexists(f):
                    continue
                data, why = _read_record(f)
                why = why or problem(data)
                found.append((path, None if why else AccountingRecord.from_dict(data), why))
    return found


def _read_record(path: Path) -> tuple[object, str | None]:
    """The JSON in ``path`` (bounded, a regular file only), or ``(None, why)``."""
    import json

    from ..yamlpos import MAX_BYTES, NotRegularFile, read_regular

    try:
        raw = read_regular(path, MAX_BYTES)
    except NotRegularFile as err:
        return None, f"not read: it {err.reason}"
    except OSError as err:
        return None, f"not read: {err.strerror or err}"
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as err:
        return None, f"not JSON: not UTF-8 (byte {err.start})"
    except ValueError as err:
        return None, f"not JSON: {str(err)[:120]}"
    except RecursionError:
        return None, "not JSON: nested too deep"


@dataclass
class Report:
    since: float
    until: float
    roots: list[str]
    jobs: list[dict] = field(default_factory=list)
    by_model: list[dict] = field(default_factory=list)
    by_shape: list[dict] = field(default_factory=list)
    by_site: list[dict] = field(default_factory=list)  # only when a job names its site (launch.json)
    slurm_accounting: str = ""  # "sacct", or why it is not there
    missing: list[dict] = field(default_factory=list)  # jobs sacct knows and no run directory explains
    largest_waste: str | None = None
    suggest_stop_s: float = 1800.0
    skipped: list[str] = field(default_factory=list)  # "path: why" of accounting.json files left out
    pools: list[dict] = field(default_factory=list)  # elastic pools (MAX_REPLICAS): a job and its replica jobs

    def to_dict(self) -> dict:
        return {"since": self.since, "until": self.until, "run_roots": self.roots,
                "slurm_accounting": self.slurm_accounting, "jobs": self.jobs, "by_model": self.by_model,
                "by_shape": self.by_shape, "by_site": self.by_site, "missing": self.missing, "largest_waste": self.largest_waste,
                "suggest_idle_stop_after_s": self.suggest_stop_s,
                "skipped": self.skipped, "pools": self.pools}


def build_report(roots: list[Path], since: float, user: str | None, *, now: float | None = None,
                 suggest_stop_s: float = 1800.0, run=None, use_sacct: bool = True) -> Report:
    now = time.time() if now is None else now
    rep = Report(since, now, [str(r) for r in roots], suggest_stop_s=suggest_stop_s)
    if use_sacct:
        sjobs, rep.slurm_accounting = sacct_jobs(since, user, run=run)
    else:
        sjobs, rep.slurm_accounting = None, "not asked: --no-sacct"
    by_id = {j.job_id: j for j in sjobs or []}
    seen = set()
    for path, record, why in run_dir_records(roots):
        if why is not None:
            rep.skipped.append(f"{path / ACCOUNTING}: not an accounting record ({why})")
            continue
        tl = record.to_dict()
        jid = str(record.job_id if isinstance(record.job_id, (str, int)) else path.name)
        owner = by_id[jid].user if jid in by_id else _owner(path)
        try:
            sp = split(tl, now=now)
            end = float(record.ended_at or now)
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            rep.skipped.append(f"{path / ACCOUNTING}: not an accounting record ({type(err).__name__}: {err})")
            continue
        if end < since or (user and owner != user):
            continue
        seen.add(jid)
        launch = read_record(path / LAUNCH, LaunchRecord) or LaunchRecord()
        rep.jobs.append({"job_id": jid, "restart": 0 if record.restart is None else record.restart, "user": owner,
                         "run_dir": str(path), "model": _model_label(launch, record),
                         "shape": f"{_or_unknown(record.shape)} {_or_unknown(record.nodes)}x{_per_node(record)} GPUs",
                         "ended": record.how, "timeline": tl, "split": sp, "site": launch.site,
                         "slurm_state": by_id[jid].state if jid in by_id else None})
    rep.pools = pools(rep.jobs)
    for j in sjobs or []:
        if j.job_id not in seen and j.state not in ("PENDING",):
            gpus = j.gpus
            rep.missing.append({"job_id": j.job_id, "user": j.user, "state": j.state, "elapsed_s": j.elapsed_s,
                                "nodes": j.nodes, "gpus": gpus,
                                "gpu_hours": round(j.elapsed_s * gpus / 3600, 4) if gpus else None})
    rep.by_model = summarize(rep.jobs, "model", suggest_stop_s)
    rep.by_shape = summarize(rep.jobs, "shape", suggest_stop_s)
    if any(j["site"] for j in rep.jobs):
        rep.by_site = summarize(rep.jobs, "site", suggest_stop_s)
    rep.largest_waste = largest_waste(rep.by_model, "model", suggest_stop_s)
    return rep


def _model_label(launch: LaunchRecord, record: AccountingRecord) -> str:
    """What "by model" groups a run under: the catalog model of its target (``glm53`` of experiment:glm53,
    from launch.json), else the model it loaded, else its served name. The served name alone would put
    every catalog model in one row: the catalog serves them all under one name."""
    experiment, sep, model = (launch.target or "").partition(":")
    catalog = sep and model and experiment != "base-env"  # a SERVE_BASE_ENV job names its file, not a model
    return str((model if catalog else None) or launch.model or record.model or record.served or "?")


def _or_unknown(value) -> object:
    return "?" if value is None else value


def _per_node(record: AccountingRecord) -> str:
    gpus, nodes = record.gpus, record.nodes
    return str(gpus // nodes) if isinstance(gpus, int) and isinstance(nodes, int) and nodes else "?"


def pools(jobs: list[dict]) -> list[dict]:
    """Each job with an elastic pool (``pool.json`` in its run directory, launch/pool.py): its replica jobs,
    their GPU-hours (from their own accounting records, when the report has them) added to the job's, and
    every grow and shrink decision. Each replica job's entry in ``jobs`` gets ``pool_of``."""
    by_id = {j["job_id"]: j for j in jobs}
    out = []
    for job in jobs:
        rec = read_record(Path(job["run_dir"]) / POOL, PoolRecord)
        if rec is None or rec.jobs is None:
            continue
        members = [m.job for m in rec.jobs if m.job is not None]
        own = job["split"]["allocated_gpu_hours"]
        hours = 0.0
        for m in members:
            member = by_id.get(m)
            if member is not None:
                member["pool_of"] = job["job_id"]
                hours += member["split"]["allocated_gpu_hours"]
        out.append({"job_id": job["job_id"], "max_replicas": rec.max_replicas, "replica_jobs": members,
                    "gpu_hours_own": own, "gpu_hours_replica_jobs": round(hours, 4),
                    "gpu_hours_total": round(own + hours, 4), "decisions": [d.to_dict() for d in rec.decisions]})
    return out
