"""``sbatch cluster/serve-only.sbatch`` on the real local Slurm cluster.

An allocation that fits the plan runs the rendered job script as the job itself and goes live; one that does
not ends at once with one line naming the command that works. The engine is the stand-in (tests/standin).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from timing import LATE_S  # how late a busy machine may run an event

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "cluster" / "serve-only.sbatch"
STANDIN = REPO / "tests" / "standin"

pytestmark = pytest.mark.slurm


def operator_env(lab, tmp_path: Path, **env: str) -> dict[str, str]:
    """An operator's shell on the login node: the lab's Slurm, the stand-in engine, their own env file."""
    (tmp_path / "mine.env").write_text("CONTAINER_RUNTIME=none\nSERVER_API_KEY_FILE=\nALLOW_PUBLIC_UNAUTHENTICATED=1\n"  # the lab serves keyless: acknowledged (docs/keys.md)
                                       f"HF_HOME={tmp_path / 'hf'}\n")
    if env.get("MODEL"):  # the model's weights are in the operator's cache, as the check before submission wants
        from envlayers.layers import load_env
        from hubcache import fake_snapshot

        fake_snapshot(tmp_path / "hf" / "hub", load_env(REPO, f"experiment:{env['MODEL']}").text()["INFERENCE_MODEL"])
    out = {**os.environ, **lab.env, "SCRATCH": str(tmp_path / "scratch"), "SERVE_ENV_FILE": str(tmp_path / "mine.env"),
           "STANDIN_LOAD_SECONDS": "1", "PATH": f"{STANDIN / 'bin'}:{lab.env.get('PATH', os.environ['PATH'])}",
           "PYTHONPATH": os.pathsep.join([str(STANDIN / "pypath"), str(REPO / "src")]), **env}
    for key in ("ENVLAYERS_ROOT", "RUN_ROOT", "ENVLAYERS_RUN_ROOT", "EXPERIMENT", "SERVE_BASE_ENV", "SUBMIT"):
        out.pop(key, None)  # the catalog is found from the script sbatch was given
    return out


def sbatch(lab, tmp_path: Path, env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(["sbatch", "--parsable", *args, str(SBATCH)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    lab._submitted.append(job_id)  # cancelled at teardown if the test fails midway
    return job_id


def cli(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_sbatch_with_a_fitting_allocation_runs_as_the_job_and_goes_live(netns_lab, tmp_path):
    env = operator_env(netns_lab, tmp_path, MODEL="qwen38")
    job_id = sbatch(netns_lab, tmp_path, env, "--nodes=1", "--gpus-per-node=4", "--time=00:10:00")
    waited = cli(tmp_path, env, "wait", job_id, "--timeout", "90", "--progress", "none")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "base URL: http://n1:8000/v1\n" in waited.stdout
    out = (tmp_path / f"serve-only-{job_id}.out").read_text()  # the wrapper's own #SBATCH --output
    assert out.startswith(f"serve-only.sbatch: running experiment:qwen38 as job {job_id} itself (the allocation "
                          "fits: 1 node(s), 4 GPU(s) per node, partition mi300)\n")
    assert f"ENVLAYERS-STAGE: job {job_id} started on n1" in out
    run_dir = tmp_path / "scratch" / "inference-server" / job_id
    job_sh = (run_dir / "job.sh").read_text()
    assert "# envlayers serve-only job for experiment:qwen38 on site mi300a (single, 1 node(s))." in job_sh
    dry = subprocess.run([str(SBATCH)], cwd=tmp_path, env={**env, "SUBMIT": "0"}, capture_output=True, text=True,
                         timeout=60).stdout
    rendered = dry.split("<<'ENVLAYERS_JOB'\n", 1)[1].split("\nENVLAYERS_JOB\n", 1)[0] + "\n"
    # the job ran the very script `serve` would have submitted (but for the interpreter's path)
    strip = [line for line in job_sh.splitlines() if " -m envlayers launch " not in line]
    assert strip == [line for line in rendered.splitlines() if " -m envlayers launch " not in line]
    info = netns_lab.job_info(job_id)
    assert info["JobName"] == "serve-only" and info["JobState"] == "RUNNING"
    stopped = cli(tmp_path, env, "stop", job_id, "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.mark.parametrize("model, args, why, nodes", [
    pytest.param("glm53", ("--nodes=1", "--gpus-per-node=4"), "1 node(s), not 4", 4, id="too-few-nodes"),
    pytest.param("qwen38", ("--nodes=1",), "0 GPU(s) per node, not 4", 1, id="no-gpus"),
    pytest.param("qwen38", ("--nodes=1", "--gpus-per-node=4", "--partition=mi200"), "partition mi200, not mi300", 1,
                 id="partition"),
])
def test_sbatch_with_an_allocation_that_does_not_fit_ends_at_once_with_one_line(netns_lab, tmp_path, model, args,
                                                                                 why, nodes):
    env = operator_env(netns_lab, tmp_path, MODEL=model)
    started = time.monotonic()
    job_id = sbatch(netns_lab, tmp_path, env, *args, "--time=00:10:00")
    assert netns_lab.wait_job(job_id, timeout_s=10 + LATE_S) == "FAILED"
    assert time.monotonic() - started < 10 + LATE_S  # no rank starts: a job that went on would run to --time
    out = (tmp_path / f"serve-only-{job_id}.out").read_text()
    assert out == (f"serve-only.sbatch: job {job_id} does not fit experiment:{model} ({why}): it needs {nodes} node(s) "
                   f"with 4 GPU(s) each on partition mi300; run it without sbatch, and it submits that job itself: "
                   f"MODEL={model} SERVE_ENV_FILE={tmp_path / 'mine.env'} cluster/serve-only.sbatch\n")
    assert netns_lab.job_info(job_id)["ExitCode"] == "2:0"
