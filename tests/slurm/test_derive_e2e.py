"""Parallelism derived across layers, on the real local Slurm cluster: a SERVE_ENV_FILE holding only
INFERENCE_NODES=2 puts a one-node model (tp=4 from the site, pp=1 in common.env) on two nodes as a pipeline; the job
plans again from the environment the job script gives it and runs the same plan."""

from __future__ import annotations

import re

import pytest

from labruns import BANNER, Run

pytestmark = pytest.mark.slurm


def test_nodes_alone_in_serve_env_file_run_a_two_node_pipeline(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, model="qwen38", layer="INFERENCE_NODES=2\n")
    dry = run.sbatch(submit=False).stdout
    assert f"# derived: pp=2 (INFERENCE_NODES=2 at {tmp_path / 'mine.env'}:2 stands above PIPELINE_PARALLEL_SIZE=1 " \
           "at experiments/layers/common.env:9" in dry
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert "ENVLAYERS-TOPOLOGY: shape=pipeline nodes=2 gpus_per_node=4 tp=4 pp=2 world=8 api_rank=0" in text
    assert "--tp-size 4 --pp-size 2" in text and "--nnodes 2 --node-rank 1" in text
    assert "export PIPELINE_PARALLEL_SIZE='2'" in (run.run_dir / "serve.env").read_text()
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    run.assert_nothing_left()
