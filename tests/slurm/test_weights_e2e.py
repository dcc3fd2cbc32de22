"""The weights check on the real local Slurm cluster: ``cluster/serve-only.sbatch`` refuses a hub-id model
whose weights are not in the job's Hugging Face cache (nothing reaches Slurm), and submits the same job
once a snapshot is there, laid out as the hub client writes it (blobs and relative links)."""

from __future__ import annotations

import re
import subprocess

import pytest

from labruns import BANNER, KEYLESS, SBATCH, Run
from hubcache import fake_snapshot  # tests/hubcache.py (tests/ is on sys.path under pytest)

QWEN = "Qwen/Qwen3.8-27B-FP8"  # qwen38's INFERENCE_MODEL

pytestmark = pytest.mark.slurm


def test_missing_weights_are_refused_before_slurm_and_a_snapshot_lets_the_job_run(netns_lab, tmp_path):
    hf = tmp_path / "hf"
    run = Run(netns_lab, tmp_path, layer=KEYLESS + f"HF_HOME={hf}\n", SERVE_TIME="00:10:00")
    before = netns_lab.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    refused = subprocess.run([str(SBATCH)], cwd=tmp_path, env=dict(run.env, SUBMIT="1"), capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"the weights of {QWEN} are not in the cache the job reads, HF_HOME={hf}" in refused.stderr
    assert f"`HF_HOME={hf} hf download {QWEN}`" in refused.stderr
    assert netns_lab.run(["squeue", "-h", "-o", "%i"]).stdout.split() == before  # nothing was submitted
    dry = run.sbatch(submit=False).stdout
    assert f"# would refuse to submit: INFERENCE_MODEL (experiments/layers/model-qwen38.env:6): the weights of " \
           f"{QWEN}" in dry

    fake_snapshot(hf / "hub", QWEN)
    assert "# would refuse to submit" not in run.sbatch(submit=False).stdout
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert f"export HF_HOME='{hf}'" in (run.run_dir / "serve.env").read_text()
    assert "base URL: http://n1:8000/v1" in text
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
