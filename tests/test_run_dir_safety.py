"""The job script's run folder on a shared file system: another user's folder, a folder others can write,
or a symbolic link planted at RUN_ROOT or at the next job's run folder ends the job before anything is
written; what the job writes is the user's alone. The job script's own lines, run by real bash."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from envlayers import jobscript, rundir

REPO = Path(__file__).resolve().parents[1]
OTHER_UID = 4242  # a uid no test user has; only root can give a folder to it


def block(tmp_path: Path, layer: str = "") -> str:
    """The job script's lines from the run folder's checks to its copies of serve.env and job.sh."""
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\n" + layer)
    script = jobscript.prepare(REPO, "qwen38", env_file=mine, python="python3",
                               environ={"EDF_PATH": str(tmp_path), "HOME": str(tmp_path)}).script
    start = script.index("envlayers_unwritable() {\n")
    end = script.index('echo "ENVLAYERS-STAGE: run_dir=$RUN_DIR"\n')
    return "set -euo pipefail\nENVLAYERS_SERVE_ENV='X=1'\n" + script[start:end] + 'echo "DONE"\n'


def run(tmp_path: Path, run_dir: Path, layer: str = "") -> subprocess.CompletedProcess:
    job = tmp_path / "job.sh"
    job.write_text(block(tmp_path, layer))
    return subprocess.run(["bash", str(job)], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "RUN_DIR": str(run_dir), "SLURM_JOB_ID": run_dir.name})


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def refused(proc: subprocess.CompletedProcess, run_dir: Path, needle: str) -> None:
    assert proc.returncode == 1 and "DONE" not in proc.stdout, proc.stdout + proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"ENVLAYERS-ERROR: unsafe run directory {run_dir}: ") and needle in line, line
    assert "; the job ends before anything is written there: " in line


def test_a_fresh_run_folder_and_its_files_are_the_users_alone(tmp_path):
    root = tmp_path / "scratch" / "inference-server"
    proc = run(tmp_path, root / "7")
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stdout + proc.stderr
    assert mode(root) == 0o700 and mode(root / "7") == 0o700
    assert {p.name: mode(p) for p in (root / "7").iterdir()} == {rundir.SERVE_ENV: 0o600, rundir.JOB_SH: 0o600}


def test_the_group_may_read_when_the_operator_says_so(tmp_path):
    root = tmp_path / "inference-server"
    proc = run(tmp_path, root / "7", "RUN_DIR_GROUP_READ=1\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert mode(root / "7") == 0o750 and mode(root / "7" / rundir.SERVE_ENV) == 0o640


def test_a_run_folder_another_user_made_writable_is_refused_and_left_alone(tmp_path):
    # the next job id's folder, made in advance by someone waiting to replace ranks.sh when it appears
    root = tmp_path / "inference-server"
    root.mkdir(mode=0o700)
    planted = root / "8"
    planted.mkdir()
    planted.chmod(0o777)
    proc = run(tmp_path, planted)
    refused(proc, planted, f"{planted} is writable by others (mode 777)")
    assert list(planted.iterdir()) == []


def test_a_run_folder_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("only root can give a folder to another uid")
    root = tmp_path / "inference-server"
    root.mkdir(mode=0o700)
    planted = root / "8"
    planted.mkdir(mode=0o755)
    os.chown(planted, OTHER_UID, OTHER_UID)
    proc = run(tmp_path, planted)
    refused(proc, planted, "belongs to ")
    assert list(planted.iterdir()) == []


def test_a_symbolic_link_at_the_run_folder_moves_nothing(tmp_path):
    # a link planted at the next run folder, into the user's own project: the requeue step used to move the
    # project's files into run-0/ and write the job's files in their place
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "README").write_text("mine\n")
    root = tmp_path / "inference-server"
    root.mkdir(mode=0o700)
    (root / "8").symlink_to(project)
    proc = run(tmp_path, root / "8")
    refused(proc, root / "8", f"{root / '8'} is a symbolic link (to {project})")
    assert sorted(p.name for p in project.iterdir()) == ["README", "src"]
    assert (project / "README").read_text() == "mine\n"


def test_a_symbolic_link_as_run_root_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "inference-server").symlink_to(elsewhere)
    proc = run(tmp_path, tmp_path / "inference-server" / "7")
    refused(proc, tmp_path / "inference-server" / "7", "is a symbolic link")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("parent_mode, ok", [
    pytest.param(0o777, False, id="world-writable-submit-folder"),
    pytest.param(0o1777, True, id="sticky-like-tmp"),
    pytest.param(0o775, True, id="group-writable-project-folder"),
])
def test_a_folder_above_run_root_that_everyone_can_write_is_refused_unless_sticky(tmp_path, parent_mode, ok):
    shared = tmp_path / "shared-submit"
    shared.mkdir()
    shared.chmod(parent_mode)
    run_dir = shared / "runs" / "inference-server" / "7"
    proc = run(tmp_path, run_dir)
    if ok:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        refused(proc, run_dir, f"{shared} above RUN_ROOT is writable by everyone without the sticky bit (mode 777)")
        assert not (run_dir / rundir.SERVE_ENV).exists()


def test_a_requeued_run_reuses_its_own_folder(tmp_path):
    root = tmp_path / "inference-server"
    run_dir = root / "7"
    assert run(tmp_path, run_dir).returncode == 0
    (run_dir / rundir.server_log_name(0)).write_text("first run\n")
    proc = run(tmp_path, run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_dir / f"{rundir.RUN_FOLDER}0" / rundir.server_log_name(0)).read_text() == "first run\n"


def _root_cases(tmp_path: Path) -> dict[str, Path]:
    """RUN_ROOT folders, each set up one way: name -> the RUN_ROOT."""
    tmp_path.mkdir()
    cases = {}
    for name, parent_mode in (("world-writable-parent", 0o777), ("sticky-parent", 0o1777), ("plain", 0o700)):
        parent = tmp_path / name
        parent.mkdir()
        parent.chmod(parent_mode)
        cases[name] = parent / "inference-server"
    (tmp_path / "g-w").mkdir()
    (tmp_path / "g-w" / "inference-server").mkdir()
    (tmp_path / "g-w" / "inference-server").chmod(0o770)
    cases["group-writable-root"] = tmp_path / "g-w" / "inference-server"
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "inference-server").symlink_to(tmp_path / "plain")
    cases["link-as-root"] = tmp_path / "linked" / "inference-server"
    if os.getuid() == 0:
        (tmp_path / "theirs").mkdir()
        (tmp_path / "theirs" / "inference-server").mkdir(mode=0o755)
        os.chown(tmp_path / "theirs" / "inference-server", OTHER_UID, OTHER_UID)
        cases["another-users-root"] = tmp_path / "theirs" / "inference-server"
    return cases


def test_the_login_nodes_check_is_the_job_scripts_rule(tmp_path):
    from envlayers.filetrust import unsafe_folder

    verdicts = {}
    for name, root in _root_cases(tmp_path / "cases").items():
        login = unsafe_folder(root, os.getuid())
        job = run(tmp_path, root / "7")
        assert (login is None) == (job.returncode == 0), (name, login, job.stdout)
        if login is not None:
            assert login in job.stdout.replace(" above RUN_ROOT ", " above it "), (name, login, job.stdout)
        verdicts[name] = login is None
    assert verdicts["plain"] and verdicts["sticky-parent"]
    assert not (verdicts["world-writable-parent"] or verdicts["group-writable-root"] or verdicts["link-as-root"])


def test_the_dry_run_refuses_a_run_root_the_job_would_refuse(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\n")
    job = jobscript.prepare(REPO, "qwen38", env_file=mine, python="python3",
                            environ={"EDF_PATH": str(tmp_path), "HOME": str(tmp_path), "SCRATCH": str(shared)})
    (blocker,) = [b for b in job.blockers if b.startswith("RUN_ROOT")]
    line = 1 + (REPO / "experiments/serve-only.env").read_text().splitlines().index(
        "RUN_ROOT=${SCRATCH:-$PWD/runs}/inference-server")
    assert blocker.startswith(f"RUN_ROOT (experiments/serve-only.env:{line}) is {shared}/inference-server: {shared} above "
                              "it is writable by everyone without the sticky bit (mode 777)")
    shared.chmod(0o1777)  # as /tmp is: fine
    assert not [b for b in jobscript.prepare(REPO, "qwen38", env_file=mine, python="python3",
                                             environ={"EDF_PATH": str(tmp_path), "HOME": str(tmp_path),
                                                      "SCRATCH": str(shared)}).blockers if b.startswith("RUN_ROOT")]
