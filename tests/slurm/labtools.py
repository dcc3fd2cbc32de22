"""Helpers for tests that run real jobs on the local Slurm cluster started by ``cluster/slurm-lab``.

The pytest fixture ``slurm_lab`` (tests/slurm/conftest.py) hands out a :class:`Lab`. Everything here
talks to Slurm through its command-line tools with ``SLURM_CONF`` set, exactly as an operator would.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB_SCRIPT = REPO / "cluster" / "slurm-lab"

# JobState values after which nothing of the job runs any more. COMPLETING is not among them:
# scontrol shows COMPLETING until every node has killed the job's processes.
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


class LabUnavailable(Exception):
    """The lab cannot run on this machine (not root, no apt, no namespaces...)."""


def require_slurm() -> bool:
    """CI sets ENVLAYERS_REQUIRE_SLURM=1: a lab that cannot start is then a failure, not a skip."""
    return os.environ.get("ENVLAYERS_REQUIRE_SLURM") == "1"


def unavailable(reason: str):
    """Skip the calling test, or fail it loudly where the lab is required."""
    import pytest

    if require_slurm():
        pytest.fail(f"ENVLAYERS_REQUIRE_SLURM=1 but the Slurm lab is unavailable: {reason}", pytrace=False)
    pytest.skip(f"local Slurm lab unavailable: {reason}")


def default_lab_dir() -> Path:
    return Path(os.environ.get("ENVLAYERS_LAB_DIR") or REPO / ".lab").resolve()


def lab_command(*args: str, env: dict[str, str] | None = None, timeout_s: float = 300.0):
    """Run ``cluster/slurm-lab ARGS``; returns the CompletedProcess (text, stdout+stderr merged)."""
    return subprocess.run(
        [str(LAB_SCRIPT), *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def parse_status(text: str) -> dict:
    """Parse ``slurm-lab status`` output into {'state', 'mode', 'nodes': {name: addr}, ...}."""
    out: dict = {"state": "down", "mode": None, "nodes": {}, "node_states": {}}
    for line in text.splitlines():
        kind, _, rest = line.partition(": ")
        fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
        if kind == "lab":
            out["state"] = fields.get("state", "down")
            out["mode"] = fields.get("mode")
            out["conf"] = fields.get("conf")
        elif kind == "node":
            out["nodes"][fields["name"]] = fields["addr"]
            out["node_states"][fields["name"]] = fields.get("state")
        elif kind == "controller":
            out["controller_addr"] = fields.get("addr")
            out["controller_port"] = fields.get("port")
    return out


def parse_scontrol_oneliner(line: str) -> dict[str, str]:
    """``scontrol show job -o`` line -> {key: value}. Values never contain spaces except Command=,
    which runs to the end of its token; good enough for JobState, NodeList, StdOut, ExitCode."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


@dataclass
class Lab:
    """A running lab. ``env`` is what a subprocess needs to use it (merge it into os.environ)."""

    lab_dir: Path
    conf: Path
    mode: str  # "netns" (own address and hostname per node) or "nonetns" (all on 127.0.0.1)
    nodes: dict[str, str]  # node name -> address (NodeAddr as Slurm has it)
    env: dict[str, str]
    workdir: Path  # default cwd of submitted jobs (their slurm-<id>.out land here)
    started_here: bool = False
    _submitted: list[str] = field(default_factory=list)

    # -- running commands ------------------------------------------------------------------
    def run(self, argv, *, timeout_s: float = 60.0, check: bool = True, cwd=None, env=None):
        """Run a command with the lab's environment; returns CompletedProcess (text)."""
        proc = subprocess.run(
            [str(a) for a in argv],
            env={**os.environ, **self.env, **(env or {})},
            cwd=cwd or self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
            )
        return proc

    # -- jobs --------------------------------------------------------------------------------
    def submit(self, script_text: str, *sbatch_args: str, cwd=None, env=None) -> str:
        """Write ``script_text`` to a file and ``sbatch`` it with ``sbatch_args``; returns the job id.
        The job runs in ``cwd`` (default ``self.workdir``), its output goes to slurm-<id>.out there
        unless the args say otherwise; ``job_output(jobid)`` reads it."""
        cwd = Path(cwd or self.workdir)
        cwd.mkdir(parents=True, exist_ok=True)
        if not script_text.startswith("#!"):
            script_text = "#!/bin/bash\n" + script_text
        script = self.workdir / f"job-{uuid.uuid4().hex[:8]}.sh"
        script.write_text(script_text)
        proc = self.run(["sbatch", "--parsable", *sbatch_args, script], cwd=cwd, env=env)
        jobid = proc.stdout.strip().split(";")[0]
        if not jobid.isdigit():
            raise RuntimeError(f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}")
        self._submitted.append(jobid)
        return jobid

    def job_info(self, jobid: str) -> dict[str, str] | None:
        """Fields of ``scontrol show job -o ID``; None when Slurm no longer knows the job."""
        proc = self.run(["scontrol", "show", "job", "-o", jobid], check=False)
        if proc.returncode != 0 or "JobId=" not in proc.stdout:
            return None
        return parse_scontrol_oneliner(proc.stdout.strip().splitlines()[0])

    def sacct_state(self, jobid: str) -> str | None:
        """Final state from the job completion log (``sacct -c``), for jobs already purged."""
        proc = self.run(["sacct", "-c", "-n", "-P", "-o", "state", "-j", jobid], check=False)
        states = [s.split()[0] for s in proc.stdout.split() if s.strip()]
        return states[-1] if states else None

    def wait_job(self, jobid: str, timeout_s: float = 60.0, poll_interval_s: float = 0.1) -> str:
        """Poll ``scontrol show job -o`` until the job reaches a final state; returns it
        (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...). Raises TimeoutError with the last job line."""
        deadline = time.monotonic() + timeout_s
        info = None
        while True:
            info = self.job_info(jobid)
            if info is None:
                state = self.sacct_state(jobid)
                if state:
                    return state
            else:
                state = info.get("JobState", "")
                if state in TERMINAL_STATES:
                    return state
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {jobid} not finished after {timeout_s}s: {info}")
            time.sleep(poll_interval_s)

    def wait_running(self, jobid: str, timeout_s: float = 30.0, poll_interval_s: float = 0.05) -> dict:
        """Wait until the job is RUNNING (returns its fields); raises if it ends or times out first."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.job_info(jobid) or {}
            state = info.get("JobState")
            if state == "RUNNING":
                return info
            if state in TERMINAL_STATES:
                raise RuntimeError(f"job {jobid} ended ({state}) before running: {info}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {jobid} not running after {timeout_s}s: {info}")
            time.sleep(poll_interval_s)

    def job_output(self, jobid: str) -> str:
        """Text of the job's stdout file (StdOut= of scontrol, else slurm-<id>.out in workdir)."""
        info = self.job_info(jobid) or {}
        path = Path(info.get("StdOut") or self.workdir / f"slurm-{jobid}.out")
        return path.read_text() if path.exists() else ""

    def track(self, jobid: str) -> None:
        """Have a job submitted some other way (e.g. by the launcher) cancelled at teardown."""
        if jobid not in self._submitted:
            self._submitted.append(jobid)

    def cancel(self, jobid: str) -> None:
        self.run(["scancel", jobid], check=False)

    def cancel_all_submitted(self) -> None:
        """scancel every job this object submitted that is still active (used at teardown)."""
        for jobid in self._submitted:
            info = self.job_info(jobid)
            if info and info.get("JobState") not in TERMINAL_STATES:
                self.cancel(jobid)


def lab_env(lab_dir: Path) -> dict[str, str]:
    path = os.environ.get("PATH", "")
    parts = path.split(os.pathsep) if path else []
    for extra in ("/usr/bin", "/usr/sbin", "/bin", "/sbin"):
        if extra not in parts:
            parts.append(extra)
    return {
        "SLURM_CONF": str(lab_dir / "etc" / "slurm.conf"),
        "ENVLAYERS_LAB_DIR": str(lab_dir),
        "PATH": os.pathsep.join(parts),
    }


def lab_from_status(lab_dir: Path, *, started_here: bool) -> Lab:
    env = lab_env(lab_dir)
    status = parse_status(lab_command("status", env={"ENVLAYERS_LAB_DIR": str(lab_dir)}).stdout)
    if status["state"] != "up":
        raise LabUnavailable(f"lab in {lab_dir} is not up: {status}")
    nodes = node_addresses(env)
    workdir = lab_dir / "jobs"
    workdir.mkdir(parents=True, exist_ok=True)
    return Lab(
        lab_dir=lab_dir,
        conf=Path(env["SLURM_CONF"]),
        mode=status["mode"],
        nodes=nodes,
        env=env,
        workdir=workdir,
        started_here=started_here,
    )


def node_addresses(env: dict[str, str]) -> dict[str, str]:
    """NodeName -> NodeAddr from ``scontrol show node -o`` (the host cannot resolve node names)."""
    proc = subprocess.run(
        ["scontrol", "show", "node", "-o"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    nodes = {}
    for line in proc.stdout.splitlines():
        fields = parse_scontrol_oneliner(line)
        if "NodeName" in fields:
            nodes[fields["NodeName"]] = fields.get("NodeAddr", "")
    return dict(sorted(nodes.items(), key=lambda kv: int(re.sub(r"\D", "", kv[0]) or 0)))


# -- sharing one lab between pytest sessions -------------------------------------------------
# Several pytest sessions (engineers, CI) may use the same lab dir at once. Each registers itself
# under <lab>/fixture-users/<pid>; the lab is taken down by the last one leaving, and only if a
# fixture started it (a lab brought up by hand stays up).


class _FileLock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "w")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _live_users(users_dir: Path) -> list[Path]:
    live = []
    for f in users_dir.glob("*"):
        try:
            pid = int(f.name)
            os.kill(pid, 0)
            live.append(f)
        except (ValueError, ProcessLookupError):
            f.unlink(missing_ok=True)
        except PermissionError:
            live.append(f)
    return live


def acquire_lab(nodes: int = 3, lab_dir: Path | None = None) -> Lab:
    """Bring the lab up (``slurm-lab up N``) unless it is already up with at least N nodes, and
    register this process as a user. Raises LabUnavailable with the reason when it cannot run."""
    lab_dir = lab_dir or default_lab_dir()
    if os.geteuid() != 0:
        raise LabUnavailable("the local Slurm lab needs root (apt-get, slurmd as root, network namespaces)")
    env = {"ENVLAYERS_LAB_DIR": str(lab_dir)}
    with _FileLock(lab_dir / "fixture.lock"):
        status = parse_status(lab_command("status", env=env).stdout)
        started = False
        if status["state"] != "up" or len(status["nodes"]) < nodes:
            args = ["up", str(nodes)]
            if os.environ.get("ENVLAYERS_LAB_MODE") == "nonetns":
                args.insert(0, "--no-netns")
            proc = lab_command(*args, env=env)
            if proc.returncode != 0 and "--no-netns up" in proc.stdout:
                # no network namespaces here: all nodes on 127.0.0.1 (tests needing netns skip)
                args.insert(0, "--no-netns")
                proc = lab_command(*args, env=env)
            if proc.returncode != 0:
                raise LabUnavailable(
                    f"cluster/slurm-lab {' '.join(args)} failed (rc={proc.returncode}):\n"
                    + "\n".join(proc.stdout.splitlines()[-15:])
                )
            (lab_dir / "fixture-started").write_text(f"{os.getpid()}\n")
            started = True
        users = lab_dir / "fixture-users"
        users.mkdir(exist_ok=True)
        (users / str(os.getpid())).write_text("")
        return lab_from_status(lab_dir, started_here=started)


def release_lab(lab: Lab) -> str | None:
    """Unregister; take the lab down if this was the last user and a fixture started it.
    Returns the ``down`` output when it ran."""
    with _FileLock(lab.lab_dir / "fixture.lock"):
        users = lab.lab_dir / "fixture-users"
        (users / str(os.getpid())).unlink(missing_ok=True)
        if _live_users(users):
            return None
        marker = lab.lab_dir / "fixture-started"
        if not marker.exists():
            return None
        marker.unlink()
        return lab_command("down", env={"ENVLAYERS_LAB_DIR": str(lab.lab_dir)}).stdout


def pid_alive(pid: int, needle: str | None = None) -> bool:
    """True when PID runs (and, given NEEDLE, its command line contains it: guards PID reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # zombie: already dead, parent has not reaped
        return False
    return needle is None or needle in cmdline


def free_subnet(candidates=range(210, 250)) -> str:
    """A 10.X.0.0/24 with no route on this machine (for a second, private lab in tests)."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for x in candidates:
        if f"10.{x}." not in routes:
            return f"10.{x}.0.0/24"
    raise LabUnavailable("no free 10.x.0.0/24 found for a private lab")


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (e.g. a job's run directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def gateway_ready(run, replicas: int, timeout_s: float = 240) -> str:
    """Rank 0's log once the gateway said every replica is ready (Serve's deployment returned: each replica
    started its server and registered its metrics reader). The endpoint goes live with the first replica."""
    deadline, log = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        log = (run.run_dir / "server-0.log").read_text()
        if f"ENVLAYERS-STAGE: gateway: {replicas} replica(s) ready after " in log:
            return log
        time.sleep(0.3)
    raise AssertionError(f"the gateway did not say {replicas} replica(s) ready within {timeout_s}s:\n{log[-3000:]}")
