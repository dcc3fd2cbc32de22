"""``wait``: follow a job until its endpoint is live, Slurm says it ended, or the budget is spent.

Returns a ``WaitResult`` and reports progress as ``WaitEvent`` records to a callback; turning them into
terminal lines is ``cli.ops_format``'s job. Live means: the job runs, the current run wrote
``endpoint.json``, and no rank of it has exited (a rank that exited means the launcher is ending the job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from .. import rundir
from ..errors import EnvLayersError
from ..phases import Phase, PhaseTracker
from .lookup import EXIT_ENDED, EXIT_LIVE, EXIT_TIMEOUT, TrackedJob, find_job, since
from .watch import Clock, JobWatcher

FILE_STEP_S = 0.25  # files are looked at at least this often
LOG_FIRST_READ = 8 << 20  # a huge rank-0 log: phases come from its last 8 MiB


@dataclass
class WaitEvent:
    """Something ``wait`` saw. ``kind``: ``"state"`` (the job's state now; ``phase`` set when a phase
    was reached), ``"launcher"`` (``text`` is an ``ENVLAYERS-WARN``/``ENVLAYERS-ERROR`` line of the current
    run) or ``"slurm-silent"`` (``text`` is why Slurm did not answer; said once per outage)."""

    kind: str
    job: TrackedJob
    report: rundir.LauncherReport
    phase: Phase | None = None
    rank_exits: dict[int, int | None] = field(default_factory=dict)
    elapsed_s: float | None = None
    text: str | None = None


@dataclass
class WaitResult:
    outcome: str  # "live" | "ended" | "timeout"
    job: TrackedJob
    report: rundir.LauncherReport
    phase: Phase | None
    endpoint: dict | None
    waited_s: float
    findings: list = field(default_factory=list)
    rank_exits: dict[int, int | None] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return {"live": EXIT_LIVE, "ended": EXIT_ENDED, "timeout": EXIT_TIMEOUT}[self.outcome]

    def to_dict(self) -> dict:
        from .status import launcher_end

        info = self.job.info
        return {
            "job_id": self.job.job_id, "outcome": self.outcome, "live": self.outcome == "live",
            "state": info.state if info else None, "reason": info.reason if info else None,
            "exit_code": info.exit_code if info else None,
            "restart": self.job.restart, "requeued": self.job.requeued,
            "phase": self.phase.to_dict() if self.phase else None,
            "rank_exits": {str(k): v for k, v in self.rank_exits.items()},
            "last_error": self.report.last_error, "warnings": self.report.warnings,
            "launcher": launcher_end(self.job) if self.outcome == "ended" else None,
            "run_dir": str(self.job.files.run_dir) if self.job.files.run_dir else None,
            "job_output": str(self.job.files.job_out) if self.job.files.job_out else None,
            "waited_s": round(self.waited_s, 2), "endpoint": self.endpoint,
            "diagnosis": [f.to_dict() for f in self.findings],
        }


class _RunReader:
    """What the job output and the current run's rank-0 log gained since the last look."""

    def __init__(self, job: TrackedJob, cwd: Path | None):
        self.job, self.cwd = job, cwd
        self.report = rundir.LauncherReport()
        self.out = rundir.FileTail(job.files.job_out)
        self.partial = ""
        self.held: list[str] = []  # launcher lines that may be an earlier run's, until the run is known
        self._run: int | None = None
        self._reset_log()

    def _reset_log(self) -> None:
        self.log = rundir.FileTail(None, max_first_read=LOG_FIRST_READ)
        self.tracker = PhaseTracker()

    @property
    def current_report(self) -> rundir.LauncherReport:
        """The launcher's lines of the current run (nothing while the top files are a previous run's)."""
        return rundir.LauncherReport() if self.job.files.previous_at_top else self.report

    def read(self, environ, run_dir_override) -> tuple[list[str], list[Phase], bool]:
        """(launcher lines to show, phases newly reached, whether a run started in the job output)."""
        job, info = self.job, self.job.info
        if self.out.path is None or (not self.out.path.exists() and info is not None):
            self.out.path = rundir.job_output_path(job.job_id, info, self.cwd or Path.cwd())
        text = self.partial + self.out.read()
        lines = text.split("\n")
        self.partial = lines.pop()  # an unfinished last line waits for its newline
        started = False
        for kind, line in self.report.feed_lines(lines):
            if kind == "STAGE" and line.startswith("run_dir="):
                started = True
                self.held = []  # what came before is an earlier run's
            elif kind in ("WARN", "ERROR"):
                self.held.append(f"ENVLAYERS-{kind}: {line}")
        if job.files.run_dir is None:
            if self.report.run_dir:
                job.update(info, rundir.JobFiles(job.job_id, job.files.job_out, Path(self.report.run_dir)))
            else:
                job.update(info, rundir.locate(job.job_id, info, environ=environ, cwd=self.cwd,
                                               run_dir=run_dir_override))
        shown: list[str] = []
        if not job.files.previous_at_top:
            shown, self.held = self.held, []
        run = None if job.files.previous_at_top else job.restart
        if run != self._run:  # another run is current now: its log and phases start afresh
            self._run = run
            self._reset_log()
        if self.log.path is None:
            self.log.path = job.files.server_log(0)
        chunk = self.log.read()
        return shown, (self.tracker.feed(chunk) if chunk else []), started

    def finish(self) -> None:
        if self.partial:
            self.report.feed_lines([self.partial])
            self.partial = ""
        self.tracker.flush()


def wait_for(job_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0,
             on_event: Callable[[WaitEvent], None] | None = None, run_dir: str | None = None,
             environ: Mapping[str, str] | None = None, cwd: Path | None = None,
             clock: Clock | None = None) -> WaitResult:
    """Poll until the current run's ``endpoint.json`` exists while the job runs and no rank has exited
    (live), Slurm says the job ended, or ``timeout_s`` passes. Files are looked at every
    ``min(poll_s, 0.25)`` s, Slurm every ``poll_s`` s."""
    emit = on_event or (lambda event: None)
    job = find_job(job_id, run_dir=run_dir, environ=environ, cwd=cwd)
    watcher = JobWatcher(job, poll_s=poll_s, step_s=min(poll_s, FILE_STEP_S), clock=clock or Clock(),
                         locate_kw={"environ": environ, "cwd": cwd, "run_dir": run_dir})
    reader = _RunReader(job, cwd)
    for tick in watcher.ticks():
        if tick.slurm_silent:
            emit(WaitEvent("slurm-silent", job, reader.current_report, text=tick.slurm_silent))
        shown, new_phases, started = reader.read(environ, run_dir)
        for line in shown:
            emit(WaitEvent("launcher", job, reader.current_report, text=line))
        info = job.info
        if started and info is not None and info.pending:
            watcher.ask_soon()  # the job writes, so it runs: ask Slurm again now rather than show PENDING
        if watcher.ended:
            reader.read(environ, run_dir)  # the launcher's last words
            reader.finish()
            stale = job.files.previous_at_top
            return WaitResult("ended", job, reader.current_report, None if stale else reader.tracker.last, None,
                              tick.elapsed_s, findings=[] if stale else diagnose_job(job),
                              rank_exits=job.files.rank_exits())
        exits = job.files.rank_exits()
        if info is not None and info.running and info.state != "COMPLETING":
            data = job.files.endpoint_data()
            if data and not _ending(exits, data):
                return WaitResult("live", job, reader.current_report, reader.tracker.last, data, tick.elapsed_s)
        elapsed = since(info.start_time) if info is not None and info.running else None
        elapsed = elapsed if elapsed is not None else tick.elapsed_s
        for phase in new_phases[:-1]:  # phases passed between two looks: each gets its event, in order
            emit(WaitEvent("state", job, reader.current_report, phase, exits, elapsed))
        emit(WaitEvent("state", job, reader.current_report, reader.tracker.last, exits, elapsed))
        if timeout_s is not None and tick.elapsed_s >= timeout_s:
            return WaitResult("timeout", job, reader.current_report, reader.tracker.last, None, tick.elapsed_s,
                              rank_exits=exits)
    raise AssertionError("unreachable")  # pragma: no cover


def _ending(exits: dict, endpoint: dict) -> bool:
    """A rank exited that is not a replica the launcher dropped (those end alone, the job serves on)."""
    from ..launch.replicas import dead_ranks

    return bool(set(exits) - dead_ranks(endpoint))


def diagnose_job(job: TrackedJob) -> list:
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
