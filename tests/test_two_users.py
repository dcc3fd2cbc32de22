"""Two real users on one machine, as on a cluster's shared scratch: an attacker prepares the next job's run
folder, and the victim's job script (its own lines, run by real bash as the victim) must refuse it and
touch nothing; what a job writes, the other user cannot read. The users are created for the module and
removed after it (root only; elsewhere the folder-owner cases of tests/test_run_dir_safety.py stand in)."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from envlayers import jobscript, rundir

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.getuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"),
                                reason="needs root and useradd/runuser to create two users")


@pytest.fixture(scope="module")
def users():
    """Two throw-away users (no home folder, no login shell of their own), removed even when a test fails."""
    tag = secrets.token_hex(3)
    names = {"victim": f"elv{tag}", "attacker": f"ela{tag}"}
    made = []
    try:
        for name in names.values():
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", name], check=True,
                           capture_output=True, timeout=60)
            made.append(name)
        yield {role: pwd.getpwnam(name) for role, name in names.items()}
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=60)


@pytest.fixture
def shared():
    """A shared scratch folder as clusters have it: writable by everyone, sticky (like /tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="envlayers-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_user(user, *argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user.pw_name, "--", *argv], capture_output=True, text=True,
                          timeout=60, cwd="/", **kw)


def readable_folder(shared: Path) -> Path:
    folder = Path(tempfile.mkdtemp(dir=shared))
    folder.chmod(0o755)  # mkdtemp's 0700 otherwise: the victim reads the job script from it
    return folder


def job_block(folder: Path) -> Path:
    """The job script's run-folder lines, in a file the victim can read."""
    mine = folder / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\n")
    script = jobscript.prepare(REPO, "qwen38", env_file=mine, python="python3",
                               environ={"EDF_PATH": str(folder), "HOME": str(folder)}).script
    start = script.index("envlayers_unwritable() {\n")
    end = script.index('echo "ENVLAYERS-STAGE: run_dir=$RUN_DIR"\n')
    path = folder / "job.sh"
    path.write_text("set -euo pipefail\nENVLAYERS_SERVE_ENV='HF_TOKEN_LIKE=seen-only-by-the-victim'\n"
                    + script[start:end] + 'echo "DONE"\n')
    path.chmod(0o644)
    return path


def victims_job(users, job: Path, run_dir: Path) -> subprocess.CompletedProcess:
    return as_user(users["victim"], "env", f"PATH={os.environ['PATH']}", f"RUN_DIR={run_dir}",
                   f"SLURM_JOB_ID={run_dir.name}", "bash", str(job))


@pytest.fixture
def victims_root(users, shared):
    """The victim's RUN_ROOT on the shared scratch, made by the victim's first job."""
    root = shared / "victim" / "inference-server"
    first = victims_job(users, job_block(readable_folder(shared)), root / "100")
    assert first.returncode == 0 and "DONE" in first.stdout, first.stdout + first.stderr
    return root


def test_a_next_run_folder_the_attacker_made_is_refused(users, shared, victims_root):
    # the attacker cannot write inside the victim's RUN_ROOT, so the place to plant is a RUN_ROOT the victim
    # has not made yet: the attacker makes it, world-writable, with the next job's folder in it
    planted_root = shared / "victim2" / "inference-server"
    assert as_user(users["attacker"], "mkdir", "-m", "777", "-p", str(planted_root / "101")).returncode == 0
    proc = victims_job(users, job_block(readable_folder(shared)), planted_root / "101")
    assert proc.returncode == 1 and "DONE" not in proc.stdout
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"ENVLAYERS-ERROR: unsafe run directory {planted_root / '101'}: ")
    assert list((planted_root / "101").iterdir()) == []  # nothing of the victim's was written there


def test_the_attacker_cannot_plant_inside_the_victims_run_root(users, victims_root):
    for name in ("101", "101/ranks.sh"):
        assert as_user(users["attacker"], "mkdir", "-p", str(victims_root / name)).returncode != 0
    assert as_user(users["attacker"], "ln", "-s", "/", str(victims_root / "101")).returncode != 0


def test_a_link_the_attacker_planted_moves_nothing_of_the_victims(users, shared):
    project = shared / "victims-project"
    assert as_user(users["victim"], "mkdir", "-p", str(project / "src")).returncode == 0
    assert as_user(users["victim"], "bash", "-c", f"echo mine > {project}/README").returncode == 0
    # the attacker's own folder, where the victim's RUN_ROOT would be made (SCRATCH pointed at a shared place)
    attackers = shared / "runs"
    assert as_user(users["attacker"], "mkdir", "-m", "755", "-p", str(attackers / "inference-server")).returncode == 0
    assert as_user(users["attacker"], "ln", "-s", str(project), str(attackers / "inference-server" / "102")).returncode == 0
    proc = victims_job(users, job_block(readable_folder(shared)), attackers / "inference-server" / "102")
    assert proc.returncode == 1 and "ENVLAYERS-ERROR: unsafe run directory" in proc.stdout
    assert sorted(p.name for p in project.iterdir()) == ["README", "src"]
    assert (project / "README").read_text() == "mine\n"


def test_what_the_victims_job_wrote_the_attacker_cannot_read(users, victims_root):
    run_dir = victims_root / "100"
    files = [run_dir / rundir.SERVE_ENV, run_dir / rundir.JOB_SH]
    assert all(f.is_file() for f in files)
    assert as_user(users["attacker"], "ls", str(run_dir)).returncode != 0
    for f in files:
        got = as_user(users["attacker"], "cat", str(f))
        assert got.returncode != 0 and "seen-only-by-the-victim" not in got.stdout
    assert as_user(users["victim"], "cat", str(run_dir / rundir.SERVE_ENV)).stdout == \
        "# site: mi300a\nHF_TOKEN_LIKE=seen-only-by-the-victim"
