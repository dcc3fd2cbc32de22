"""A successor past the walltime: a chain of jobs that hands the endpoint over before each one's limit.

With ``SUCCESSORS=N`` (a launch key, default 0) a job that goes live submits, once, a successor: the
same job script (``job.sh`` of its run directory) with the same time limit and
``--dependency=after:<this job>+<minutes>``, so Slurm starts it that many minutes after this job
started. The minutes are the time limit less a lead: twice this job's own time to live plus a margin
for the scheduler, which starts an eligible job up to a minute or two late. The successor carries
``ENVLAYERS_CHAIN_LEFT`` (one less) and ``ENVLAYERS_PREDECESSOR`` in its environment, so the chain
stops after N successors. Once the successor's ``endpoint.json`` exists, this job drains for
``SUCCESSOR_DRAIN_S`` (a launch key, default 60) and ends on its own, reporting the handover.

The successor keeps what the submission chose: the job script carries the ``#SBATCH`` recipe (nodes,
GPUs per node, tasks, job name, output), and what Slurm says this job runs with is passed on the
command line, since it may have come from ``sbatch`` options or ``SBATCH_*`` variables that the
job script does not repeat: the partition, the account, the QOS, the reservation and the working
directory. A per-job key (``SERVER_API_KEY_FILE=generate``) is inherited: the successor copies this
job's ``api-key`` into its own run directory (``ENVLAYERS_CHAIN_KEY_FILE``), so clients keep their key.

Each job records its place in the chain in its run directory: ``chain.json`` (``predecessor``,
``successor``, ``dependency``, ``left``), which ``status`` shows.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Mapping

from .. import keys as keytable
from .. import slurm
from ..joblines import STAGE, WARN
from ..rundir import API_KEY, CHAIN, ENDPOINT, JOB_SH, ChainRecord, read_endpoint, write_api_key, write_json

QUEUE_MARGIN_S = 120

# The chain's variables: set by a job in its successor's (and its pool replicas') sbatch environment, never by a
# layer; each name is spelled here only.
CHAIN_LEFT = "ENVLAYERS_CHAIN_LEFT"  # successors still to submit after the job that reads it
PREDECESSOR = "ENVLAYERS_PREDECESSOR"  # the job id of the link before
CHAIN_KEY_FILE = "ENVLAYERS_CHAIN_KEY_FILE"  # the predecessor's per-job key file, copied by the successor
CHAIN_VARIABLES = (CHAIN_LEFT, PREDECESSOR, CHAIN_KEY_FILE)


class HandedOver(Exception):
    """The successor is live and this job drained: the orderly end of a link in the chain."""


def drain_s(keys: Mapping[str, str]) -> int:
    """``SUCCESSOR_DRAIN_S``: seconds this job serves on once its successor is live (``envlayers.keys``)."""
    return keytable.value(keys, "SUCCESSOR_DRAIN_S")


def chain_left(keys: Mapping[str, str], environ: Mapping[str, str]) -> int:
    """Successors still to submit: ``ENVLAYERS_CHAIN_LEFT`` set by the predecessor, else ``SUCCESSORS``. Never
    more than ``SUCCESSORS``: every job of a chain runs the same job.sh, so a count above it did not come from a
    predecessor (a layer may not set it; an export in the submitting shell might) and cannot lengthen the chain."""
    n = keytable.value(keys, "SUCCESSORS")
    left = environ.get(CHAIN_LEFT, "").strip()  # set by the predecessor's sbatch, never by a layer
    return min(int(left), n) if left.isdigit() else n


def dependency(job_id: str, time_limit_s: int, startup_s: float) -> tuple[str, int]:
    """(``after:<job>+<minutes>``, minutes): start the successor ``minutes`` after this job started,
    a lead of ``2 x startup + QUEUE_MARGIN_S`` before this job's limit (whole minutes, at least 0)."""
    lead = 2 * startup_s + QUEUE_MARGIN_S
    minutes = max(0, int((time_limit_s - lead) // 60))
    return f"after:{job_id}+{minutes}", minutes


def inherited_key(run_dir: Path, environ: Mapping[str, str], say: Callable[[str], None]) -> tuple[str, str] | None:
    """A successor's per-job key: the predecessor's (``ENVLAYERS_CHAIN_KEY_FILE``), copied 0600 to
    ``run_dir/api-key``. ``None`` (with a warning when the file was named) when there is none to take."""
    src = (environ.get(CHAIN_KEY_FILE) or "").strip()
    if not src:
        return None
    from ..errors import EnvLayersError

    try:
        from ..apikey import read_key

        # the predecessor wrote it 0600 in its own run directory: a file of someone else's, or one others can
        # read or write, is not the chain's key (another user could know it)
        key = read_key(src, named_by=CHAIN_KEY_FILE, owner=os.getuid())
        mode = os.stat(src).st_mode & 0o777
        if mode & 0o077:
            raise EnvLayersError(f"others may read or write it (mode {mode:04o})", where=src)
    except EnvLayersError as err:
        say(WARN.line(f"cannot take the chain's API key from {src} ({err.message}): a new key is generated; "
                      f"clients of job {environ.get(PREDECESSOR) or '?'} must take it from `env_layers connect`"))
        return None
    path = write_api_key(run_dir, key)
    say(STAGE.line(f"the chain's API key (job {environ.get(PREDECESSOR) or '?'}'s, {src}) "
                   f"copied to {path} (mode 0600): clients keep their key"))
    return str(path), key


class Chain:
    """The job's link in the chain: submits the successor once live, hands over once it is live."""

    def __init__(self, job_id: str, run_dir: Path, left: int, drain_s: int, *, say: Callable[[str], None],
                 environ: Mapping[str, str], clock: Callable[[], float] = time.monotonic,
                 run: Callable | None = None, job_fields: Callable[[str], dict[str, str]] | None = None):
        self.job_id, self.run_dir, self.left, self.drain_s, self.say = job_id, run_dir, left, drain_s, say
        self.environ, self.clock = dict(environ), clock
        self.run = run or (lambda argv, env: slurm.run(argv, env=env, timeout_s=60))
        self.job_fields = job_fields or slurm.job_fields_or_none
        self.record = ChainRecord(predecessor=self.environ.get(PREDECESSOR) or None, left=left)
        self.drain_from: float | None = None
        self._write()

    def _write(self) -> None:
        try:
            write_json(self.run_dir / CHAIN, self.record.to_dict())
        except OSError:
            pass

    def went_live(self, startup_s: float) -> None:
        if self.left <= 0:
            if self.record.predecessor:
                self.say(STAGE.line(f"last job of the chain (after job {self.record.predecessor}): "
                                    "no successor"))
            return
        fields = self.job_fields(self.job_id)
        limit = _limit_s(fields.get("TimeLimit"))
        if not limit:
            self.say(WARN.line("SUCCESSORS is set but the job has no time limit Slurm reports: no successor"))
            return
        dep, minutes = dependency(self.job_id, limit, startup_s)
        env = {k: v for k, v in self.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        env.update({CHAIN_LEFT: str(self.left - 1), PREDECESSOR: self.job_id})
        env.pop(CHAIN_KEY_FILE, None)
        if (self.run_dir / API_KEY).is_file():  # a per-job key: the successor serves with the same one
            env[CHAIN_KEY_FILE] = str(self.run_dir / API_KEY)
        argv = slurm.dependent_sbatch_argv(self.run_dir / JOB_SH, dep, limit, slurm.resubmit_options(fields))
        try:
            proc = self.run(argv, env)
        except (OSError, slurm.SlurmError) as err:
            self.say(WARN.line(f"could not submit the successor: {err}"))
            return
        succ = slurm.parse_parsable(proc.stdout) if proc.returncode == 0 else None
        if succ is None:
            said = (proc.stderr or "").strip().splitlines()
            self.say(WARN.line(f"could not submit the successor: {said[-1] if said else proc.returncode}"))
            return
        self.record.successor, self.record.dependency = succ, dep
        self._write()
        self.say(STAGE.line(f"successor job {succ} submitted ({dep}: starts {minutes} min after this job "
                            f"started, {self.left - 1} more after it); this job ends once it is live"))
        from .. import shell

        self.say(STAGE.line(f"successor job {succ}: {shell.words(argv)}"
                            + ("; it keeps this job's API key" if CHAIN_KEY_FILE in env else "")))

    def tick(self) -> None:
        """Raise HandedOver once the successor's endpoint is live and the drain time passed."""
        succ = self.record.successor
        if not succ:
            return
        if self.drain_from is None:
            if not (self.run_dir.parent / succ / ENDPOINT).is_file():
                return
            self.drain_from = self.clock()
            ep = read_endpoint(self.run_dir.parent / succ)
            urls = "?" if ep is None else " ".join(ep.base_urls)
            self.say(STAGE.line(f"successor job {succ} is live at {urls}; this job drains for {self.drain_s}s "
                                "and ends"))
        elif self.clock() - self.drain_from >= self.drain_s:
            raise HandedOver(f"handed over to successor job {succ}")


def _limit_s(text: str | None) -> int | None:
    from ..durations import parse_duration

    return parse_duration(text)

