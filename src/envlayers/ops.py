"""Operating a launched endpoint job: wait until live, describe, stop.

Reads Slurm (through ``slurm``, whose runner is looked up at call time so tests can replace it) and
the job's files (``rundir``); never decides failure from a log line: a job has failed when Slurm says
it ended, a wait has failed when its budget is spent. Log lines only explain.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping, TextIO

from . import rundir, slurm
from .errors import EnvLayersError, SlurmError
from .phases import Phase, PhaseTracker

EXIT_LIVE = 0
EXIT_ENDED = 1  # the job ended (or was never going to be live)
EXIT_TIMEOUT = 3  # the wait budget ran out; the job goes on

SLURM_OUTAGE_S = 300.0  # wait rides out Slurm not answering for this long, then gives up
_JOB_ID_RE = re.compile(r"^\d+$")
_LOG_FIRST_READ = 8 << 20  # a huge rank-0 log: phases come from its last 8 MiB


def check_job_id(job_id: str) -> str:
    job_id = str(job_id).strip()
    if not _JOB_ID_RE.match(job_id):
        raise EnvLayersError(f"{job_id!r} is not a Slurm job id",
                             hint="give the number sbatch printed, e.g. `env_layers wait 12345`")
    return job_id


def fmt_duration(seconds: float | None) -> str:
    """``75`` -> ``1m15s``, ``3725`` -> ``1h02m05s``; ``None`` -> ``-``."""
    if seconds is None:
        return "-"
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


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


# ------------------------------------------------------------------------------------------ lookup

@dataclass
class Job:
    """A job as the operator commands see it: Slurm's record (``None`` once forgotten) and its files."""

    job_id: str
    info: slurm.JobInfo | None
    files: rundir.JobFiles

    @property
    def state(self) -> str | None:
        return self.info.state if self.info else None


def find_job(job_id: str, *, run_dir: str | None = None, environ: Mapping[str, str] | None = None,
             cwd: Path | None = None) -> Job:
    """Slurm's record and the files of ``job_id``; an ``EnvLayersError`` when neither exists."""
    job_id = check_job_id(job_id)
    info = slurm.job_info(job_id, run=slurm.run)
    files = rundir.locate(job_id, info, environ=environ, cwd=cwd, run_dir=run_dir)
    if info is None and not (files.job_out and files.job_out.is_file()) and files.run_dir is None:
        raise EnvLayersError(
            f"no job {job_id}: Slurm does not know it and there is no serve-only-{job_id}.out here",
            hint="`env_layers status` lists your endpoint jobs; without accounting Slurm forgets a finished job "
                 "after MinJobAge, so run from the submit directory or pass --run-dir")
    return Job(job_id, info, files)


# ------------------------------------------------------------------------------------------ progress

def progress_text(job_id: str, info: slurm.JobInfo | None, report: rundir.LauncherReport,
                  phase: Phase | None, details: bool = True) -> str:
    """The one-line state of a starting job, without the clock. ``details=False`` leaves out the
    phase's numbers: the text then changes only when the state or phase does."""
    if info is None:
        return f"job {job_id}: Slurm no longer lists it"
    state = info.state or "?"
    if info.pending:
        return f"job {job_id}: PENDING" + (f" ({info.reason})" if info.reason else "")
    if info.state == "COMPLETING" or info.finished:
        return f"job {job_id}: {state}"
    parts = [f"job {job_id}: {state}"]
    if info.nodelist:
        parts[0] += f" on {info.nodelist}"
    if phase is not None:
        parts.append(f"rank 0 {phase.summary() if details else phase.label}")
    elif report.ranks_up or report.ranks_started:
        total = report.ranks_started or info.nodes or None
        if report.ranks_started:
            parts.append(f"all {report.ranks_started} ranks started, waiting for the server log")
        else:
            parts.append(f"{len(report.ranks_up)}/{total or '?'} ranks up")
    elif report.stages or report.topology:
        parts.append("launcher starting the ranks")
    else:
        parts.append("waiting for the launcher")
    return ", ".join(parts)


class Progress:
    """Shows a changing one-line state on stderr.

    ``tty``: one line rewritten in place, elapsed time ticking. ``plain``: a timestamped line per change.
    ``none``: silent. Launcher warnings and errors are printed once, as their own lines, in both modes.
    """

    def __init__(self, stream: TextIO | None = None, mode: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.stream = stream if stream is not None else sys.stderr
        if mode is None:
            mode = "tty" if getattr(self.stream, "isatty", lambda: False)() else "plain"
        if mode not in ("tty", "plain", "none"):
            raise ValueError(f"progress mode {mode!r}")
        self.mode = mode
        self.clock = clock
        self._last: str | None = None  # the line as last shown
        self._key: str | None = None
        self._drawn = False

    def update(self, text: str, elapsed_s: float | None = None, key: str | None = None) -> None:
        """Show ``text`` (+ elapsed). In plain mode a line is printed only when ``key`` (default: the
        text) differs from the previous one."""
        shown = f"{text} [{fmt_duration(elapsed_s)}]" if elapsed_s is not None else text
        key = text if key is None else key
        if self.mode == "tty":
            if shown != self._last or not self._drawn:
                self.stream.write("\r\x1b[K" + shown)
                self._drawn = True
                self.stream.flush()
        elif self.mode == "plain" and key != self._key:
            self._emit(shown)
        self._key = key
        self._last = shown

    def message(self, line: str) -> None:
        if self.mode == "none":
            return
        if self.mode == "tty":
            self._clear()
            self.stream.write(line + "\n")
            if self._last is not None:
                self.stream.write(self._last)
                self._drawn = True
            self.stream.flush()
        else:
            self._emit(line)

    def close(self) -> None:
        if self.mode == "tty" and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self._drawn = False

    def _emit(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.clock()))
        self.stream.write(f"[{stamp}] {line}\n")
        self.stream.flush()


# ------------------------------------------------------------------------------------------ wait

@dataclass
class WaitResult:
    outcome: str  # "live" | "ended" | "timeout"
    job: Job
    report: rundir.LauncherReport
    phase: Phase | None
    endpoint: dict | None
    waited_s: float
    findings: list = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"live": EXIT_LIVE, "ended": EXIT_ENDED, "timeout": EXIT_TIMEOUT}[self.outcome]

    def to_dict(self) -> dict:
        info = self.job.info
        return {
            "job_id": self.job.job_id, "outcome": self.outcome, "live": self.outcome == "live",
            "state": info.state if info else None, "reason": info.reason if info else None,
            "exit_code": info.exit_code if info else None,
            "phase": self.phase.to_dict() if self.phase else None,
            "last_error": self.report.last_error, "warnings": self.report.warnings,
            "run_dir": str(self.job.files.run_dir) if self.job.files.run_dir else None,
            "job_output": str(self.job.files.job_out) if self.job.files.job_out else None,
            "waited_s": round(self.waited_s, 2), "endpoint": self.endpoint,
            "diagnosis": [f.to_dict() for f in self.findings],
        }


def wait_for(job_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0,
             progress: Progress | None = None, run_dir: str | None = None,
             environ: Mapping[str, str] | None = None, cwd: Path | None = None,
             sleep: Callable[[float], None] = time.sleep,
             monotonic: Callable[[], float] = time.monotonic) -> WaitResult:
    """Poll until ``endpoint.json`` exists while the job runs (live), Slurm says the job ended, or
    ``timeout_s`` passes. Files are looked at every ``min(poll_s, 0.25)`` s, Slurm every ``poll_s`` s."""
    progress = progress or Progress(mode="none")
    t0 = monotonic()
    job = find_job(job_id, run_dir=run_dir, environ=environ, cwd=cwd)
    info = job.info
    files = job.files
    report = rundir.LauncherReport()
    out_tail = rundir.Tail(files.job_out)
    log_tail = rundir.Tail(None, max_first_read=_LOG_FIRST_READ)
    tracker = PhaseTracker()
    file_step = min(poll_s, 0.25)
    next_slurm = t0 + poll_s
    failing_since: float | None = None
    partial = [""]

    def read_files() -> list[Phase]:
        """Read what the job output and the rank-0 log gained; returns the phases newly reached."""
        nonlocal files
        if out_tail.path is None or (not out_tail.path.exists() and info is not None):
            out_tail.path = rundir.job_output_path(job.job_id, info, cwd or Path.cwd())
        text = partial[0] + out_tail.read()
        lines = text.split("\n")
        partial[0] = lines.pop()  # an unfinished last line waits for its newline
        for kind, line in report.feed_lines(lines):
            if kind in ("WARN", "ERROR"):
                progress.message(f"ENVLAYERS-{kind}: {line}")
        if files.run_dir is None and report.run_dir:
            files = rundir.JobFiles(job.job_id, files.job_out, Path(report.run_dir))
            job.files = files
        elif files.run_dir is None:
            found = rundir.locate(job.job_id, info, environ=environ, cwd=cwd)
            if found.run_dir is not None:
                files = found
                job.files = files
        if files.run_dir is not None and log_tail.path is None:
            log_tail.path = files.server_log(0)
        chunk = log_tail.read()
        return tracker.feed(chunk) if chunk else []

    while True:
        now = monotonic()
        if now >= next_slurm:
            next_slurm = now + poll_s
            try:
                info = slurm.job_info(job.job_id, run=slurm.run)
                job.info = info
                failing_since = None
            except SlurmError as err:  # a busy or restarting slurmctld must not end a long wait
                if failing_since is None:
                    failing_since = now
                    progress.message(f"Slurm did not answer ({err.message}); retrying")
                if now - failing_since > SLURM_OUTAGE_S:
                    raise
        new_phases = read_files()
        if info is not None and info.pending and (report.stages or report.topology):
            next_slurm = now  # the job writes, so it runs: ask Slurm again now rather than show PENDING
        ended = info is None or info.finished  # None: neither scontrol nor sacct knows it any more
        if ended:
            read_files()  # the launcher's last words
            if partial[0]:
                report.feed_lines([partial[0]])
            tracker.flush()
            return _ended(job, report, tracker, monotonic() - t0)
        if info is not None and info.running and info.state != "COMPLETING":
            data = files.endpoint_data()
            # a rank that already exited means the launcher is ending the job: not live
            if data and not files.rank_exits():
                return WaitResult("live", job, report, tracker.last, data, monotonic() - t0)
        elapsed = since(info.start_time) if info is not None and info.running else None
        elapsed = elapsed if elapsed is not None else now - t0
        for phase in new_phases[:-1]:  # phases passed between two looks: each gets its line, in order
            progress.update(progress_text(job.job_id, info, report, phase), elapsed,
                            key=progress_text(job.job_id, info, report, phase, details=False))
        progress.update(progress_text(job.job_id, info, report, tracker.last), elapsed,
                        key=progress_text(job.job_id, info, report, tracker.last, details=False))
        if timeout_s is not None and now - t0 >= timeout_s:
            return WaitResult("timeout", job, report, tracker.last, None, now - t0)
        sleep(file_step)


def _ended(job: Job, report: rundir.LauncherReport, tracker: PhaseTracker, waited_s: float) -> WaitResult:
    return WaitResult("ended", job, report, tracker.last, None, waited_s, findings=diagnose_job(job))


def diagnose_job(job: Job) -> list:
    """Findings of the knowledge base on the job's logs; ``[]`` when the diagnosis itself cannot run."""
    try:
        from .diagnose import diagnose, input_order, read_log
    except ImportError:
        return []
    paths: list[Path] = []
    if job.files.run_dir is not None and job.files.run_dir.is_dir():
        paths += [p for p in job.files.run_dir.glob("*.log") if p.is_file()]
    if job.files.job_out is not None and job.files.job_out.is_file():
        paths.append(job.files.job_out)
    if not paths:
        return []
    try:
        return diagnose([read_log(p) for p in sorted(paths, key=input_order)])
    except EnvLayersError:
        return []


def describe_end(result: WaitResult) -> list[str]:
    """The lines ``wait`` prints when the job ended before its endpoint was live."""
    info = result.job.info
    jid = result.job.job_id
    when = "after its endpoint had been live" if result.report.live else "before its endpoint was live"
    if info is None:
        head = f"job {jid} ended {when} (Slurm no longer lists it)"
    else:
        bits = [info.state or "?"]
        if info.reason and info.reason != "None":
            bits.append(info.reason)
        if info.exit_code:
            bits.append(f"exit {info.exit_code}")
        head = f"job {jid} ended {when}: {', '.join(bits)}"
    lines = [head]
    if result.report.last_error:
        lines.append(f"  ENVLAYERS-ERROR: {result.report.last_error}")
    if result.phase is not None:
        lines.append(f"  last phase of rank 0: {result.phase.summary()}")
    exits = result.job.files.rank_exits()
    bad = {r: c for r, c in exits.items() if c not in (0, None)}
    if bad:
        lines.append("  rank exits: " + ", ".join(f"rank {r} -> {c}" for r, c in bad.items()))
    # errors first, informational findings after; the knowledge base's order within each
    ranked = sorted(result.findings, key=lambda f: (f.severity != "error", f.status == "informational"))
    for f in ranked[:3]:
        where = f.evidence[0].where if f.evidence else "-"
        lines.append(f"  diagnosis [{f.rule_id}] {where}: {f.cause}")
        lines.append(f"    fix: {f.fix}")
    lines.append(f"  next: env_layers diagnose {jid}; env_layers logs {jid} --tail 50")
    return lines


def describe_timeout(result: WaitResult, timeout_s: float) -> list[str]:
    info = result.job.info
    state = info.state if info else "unknown"
    if info is not None and info.pending:
        state += f" ({info.reason})"
    line = f"job {result.job.job_id} not live after {fmt_duration(timeout_s)}: {state}"
    if result.phase is not None:
        line += f", rank 0 {result.phase.summary()}"
    return [line, f"  the job goes on; `env_layers wait {result.job.job_id}` again, or "
                  f"`env_layers stop {result.job.job_id}` to end it"]


# ------------------------------------------------------------------------------------------ status

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


def endpoint_urls(data: Mapping | None) -> list[str]:
    """The URLs to probe: endpoint.json's ``addresses`` matching the base URLs (node names may not
    resolve on the login node), each either a URL (used as is) or an IP (put in the base URL's place);
    else the base URLs."""
    if not data:
        return []
    bases = data.get("base_urls") or ([data["base_url"]] if data.get("base_url") else [])
    addresses = data.get("addresses") or []
    urls = []
    for i, base in enumerate(bases):
        addr = addresses[i] if i < len(addresses) else None
        if not addr:
            urls.append(base)
        elif "://" in str(addr):
            urls.append(str(addr))
        else:
            urls.append(_with_host(base, str(addr)))
    return urls


def _with_host(url: str, host: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def list_rows(user: str | None, *, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> list[dict]:
    """One row per endpoint job Slurm lists: id, state, nodes, time left, model, endpoint."""
    rows = []
    for info in slurm.list_jobs(user=user, run=slurm.run):
        files = rundir.locate(info.job_id, info, environ=environ, cwd=cwd)
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


def format_table(rows: list[dict]) -> str:
    # the catalog target (every catalog model is served under the same name, so that name tells nothing)
    head = ("JOBID", "STATE", "NODES", "TIME LEFT", "MODEL", "ENDPOINT")
    body = [(r["job_id"], r["state"], str(r["nodes"]), fmt_duration(r["time_left_s"])
             if r["time_left_s"] is not None else "-", r.get("target") or r.get("hf_model") or r["model"] or "-",
             r["endpoint"] or "-") for r in rows]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body]]
    return "\n".join(lines) + "\n"


def job_record(job: Job, *, probe_endpoint: bool = True) -> dict:
    """Everything ``status JOBID`` shows, as data."""
    from . import readiness

    info, files = job.info, job.files
    report = files.read_job_output()
    phase = None
    log0 = files.server_log(0)
    if log0 is not None and log0.is_file():
        tracker = PhaseTracker()
        tracker.feed(rundir.Tail(log0, max_first_read=_LOG_FIRST_READ).read())
        tracker.flush()
        phase = tracker.last
    model, served, engine = _model_names(files)
    data = files.endpoint_data()
    answers = []
    if data and probe_endpoint and info is not None and info.running:
        for url in endpoint_urls(data):
            p = readiness.probe(url, served or "", timeout_s=2.0)
            answers.append({"url": url, "answers": p.status is not None, "ok": p.ok, "detail": p.detail})
    return {
        "job_id": job.job_id,
        "slurm": info.to_dict() if info else None,
        "state": info.state if info else None,
        "job_output": str(files.job_out) if files.job_out else None,
        "run_dir": str(files.run_dir) if files.run_dir else None,
        "model": model, "served_model_name": served, "engine": engine,
        "launcher": report.to_dict(),
        "phase": phase.to_dict() if phase else None,
        "rank_exits": {str(k): v for k, v in files.rank_exits().items()},
        "endpoint": data,
        "probes": answers,
    }


def format_record(rec: dict) -> str:
    s = rec["slurm"] or {}
    jid = rec["job_id"]
    lines = []
    state = rec["state"] or "unknown to Slurm (finished and forgotten)"
    if s.get("reason") and s.get("state") not in ("RUNNING",):
        state += f" ({s['reason']})"
    if s.get("exit_code") and s.get("state") in slurm.TERMINAL_STATES:
        state += f", exit {s['exit_code']}"
    lines.append(f"job {jid}: {state}")
    if s:
        nodes = f"{s['nodes']} ({s['nodelist']})" if s.get("nodelist") else str(s.get("nodes", "-"))
        lines.append(f"  nodes:      {nodes}")
        left = fmt_duration(s["time_left_s"]) if s.get("time_left_s") is not None else "-"
        limit = fmt_duration(s["time_limit_s"]) if s.get("time_limit_s") is not None else "unlimited"
        lines.append(f"  time:       {left} left of {limit}; start {s.get('start_time') or '-'}, "
                     f"end {s.get('end_time') or '-'}")
    if rec["model"] or rec["served_model_name"]:
        lines.append(f"  model:      {rec['served_model_name'] or '-'} = {rec['model'] or '-'}"
                     f" ({rec['engine'] or '?'})")
    lines.append(f"  job output: {rec['job_output'] or '-'}")
    lines.append(f"  run dir:    {rec['run_dir'] or '- (not created yet)'}")
    la = rec["launcher"]
    if la["ranks_up"] or la["ranks_started"]:
        ups = ", ".join(f"{r} on {h}" for r, h in la["ranks_up"].items())
        total = la["ranks_started"] or len(la["ranks_up"])
        lines.append(f"  ranks:      {len(la['ranks_up'])}/{total} up ({ups})")
    if rec["rank_exits"]:
        lines.append("  rank exits: " + ", ".join(f"rank {r} -> {c}" for r, c in rec["rank_exits"].items()))
    ph = rec["phase"]
    if ph:
        detail = ", ".join(f"{k}={v}" for k, v in ph["details"].items())
        lines.append(f"  phase:      rank 0 {ph['label']}" + (f" ({detail})" if detail else ""))
    ep = rec["endpoint"]
    if ep:
        bases = ep.get("base_urls") or [ep.get("base_url")]
        for base in bases:
            lines.append(f"  endpoint:   {base}")
        for p in rec["probes"]:
            lines.append(f"  probe:      {p['url']}: {'answers' if p['answers'] else 'no answer'} ({p['detail']})")
        if ep.get("curl") and rec["state"] in ("RUNNING",):
            lines.append(f"  try:        {ep['curl']}")
    elif rec["state"] == "RUNNING":
        lines.append("  endpoint:   not live yet (`env_layers wait " + jid + "`)")
    for w in la["warnings"]:
        lines.append(f"  warning:    {w}")
    for e in la["errors"]:
        if not rundir.TAIL_HEADER_RE.match(e):  # "last 20 lines of ...:" introduces the tail, it says nothing
            lines.append(f"  error:      {e}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ stop

@dataclass
class StopResult:
    job_id: str
    state_before: str | None
    cancelled: bool
    ended: bool
    state_after: str | None
    waited_s: float
    probes: list[dict]

    @property
    def still_answers(self) -> list[str]:
        return [p["url"] for p in self.probes if p["answers"]]

    @property
    def ok(self) -> bool:
        return self.ended and not self.still_answers

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "state_before": self.state_before, "cancelled": self.cancelled,
                "ended": self.ended, "state_after": self.state_after, "waited_s": round(self.waited_s, 2),
                "probes": self.probes, "ok": self.ok}


def stop_job(job_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.25, probe_window_s: float = 5.0,
             run_dir: str | None = None, environ: Mapping[str, str] | None = None, cwd: Path | None = None,
             sleep: Callable[[float], None] = time.sleep,
             monotonic: Callable[[], float] = time.monotonic) -> StopResult:
    """scancel, wait until Slurm says the job ended, then check that no endpoint URL answers."""
    from . import readiness

    job = find_job(job_id, run_dir=run_dir, environ=environ, cwd=cwd)
    before = job.state
    cancelled = False
    t0 = monotonic()
    info = job.info
    if info is not None and not info.finished:
        slurm.cancel(job.job_id, run=slurm.run)
        cancelled = True
        while True:
            info = slurm.job_info(job.job_id, run=slurm.run)
            if info is None or info.finished or monotonic() - t0 >= timeout_s:
                break
            sleep(poll_s)
    ended = info is None or info.finished
    data = job.files.endpoint_data()
    if data is None and job.files.run_dir is None:
        job.files = rundir.locate(job.job_id, info or job.info, environ=environ, cwd=cwd, run_dir=run_dir)
        data = job.files.endpoint_data()
    served = (data or {}).get("served_model_name") or ""
    probes: list[dict] = []
    if ended:
        deadline = monotonic() + probe_window_s
        while True:
            probes = []
            for url in endpoint_urls(data):
                p = readiness.probe(url, served, timeout_s=1.0)
                probes.append({"url": url, "answers": p.status is not None, "detail": p.detail})
            if not any(p["answers"] for p in probes) or monotonic() >= deadline:
                break
            sleep(poll_s)
    return StopResult(job.job_id, before, cancelled, ended, info.state if info else None, monotonic() - t0, probes)

