"""The wrapper under sbatch, without Slurm: the allocation read from a batch job's environment, the fit
verdict, and cluster/serve-only.sbatch run by real bash as Slurm runs it (a copy named slurm_script).

The same behaviour on the real local cluster: tests/slurm/test_wrapper_sbatch_e2e.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from envlayers import allocation

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env, expected", [
    pytest.param({}, None, id="outside-a-job"),
    pytest.param({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "4", "SLURM_GPUS_ON_NODE": "4",
                  "SLURM_JOB_PARTITION": "mi300"}, ("7", 4, 4, "mi300"), id="gpus-on-node"),
    pytest.param({"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_GPUS": "0,1,2,3"}, ("7", 2, 4, None),
                 id="job-gpus-list"),
    pytest.param({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_PER_NODE": "gpu:mi300a:4"},
                 ("7", 1, 4, None), id="typed-gpus-per-node"),
    pytest.param({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"}, ("7", 1, None, None), id="no-gpus"),
    pytest.param({"SLURM_JOBID": "8", "SLURM_JOB_NUM_NODES": "x", "SLURM_GPUS_ON_NODE": "0"}, ("8", None, 0, None),
                 id="old-name-and-garbage"),
])
def test_the_allocation_from_a_batch_jobs_environment(env, expected):
    alloc = allocation.from_environ(env)
    got = None if alloc is None else (alloc.job_id, alloc.nodes, alloc.gpus_per_node, alloc.partition)
    assert got == expected


@pytest.mark.parametrize("nodes, gpus, partition, problems", [
    pytest.param(4, 4, "mi300", [], id="fits"),
    pytest.param(1, 4, "mi300", ["1 node(s), not 4"], id="too-few-nodes"),
    pytest.param(4, None, "mi300", ["0 GPU(s) per node, not 4"], id="no-gpus"),
    pytest.param(4, 8, "mi300", ["8 GPU(s) per node, not 4"], id="too-many-gpus-would-idle"),
    pytest.param(4, 4, "mi200", ["partition mi200, not mi300"], id="partition"),
    pytest.param(2, 2, None, ["2 node(s), not 4", "2 GPU(s) per node, not 4", "partition ?, not mi300"],
                 id="everything"),
])
def test_misfits(nodes, gpus, partition, problems):
    alloc = allocation.Allocation("9", nodes, gpus, partition)
    assert allocation.misfits(alloc, 4, 4, "mi300") == problems


@pytest.mark.parametrize("partition, problems", [
    pytest.param("mi200", [], id="second-of-the-list"),
    pytest.param("debug", ["partition debug, not mi300 or mi200"], id="none-of-the-list"),
])
def test_a_plan_may_name_several_partitions(partition, problems):
    assert allocation.misfits(allocation.Allocation("9", 1, 4, partition), 1, 4, "mi300,mi200") == problems


def test_a_plan_without_partition_takes_any():
    assert allocation.misfits(allocation.Allocation("9", 1, 4, "debug"), 1, 4, None) == []


def test_the_right_command_keeps_the_operators_choices_quoted():
    env = {"MODEL": "glm53", "SERVE_ENV_FILE": "/home/a b/mine.env", "UNRELATED": "x"}
    assert allocation.right_command(env) == "MODEL=glm53 SERVE_ENV_FILE='/home/a b/mine.env' cluster/serve-only.sbatch"


# -- the wrapper, as Slurm runs it ------------------------------------------------------------------------------


def run_as_batch_job(tmp_path, slurm_env: dict[str, str], **env: str) -> subprocess.CompletedProcess:
    """Run a copy of the wrapper named slurm_script (what slurmd runs) with a batch job's variables."""
    spool = tmp_path / "spool" / "job77"
    spool.mkdir(parents=True)
    script = spool / "slurm_script"
    shutil.copy(REPO / "cluster" / "serve-only.sbatch", script)
    (tmp_path / "mine.env").write_text("CONTAINER_RUNTIME=none\n")  # the per-job key of serve-only.env
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in (
        "MODEL", "EXPERIMENT", "SERVE_BASE_ENV", "SUBMIT")}
    base.update(PYTHONPATH=str(REPO / "src"), ENVLAYERS_ROOT=str(REPO), SERVE_ENV_FILE=str(tmp_path / "mine.env"),
                PATH=f"{tmp_path / 'nobin'}:{os.environ['PATH']}")
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env={**base, **slurm_env, **env}, capture_output=True,
                          text=True, timeout=60)


FITS_QWEN38 = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "4",
               "SLURM_JOB_PARTITION": "mi300"}


def test_under_sbatch_a_fitting_allocation_runs_the_rendered_job_script(tmp_path):
    proc = run_as_batch_job(tmp_path, FITS_QWEN38, SUBMIT="0")
    assert proc.returncode == 0, proc.stderr
    first, script = proc.stdout.split("\n", 1)
    assert first == ("serve-only.sbatch: running experiment:qwen38 as job 77 itself (the allocation fits: 1 node(s), "
                     "4 GPU(s) per node, partition mi300)")
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=serve-only\n")
    assert "# envlayers serve-only job for experiment:qwen38 on site mi300a (single, 1 node(s))." in script
    assert script.rstrip().endswith('-m envlayers launch --run-dir "$RUN_DIR"')


@pytest.mark.parametrize("slurm_env, model, why, nodes", [
    pytest.param({**FITS_QWEN38}, "glm53", "1 node(s), not 4", 4, id="too-few-nodes"),
    pytest.param({**FITS_QWEN38, "SLURM_GPUS_ON_NODE": ""}, "qwen38", "0 GPU(s) per node, not 4", 1, id="no-gpus"),
    pytest.param({**FITS_QWEN38, "SLURM_JOB_PARTITION": "mi200"}, "qwen38", "partition mi200, not mi300", 1,
                 id="partition"),
])
def test_under_sbatch_a_misfit_ends_at_once_with_one_line(tmp_path, slurm_env, model, why, nodes):
    proc = run_as_batch_job(tmp_path, slurm_env, MODEL=model)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        f"serve-only.sbatch: job 77 does not fit experiment:{model} ({why}): it needs {nodes} node(s) with 4 GPU(s) "
        f"each on partition mi300; run it without sbatch, and it submits that job itself: MODEL={model} "
        f"SERVE_ENV_FILE={tmp_path / 'mine.env'} cluster/serve-only.sbatch\n")


def test_under_sbatch_a_bad_model_is_the_usual_one_line_error(tmp_path):
    proc = run_as_batch_job(tmp_path, FITS_QWEN38, MODEL="nope")
    assert proc.returncode == 2 and proc.stderr.startswith("env_layers: error: experiments/layers/model-nope.env: "
                                                           "unknown model 'nope'")


def test_run_directly_inside_an_allocation_still_submits(tmp_path):
    """SLURM_JOB_ID alone (an salloc shell) is not sbatch: the wrapper submits as usual (here: the dry run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "EXPERIMENT", "SERVE_BASE_ENV")}
    (tmp_path / "mine.env").write_text("CONTAINER_RUNTIME=none\n")  # the per-job key of serve-only.env
    env.update(FITS_QWEN38, SUBMIT="0", PYTHONPATH=str(REPO / "src"), SERVE_ENV_FILE=str(tmp_path / "mine.env"))
    proc = subprocess.run([str(REPO / "cluster" / "serve-only.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# envlayers dry run: nothing was submitted.")
