"""`env_layers plan` and the dry run show each shape of the catalog examples, with why it was chosen."""

from __future__ import annotations

from pathlib import Path

import json
import shlex

import pytest
from click.testing import CliRunner

from envlayers.cli import cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def edf_dir(tmp_path, monkeypatch):
    d = tmp_path / "edf"
    d.mkdir()
    monkeypatch.setenv("EDF_PATH", str(d))
    monkeypatch.setenv("HOME", str(tmp_path))
    return d


def run(*args):
    return CliRunner().invoke(cli, ["--root", str(REPO), *args])


@pytest.mark.parametrize(
    "target, why, summary",
    [
        pytest.param("experiment:oss20bdp",
                     "why: data-parallel: 8 instances of tp x pp = 1 GPU(s), each fits a node: vLLM data parallelism, "
                     "4 per node, one endpoint on node 0",
                     "ENVLAYERS-TOPOLOGY: shape=data-parallel nodes=2 gpus_per_node=4 tp=1 pp=1 world=1 instances=8 "
                     "instances_per_node=4 api_rank=0 port=8000", id="data-parallel"),
        pytest.param("experiment:llama405bray",
                     "why: ray: one instance across 2 nodes (tp=8 is larger than a node's 4 GPU(s): tensor "
                     "parallelism across nodes uses Ray)",
                     "ENVLAYERS-TOPOLOGY: shape=ray nodes=2 gpus_per_node=4 tp=8 pp=1 world=8 api_rank=0 port=8000",
                     id="ray"),
        pytest.param("experiment:llama405bgateway",
                     "why: gateway: 2 instances that each span nodes: tp x pp = 8 > 4 GPU(s) per node: a Ray Serve "
                     "gateway on node 0 in front of 2 vLLM instance(s) on Ray",
                     "ENVLAYERS-TOPOLOGY: shape=gateway nodes=4 gpus_per_node=4 tp=8 pp=1 world=8 instances=2 "
                     "nodes_per_instance=2 api_rank=0 port=8000", id="gateway"),
        pytest.param("experiment:kimi27sglang",
                     "why: pipeline: one instance across 4 nodes (tp=4 fits a node of 4 GPU(s): tensor parallelism "
                     "inside a node, pipeline parallelism (pp=4) across nodes, the engine's own rendezvous)",
                     "ENVLAYERS-TOPOLOGY: shape=pipeline nodes=4 gpus_per_node=4 tp=4 pp=4 world=16 api_rank=0 "
                     "port=8000", id="pipeline"),
    ],
)
def test_plan_prints_the_shape_and_why(target, why, summary, edf_dir):
    result = run("plan", target)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == why
    assert summary in lines


def test_plan_with_model_option_equals_plan_with_target(edf_dir):
    assert run("plan", "--model", "oss20bdp").output == run("plan", "experiment:oss20bdp").output


def test_plan_target_must_be_experiment_colon_model(edf_dir):
    result = run("plan", "oss20bdp")
    assert result.exit_code == 2
    assert "TARGET: 'oss20bdp' is not EXPERIMENT:MODEL" in result.output


@pytest.mark.parametrize(
    "model, shape, ranks, blocked",
    [
        pytest.param("oss20bdp", "data-parallel", 2, None, id="data-parallel"),
        pytest.param("llama405bray", "ray", 2, None, id="ray"),
        pytest.param("llama405bgateway", "gateway", 4, None, id="gateway"),
    ],
)
def test_dry_run_shows_each_shape(model, shape, ranks, blocked, edf_dir):
    result = run("serve", "--model", model, "--dry-run")
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"# target experiment:{model} on site mi300a: shape={shape} " in out
    assert f"# why: {shape}: " in out
    assert sum(1 for line in out.splitlines() if line.startswith("#   rank ")) == ranks
    assert f"--nodes={ranks} " in out
    if blocked:
        assert f"# would refuse to submit: {blocked}" in out
    else:
        assert f"shape {shape}" not in out.split("would refuse to submit")[-1]


def test_dry_run_of_data_parallel_has_headless_node_one(edf_dir):
    out = run("serve", "--model", "oss20bdp", "--dry-run").output
    rank1 = next(line for line in out.splitlines() if line.startswith("#   rank 1: "))
    assert ("--headless --data-parallel-size 8 --data-parallel-start-rank 4 --data-parallel-size-local 4 "
            '--data-parallel-address "${ENVLAYERS_MASTER_ADDR}" --data-parallel-rpc-port 13345') in rank1
    # the per-job key of experiments/serve-only.env reaches every vLLM rank through its environment, shown masked
    assert rank1.startswith("#   rank 1: NCCL_NET_GDR_LEVEL=LOC VLLM_ALLREDUCE_USE_SYMM_MEM=0 VLLM_API_KEY='***' "
                            "VLLM_HOST_IP=\"${ENVLAYERS_NODE_ADDR}\" vllm serve ")


@pytest.mark.parametrize("model", ["llama405bray", "llama405bgateway"])
def test_ray_shapes_are_not_refused_at_submission(model, edf_dir):
    # the job starts both Ray shapes: the dry run lists no shape among what would refuse the submission
    (edf_dir / "hpcagent-bench-vllm-mi300-latest.toml").write_text("")
    result = run("serve", "--model", model, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    blockers = json.loads(result.output)["blockers"]
    assert not [b for b in blockers if b.startswith("shape ")], blockers


@pytest.mark.parametrize("model, then", [
    ("llama405bray", "once all 2 node(s) joined: NCCL_NET_GDR_LEVEL=LOC VLLM_ALLREDUCE_USE_SYMM_MEM=0 VLLM_API_KEY='***' VLLM_HOST_IP=\"${ENVLAYERS_NODE_ADDR}\" vllm serve "),
    ("llama405bgateway", "once all 4 node(s) joined: the Ray Serve gateway on port 8000 with 2 replica(s), each "
                         "running this server on a free 127.0.0.1 port in place of --host/--port: "
                         "NCCL_NET_GDR_LEVEL=LOC VLLM_ALLREDUCE_USE_SYMM_MEM=0 VLLM_API_KEY='***' VLLM_HOST_IP=\"${ENVLAYERS_NODE_ADDR}\" vllm serve "),
])
def test_dry_run_of_a_ray_shape_shows_the_head_node_zero_starts_first(model, then, edf_dir):
    from envlayers import topology
    from envlayers.engines.vllm import ray_head_command

    data = json.loads(run("serve", "--model", model, "--dry-run", "--json").output)
    keys = json.loads(run("render", f"experiment:{model}", "--format", "json").output)
    head = shlex.join(ray_head_command(topology.plan(keys), keys))
    assert head.startswith("ray start --head --port=29500 ") and head.endswith(" --block")
    assert data["ranks"][0].startswith(f"{head} (the Ray head, kept running); {then}"), data["ranks"][0]
    assert data["ranks"][1].startswith("NCCL_NET_GDR_LEVEL=LOC VLLM_ALLREDUCE_USE_SYMM_MEM=0 VLLM_HOST_IP=\"${ENVLAYERS_NODE_ADDR}\" ray start "
                                       '"--address=${ENVLAYERS_MASTER_ADDR}:29500" ')
