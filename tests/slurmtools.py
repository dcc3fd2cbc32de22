"""The tests' fake Slurm, in the two places the code meets Slurm:

- in process, as the ``run`` callable slurm.py's functions take (``slurm.run``'s signature):
  ``FakeRunner`` answers by argv prefix, ``FakeSlurm`` plays jobs whose state moves one step per
  ``scontrol show job`` (with ``scontrol_line`` as its answer);
- on PATH, for code run as a subprocess: ``slurm_bin`` writes stand-in clients into a folder, and
  ``NO_SUCH_JOB`` is the ``scontrol`` of a Slurm that knows no job (``sacct`` answering nothing).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class FakeRunner:
    """Answers by argv prefix (``answers``: prefix -> (rc, stdout, stderr)), else ``default``, else an error
    saying the call was not expected; records every call as (argv, input)."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str, str]] | None = None,
                 default: tuple[int, str, str] | None = None):
        self.answers = answers or {}
        self.default = default
        self.calls: list[tuple[list[str], str | None]] = []

    def __call__(self, argv, *, input=None, timeout_s=30):
        argv = list(argv)
        self.calls.append((argv, input))
        for prefix, (rc, out, err) in self.answers.items():
            if tuple(argv[:len(prefix)]) == prefix:
                return subprocess.CompletedProcess(argv, rc, out, err)
        if self.default is not None:
            rc, out, err = self.default
            return subprocess.CompletedProcess(argv, rc, out, err)
        return subprocess.CompletedProcess(argv, 1, "", f"{argv[0]}: error: unexpected call")

    @property
    def argvs(self) -> list[list[str]]:
        return [argv for argv, _ in self.calls]


def answering(stdout: str = "", rc: int = 0, stderr: str = "") -> FakeRunner:
    """A runner giving the same answer to every call."""
    return FakeRunner(default=(rc, stdout, stderr))


def scontrol_line(job_id: str, state: str = "RUNNING", *, reason: str = "None", workdir: str = "/tmp",
                  nodelist: str = "n1", exit_code: str = "0:0", limit: str = "04:00:00",
                  run_time: str = "00:01:00", user: str = "alice", restarts: int = 0) -> str:
    """What ``scontrol show job -o`` prints for a serve-only job."""
    return (f"JobId={job_id} JobName=serve-only UserId={user}(1000) GroupId={user}(1000) JobState={state} "
            f"Reason={reason} Dependency=(null) Requeue=1 Restarts={restarts} BatchFlag=1 Reboot=0 "
            f"ExitCode={exit_code} RunTime={run_time} TimeLimit={limit} "
            f"SubmitTime=2026-12-02T09:00:00 StartTime=2026-12-02T09:00:01 EndTime=2026-12-02T13:00:01 "
            f"Partition=mi300 NodeList={nodelist if state != 'PENDING' else ''} NumNodes=1 NumCPUs=8 "
            f"WorkDir={workdir} StdErr={workdir}/serve-only-{job_id}.out StdIn=/dev/null "
            f"StdOut={workdir}/serve-only-{job_id}.out Power=\n")


class FakeSlurm:
    """A scriptable Slurm: ``states[job]`` is a list of states, one consumed per scontrol call (the last
    one sticks); ``on_poll`` runs before each scontrol answer (to grow files as a job would). While the
    ``clock`` (clocktools.Clock) reads less than ``down_until`` the controller is stopped: each call fails
    and costs 18 s of that clock. Records every argv in ``calls``."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.states: dict[str, list[str]] = {}
        self.extra: dict[str, dict] = {}
        self.calls: list[list[str]] = []
        self.on_poll = None
        self.squeue_out = ""
        self.cancelled: list[str] = []
        self.after_cancel = "CANCELLED"
        self.down_until: float | None = None  # the controller is stopped until the fake clock reads this
        self.clock = None

    def __call__(self, argv, *, input=None, timeout_s=30):
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        done = lambda out, rc=0, err="": subprocess.CompletedProcess(argv, rc, out, err)  # noqa: E731
        if self.down_until is not None and self.clock.now < self.down_until:
            self.clock.now += 18.0  # what a stopped slurmctld costs a client command before it gives up
            return done("", 1, f"{argv[0]}: error: Unable to contact slurm controller (connect failure)\n")
        if argv[:3] == ["scontrol", "show", "job"]:
            job = argv[-1]
            if self.on_poll:
                self.on_poll(job, sum(1 for c in self.calls if c[:3] == ["scontrol", "show", "job"]))
            if job not in self.states:
                return done("", 1, "slurm_load_jobs error: Invalid job id specified\n")
            seq = self.states[job]
            state = seq.pop(0) if len(seq) > 1 else seq[0]
            return done(scontrol_line(job, state, workdir=str(self.workdir), **self.extra.get(job, {})))
        if argv[0] == "sacct":
            return done("", 1, "Slurm accounting storage is disabled\n")
        if argv[0] == "scancel":
            self.cancelled.append(argv[-1])
            if argv[-1] in self.states:
                self.states[argv[-1]] = ["COMPLETING", self.after_cancel]
            return done("")
        if argv[0] == "squeue":
            return done(self.squeue_out)
        return done("", 1, f"{argv[0]}: error: not faked\n")


NO_SUCH_JOB = {"scontrol": "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1", "sacct": "exit 0"}


def slurm_bin(bindir: Path, bodies: dict[str, str]) -> dict[str, str]:
    """Stand-in Slurm clients in ``bindir`` (name -> the body of a /bin/sh script, or a whole script when it
    starts with ``#!``); returns the environment that puts them first on PATH."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, body in bodies.items():
        (bindir / name).write_text(body if body.startswith("#!") else f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}
