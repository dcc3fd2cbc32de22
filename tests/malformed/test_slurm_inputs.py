"""Slurm's own inputs in a layer: srun, sbatch and salloc read SLURM_*, SRUN_*, SBATCH_* and SALLOC_* variables
as options (SLURM_TASK_PROLOG runs a program on every node before each rank), and every key a layer assigns is
exported to the job. Each is refused, in a SERVE_ENV_FILE and in setups.yaml's `env:`, through the operator's
own entry (cluster/serve-only.sbatch, run by real bash) before anything is submitted; SLURM_PARTITION, the
launch key the job's --partition comes from, stays allowed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from malformed_tools import REPO, assert_clean_error, run_cli

FAKE_SBATCH = "#!/bin/sh\ntouch {submitted}\necho 4242\n"


def _wrapper(tmp_path: Path, layer: str, submit: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """``SUBMIT=<submit> SERVE_ENV_FILE=t.env cluster/serve-only.sbatch`` in bash, with an sbatch that only
    records that it ran; (result, canary the layer's program would create, sbatch's record)."""
    canary, submitted = tmp_path / "canary", tmp_path / "submitted"
    prolog = tmp_path / "prolog.sh"
    prolog.write_text(f"#!/bin/sh\ntouch {canary}\n")
    prolog.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text(FAKE_SBATCH.format(submitted=submitted))
    (bin_dir / "sbatch").chmod(0o755)
    env_file = tmp_path / "t.env"
    env_file.write_text("CONTAINER_RUNTIME=none\nSERVER_API_KEY_FILE=generate\n" + layer.format(prolog=prolog))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env.pop("ENVLAYERS_DEBUG", None)
    env.update(SUBMIT=submit, SERVE_ENV_FILE=str(env_file), HOME=str(tmp_path), MODEL="qwen38",
               PATH=f"{bin_dir}:{os.environ['PATH']}", EDF_PATH=str(tmp_path))
    proc = subprocess.run(["bash", str(REPO / "cluster" / "serve-only.sbatch")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, canary, submitted


@pytest.mark.parametrize("submit", ["0", "1"])
@pytest.mark.parametrize("key, why", [
    pytest.param("SLURM_TASK_PROLOG", "SLURM_TASK_PROLOG and SLURM_TASK_EPILOG run a program on every node",
                 id="task-prolog"),
    pytest.param("SLURM_TASK_EPILOG", "SLURM_TASK_PROLOG and SLURM_TASK_EPILOG run a program on every node",
                 id="task-epilog"),
    pytest.param("SLURM_NTASKS_PER_NODE", "srun reads SLURM_* variables as its options", id="srun-option"),
    pytest.param("SRUN_CPUS_PER_TASK", "srun reads SRUN_* variables as its options", id="srun-variable"),
    pytest.param("SBATCH_TIMELIMIT", "sbatch reads SBATCH_* variables as its options", id="sbatch-variable"),
    pytest.param("SALLOC_PARTITION", "salloc reads SALLOC_* variables as its options", id="salloc-variable"),
])
def test_a_slurm_input_in_serve_env_file_is_refused_before_submission(tmp_path, submit, key, why):
    proc, canary, submitted = _wrapper(tmp_path, f"{key}={{prolog}}\n", submit)
    assert_clean_error(proc, f"{tmp_path / 't.env'}:3: '{key}' is refused in a layer: ", why, "; hint: ")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == "" and not submitted.exists() and not canary.exists()


def test_slurm_partition_is_the_one_slurm_name_a_layer_passes_on(tmp_path):
    proc, canary, submitted = _wrapper(tmp_path, "SLURM_PARTITION=mi200\nX=$SLURM_JOB_ID\n", "0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--partition=mi200" in proc.stdout and "export SLURM_PARTITION='mi200'" in proc.stdout
    assert not submitted.exists() and not canary.exists()


@pytest.mark.parametrize("key, why", [
    pytest.param("BASH_ENV", "bash runs the file it names", id="bash-env"),
    pytest.param("SLURM_TASK_PROLOG", "srun reads SLURM_* variables as its options", id="task-prolog"),
    pytest.param("SBATCH_ACCOUNT", "sbatch reads SBATCH_* variables as its options", id="sbatch-account"),
    pytest.param("IFS", "is a bash special variable", id="bash-special"),
])
def test_setups_yaml_env_refuses_them_for_the_real_reason(repo_copy, key, why):
    setups = repo_copy / "experiments" / "setups.yaml"
    text = setups.read_text()
    anchor = "    layers: [replicas.env]\n"
    assert anchor in text
    setups.write_text(text.replace(anchor, anchor + f"    env: {{{key}: /tmp/x}}\n", 1))
    line = text[:text.index(anchor)].count("\n") + 2
    for args in (["list"], ["render", "replicas:qwen38"]):
        proc = run_cli("--root", str(repo_copy), *args)
        assert_clean_error(proc, f"experiments/setups.yaml:{line}: experiments.replicas.env.{key}: ", why, "; hint: ")
        assert "is not a valid variable name" not in proc.stderr
