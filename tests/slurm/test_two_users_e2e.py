"""Two real users on the real local Slurm cluster, as on a shared login node and scratch: the victim submits
with cluster/serve-only.sbatch from a folder both can write (the stand-in engine, CONTAINER_RUNTIME=none),
the attacker prepares what the victim's job will read or write. Every test asserts the outcome: the
attacker's code did not run as the victim (the file its payload would make does not exist), the victim's
files are in place and byte for byte the same, the attacker's key gets 401; and the refusal is one line
naming what was refused, before submission (no job) or in the job before any rank started.

The users (and the Python they run, a root-owned copy of this checkout) come from the ``two_users``
fixture (tests/slurm/conftest.py, tests/slurm/usertools.py): made for the module, removed after it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from labtools import TERMINAL_STATES

pytestmark = pytest.mark.slurm

LIVE = "===== endpoint is live ====="


# -- the setting ---------------------------------------------------------------------------------------------
@pytest.fixture
def shared():
    """A folder both users can write, as a project's shared submit folder or scratch: sticky, like /tmp."""
    folder = Path(tempfile.mkdtemp(prefix="envlayers-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def write_as(users, user, path: Path, text: str, mode: int = 0o600) -> Path:
    """A file of ``user``'s own (written by root, then given to them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chown(path, user.uid, user.gid)
    path.chmod(mode)
    return path


def victims_layer(users, text: str, name: str = "mine.env") -> Path:
    """The victim's own SERVE_ENV_FILE in their home, 0600: what a careful user has."""
    return write_as(users, users.victim, users.victim.home / name, "CONTAINER_RUNTIME=none\n" + text)


def jobs_of(lab, user) -> set[str]:
    """Every job of ``user`` Slurm still knows (finished ones stay for MinJobAge, 5 min in the lab)."""
    return set(lab.run(["squeue", "-h", "-t", "all", "-u", user.name, "-o", "%i"], check=False).stdout.split())


def markers(folder: Path) -> list[str]:
    """What the attacker's payloads leave when they run: files named pwned-* (holding `id -un`)."""
    return sorted(f"{p.name}: {p.read_text(errors='replace').strip()}" for p in folder.glob("pwned-*"))


@dataclass
class Submission:
    proc: subprocess.CompletedProcess  # the victim's cluster/serve-only.sbatch
    new_jobs: set[str]  # the victim's jobs that appeared
    output: str  # the submitted job's output once it settled ("" when none)
    state: str | None  # its Slurm state then

    @property
    def job_id(self) -> str | None:
        return min(self.new_jobs, key=int) if self.new_jobs else None


def submit_as_victim(lab, users, cwd: Path, env_file: Path, settle_s: float = 90, **env: str) -> Submission:
    """The victim runs ``cluster/serve-only.sbatch --json`` in ``cwd``; when a job was submitted, waits until it
    ended, or its endpoint is live (then it is left running), or an ENVLAYERS-ERROR line."""
    before = jobs_of(lab, users.victim)
    proc = users.run(users.victim, [users.py.sbatch, "--json"], cwd=cwd, timeout_s=120,
                     env={"SERVE_ENV_FILE": str(env_file), "MODEL": "qwen38", "STANDIN_LOAD_SECONDS": "1",
                          "SERVE_TIME": "00:05:00", **env})
    new = jobs_of(lab, users.victim) - before
    for job in new:
        lab.track(job)
    output, state = "", None
    if new:
        first = min(new, key=int)
        out = cwd / f"serve-only-{first}.out"
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            info = lab.job_info(first) or {}
            state = info.get("JobState") or lab.sacct_state(first)
            output = out.read_text(errors="replace") if out.exists() else ""
            if state in TERMINAL_STATES or LIVE in output or "ENVLAYERS-ERROR:" in output:
                break
            time.sleep(0.2)
        if state not in TERMINAL_STATES and LIVE not in output:  # an error line: let it end
            try:
                state = lab.wait_job(first, timeout_s=30)
            except TimeoutError:
                pass
            output = out.read_text(errors="replace") if out.exists() else ""
    return Submission(proc, new, output, state)


def error_lines(text: str) -> list[str]:
    """The lines of the launcher's stderr that are not warnings."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("warning:")]


def assert_refused_before_submission(sub: Submission, *names: str) -> str:
    """No job; a non-zero exit; one line (besides warnings) that names each of ``names``; no traceback."""
    said = sub.proc.stdout + sub.proc.stderr
    assert not sub.new_jobs, f"a job was submitted ({sorted(sub.new_jobs)}):\n{said}\n{sub.output}"
    assert sub.proc.returncode != 0, said
    assert "Traceback" not in said, said
    lines = error_lines(sub.proc.stderr)
    assert len(lines) == 1, f"not one line:\n{sub.proc.stderr}"
    for name in names:
        assert name in lines[0], f"{name!r} not named in: {lines[0]}"
    return lines[0]


def assert_refused(sub: Submission, path: Path) -> str:
    """Refused before submission, naming ``path`` (or a folder above it); or the job ended before any rank
    started with one ENVLAYERS-ERROR line naming its run directory."""
    said = sub.proc.stdout + sub.proc.stderr
    if not sub.new_jobs:
        assert sub.proc.returncode != 0, said
        lines = error_lines(sub.proc.stderr)
        assert len(lines) == 1 and "Traceback" not in said, f"not one line:\n{sub.proc.stderr}"
        named = re.findall(r"/[^\s:;,'\"()]+", lines[0])
        assert any(str(path).startswith(p.rstrip("/")) or p.startswith(str(path)) for p in named), \
            f"{path} not named in: {lines[0]}"
        return lines[0]
    errors = [line for line in sub.output.splitlines() if line.startswith("ENVLAYERS-ERROR:")]
    assert len(errors) == 1, f"job {sub.job_id} ({sub.state}) did not end with one ENVLAYERS-ERROR line:\n{sub.output}"
    assert str(path.parent) in errors[0], errors[0]
    assert sub.state in TERMINAL_STATES and sub.state != "COMPLETED", (sub.state, sub.output)
    assert "ENVLAYERS-STAGE: starting" not in sub.output and LIVE not in sub.output, sub.output
    return errors[0]


def next_job_ids(lab, users, count: int = 8) -> list[int]:
    """What the attacker can know of the next job ids: submit a job of their own and count on from it."""
    got = users.run(users.attacker, ["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"])
    assert got.returncode == 0, got.stderr
    mine = int(got.stdout.strip().split(";")[0])
    lab.wait_job(str(mine), timeout_s=30)
    return list(range(mine + 1, mine + 1 + count))


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under ``folder``: kind, mode, owner and bytes."""
    out = {}
    for path in sorted([folder, *folder.rglob("*")]):
        st = path.lstat()
        body = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        out[str(path.relative_to(folder))] = (st.st_mode, st.st_uid, body)
    return out


# -- 1. the next run directory, made by the attacker first -----------------------------------------------------
WATCHER = r'''
import os, sys, time
runs, marker, ready = sys.argv[1], sys.argv[2], sys.argv[3]
payload = "id -un > %s-$SLURM_JOB_ID 2>/dev/null || id -un > %s\n" % (marker, marker)
open(ready, "w").close()
while True:  # replace ranks.sh the moment it appears, and add a line to job.sh (successors are submitted from it)
    for name in os.listdir(runs):
        d = os.path.join(runs, name)
        try:
            for f in ("ranks.sh", "job.sh"):
                p = os.path.join(d, f)
                if os.path.isfile(p) and os.stat(p).st_uid != os.getuid():
                    body = "#!/bin/bash\n" + payload if f == "ranks.sh" else open(p).read() + "\n" + payload
                    with open(p + ".x", "w") as fh:
                        fh.write(body)
                    os.chmod(p + ".x", 0o777)
                    os.replace(p + ".x", p)
        except OSError:
            pass
    time.sleep(0.005)
'''


def test_a_run_directory_the_attacker_made_first_runs_none_of_their_code(slurm_lab, two_users, shared):
    users, attacker = two_users, two_users.attacker
    runs = shared / "runs" / "inference-server"  # RUN_ROOT with SCRATCH unset: $PWD/runs/inference-server
    assert users.run(attacker, ["mkdir", "-p", runs]).returncode == 0
    for job in next_job_ids(slurm_lab, users):
        assert users.run(attacker, ["mkdir", "-m", "777", runs / str(job)]).returncode == 0
    watcher = write_as(users, attacker, attacker.home / "watch.py", WATCHER, 0o644)
    ready = attacker.home / "watching"
    users.start(attacker, ["/usr/bin/python3", watcher, runs, shared / "pwned-run-dir", ready])
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the attacker's watcher did not start"
        time.sleep(0.05)
    planted = snapshot(runs)

    try:
        sub = submit_as_victim(slurm_lab, users, shared, victims_layer(users, ""))
    finally:
        users.stop_started()  # the watcher, by the PID it was started with

    assert markers(shared) == [], f"the attacker's code ran as the victim:\n{sub.output}"
    refusal = assert_refused(sub, runs / (sub.job_id or "0"))
    assert snapshot(runs) == planted, "the victim's job wrote into the attacker's folders"
    assert "unsafe" in refusal or "writable" in refusal or "belongs" in refusal or "owned" in refusal, refusal


# -- 2. a link planted at the next run directory ------------------------------------------------------------------
def test_a_link_at_the_next_run_directory_moves_nothing_of_the_victims(slurm_lab, two_users, shared):
    users, victim, attacker = two_users, two_users.victim, two_users.attacker
    project = victim.home / "project"
    for rel, text in {".git/HEAD": "ref: refs/heads/main\n", "src/main.py": "print('mine')\n",
                      "README": "the victim's work\n"}.items():
        write_as(users, victim, project / rel, text, 0o644)
    for folder in (project, project / ".git", project / "src"):
        os.chown(folder, victim.uid, victim.gid)
        folder.chmod(0o755)
    before = snapshot(project)
    runs = shared / "runs" / "inference-server"
    assert users.run(attacker, ["mkdir", "-p", runs]).returncode == 0
    for job in next_job_ids(slurm_lab, users):
        assert users.run(attacker, ["ln", "-s", project, runs / str(job)]).returncode == 0

    sub = submit_as_victim(slurm_lab, users, shared, victims_layer(users, ""))

    assert snapshot(project) == before, f"the victim's project changed:\n{sub.output}"
    said = sub.proc.stdout + sub.proc.stderr + sub.output
    assert "requeued" not in said, said
    assert_refused(sub, runs / (sub.job_id or "0"))


# -- 3. an env file the attacker can change, and Python's search path in a layer ----------------------------------
SITECUSTOMIZE = "import os, getpass\nopen({marker!r} + '-' + getpass.getuser(), 'w').write(getpass.getuser())\n"


def attackers_python_dir(users, shared: Path) -> Path:
    """A folder of the attacker's with a sitecustomize.py: any Python started with it on PYTHONPATH runs it."""
    folder = shared / "attackers-python"
    assert users.run(users.attacker, ["mkdir", "-m", "755", folder]).returncode == 0
    write_as(users, users.attacker, folder / "sitecustomize.py",
             SITECUSTOMIZE.format(marker=str(shared / "pwned-sitecustomize")), 0o644)
    return folder


@pytest.mark.parametrize("where", ["attackers-file", "victims-file-in-attackers-folder"])
def test_an_env_file_the_attacker_can_change_is_refused_before_submission(slurm_lab, two_users, shared, where):
    users, victim, attacker = two_users, two_users.victim, two_users.attacker
    pydir = attackers_python_dir(users, shared)
    text = f"CONTAINER_RUNTIME=none\nPYTHONPATH={pydir}\n"
    if where == "attackers-file":
        env_file = write_as(users, attacker, shared / "team.env", text, 0o666)
    else:
        folder = shared / "team"
        assert users.run(attacker, ["mkdir", "-m", "777", folder]).returncode == 0
        env_file = write_as(users, victim, folder / "team.env", text.replace(f"PYTHONPATH={pydir}\n", ""), 0o644)

    sub = submit_as_victim(slurm_lab, users, shared, env_file)

    assert markers(shared) == [], f"the attacker's code ran as the victim:\n{sub.output}"
    assert_refused_before_submission(sub, str(env_file) if where == "attackers-file" else str(env_file.parent))


def test_pythonpath_in_the_victims_own_layer_is_refused_before_submission(slurm_lab, two_users, shared):
    users = two_users
    pydir = attackers_python_dir(users, shared)
    env_file = victims_layer(users, f"PYTHONPATH={pydir}\n")

    sub = submit_as_victim(slurm_lab, users, shared, env_file)

    assert markers(shared) == [], f"the attacker's code ran as the victim:\n{sub.output}"
    assert_refused_before_submission(sub, str(env_file), "PYTHONPATH")


# -- 4. the launcher's own variables set from a layer ---------------------------------------------------------
@pytest.mark.parametrize("key", ["ENVLAYERS_CHAIN_KEY_FILE", "ENVLAYERS_CHAIN_LEFT", "ENVLAYERS_RANK"])
def test_a_launcher_variable_in_a_layer_is_refused_before_submission(slurm_lab, two_users, shared, key):
    users, attacker = two_users, two_users.attacker
    attackers_key = "attackers-key-" + os.urandom(4).hex()
    key_file = write_as(users, attacker, shared / "their-key", attackers_key + "\n", 0o644)
    line = {"ENVLAYERS_CHAIN_KEY_FILE": f"ENVLAYERS_CHAIN_KEY_FILE={key_file}\n",
            "ENVLAYERS_CHAIN_LEFT": "ENVLAYERS_CHAIN_LEFT=50\n",
            "ENVLAYERS_RANK": "INFERENCE_NODES=2\nENVLAYERS_RANK=0\n"}[key]
    env_file = victims_layer(users, line)

    sub = submit_as_victim(slurm_lab, users, shared, env_file)

    if sub.job_id and LIVE in sub.output:  # submitted after all: the attacker's key must still get nowhere
        url = endpoint_url(shared / "runs" / "inference-server" / sub.job_id)
        got = curl(f"{url}/models", attackers_key)
        assert got == 401, f"the attacker's key opened the victim's endpoint (HTTP {got})"
    assert_refused_before_submission(sub, str(env_file), key)


# -- 5. secrets in a layer; what a job writes ---------------------------------------------------------------------
@pytest.mark.parametrize("key", ["HF_TOKEN", "OPENAI_API_KEY"])
def test_a_credential_in_a_layer_is_refused_before_submission(slurm_lab, two_users, shared, key):
    env_file = victims_layer(two_users, f"{key}=hf_{os.urandom(8).hex()}\n")
    sub = submit_as_victim(slurm_lab, two_users, shared, env_file)
    assert_refused_before_submission(sub, str(env_file), key)


def endpoint_url(run_dir: Path) -> str:
    """The job's base URL with the node's address (the host cannot resolve lab node names)."""
    endpoint = json.loads((run_dir / "endpoint.json").read_text())
    port = re.search(r":(\d+)/", endpoint["base_url"]).group(1)
    return f"http://{endpoint['addresses'][0]}:{port}/v1"


def curl(url: str, key: str | None = None) -> int:
    argv = ["curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", url]
    if key is not None:
        argv += ["-H", f"Authorization: Bearer {key}"]
    return int(subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout or 0)


def test_a_live_job_of_the_victims_is_closed_to_the_attacker(slurm_lab, two_users, shared):
    """One ordinary job carries the checks of what another user can do to it while it serves."""
    users, victim, attacker = two_users, two_users.victim, two_users.attacker
    sub = submit_as_victim(slurm_lab, users, shared, victims_layer(users, "", "plain.env"), SERVE_TIME="00:10:00")
    assert sub.job_id and LIVE in sub.output, sub.proc.stderr + sub.output
    run_dir = shared / "runs" / "inference-server" / sub.job_id
    url, key = endpoint_url(run_dir), (run_dir / "api-key").read_text().strip()

    # what it wrote: the run directory, the environment the engine got, the scripts, the logs, the key
    assert users.run(attacker, ["ls", run_dir]).returncode != 0
    names = ["serve.env", "job.sh", "ranks.sh", "server-0.log", "api-key", "endpoint.json"]
    assert all((run_dir / n).is_file() for n in names), sorted(p.name for p in run_dir.iterdir())
    for name in names:
        got = users.run(attacker, ["cat", run_dir / name])
        assert got.returncode != 0 and got.stdout == "", f"the attacker read {name}:\n{got.stdout[:300]}"
    assert users.run(victim, ["cat", run_dir / "serve.env"]).returncode == 0  # refused to the other user only

    # its endpoint: no key, or a wrong one, gets 401; the victim's key still opens it
    assert curl(f"{url}/models") == 401
    assert curl(f"{url}/models", "not-the-key") == 401
    assert curl(f"{url}/models", key) == 200

    # stopping it: the attacker's `env_layers stop` fails in one line (Slurm's refusal, not an OS error about the
    # run directory it cannot enter) and the job serves on
    stop = users.run(attacker, [users.py.python, "-m", "envlayers", "stop", sub.job_id, "--timeout-s", "20"], cwd=shared)
    said = [line for line in (stop.stdout + stop.stderr).splitlines() if line.strip()]
    assert stop.returncode != 0 and len(said) == 1 and "internal error" not in said[0], stop.stdout + stop.stderr
    assert sub.job_id in said[0], said[0]
    assert (slurm_lab.job_info(sub.job_id) or {}).get("JobState") == "RUNNING", stop.stdout + stop.stderr
    assert curl(f"{url}/models", key) == 200
