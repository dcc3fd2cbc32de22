"""A file that says what a job runs (a layer, SERVE_ENV_FILE, SERVE_BASE_ENV, setups.yaml, an EDF's YAML) is
refused when another user could change it or the folder holding it: the rule OpenSSH applies to
authorized_keys (filetrust.untrusted_config), on the one read of such a file (yamlpos.read_regular)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OTHER_UID = 4242


def dry_run(tmp_path: Path, env_file: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SERVE_"))}
    env.update(PYTHONPATH=str(REPO / "src"), HOME=str(tmp_path), SUBMIT="0", SERVE_ENV_FILE=str(env_file), **extra)
    return subprocess.run([str(REPO / "cluster" / "serve-only.sbatch")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def refused(proc: subprocess.CompletedProcess, start: str, hint: str) -> None:
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"env_layers: error: {start}") and f"; hint: {hint}" in line, line


def layer(folder: Path, name: str = "mine.env", text: str = "MAX_MODEL_LEN=4096\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_a_serve_env_file_others_can_write_is_refused(tmp_path):
    mine = layer(tmp_path / "private")
    mine.chmod(0o666)
    refused(dry_run(tmp_path, mine), f"{mine}: is writable by others (mode 0666): another user could change what "
            "this job runs", f"chmod go-w {mine}")


def test_a_serve_env_file_in_a_folder_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    mine = layer(shared)
    shared.chmod(0o777)
    refused(dry_run(tmp_path, mine), f"{mine}: is in {shared}, which others can write (mode 0777)",
            f"keep it in a folder only you can write (chmod go-w {shared}, or move it)")


def test_a_link_to_a_file_in_a_folder_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    theirs = layer(shared)
    shared.chmod(0o777)
    link = tmp_path / "private" / "mine.env"
    link.parent.mkdir()
    link.symlink_to(theirs)
    refused(dry_run(tmp_path, link), f"{link}: is in {shared}, which others can write", "keep it in a folder")


def test_a_serve_env_file_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("only root can give a file to another uid")
    theirs = layer(tmp_path / "private")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    refused(dry_run(tmp_path, theirs), f"{theirs}: belongs to ", "copy it to a file of your own")


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o444])
def test_a_file_of_ones_own_in_tmp_is_fine(tmp_path, mode):
    # /tmp is writable by everyone, but sticky: nobody else can replace a file of the user's there
    import tempfile

    folder = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        folder.chmod(0o1777)
        mine = layer(folder)
        mine.chmod(mode)
        proc = dry_run(tmp_path, mine)
        assert proc.returncode == 0, proc.stderr
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("which", ["experiments/setups.yaml", "experiments/layers/model-qwen38.env",
                                   "experiments/layers/common.env"])
def test_a_catalog_file_others_can_write_is_refused(tmp_path, which):
    root = tmp_path / "cat"
    shutil.copytree(REPO / "experiments", root / "experiments")
    shutil.copytree(REPO / "containers", root / "containers")
    (root / which).chmod(0o664)
    proc = subprocess.run([sys.executable, "-m", "envlayers", "--root", str(root), "render", "experiment:qwen38"],
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"env_layers: error: {which}: is writable by others (mode 0664)"), proc.stderr


@pytest.mark.parametrize("make, said", [
    pytest.param(lambda p: None, "SERVE_ENV_FILE names a file that does not exist", id="missing"),
    pytest.param(lambda p: (p.symlink_to(p.with_name("b.env")), p.with_name("b.env").symlink_to(p)),
                 "SERVE_ENV_FILE is a loop of symbolic links", id="symlink-loop"),
    pytest.param(lambda p: p.symlink_to(p.with_name("gone.env")), "SERVE_ENV_FILE is a symbolic link to ",
                 id="dangling-symlink"),
])
def test_a_serve_env_file_that_cannot_be_read_is_one_line_naming_it(tmp_path, make, said):
    # before: click's four lines about an --env-file option the wrapper's user never typed, and a loop was
    # "does not exist"
    path = tmp_path / "a.env"
    make(path)
    proc = dry_run(tmp_path, path)
    refused(proc, f"{path}: {said}", "")
    assert "--env-file" not in proc.stderr


def test_a_serve_env_file_under_a_folder_everyone_can_write_is_refused(tmp_path):
    # the file and its own folder are the user's, but a folder above it is open to everyone without the sticky
    # bit: another user could rename the user's folder away and put one of theirs, with their file, in its place
    shared = tmp_path / "shared"
    mine = layer(shared / "me")
    shared.chmod(0o777)
    refused(dry_run(tmp_path, mine), f"{mine}: is under {shared}, which everyone can write without the sticky bit "
            "(mode 0777): another user could put a folder of theirs in its place",
            f"keep it under folders only you can write (chmod o-w {shared}, or move it)")


def test_a_serve_base_env_others_can_write_is_refused(tmp_path):
    mine = layer(tmp_path / "private")
    base = layer(tmp_path / "private", "base.env", "INFERENCE_NODES=1\n")
    base.chmod(0o664)
    refused(dry_run(tmp_path, mine, SERVE_BASE_ENV=str(base)),
            f"{base}: is writable by others (mode 0664): another user could change what this job runs",
            f"chmod go-w {base}")
