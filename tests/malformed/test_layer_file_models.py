"""Malformed layer-file models (experiments/layers/model-<MODEL>.env without a setups.yaml entry) and a
malformed batch-job environment for the wrapper under sbatch.

A file that cannot be a model (a FIFO, a directory, a device behind a symlink, a name that cannot be a
target) is never read and never blocks; a model file whose content is bad is one error naming file:line
when the model is used, while `list` keeps working and says which model is broken.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from malformed_tools import REPO, assert_clean_error, run_cli
from timing import LATE_S  # how late a busy machine may run an event


@pytest.fixture
def root(tmp_path):
    dst = tmp_path / "cat"
    shutil.copytree(REPO / "experiments", dst / "experiments")
    shutil.copytree(REPO / "containers", dst / "containers")
    return dst


def layers(root: Path) -> Path:
    return root / "experiments" / "layers"


@pytest.mark.parametrize("make", [
    pytest.param(lambda p: os.mkfifo(p), id="fifo"),
    pytest.param(lambda p: p.mkdir(), id="directory"),
    pytest.param(lambda p: p.symlink_to("/dev/zero"), id="symlink-to-device"),
    pytest.param(lambda p: p.symlink_to(p.parent / "nowhere.env"), id="dangling-symlink"),
])
def test_a_model_file_that_is_not_a_regular_file_is_not_a_model_and_never_blocks(root, make):
    make(layers(root) / "model-odd.env")
    started = time.monotonic()
    listed = run_cli("--root", str(root), "list", timeout_s=3 * LATE_S)
    assert listed.returncode == 0 and " odd " not in listed.stdout, listed.stderr
    assert_clean_error(run_cli("--root", str(root), "render", "experiment:odd", timeout_s=3 * LATE_S),
                       "experiments/layers/model-odd.env: unknown model 'odd'")
    assert time.monotonic() - started < 2 * LATE_S  # a FIFO opened for reading would block for ever


@pytest.mark.parametrize("content, needle", [
    pytest.param(b"# caf\xe9\nA=1\n", "experiments/layers/model-bad.env:1", id="not-utf8"),
    pytest.param(b"# bad\nB=$(hostname)\n", "experiments/layers/model-bad.env:2", id="command-substitution"),
    pytest.param(b"# bad\nunset A\n", "experiments/layers/model-bad.env:2", id="unset"),
])
def test_a_bad_model_file_is_one_error_when_used_and_a_row_in_list(root, content, needle):
    (layers(root) / "model-bad.env").write_bytes(content)
    assert_clean_error(run_cli("--root", str(root), "render", "experiment:bad"), needle)
    assert_clean_error(run_cli("--root", str(root), "plan", "--model", "bad"), needle)
    listed = run_cli("--root", str(root), "list")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.split()[:1] == ["bad"]]
    assert "layer-file" in row and "error: " + needle in row


def test_an_unreadable_model_file_is_one_error(root):
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    path = layers(root) / "model-secret.env"
    path.write_text("# secret\nA=1\n")
    path.chmod(0)
    assert_clean_error(run_cli("--root", str(root), "render", "experiment:secret"), "model-secret.env")


@pytest.mark.parametrize("name, note", [
    pytest.param("model-a\nb.env", "note: 'experiments/layers/model-a\\nb.env' is not a model: 'a\\nb' cannot be",
                 id="newline"),
    pytest.param("model-x:y.env", "note: experiments/layers/model-x:y.env is not a model: 'x:y' cannot be", id="colon"),
    pytest.param("model-.env", None, id="empty-name"),
])
def test_a_file_name_that_cannot_be_a_target_is_not_a_model(root, name, note):
    before = run_cli("--root", str(root), "list").stdout.splitlines()
    (layers(root) / name).write_text("# nope\nA=1\n")
    listed = run_cli("--root", str(root), "list")
    assert listed.returncode == 0, listed.stderr
    assert "\nb.env" not in listed.stdout  # a control character is never printed raw
    added = [line for line in listed.stdout.splitlines() if line not in before]
    assert [line[:len(note)] for line in added] == ([note] if note else [])  # a note at most: no model came of it
    checked = run_cli("--root", str(root), "check", "--update")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_huge_first_comment_is_cut(root):
    (layers(root) / "model-big.env").write_text("#" + "x" * 1_000_000 + "\nA=1\n")
    listed = run_cli("--root", str(root), "list", "--json")
    assert listed.returncode == 0, listed.stderr
    import json

    (row,) = [m for m in json.loads(listed.stdout)["models"] if m["name"] == "big"]
    assert len(row["description"]) <= 200


@pytest.mark.parametrize("env, needle", [
    pytest.param({"SLURM_JOB_NUM_NODES": "lots", "SLURM_GPUS_ON_NODE": "4"}, "? node(s), not 1", id="garbage-nodes"),
    pytest.param({"SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_PER_NODE": "gpu:many"}, "0 GPU(s) per node, not 4",
                 id="garbage-gpus"),
])
def test_a_batch_job_environment_that_makes_no_sense_does_not_fit(tmp_path, env, needle):
    import subprocess
    import sys

    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    full.update(env, SLURM_JOB_ID="5", SLURM_JOB_PARTITION="mi300", PYTHONPATH=str(REPO / "src"),
                ENVLAYERS_ROOT=str(REPO), MODEL="qwen38")
    proc = subprocess.run([sys.executable, "-m", "envlayers", "serve", "--in-allocation"], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert_clean_error(proc, "does not fit experiment:qwen38", needle, "cluster/serve-only.sbatch")
