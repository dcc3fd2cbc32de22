"""The one polling loop of the operator commands: ask Slurm every ``poll_s`` seconds, let the caller look
at files every ``step_s`` seconds, ride out a controller that does not answer for a while.

``wait`` and ``logs --follow`` both run on a ``JobWatcher``. The clock and the sleep are injected, so a
test drives the loop without real time passing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from .. import slurm
from ..errors import SlurmError, SlurmUnreachable
from ..job import SLURM_OUTAGE_S, Clock, Job, locate_job, outage_error

__all__ = ["SLURM_OUTAGE_S", "Clock", "JobWatcher", "Tick"]


@dataclass
class Tick:
    """One turn of the loop: when, and what Slurm said this turn (``slurm_silent`` set once per outage)."""

    now: float
    elapsed_s: float
    asked_slurm: bool
    slurm_silent: str | None = None


@dataclass
class JobWatcher:
    """Follows ``job``: every ``ticks()`` turn asks Slurm when due (updating ``job.info`` and which run is
    current), then yields so the caller reads files; sleeps ``step_s`` between turns."""

    job: Job
    poll_s: float = 1.0
    step_s: float = 0.25
    clock: Clock = field(default_factory=Clock)
    outage_s: float = SLURM_OUTAGE_S
    locate_kw: dict = field(default_factory=dict)  # how to find the run directory again (environ, cwd, run_dir)

    def __post_init__(self) -> None:
        self.t0 = self.clock.monotonic()
        self._next_slurm = self.t0 + self.poll_s
        self._failing_since: float | None = None

    @property
    def ended(self) -> bool:
        """Slurm says the job ended, or no longer knows it."""
        return self.job.info is None or self.job.info.finished

    def ask_soon(self) -> None:
        """Ask Slurm on the next turn rather than after ``poll_s`` (the job shows signs of change)."""
        self._next_slurm = self.clock.monotonic()

    def ticks(self) -> Iterator[Tick]:
        while True:
            yield self.turn()
            self.clock.sleep(self.step_s)

    def turn(self) -> Tick:
        now = self.clock.monotonic()
        tick = Tick(now, now - self.t0, asked_slurm=False)
        if now >= self._next_slurm:
            self._next_slurm = now + self.poll_s
            try:
                info = slurm.job_info(self.job.job_id, run=slurm.run)
            except SlurmError as err:  # a busy or restarting slurmctld must not end a long watch
                if self._failing_since is None:
                    self._failing_since = now
                    tick.slurm_silent = err.message
                silent_s = self.clock.monotonic() - self._failing_since
                if silent_s > self.outage_s:
                    raise outage_error(err, silent_s) if isinstance(err, SlurmUnreachable) else err
            else:
                self._failing_since = None
                tick.asked_slurm = True
                files = self.job.files
                if files.run_dir is None or not files.run_dir.is_dir():
                    files = locate_job(self.job.job_id, info, **self.locate_kw).files
                self.job.update(info, files)
        return tick
