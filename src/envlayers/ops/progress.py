"""Startup progress of every rank of a run, as a sequence of steps that never skips.

Each rank's ``server-<rank>.log`` is read as it grows (one ``PhaseTracker`` per rank). The run's progress
is the furthest phase any rank reached and how many ranks reached it (``loading weights 3/4 ranks``).
``ready`` counts only the ranks that serve the API (rank 0 of a pipeline; every replica), since the other
ranks of a pipeline never print it.

``steps()`` gives what changed since the last call, in order: when the furthest phase moved by more than
one phase between two looks, each phase passed on the way (that some rank reached) is its own step first.
Pure apart from reading the logs it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import rundir
from ..phases import PHASE_ORDER, Phase, PhaseTracker
from ..tail import Tail

LOG_FIRST_READ = 8 << 20  # a huge log: phases come from its last 8 MiB


@dataclass(frozen=True)
class RankProgress:
    """The furthest phase of a run, how many ranks reached it, out of how many ranks count for it."""

    phase: Phase
    ranks_at: int
    ranks_total: int
    by_rank: tuple[tuple[int, str], ...] = ()  # (rank, phase name) for every rank with a phase

    @property
    def label(self) -> str:
        return self.phase.label

    def text(self, details: bool = True) -> str:
        """``KV cache allocated (tokens=2243474)`` for one rank; ``loading weights 3/4 ranks`` for many."""
        if self.ranks_total <= 1:
            return self.phase.summary() if details else self.phase.label
        return f"{self.phase.label} {self.ranks_at}/{self.ranks_total} ranks"

    def to_dict(self) -> dict:
        data = self.phase.to_dict()
        data.update(ranks_at=self.ranks_at, ranks_total=self.ranks_total,
                    by_rank={str(r): name for r, name in self.by_rank})
        return data


class RunPhases:
    """The phases of every rank's server log of one run (``files``), read incrementally."""

    def __init__(self, files: rundir.JobFiles | None = None):
        self.files = files
        self.tails: dict[int, Tail] = {}
        self.trackers: dict[int, PhaseTracker] = {}
        self._shown: tuple[int, int, int] | None = None  # (phase index, ranks at, total) last given by steps()

    def read(self, files: rundir.JobFiles | None = None) -> bool:
        """Read what every rank's log gained; whether any rank reached a new phase."""
        if files is not None:
            self.files = files
        if self.files is None:
            return False
        logs = dict(self.files.server_logs())
        zero = self.files.server_log(0)
        if zero is not None and 0 not in logs:
            logs[0] = zero  # not there yet: its tail reads nothing until it appears
        moved = False
        for rank, path in logs.items():
            if rank not in self.tails:
                self.tails[rank] = Tail(path, max_first_read=LOG_FIRST_READ)
                self.trackers[rank] = PhaseTracker()
            if self.trackers[rank].feed_lines(self.tails[rank].lines()):
                moved = True
        return moved

    @property
    def shown_any(self) -> bool:
        """Whether ``steps()`` gave a phase already."""
        return self._shown is not None

    def finish(self) -> None:
        for rank, tracker in self.trackers.items():  # a last line without its newline counts too
            rest = self.tails[rank].rest()
            if rest:
                tracker.feed_lines([rest])

    def reached(self) -> dict[int, int]:
        """rank -> index in PHASE_ORDER of the furthest phase it reached (ranks with none left out)."""
        out = {}
        for rank, tracker in sorted(self.trackers.items()):
            if tracker.phases:
                out[rank] = max(PHASE_ORDER.index(p.name) for p in tracker.phases)
        return out

    def _phase(self, index: int) -> Phase:
        """The ``Phase`` record of phase ``index``: rank 0's when it reached it, else the lowest rank's."""
        name = PHASE_ORDER[index]
        for _rank, tracker in sorted(self.trackers.items()):
            phase = next((p for p in tracker.phases if p.name == name), None)
            if phase is not None:
                return phase
        raise KeyError(name)

    def _at(self, index: int, total: int, serving: set[int] | None, reached: dict[int, int]) -> RankProgress:
        if PHASE_ORDER[index] == "ready" and serving is not None:
            count = sum(1 for r, i in reached.items() if i >= index and r in serving)
            total = max(len(serving), 1)
        else:
            count = sum(1 for i in reached.values() if i >= index)
        by_rank = tuple((r, PHASE_ORDER[i]) for r, i in reached.items())
        return RankProgress(self._phase(index), count, max(total, count), by_rank)

    def current(self, total: int | None = None, serving: set[int] | None = None) -> RankProgress | None:
        """The furthest phase now (``None`` before any rank reached one). ``total``: ranks of the run
        (default: the ranks with a log); ``serving``: the ranks that serve the API (default: all)."""
        reached = self.reached()
        if not reached:
            return None
        total = total or len(self.tails) or 1
        return self._at(max(reached.values()), total, serving, reached)

    def steps(self, total: int | None = None, serving: set[int] | None = None) -> list[RankProgress]:
        """What changed since the last call, in phase order: every phase passed on the way, then now."""
        now = self.current(total, serving)
        if now is None:
            return []
        index = PHASE_ORDER.index(now.phase.name)
        key = (index, now.ranks_at, now.ranks_total)
        if key == self._shown:
            return []
        reached = self.reached()
        start = self._shown[0] + 1 if self._shown is not None else 0
        out = []
        for i in range(start, index):
            if any(r >= i for r in reached.values()) and self._has(i):
                out.append(self._at(i, total or len(self.tails) or 1, serving, reached))
        out.append(now)
        self._shown = key
        return out

    def _has(self, index: int) -> bool:
        name = PHASE_ORDER[index]
        return any(any(p.name == name for p in t.phases) for t in self.trackers.values())


def read_run(files: rundir.JobFiles, total: int | None = None, serving: set[int] | None = None
             ) -> RankProgress | None:
    """The progress of a run read once, whole (``status``)."""
    phases = RunPhases(files)
    phases.read()
    phases.finish()
    return phases.current(total, serving)


def serving_ranks(shape: str | None, total: int) -> set[int] | None:
    """The ranks that serve the API: every replica; rank 0 of a pipeline; ``None`` (all) when unknown."""
    if shape == "replicas":
        return set(range(total))
    if shape in ("pipeline", "single"):
        return {0}
    return None


def run_total(report: rundir.LauncherReport, launch: rundir.LaunchRecord | None, nodes: int | None) -> int | None:
    """How many ranks the run has: the launcher's ``all N ranks started``, its nodes, Slurm's node count."""
    if report.ranks_started:
        return report.ranks_started
    if launch is not None and launch.nodes:
        return len(launch.nodes)
    if report.ranks_up:
        return max(len(report.ranks_up), nodes or 0)
    return nodes or None


__all__ = ["LOG_FIRST_READ", "RankProgress", "RunPhases", "read_run", "run_total", "serving_ranks"]
