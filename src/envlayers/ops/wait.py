"""``wait``: follow a job until its endpoint is live, Slurm says it ended, or the budget is spent.

Returns a ``WaitResult`` and reports progress as ``WaitEvent`` records to a callback; turning them into
terminal lines is ``cli.ops_format``'s job. Live means: the job runs, the current run wrote
``endpoint.json``, and no rank of it has exited (a rank that exited means the launcher is ending the job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping

from .. import joblines, rundir
from ..durations import parse_time
from ..errors import EnvLayersError
from ..job import SLURM_OUTAGE_S, Job, find_job, locate_job
from ..tail import Tail
from .progress import RankProgress, RunPhases, run_total, serving_ranks
from .watch import Clock, JobWatcher

FILE_STEP_S = 0.25  # files are looked at at least this often
EXIT_LIVE = 0
EXIT_ENDED = 1  # the job ended (or was never going to be live)
EXIT_TIMEOUT = 3  # the wait budget ran out; the job goes on


def since(iso: str | None, now: datetime | None = None) -> float | None:
    """Seconds since a Slurm timestamp (local time, ``2026-12-02T09:52:00``), ``None`` if unknown or future."""
    then = parse_time(iso)
    if then is None:
        return None
    delta = (now or datetime.now()).timestamp() - then
    return delta if delta >= 0 else None


@dataclass
class WaitEvent:
    """Something ``wait`` saw. ``kind``: ``"state"`` (the job's state now; ``phase`` the run's furthest
    startup phase and how many ranks reached it), ``"live"`` (the endpoint answers), ``"launcher"`` (``text`` is an ``ENVLAYERS-WARN``/``ENVLAYERS-ERROR`` line of the current
    run) or ``"slurm-silent"`` (``text`` is why Slurm did not answer; said once per outage; ``job`` is
    ``None`` when Slurm was silent at the first look, before there was a job record)."""

    kind: str
    job: Job | None
    report: rundir.LauncherReport
    phase: RankProgress | None = None
    rank_exits: dict[int, int | None] = field(default_factory=dict)
    elapsed_s: float | None = None
    text: str | None = None


@dataclass
class WaitResult:
    outcome: str  # "live" | "ended" | "timeout"
    job: Job
    report: rundir.LauncherReport
    phase: RankProgress | None
    endpoint: rundir.EndpointRecord | None
    waited_s: float
    findings: list = field(default_factory=list)
    rank_exits: dict[int, int | None] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return {"live": EXIT_LIVE, "ended": EXIT_ENDED, "timeout": EXIT_TIMEOUT}[self.outcome]

    def to_dict(self) -> dict:
        info = self.job.info
        urls = self.endpoint.base_urls if self.endpoint is not None else []
        return {
            "job_id": self.job.job_id, "outcome": self.outcome, "live": self.outcome == "live",
            **self.job.identity(),
            "state": info.state if info else None, "reason": info.reason if info else None,
            "expected_start": info.start_time if info is not None and info.pending else None,
            "url": urls[0] if urls else None, "urls": urls,
            "exit_code": info.exit_code if info else None,
            "restart": self.job.restart, "requeued": self.job.requeued,
            "phase": self.phase.to_dict() if self.phase else None,
            "rank_exits": {str(k): v for k, v in self.rank_exits.items()},
            "last_error": self.report.last_error, "warnings": self.report.warnings,
            "launcher": self.job.launcher_end() if self.outcome == "ended" else None,
            "run_dir": str(self.job.files.run_dir) if self.job.files.run_dir else None,
            "job_output": str(self.job.files.job_out) if self.job.files.job_out else None,
            "waited_s": round(self.waited_s, 2),
            "endpoint": self.endpoint.to_dict() if self.endpoint is not None else None,
            "diagnosis": [f.to_dict() for f in self.findings],
        }


class _RunReader:
    """What the job output and the current run's server logs (every rank's) gained since the last look."""

    def __init__(self, job: Job, cwd: Path | None):
        self.job, self.cwd = job, cwd
        self.report = rundir.LauncherReport()
        self.out = Tail(job.files.job_out)
        self.held: list[str] = []  # launcher lines that may be an earlier run's, until the run is known
        self._run: int | None = None
        self._reset_log()

    def _reset_log(self) -> None:
        self.phases = RunPhases()
        self.launch_shown: tuple | None = None  # the launcher step last shown (ranks up, ranks started)

    @property
    def current_report(self) -> rundir.LauncherReport:
        """The launcher's lines of the current run (nothing while the top files are a previous run's)."""
        return rundir.LauncherReport() if self.job.files.previous_at_top else self.report

    def read(self, environ, run_dir_override) -> tuple[list[str], bool]:
        """(launcher lines to show, whether a run started in the job output); reads every rank's log."""
        job, info = self.job, self.job.info
        if self.out.path is None or (not self.out.path.exists() and info is not None):
            self.out.path = rundir.job_output_path(job.job_id, info, self.cwd or Path.cwd())
        lines = self.out.lines()  # an unfinished last line waits for its newline
        started = False
        for kind, line in self.report.feed_lines(lines):
            if kind == joblines.STAGE.name and joblines.RUN_DIR.match(line):
                started = True
                self.held = []  # what came before is an earlier run's
            elif kind in (joblines.WARN.name, joblines.ERROR.name):
                self.held.append(joblines.line(kind, line))
        if job.files.run_dir is None:
            if self.report.run_dir:
                job.update(info, rundir.JobFiles(job.job_id, job.files.job_out, Path(self.report.run_dir)))
            else:
                job.update(info, locate_job(job.job_id, info, environ=environ, cwd=self.cwd,
                                            run_dir=run_dir_override).files)
        shown: list[str] = []
        if not job.files.previous_at_top:
            shown, self.held = self.held, []
        run = None if job.files.previous_at_top else job.restart
        if run != self._run:  # another run is current now: its logs and phases start afresh
            self._run = run
            self._reset_log()
        if not job.files.previous_at_top:
            self.phases.read(job.files)
        return shown, started

    def _shape(self) -> tuple[int | None, set[int] | None]:
        report, launch = self.current_report, self.job.files.launch()
        info = self.job.info
        total = run_total(report, launch, info.nodes if info is not None else None)
        shape = launch.shape if launch is not None else None
        for line in report.topology:
            if line.startswith("shape="):
                shape = shape or line.split()[0].partition("=")[2]
        return total, serving_ranks(shape, total or 1)

    def current(self) -> RankProgress | None:
        total, serving = self._shape()
        return self.phases.current(total, serving)

    def steps(self) -> list[RankProgress | None]:
        """What to show since the last look, in order: the launcher's step (as ``None``) when it moved and
        no phase was shown yet, then every phase passed on the way."""
        total, serving = self._shape()
        report = self.current_report
        launch = (len(report.ranks_up), report.ranks_started)
        first = not self.phases.shown_any
        phase_steps: list[RankProgress | None] = list(self.phases.steps(total, serving))
        if phase_steps and first and any(launch) and launch != self.launch_shown:
            phase_steps.insert(0, None)  # "all N ranks started" came with the first phase: shown first
        self.launch_shown = launch
        return phase_steps

    def finish(self) -> None:
        rest = self.out.rest()
        if rest:
            self.report.feed_lines([rest])
        self.phases.finish()


def wait_for(job_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0,
             on_event: Callable[[WaitEvent], None] | None = None, run_dir: str | None = None,
             environ: Mapping[str, str] | None = None, cwd: Path | None = None,
             clock: Clock | None = None, outage_s: float = SLURM_OUTAGE_S) -> WaitResult:
    """Poll until the current run's ``endpoint.json`` exists while the job runs and no rank has exited
    (live), Slurm says the job ended, or ``timeout_s`` passes. Files are looked at every
    ``min(poll_s, 0.25)`` s, Slurm every ``poll_s`` s. Every step of the startup is reported in order,
    also those passed between two looks and those reached just before the end.

    Slurm not answering, from the first look on, is ridden out for ``outage_s`` seconds (said once per
    outage as a ``slurm-silent`` event); longer, it ends the wait with a ``SlurmUnreachable`` (exit 75)."""
    emit = on_event or (lambda event: None)
    clock = clock or Clock()

    def silent_at_first(text: str) -> None:
        emit(WaitEvent("slurm-silent", None, rundir.LauncherReport(), text=text))

    first_outage_s = outage_s if timeout_s is None else min(outage_s, timeout_s)  # the budget bounds it too
    job = find_job(job_id, run_dir=run_dir, environ=environ, cwd=cwd, outage_s=first_outage_s, clock=clock,
                   on_silent=silent_at_first)
    watcher = JobWatcher(job, poll_s=poll_s, step_s=min(poll_s, FILE_STEP_S), clock=clock, outage_s=outage_s,
                         locate_kw={"environ": environ, "cwd": cwd, "run_dir": run_dir})
    reader = _RunReader(job, cwd)

    def show_steps(exits, elapsed) -> bool:
        steps = reader.steps()
        for step in steps:
            emit(WaitEvent("state", job, reader.current_report, step, exits, elapsed))
        return bool(steps)

    for tick in watcher.ticks():
        if tick.slurm_silent:
            emit(WaitEvent("slurm-silent", job, reader.current_report, text=tick.slurm_silent))
        shown, started = reader.read(environ, run_dir)
        for line in shown:
            emit(WaitEvent("launcher", job, reader.current_report, text=line))
        info = job.info
        if started and info is not None and info.pending:
            watcher.ask_soon()  # the job writes, so it runs: ask Slurm again now rather than show PENDING
        elapsed = since(info.start_time) if info is not None and info.running else None
        elapsed = elapsed if elapsed is not None else tick.elapsed_s
        if watcher.ended:
            for line in reader.read(environ, run_dir)[0]:  # the launcher's last words
                emit(WaitEvent("launcher", job, reader.current_report, text=line))
            reader.finish()
            stale = job.files.previous_at_top
            exits = job.files.rank_exits()
            if not stale:
                show_steps(exits, elapsed)  # the phases reached before the end are shown too
            return WaitResult("ended", job, reader.current_report, None if stale else reader.current(), None,
                              tick.elapsed_s, findings=[] if stale else diagnose_job(job), rank_exits=exits)
        exits = job.files.rank_exits()
        if info is not None and info.running and info.state != "COMPLETING":
            ep = job.files.endpoint()
            if ep is not None and not _ending(exits, ep):
                show_steps(exits, elapsed)  # every phase up to now, then live
                emit(WaitEvent("live", job, reader.current_report, reader.current(), exits, elapsed))
                return WaitResult("live", job, reader.current_report, reader.current(), ep, tick.elapsed_s)
        if not show_steps(exits, elapsed):
            emit(WaitEvent("state", job, reader.current_report, reader.current(), exits, elapsed))
        if timeout_s is not None and tick.elapsed_s >= timeout_s:
            return WaitResult("timeout", job, reader.current_report, reader.current(), None, tick.elapsed_s,
                              rank_exits=exits)
    raise AssertionError("unreachable")  # pragma: no cover


def _ending(exits: dict, endpoint: rundir.EndpointRecord) -> bool:
    """A rank exited that is not a replica the launcher dropped (those end alone, the job serves on)."""
    return bool(set(exits) - endpoint.dead_ranks)


def diagnose_job(job: Job) -> list:
    """Findings of the knowledge base on the job's logs; ``[]`` when the diagnosis itself cannot run."""
    try:
        from ..diagnose import diagnose, input_order, read_log
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
