"""Operating a launched endpoint job from its id, as data: one module per operation.

A job is looked up by the one handle, ``envlayers.job`` (a job id -> Slurm's record and the current run's
files); here: ``watch`` (the one polling loop, shared by ``wait`` and ``logs --follow``), ``progress``
(every rank's startup phases, as steps that never skip), ``wait``, ``status`` (also the shared words:
target, model id, served name, state, phase, url), ``stop``, ``logs``,
``probe`` (asking an endpoint whether it answers). Nothing here formats for a terminal: that is
``envlayers.cli.ops_format``.

Reads Slurm through ``slurm.run`` (looked up at call time, so tests can replace it) and never decides
failure from a log line: a job has failed when Slurm says it ended, a wait has failed when its budget is
spent. Log lines only explain.
"""

from __future__ import annotations

from .status import job_record, list_rows
from .stop import StopResult, stop_job
from .wait import EXIT_ENDED, EXIT_LIVE, EXIT_TIMEOUT, WaitEvent, WaitResult, wait_for

__all__ = [
    "EXIT_ENDED", "EXIT_LIVE", "EXIT_TIMEOUT", "StopResult", "WaitEvent", "WaitResult",
    "job_record", "list_rows", "stop_job", "wait_for",
]
