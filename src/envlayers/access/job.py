"""A job as the access commands hold it: the owner's ``envlayers.job.Job`` (found and owner-checked there)
and its tunnel record, settled (access.tunnelrecord).

Everything else a command asks of it (the endpoint, the served name, the URLs, the key file and the
key) is the handle's own: ``envlayers.job`` decides it once for every command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .. import rundir
from ..job import Job, owned_job
from .tunnelrecord import settle


@dataclass
class JobAccess:
    """What ``connect``, ``tunnel`` and ``release`` need to know about one job: its handle (``job``, whose
    attributes it answers for) and :meth:`tunnel`."""

    job: Job

    def __getattr__(self, name: str):
        if name == "job":  # not set yet (a copy being made): no handle to ask
            raise AttributeError(name)
        return getattr(self.job, name)

    def tunnel(self) -> rundir.TunnelRecord | None:
        """tunnel.json as the truth of now: a tunnel that ended with its job or step says closed
        (access.tunnelrecord), and the file is brought up to date."""
        return settle(rundir.read_tunnel(self.job.run_dir), self.job.run_dir, self.job.info)


def open_job(job_id: str, *, run_dir: str | None = None, environ: Mapping[str, str] | None = None,
             cwd: Path | None = None, uid: int | None = None) -> JobAccess:
    """Find the job, check the caller owns it (``job.owned_job``), and hold it with its tunnel record."""
    return JobAccess(owned_job(job_id, run_dir=run_dir, environ=environ, cwd=cwd, uid=uid))
