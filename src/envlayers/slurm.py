"""Talking to Slurm: every Slurm command line the project runs or prints, pure parsers of Slurm's
output, and one injectable runner.

The argv builders cover the submission (``sbatch``, a successor's dependent ``sbatch``), the job's own
steps (the ranks' ``srun``, one replica's, an ``srun --overlap`` step on one node for a tunnel or a
``podman stop``), the running job (``scontrol update`` to shrink it, ``squeue -s`` for its steps) and
what Slurm knows (``scontrol show``, ``squeue``, ``sacct``). Everything that touches Slurm goes through
``run`` (or a fake passed as ``run=``), so every other function here is testable by feeding text in.
No policy lives here: callers decide what a state means. Long-lived steps (the ranks, a tunnel) are
started by their owners with ``subprocess.Popen`` on an argv built here.

Slurm facts this module relies on (Slurm's sbatch, scontrol and squeue man pages):

- ``SLURM_TIME_FORMAT=standard`` is forced, since a site may set ``relative``.
- ``scontrol show job -o ID`` prints one line of ``Key=Value`` pairs; it knows a finished job only for
  ``MinJobAge`` seconds, after which ``sacct`` (full accounting) or ``sacct -c`` (job completion
  plugin only, as in the local lab) still can.
- ``sbatch --parsable`` prints ``jobid[;cluster]``.
- ``squeue -h -j ID -o %L`` prints the time left (``UNLIMITED``/``NOT_SET`` when there is no limit).
- A client command whose controller does not answer (slurmctld stopped, restarting or overloaded) exits
  non-zero after its own retries (about 18 s for a stopped one) with words like ``Unable to contact slurm
  controller (connect failure)`` or ``Socket timed out on send/recv operation``: that is a
  ``SlurmUnreachable``, never a refusal of the request.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from .durations import format_time_limit, parse_duration, parse_time  # Slurm's durations and times; slurm's API
from .errors import SlurmError, SlurmUnreachable

if TYPE_CHECKING:
    import subprocess

__all__ = [
    "RESUBMIT_OPTIONS", "TERMINAL_STATES", "WINDOW_FIELDS", "JobInfo", "SacctJob", "cancel",
    "dependent_sbatch_argv", "format_time_limit", "hostnames", "job_fields", "job_info", "list_jobs",
    "one_node_step_argv", "overlap_step_argv", "parse_duration", "parse_job_fields", "parse_parsable",
    "parse_partitions", "parse_scontrol_job", "parse_window", "partition_max_times", "ranks_step_argv",
    "remaining_s", "resubmit_options", "run", "sbatch_argv", "shrink_argv", "slurm_cancelled", "step_listed",
    "submit", "unreachable", "window_argv", "window_jobs",
]

TERMINAL_STATES: frozenset[str] = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE",
})

_Runner = Callable[..., "subprocess.CompletedProcess[str]"]

_CTLD_HINT = ("is slurmctld up and SLURM_CONF right? `scontrol ping` says "
              "(for the local lab: eval \"$(cluster/slurm-lab env)\")")
# What Slurm's client commands say when the controller does not answer (slurm_strerror's words)
_OUTAGE_RE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|"
    r"Communication connection failure|Connection refused|connect failure|Connection timed out|"
    r"Transport endpoint is not connected|backup controller in standby mode|slurmctld.*not responding|"
    r"Unable to establish .*connection", re.I)
_NO_TOOLS_HINT = ("run this on a Slurm login node, or put Slurm's client tools on PATH "
                  "(for the local lab: eval \"$(cluster/slurm-lab env)\")")


def run(argv: Sequence[str], *, input: str | None = None, timeout_s: float = 30,
        env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run one Slurm client command: no shell, always a timeout, ``SLURM_TIME_FORMAT=standard``, stdin
    ``input`` or nothing (an ``srun`` step never reads the caller's terminal).

    ``env`` is the environment to run in (default: this process's), ``cwd`` the directory (scontrol
    leaves a resized job's scripts there). Returns the CompletedProcess (text, captured) whatever the
    exit status; callers read it. A missing binary is a ``SlurmError``; a command that does not answer
    in time a ``SlurmUnreachable``.
    """
    import subprocess

    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env, SLURM_TIME_FORMAT="standard")
    stdin = subprocess.DEVNULL if input is None else None
    try:
        return subprocess.run(argv, input=input, stdin=stdin, capture_output=True, text=True, timeout=timeout_s,
                              env=env, cwd=cwd, check=False)
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not on PATH", hint=_NO_TOOLS_HINT) from None
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(f"`{' '.join(argv)}` did not answer within {timeout_s:g}s",
                               hint="slurmctld may be down or overloaded; `scontrol ping` says which") from None


def unreachable(proc: subprocess.CompletedProcess) -> bool:
    """Whether a failed client command failed because the controller did not answer."""
    return proc.returncode != 0 and bool(_OUTAGE_RE.search((proc.stderr or "") + (proc.stdout or "")))


def _failure(proc: subprocess.CompletedProcess, message: str, hint: str | None = None) -> SlurmError:
    """The error for a failed client command: ``SlurmUnreachable`` (with the controller hint) when the
    controller did not answer, else a ``SlurmError`` with ``hint``."""
    if unreachable(proc):
        return SlurmUnreachable(message, hint=_CTLD_HINT)
    return SlurmError(message, hint=hint)


# --------------------------------------------------------------------------------- job records

@dataclass
class JobInfo:
    """One job as Slurm describes it. ``None`` means Slurm did not say (or said ``(null)``/``Unknown``).

    ``state`` is the bare state word (``RUNNING``, ``CANCELLED``; sacct's ``CANCELLED by 0`` -> ``CANCELLED``).
    ``exit_code`` is Slurm's ``code:signal`` text. ``time_left_s`` is the time left when the record was
    read (``None`` when unlimited, unknown, or the job has ended). Times are Slurm's ISO text.
    """

    job_id: str
    name: str | None = None
    state: str | None = None
    reason: str | None = None
    nodes: int = 0
    nodelist: str | None = None
    stdout: str | None = None
    workdir: str | None = None
    time_limit_s: int | None = None
    time_left_s: int | None = None
    start_time: str | None = None
    end_time: str | None = None
    exit_code: str | None = None
    user: str | None = None
    restarts: int | None = None  # scontrol's Restarts: how often Slurm requeued the job (None: not said)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING", "CONFIGURING")

    def to_dict(self) -> dict:
        return asdict(self)


_NULLS = frozenset({"", "(null)", "None", "none", "Unknown", "N/A", "n/a"})
_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_/:.]*=")


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return None if value in _NULLS else value


def _user(value: str | None) -> str | None:
    value = _clean(value)
    return value.split("(", 1)[0] if value else value  # "root(0)" -> "root"


def _state(value: str | None) -> str | None:
    value = _clean(value)
    return value.split()[0].rstrip("+") if value else value  # "CANCELLED by 0" -> "CANCELLED"


def _int(value: str | None, default: int = 0) -> int:
    value = _clean(value)
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _split_keyvalues(line: str) -> dict[str, str]:
    """``Key=Value Key=Value ...`` -> dict. A token without ``Key=`` continues the previous value,
    so a path with a space survives; values may contain ``=`` (``TRES=cpu=2,mem=2000M``)."""
    fields: dict[str, str] = {}
    last: str | None = None
    for token in line.strip().split(" "):
        if _KEY_RE.match(token):
            key, value = token.split("=", 1)
            fields[key] = value
            last = key
        elif last is not None:
            fields[last] += " " + token
    return fields


def parse_scontrol_job(text: str) -> JobInfo:
    """Parse ``scontrol show job -o ID`` output (the first record; one line per job).

    Also accepts the multi-line form without ``-o``. Raises ``SlurmError`` when there is no ``JobId=``.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = next((i for i, ln in enumerate(lines) if ln.startswith("JobId=")), None)
    if first is None:
        raise SlurmError("scontrol printed no job record", hint=f"Slurm answered: {text.strip()[:200]!r}")
    record_lines = [lines[first]]
    for ln in lines[first + 1:]:  # the multi-line form continues until the next record
        if ln.startswith("JobId="):
            break
        record_lines.append(ln)
    record = " ".join(record_lines)
    f = _split_keyvalues(record)
    state = _state(f.get("JobState"))
    limit_s = parse_duration(f.get("TimeLimit"))
    run_s = parse_duration(f.get("RunTime"))
    left_s: int | None = None
    if limit_s is not None and state not in TERMINAL_STATES:
        left_s = max(0, limit_s - (run_s or 0))
    return JobInfo(
        job_id=f["JobId"],
        name=_clean(f.get("JobName")),
        state=state,
        reason=_clean(f.get("Reason")),
        nodes=_int(f.get("NumNodes")),
        nodelist=_clean(f.get("NodeList")),
        stdout=_clean(f.get("StdOut")),
        workdir=_clean(f.get("WorkDir")),
        time_limit_s=limit_s,
        time_left_s=left_s,
        start_time=_clean(f.get("StartTime")),
        end_time=_clean(f.get("EndTime")),
        exit_code=_clean(f.get("ExitCode")),
        user=_user(f.get("UserId")),
        restarts=_count(f.get("Restarts")),
    )


# sacct: the same field list works with full accounting and with `-c` (job completion plugin)
_SACCT_FIELDS = ("JobID", "JobName", "State", "Reason", "NNodes", "NodeList", "Timelimit", "Start", "End",
                 "ExitCode", "User", "WorkDir")


def _sacct_argv(job_id: str, completion: bool) -> list[str]:
    argv = ["sacct"]
    if completion:
        argv.append("-c")
    return argv + ["-j", str(job_id), "-X", "-P", "-n", "-o", ",".join(_SACCT_FIELDS)]


def _parse_sacct(text: str, job_id: str) -> JobInfo | None:
    """Parse ``sacct -P -n -o <_SACCT_FIELDS>`` output; the record of ``job_id`` or ``None``."""
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < len(_SACCT_FIELDS):
            continue
        f = dict(zip(_SACCT_FIELDS, cols))
        if f["JobID"].strip() != str(job_id):
            continue
        return JobInfo(
            job_id=f["JobID"].strip(),
            name=_clean(f["JobName"]),
            state=_state(f["State"]),
            reason=_clean(f["Reason"]),
            nodes=_int(f["NNodes"]),
            nodelist=_clean(f["NodeList"]),
            stdout=None,  # sacct of this Slurm generation does not say
            workdir=_clean(f["WorkDir"]),
            time_limit_s=parse_duration(f["Timelimit"]),
            time_left_s=None,
            start_time=_clean(f["Start"]),
            end_time=_clean(f["End"]),
            exit_code=_clean(f["ExitCode"]),
            user=_user(f["User"]),
        )
    return None


_UNKNOWN_JOB_RE = re.compile(r"Invalid job id|does not exist|Job.*not found", re.I)


def _show_job_argv(job_id: str) -> list[str]:
    return ["scontrol", "show", "job", "-o", str(job_id)]


def parse_job_fields(text: str) -> dict[str, str]:
    """``scontrol show job -o ID`` output -> its ``Key=Value`` fields as Slurm printed them."""
    return _split_keyvalues(text)


def job_fields(job_id: str, run: _Runner = run) -> dict[str, str]:
    """The raw fields ``scontrol show job -o`` prints for ``job_id`` (``{}`` when it shows none)."""
    proc = run(_show_job_argv(job_id))
    return parse_job_fields(proc.stdout) if proc.returncode == 0 else {}


def job_fields_or_none(job_id: str) -> dict[str, str]:
    """:func:`job_fields`, and ``{}`` when Slurm does not answer either: for what a job passes on to the
    jobs it submits (a successor, a pool's replica), which then keep the job script's own settings."""
    try:
        return job_fields(job_id)
    except SlurmError:
        return {}


def job_info(job_id: str, run: _Runner = run) -> JobInfo | None:
    """The job's record: from ``scontrol show job -o`` while Slurm holds it, else from ``sacct``
    (full accounting) or ``sacct -c`` (job completion log), else ``None`` (no such job).

    A controller that does not answer is a ``SlurmUnreachable``, never "no such job".
    """
    job_id = str(job_id)
    proc = run(_show_job_argv(job_id))
    if proc.returncode == 0 and "JobId=" in proc.stdout:
        return parse_scontrol_job(proc.stdout)
    if proc.returncode != 0 and not _UNKNOWN_JOB_RE.search(proc.stderr + proc.stdout):
        raise _failure(proc, f"scontrol could not read job {job_id}: {_first_error(proc)}", hint=_CTLD_HINT)
    for completion in (False, True):
        acct = run(_sacct_argv(job_id, completion))
        if acct.returncode == 0:
            info = _parse_sacct(acct.stdout, job_id)
            if info is not None:
                return info
    return None


# --------------------------------------------------------------------------------- sacct: a time window

# the endpoint jobs of a window, for the GPU-hour report
WINDOW_FIELDS = ("JobID", "User", "State", "Start", "End", "ElapsedRaw", "NNodes", "AllocTRES")


@dataclass
class SacctJob:
    job_id: str
    user: str
    state: str
    start: float | None
    end: float | None
    elapsed_s: int
    nodes: int
    gpus: int | None  # gres/gpu in AllocTRES; None when the allocation names no GPU


def window_argv(name: str, since: float, user: str | None) -> list[str]:
    """``sacct`` for the jobs named ``name`` that ran since ``since`` (epoch seconds; local time, as sacct
    reads it), of ``user`` or (``None``) of every user."""
    from .durations import format_time

    start = format_time(since)
    argv = ["sacct", "-X", "-P", "-n", f"--name={name}", f"--starttime={start}", "--endtime=now",
            f"--format={','.join(WINDOW_FIELDS)}"]
    return argv + ([f"--user={user}"] if user else ["--allusers"])


def parse_window(text: str) -> list[SacctJob]:
    """:func:`window_argv`'s output (``sacct -X -P -n --format=<WINDOW_FIELDS>``) -> jobs."""
    jobs = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < len(WINDOW_FIELDS) or not parts[0].strip():
            continue
        jid, user, state, start, end, elapsed, nnodes, tres = parts[:len(WINDOW_FIELDS)]
        gpu = re.search(r"gres/gpu=(\d+)", tres)
        jobs.append(SacctJob(jid.strip(), user, state.split()[0] if state else "", parse_time(start), parse_time(end),
                             int(elapsed) if elapsed.isdigit() else 0, int(nnodes) if nnodes.isdigit() else 0,
                             int(gpu.group(1)) if gpu else None))
    return jobs


def window_jobs(name: str, since: float, user: str | None, run: _Runner = run) -> list[SacctJob]:
    """The jobs Slurm's accounting lists for :func:`window_argv`; a ``SlurmError`` with sacct's first line
    when it cannot (no accounting storage, no controller)."""
    proc = run(window_argv(name, since, user))
    if proc.returncode != 0:
        first = next((ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()), "")
        raise SlurmError(first or f"sacct exited with code {proc.returncode}")
    return parse_window(proc.stdout)


# --------------------------------------------------------------------------------- squeue

_SQUEUE_FIELDS = (("%i", "job_id"), ("%j", "name"), ("%T", "state"), ("%r", "reason"), ("%D", "nodes"),
                  ("%N", "nodelist"), ("%l", "time_limit"), ("%L", "time_left"), ("%S", "start_time"),
                  ("%e", "end_time"), ("%u", "user"), ("%Z", "workdir"))
_SQUEUE_SEP = "|"
_SQUEUE_FORMAT = _SQUEUE_SEP.join(code for code, _ in _SQUEUE_FIELDS)


def _list_jobs_argv(user: str | None, name: str | None) -> list[str]:
    argv = ["squeue", "-h", "-o", _SQUEUE_FORMAT]
    if name:
        argv.append(f"--name={name}")
    if user:
        argv += ["-u", user]
    return argv


def _parse_squeue(text: str) -> list[JobInfo]:
    jobs = []
    keys = [key for _, key in _SQUEUE_FIELDS]
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = line.split(_SQUEUE_SEP)
        if len(cols) < len(keys):
            continue
        # a workdir holding the separator: glue the tail back
        cols = cols[:len(keys) - 1] + [_SQUEUE_SEP.join(cols[len(keys) - 1:])]
        f = dict(zip(keys, cols))
        state = _state(f["state"])
        jobs.append(JobInfo(
            job_id=f["job_id"].strip(), name=_clean(f["name"]), state=state, reason=_clean(f["reason"]),
            nodes=_int(f["nodes"]), nodelist=_clean(f["nodelist"]), stdout=None, workdir=_clean(f["workdir"]),
            time_limit_s=parse_duration(f["time_limit"]), time_left_s=parse_duration(f["time_left"]),
            start_time=_clean(f["start_time"]), end_time=_clean(f["end_time"]), exit_code=None,
            user=_user(f["user"]),
        ))
    return jobs


def list_jobs(user: str | None = None, name: str | None = "serve-only", run: _Runner = run) -> list[JobInfo]:
    """Jobs Slurm still queues or runs, filtered by user (``None``: everyone) and job name."""
    proc = run(_list_jobs_argv(user, name))
    if proc.returncode != 0:
        raise _failure(proc, f"squeue failed: {_first_error(proc)}", hint=_CTLD_HINT)
    return _parse_squeue(proc.stdout)


def remaining_s(job_id: str, run: _Runner = run) -> int | None:
    """Seconds left in the job's allocation (``squeue -h -j ID -o %L``); ``None`` when unlimited,
    not set, or Slurm no longer lists the job."""
    proc = run(["squeue", "-h", "-j", str(job_id), "-o", "%L"])
    if proc.returncode != 0:
        return None
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return parse_duration(lines[0]) if lines else None


def step_listed(step_id: str, run: _Runner = run) -> bool | None:
    """Whether ``squeue -s`` still lists the step ``JOB.STEP`` (None: Slurm did not answer)."""
    job = step_id.split(".", 1)[0]
    try:
        proc = run(["squeue", "-h", "-s", "-j", job, "-o", "%i"])
    except SlurmError:
        return None
    if proc.returncode != 0:
        return None
    return step_id in proc.stdout.split()


# slurmstepd's words in a step's output when Slurm ends the step or its job (scancel, the time limit, a
# preemption, a node failure): `slurmstepd: error: *** STEP 5.2 ON n1 CANCELLED AT 2026-12-05T07:00:00
# DUE TO TIME LIMIT ***`
_CANCELLED_RE = re.compile(r"\*\*\* ((?:STEP|JOB) \S+ ON \S+ CANCELLED AT .*?) \*\*\*")


def slurm_cancelled(text: str) -> str | None:
    """slurmstepd's last "*** STEP|JOB ... CANCELLED AT ... ***" line in a step's output, without the stars;
    None when Slurm did not say it ended the step."""
    found = _CANCELLED_RE.findall(text)
    return found[-1] if found else None


def hostnames(nodelist: str | None, run: _Runner = run) -> list[str]:
    """Expand a Slurm node list (``n[1-3],gpu7``) with ``scontrol show hostnames``."""
    if not nodelist or not nodelist.strip():
        return []
    proc = run(["scontrol", "show", "hostnames", nodelist.strip()])
    if proc.returncode != 0:
        raise _failure(proc, f"cannot expand node list {nodelist!r}: {_first_error(proc)}")
    return [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]


def parse_node_addrs(text: str) -> dict[str, str]:
    """``scontrol show node -o`` output -> ``{NodeName: NodeAddr}``; a node without a NodeAddr
    (or with an empty one) is left out."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = _split_keyvalues(line)
        name, addr = _clean(fields.get("NodeName")), _clean(fields.get("NodeAddr"))
        if name and addr:
            out[name] = addr.split(" ")[0]
    return out


def node_addrs(names: Sequence[str], run: _Runner = run) -> dict[str, str]:
    """The NodeAddr Slurm has for each of ``names`` (``scontrol show node -o NAME``, one call per
    node); a node Slurm cannot show is left out, so the caller falls back to the name."""
    out: dict[str, str] = {}
    for name in names:
        proc = run(["scontrol", "show", "node", "-o", name])
        if proc.returncode == 0:
            out.update({k: v for k, v in parse_node_addrs(proc.stdout).items() if k == name})
    return out


@dataclass
class NodeState:
    """What Slurm says of one node: its state (``IDLE``, ``ALLOCATED``, ``DOWN+DRAIN``...) and the reason
    an operator or Slurm gave for it (None when there is none)."""

    name: str
    state: str
    reason: str | None


def parse_node_states(text: str) -> dict[str, NodeState]:
    """``scontrol show node -o`` output -> ``{NodeName: NodeState}`` (a line without a name is skipped)."""
    out: dict[str, NodeState] = {}
    for line in text.splitlines():
        fields = _split_keyvalues(line)
        name = _clean(fields.get("NodeName"))
        if name:
            out[name] = NodeState(name, _clean(fields.get("State")) or "?", _clean(fields.get("Reason")))
    return out


def node_states(names: Sequence[str], run: _Runner = run, timeout_s: float = 10) -> dict[str, NodeState]:
    """The state and reason Slurm has for each of ``names`` (``scontrol show node -o NAME``); a node Slurm
    cannot show is left out."""
    out: dict[str, NodeState] = {}
    for name in names:
        proc = run(["scontrol", "show", "node", "-o", name], timeout_s=timeout_s)
        if proc.returncode == 0:
            out.update({k: v for k, v in parse_node_states(proc.stdout).items() if k == name})
    return out


@dataclass
class StepInfo:
    """One step of a job as ``scontrol show step -o`` prints it."""

    step_id: str
    state: str
    nodelist: str | None
    tasks: int | None
    name: str | None


def parse_steps(text: str) -> list[StepInfo]:
    """``scontrol show step -o JOBID`` output -> the job's steps, in Slurm's order (``No job steps exist
    ...`` and other lines without a ``StepId=`` give none)."""
    steps = []
    for line in text.splitlines():
        fields = _split_keyvalues(line)
        step_id = _clean(fields.get("StepId"))
        if step_id:
            steps.append(StepInfo(step_id, _clean(fields.get("State")) or "?", _clean(fields.get("NodeList")),
                                  _count(fields.get("Tasks")), _clean(fields.get("Name"))))
    return steps


def job_steps(job_id: str, run: _Runner = run, timeout_s: float = 10) -> list[StepInfo] | None:
    """The steps Slurm lists for ``job_id`` (``scontrol show step -o JOBID``); None when it cannot say."""
    proc = run(["scontrol", "show", "step", "-o", str(job_id)], timeout_s=timeout_s)
    if proc.returncode != 0:
        return None
    return parse_steps(proc.stdout)


# --------------------------------------------------------------------------------- partitions

def parse_partitions(text: str) -> list[tuple[str, bool, int | None]]:
    """``scontrol show partition -o`` output -> ``(name, is_default, max_time_s)`` per partition, in order;
    ``max_time_s`` is ``None`` for ``UNLIMITED``/``INFINITE`` (no limit)."""
    out = []
    for line in text.splitlines():
        fields = _split_keyvalues(line)
        name = _clean(fields.get("PartitionName"))
        if name:
            out.append((name, fields.get("Default") == "YES", parse_duration(fields.get("MaxTime"))))
    return out


def partition_max_times(names: Sequence[str], run: _Runner = run) -> dict[str, int | None]:
    """The MaxTime (seconds; ``None``: no limit) Slurm has for each of ``names`` (``scontrol show partition
    -o NAME``), or for its default partition when ``names`` is empty. A partition Slurm does not know is
    left out (sbatch names it); a controller that does not answer is a ``SlurmUnreachable``."""
    out: dict[str, int | None] = {}
    for name in names or [None]:
        proc = run(["scontrol", "show", "partition", "-o", *([name] if name else [])])
        if proc.returncode != 0:
            if unreachable(proc):
                raise _failure(proc, f"scontrol could not show partition {name or '(default)'}: {_first_error(proc)}")
            continue
        for part, default, max_s in parse_partitions(proc.stdout):
            if part == name or (name is None and default):
                out[part] = max_s
    return out


# --------------------------------------------------------------------------------- sbatch / scancel

_JOBID_RE = re.compile(r"^(\d+)(?:_\d+)?(?:;(\S+))?$")


def parse_parsable(text: str) -> str | None:
    """``sbatch --parsable`` stdout -> job id (``1234`` from ``1234;cluster``), or None."""
    for line in reversed(text.splitlines()):
        m = _JOBID_RE.match(line.strip())
        if m:
            return m.group(1)
    return None


def _sbatch_hint(message: str) -> str:
    low = message.lower()
    if "account" in low or "association" in low:
        return "set SBATCH_ACCOUNT (or ask which account you may charge: `sacctmgr show assoc user=$USER`)"
    if "partition" in low:
        return "check SLURM_PARTITION in your layers against `sinfo -s`"
    if "time limit" in low:
        return "lower SERVE_TIME below the partition's MaxTime (`sinfo -o '%P %l'`)"
    if "node configuration" in low or "gres" in low or "gpu" in low:
        return "the partition cannot give that many nodes/GPUs; check `sinfo -o '%P %D %G'` and the plan's node count"
    return "SUBMIT=0 cluster/serve-only.sbatch prints the exact sbatch line; run it by hand to see Slurm's full answer"


def sbatch_argv(options: Sequence[str], script: str | os.PathLike | None = None) -> list[str]:
    """``sbatch --parsable OPTIONS [SCRIPT]`` (without ``script`` sbatch reads the job script on stdin)."""
    return ["sbatch", "--parsable", *[str(a) for a in options], *([str(script)] if script is not None else [])]


# scontrol's field -> the sbatch option that asks for it again
RESUBMIT_OPTIONS = (("Partition", "--partition"), ("Account", "--account"), ("QOS", "--qos"),
                    ("Reservation", "--reservation"), ("WorkDir", "--chdir"))


def resubmit_options(fields: Mapping[str, str]) -> list[str]:
    """The sbatch options that ask again for a job's partition, account, QOS, reservation and working
    directory (from :func:`parse_job_fields`; a field Slurm leaves unset is left out)."""
    return [f"{opt}={_clean(fields.get(name))}" for name, opt in RESUBMIT_OPTIONS if _clean(fields.get(name))]


def dependent_sbatch_argv(script: str | os.PathLike, dependency: str, time_limit_s: int,
                          options: Sequence[str] = ()) -> list[str]:
    """Submit the job script file ``script`` again, after ``dependency`` (``after:<job>+<minutes>``), with
    the time limit ``time_limit_s`` and ``options``."""
    return sbatch_argv([f"--dependency={dependency}", f"--time={format_time_limit(time_limit_s)}", *options], script)


def pool_sbatch_argv(script: str | os.PathLike, time_limit_s: int | None, options: Sequence[str] = ()) -> list[str]:
    """Submit the job script file ``script`` again as one replica of an elastic pool: one node, the time
    limit ``time_limit_s`` (None: the script's own), and ``options`` (:func:`resubmit_options`)."""
    limit = [] if time_limit_s is None else [f"--time={format_time_limit(time_limit_s)}"]
    return sbatch_argv(["--nodes=1", *limit, *options], script)


def submit(argv_extra: Sequence[str], script: str, run: _Runner = run) -> str:
    """Submit ``script`` (the job script text, on stdin) with ``sbatch --parsable <argv_extra>``.

    Returns the job id. A refusal is a ``SlurmError`` carrying sbatch's own words and a hint.
    """
    proc = run(sbatch_argv(argv_extra), input=script)
    if proc.returncode != 0:
        message = _first_error(proc, prefer="submission failed")
        if unreachable(proc):
            raise SlurmUnreachable(f"sbatch could not reach Slurm: {message}",
                                   hint="`scontrol ping` says whether slurmctld is up; before submitting again, "
                                        "`squeue --me` shows whether a submission whose answer was lost went through")
        raise SlurmError(f"sbatch refused the job: {message}", hint=_sbatch_hint(message))
    job_id = parse_parsable(proc.stdout)
    if job_id is None:
        raise SlurmError(f"sbatch printed no job id (stdout: {proc.stdout.strip()[:200]!r})",
                         hint="check `squeue --me`; the job may have been submitted anyway")
    return job_id


_CANCEL_OK_RE = re.compile(r"already completing or completed|Invalid job id", re.I)


def cancel(job_id: str, run: _Runner = run, signal: str | None = None) -> None:
    """``scancel [--signal=SIG] ID``. A job that already ended or is unknown is not an error."""
    argv = ["scancel"]
    if signal:
        argv.append(f"--signal={signal}")
    argv.append(str(job_id))
    proc = run(argv)
    if proc.returncode != 0 and not _CANCEL_OK_RE.search(proc.stderr + proc.stdout):
        raise _failure(proc, f"scancel {job_id} failed: {_first_error(proc)}",
                       hint="you can cancel only your own jobs; `squeue -j ID -o %u` shows the owner")


# --------------------------------------------------------------------------------- a running job

def ranks_step_argv(nodes: int, cpus_per_task: str, edf: str | None, ranks_sh: str,
                    container: Sequence[str] = ()) -> list[str]:
    """The job's srun step that starts one rank per node: every CPU of the node for the rank, the job ends
    when a rank fails (--kill-on-bad-exit), and the EDF (or Pyxis's ``container`` options) when the ranks run
    in a container."""
    n = str(nodes)
    argv = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", f"--cpus-per-task={cpus_per_task}",
            "--kill-on-bad-exit=1"]
    if edf:
        argv.append(f"--environment={edf}")
    return argv + list(container) + ["bash", ranks_sh]


def one_node_step_argv(step: Sequence[str], node: str) -> list[str]:
    """:func:`ranks_step_argv` for one replica: one node (``--nodelist``), one task; the rest unchanged."""
    out = []
    for word in step:
        if word.startswith("--nodes="):
            out += ["--nodes=1", f"--nodelist={node}"]
        elif word.startswith("--ntasks="):
            out.append("--ntasks=1")
        else:
            out.append(word)
    return out


def shrink_argv(job_id: str, keep: Sequence[str]) -> list[str]:
    """``scontrol update`` that shrinks a running job to the nodes in ``keep``."""
    return ["scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(keep)}"]


def overlap_step_argv(job_id: str, node: str, command: Sequence[str], *, options: Sequence[str] = ()) -> list[str]:
    """A one-task step of the running job ``job_id`` on ``node`` that shares the job's resources
    (``srun --overlap``), running ``command``; ``options`` are more srun options (``--gres=none``...)."""
    return ["srun", "--overlap", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            *options, *command]


def _first_error(proc: subprocess.CompletedProcess, prefer: str | None = None) -> str:
    """The most telling line Slurm wrote (stderr first), without the ``sbatch: error:`` prefix."""
    lines = [ln.strip() for ln in (proc.stderr or "").splitlines() + (proc.stdout or "").splitlines()
             if ln.strip()]
    if prefer:
        for ln in lines:
            if prefer in ln.lower():
                return _strip_prefix(ln)
    for ln in lines:
        if "error" in ln.lower():
            return _strip_prefix(ln)
    return _strip_prefix(lines[0]) if lines else f"exit status {proc.returncode}, no message"


def _strip_prefix(line: str) -> str:
    return re.sub(r"^\w+: error: ", "", line)


def _count(value: str | None) -> int | None:
    """A non-negative count Slurm printed (``Restarts=2`` -> 2), ``None`` when absent or not a number."""
    value = _clean(value)
    return int(value) if value is not None and value.isdigit() else None
