"""The job's timeline for the GPU-hour accounting: when the job started, when every rank had started, when
rank 0's log entered each startup phase, when the endpoint went live, when the last request was served,
and how it ended; kept in ``accounting.json`` (``rundir.ACCOUNTING``, split by ``envlayers.accounting``) so
``status`` shows the split while the job runs. Wall-clock times throughout (``wall``); ``clock`` is the
monotonic clock the supervision loop passes in.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping

from ..rundir import ACCOUNTING, AccountingRecord, RecordWriter, server_log_name
from ..tail import Tail
from .prepare import LaunchPlan


class Timeline:
    def __init__(self, lp: LaunchPlan, records: RecordWriter, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, job_start: float | None = None):
        self.lp, self.records, self.wall = lp, records, wall
        self.offset = wall() - clock()  # monotonic -> wall clock
        self.job_start = job_start if job_start is not None else wall()
        self.ranks_up_at: float | None = None
        self.phases: dict[str, float] = {}
        self.live_at: float | None = None
        self._log: Tail | None = None
        self._phase_tracker = None

    @property
    def gpus(self) -> int:
        return self.lp.plan.nodes * self.lp.plan.gpus_per_node

    def wall_of(self, mono: float) -> float:
        return round(mono + self.offset, 3)

    def ranks_started(self, now: float) -> None:
        if self.ranks_up_at is None:
            self.ranks_up_at = self.wall_of(now)

    def went_live(self, now: float) -> None:
        self.read_phases(now)
        self.live_at = self.wall_of(now)

    def read_phases(self, now: float) -> None:
        """Note the time of every startup phase rank 0's log entered since the last call."""
        from ..phases import PhaseTracker

        if self._phase_tracker is None:
            self._phase_tracker = PhaseTracker()
        for phase in self._phase_tracker.feed_lines(self.log.lines()):
            self.phases.setdefault(phase.name, self.wall_of(now))

    @property
    def log(self) -> Tail:
        """The reader of rank 0's log: its phases until live, then the gateway's lines (``GatewayRelay``)."""
        if self._log is None:
            self._log = Tail(self.lp.run_dir / server_log_name(0), chunk=1 << 20)
        return self._log

    def record(self, tracker, stop_after_s: float | None, end_wall: float | None = None,
               died_wall: float | None = None) -> AccountingRecord:
        """The timeline; ``tracker``: the idle tracker once live (``launch.idle.IdleTracker``, else None)."""
        t = tracker
        return AccountingRecord(
            job_id=self.lp.job_id, restart=self.lp.restart, gpus=self.gpus, nodes=self.lp.plan.nodes,
            shape=self.lp.plan.shape, engine=self.lp.engine, model=self.lp.model, served=self.lp.served,
            job_start=round(self.job_start, 3), ranks_up_at=self.ranks_up_at, phases=self.phases,
            live_at=self.live_at,
            last_request_at=self.wall_of(t.last_request_at) if t and t.last_request_at is not None else None,
            live=t.to_dict() if t else None, idle_stop_after_s=stop_after_s, died_at=died_wall, ended_at=end_wall)

    def write(self, tracker, stop_after_s: float | None, *, final: bool, end_wall: float | None = None,
              died_wall: float | None = None, how: str | None = None) -> None:
        """accounting.json: the timeline and its split in GPU-hours (``envlayers.accounting``)."""
        from ..accounting import split

        record = self.record(tracker, stop_after_s, end_wall, died_wall)
        record.final, record.how = final, how
        record.split = split(record.to_dict(), now=self.wall())
        self.records.write_json(self.lp.run_dir / ACCOUNTING, record.to_dict())


def job_start_time(environ: Mapping[str, str]) -> float | None:
    """SLURM_JOB_START_TIME (epoch seconds; set by Slurm in the job's environment), else None."""
    raw = environ.get("SLURM_JOB_START_TIME", "")
    return float(raw) if raw.strip().isdigit() else None
