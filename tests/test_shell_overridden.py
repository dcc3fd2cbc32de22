"""A launch key given on the command line that a layer overwrites: one warning naming the layer line that
wins and the way that works (a SERVE_ENV_FILE layer), in the dry run and at submission."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envlayers.layers import load_env, shell_overridden

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "cluster" / "serve-only.sbatch"
WINS = "experiments/layers/model-glm53.env:11"  # AGENT_READY_TIMEOUT_SECONDS=10800
WARNING = (f"AGENT_READY_TIMEOUT_SECONDS from the submitting shell is ignored: {WINS} sets "
           "AGENT_READY_TIMEOUT_SECONDS=10800, and the layers are sourced after the command line; to set it for a "
           "run, put AGENT_READY_TIMEOUT_SECONDS=<value> in a SERVE_ENV_FILE layer (sourced last, docs/keys.md)")


def _env(tmp_path: Path, layer: str = ""):
    mine = tmp_path / "mine.env"
    mine.write_text(layer)
    return load_env(REPO, "experiment:glm53", (mine,))


@pytest.mark.parametrize("layer, environ, keys", [
    pytest.param("", {"AGENT_READY_TIMEOUT_SECONDS": "100"}, ["AGENT_READY_TIMEOUT_SECONDS"], id="overwritten"),
    pytest.param("", {"AGENT_READY_TIMEOUT_SECONDS": "10800"}, [], id="the-same-value"),
    pytest.param("", {"MAX_MODEL_LEN": "4096"}, [], id="a-key-no-layer-sets"),
    pytest.param("PATH=/opt/x/bin\nLC_ALL=C\n", {"PATH": "/usr/bin", "LC_ALL": "en_US.UTF-8"}, [],
                 id="the-shells-basics"),
    pytest.param("NCCL_DEBUG=${NCCL_DEBUG:-WARN}\n", {"NCCL_DEBUG": "INFO"}, [], id="a-layer-that-reads-it"),
    pytest.param("", {"SLURM_PARTITION": "debug"}, ["SLURM_PARTITION"], id="slurm-partition-on-the-login-node"),
    pytest.param("", {"SLURM_PARTITION": "debug", "SLURM_JOB_ID": "7"}, [], id="slurm-set-it-in-a-job"),
    pytest.param("", {"SERVER_PORT": "9000", "RDZV_PORT": "1"}, ["SERVER_PORT", "RDZV_PORT"], id="each-key"),
])
def test_shell_overridden(tmp_path, layer, environ, keys):
    assert [b.key for b in shell_overridden(_env(tmp_path, layer), environ)] == keys


def test_the_binding_named_is_the_one_that_wins(tmp_path):
    mine = "AGENT_READY_TIMEOUT_SECONDS=600\n"
    (b,) = shell_overridden(_env(tmp_path, mine), {"AGENT_READY_TIMEOUT_SECONDS": "100"})
    assert str(b.origin) == f"{tmp_path / 'mine.env'}:1"


def _operator(tmp_path: Path, layer: str = "", **env: str) -> dict[str, str]:
    """The operator's shell and SERVE_ENV_FILE (no EDF to install: runtime none; no weights check)."""
    (tmp_path / "serve.env").write_text("CONTAINER_RUNTIME=none\nCHECK_WEIGHTS=0\n" + layer)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    sbatch = bin_dir / "sbatch"  # records what it was given, like sbatch --parsable answers with a job id
    sbatch.write_text(f"#!/bin/sh\ncat > {tmp_path / 'sbatch.stdin'}\necho 4242\n")
    sbatch.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "ENVLAYERS_"))}
    return {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "PYTHON": sys.executable,
            "PYTHONPATH": str(REPO / "src"), "MODEL": "glm53", "SERVE_ENV_FILE": str(tmp_path / "serve.env"), **env}


def _run(tmp_path: Path, layer: str = "", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SBATCH)], cwd=tmp_path, env=_operator(tmp_path, layer, **env), capture_output=True,
                          text=True, timeout=120)


def test_the_dry_run_warns_once_naming_the_layer_line_and_serve_env_file(tmp_path):
    proc = _run(tmp_path, SUBMIT="0", AGENT_READY_TIMEOUT_SECONDS="100")
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stdout.splitlines() if "from the submitting shell" in line]
    assert warned == [f"# warning: {WARNING}"]
    assert warned[0] in (REPO / "docs" / "layers.md").read_text()  # the docs show it as printed
    assert "\nexport AGENT_READY_TIMEOUT_SECONDS='10800'\n" in proc.stdout  # what the job will use


def test_a_submission_warns_once_on_stderr_and_submits(tmp_path):
    proc = _run(tmp_path, SUBMIT="1", AGENT_READY_TIMEOUT_SECONDS="100")
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "from the submitting shell" in line] == [
        f"warning: {WARNING}"]
    assert "submitted job 4242" in proc.stdout
    assert "\nexport AGENT_READY_TIMEOUT_SECONDS='10800'\n" in (tmp_path / "sbatch.stdin").read_text()


def test_the_way_the_warning_names_works_and_says_nothing(tmp_path):
    proc = _run(tmp_path, SUBMIT="0")  # no shell value: nothing to warn about
    assert proc.returncode == 0 and "from the submitting shell" not in proc.stdout, proc.stdout
    proc = _run(tmp_path, "AGENT_READY_TIMEOUT_SECONDS=100\n", SUBMIT="0")  # the SERVE_ENV_FILE layer
    assert proc.returncode == 0, proc.stderr
    assert "from the submitting shell" not in proc.stdout
    assert "\nexport AGENT_READY_TIMEOUT_SECONDS='100'\n" in proc.stdout
