"""Exact vLLM argv per rank for the data-parallel, ray and gateway shapes (issue 11), the flags vLLM
rejects on headless ranks, and VLLM_ALLREDUCE_USE_SYMM_MEM on multi-node commands."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envlayers.engines import build_commands, shell_line
from envlayers.errors import TopologyError
from envlayers.engines.vllm import ray_head_command
from envlayers.topology import plan

MASTER = "10.1.2.3"
BASE = {
    "INFERENCE_ENGINE": "vllm",
    "INFERENCE_MODEL": "org/model",
    "VLLM_SERVED_MODEL": "served",
}
DP = {**BASE, "INFERENCE_NODES": "2", "GPUS_PER_NODE": "8", "TENSOR_PARALLEL_SIZE": "2", "NUMBER_OF_INSTANCES": "8"}
RAY = {**BASE, "INFERENCE_NODES": "2", "GPUS_PER_NODE": "8", "TENSOR_PARALLEL_SIZE": "16"}
GATEWAY = {**BASE, "INFERENCE_NODES": "4", "GPUS_PER_NODE": "8", "TENSOR_PARALLEL_SIZE": "16",
           "NUMBER_OF_INSTANCES": "2"}
HEAD = ("vllm", "serve", "org/model", "--served-model-name", "served")
HOST = ("--host", "0.0.0.0", "--port", "8000")
# a Ray worker's fixed ports: RAY_PORT_BASE (absent: 28000) + their offsets (docs/keys.md)
RAY_WORKER_PORTS = ("--dashboard-agent-listen-port=28000", "--node-manager-port=28002", "--object-manager-port=28003",
                    "--metrics-export-port=28004", "--dashboard-agent-grpc-port=28005",
                    "--runtime-env-agent-port=28006", "--min-worker-port=28100", "--max-worker-port=28999")


def commands(env, master=MASTER):
    return build_commands(plan(env), env, master)


@pytest.mark.parametrize(
    "env, expected",
    [
        pytest.param(DP, [
            (*HEAD, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
             "--data-parallel-size", "8", "--data-parallel-size-local", "4",
             "--data-parallel-address", MASTER, "--data-parallel-rpc-port", "13345", *HOST),
            (*HEAD, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
             "--headless", "--data-parallel-size", "8", "--data-parallel-start-rank", "4",
             "--data-parallel-size-local", "4", "--data-parallel-address", MASTER,
             "--data-parallel-rpc-port", "13345", *HOST),
        ], id="data-parallel-2-nodes"),
        pytest.param({**DP, "INFERENCE_NODES": "4", "GPUS_PER_NODE": "4", "NUMBER_OF_INSTANCES": "8",
                      "DATA_PARALLEL_RPC_PORT": "14000"}, [
            (*HEAD, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
             "--data-parallel-size", "8", "--data-parallel-size-local", "2",
             "--data-parallel-address", MASTER, "--data-parallel-rpc-port", "14000", *HOST),
            *[(*HEAD, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
               "--headless", "--data-parallel-size", "8", "--data-parallel-start-rank", str(k),
               "--data-parallel-size-local", "2", "--data-parallel-address", MASTER,
               "--data-parallel-rpc-port", "14000", *HOST) for k in (2, 4, 6)],
        ], id="data-parallel-4-nodes-start-ranks"),
        pytest.param({**DP, "INFERENCE_NODES": "1", "NUMBER_OF_INSTANCES": "4"}, [
            (*HEAD, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
             "--data-parallel-size", "4", *HOST),
        ], id="data-parallel-one-node"),
        pytest.param(RAY, [
            (*HEAD, "--tensor-parallel-size", "16", "--pipeline-parallel-size", "1",
             "--distributed-executor-backend", "ray", *HOST),
            ("ray", "start", f"--address={MASTER}:29500", "--num-gpus=8", *RAY_WORKER_PORTS, "--block"),
        ], id="ray"),
        pytest.param(GATEWAY, [
            (*HEAD, "--tensor-parallel-size", "16", "--pipeline-parallel-size", "1",
             "--distributed-executor-backend", "ray", *HOST),
            *[("ray", "start", f"--address={MASTER}:29500", "--num-gpus=8", *RAY_WORKER_PORTS, "--block")] * 3,
        ], id="gateway"),
    ],
)
def test_argv_per_rank(env, expected):
    assert [c.argv for c in commands(env)] == expected


def test_node_zero_never_gets_a_start_rank():
    # vLLM reads --data-parallel-start-rank without --headless as hybrid load balancing
    head = commands(DP)[0].argv
    assert "--data-parallel-start-rank" not in head and "--headless" not in head


@pytest.mark.parametrize(
    "extra, head_keeps, headless_keeps",
    [
        pytest.param("--api-server-count 4 --enforce-eager", ["--api-server-count", "4", "--enforce-eager"],
                     ["--enforce-eager"], id="api-server-count"),
        pytest.param("-asc=2 --enforce-eager", ["-asc=2", "--enforce-eager"], ["--enforce-eager"], id="short-form"),
        pytest.param("--data-parallel-hybrid-lb --max-model-len 4096",
                     ["--data-parallel-hybrid-lb", "--max-model-len", "4096"], ["--max-model-len", "4096"],
                     id="hybrid-lb-switch"),
        pytest.param("""--hf-overrides '{"rope_scaling": {"factor": 4}}' -asc 8""",
                     ["--hf-overrides", '{"rope_scaling": {"factor": 4}}', "-asc", "8"],
                     ["--hf-overrides", '{"rope_scaling": {"factor": 4}}'], id="json-valued-flag-intact"),
    ],
)
def test_one_extra_args_value_works_for_every_node(extra, head_keeps, headless_keeps):
    env = {**DP, "SERVER_EXTRA_ARGS": extra}
    head, headless = commands(env)
    assert list(head.argv[-len(head_keeps):]) == head_keeps
    assert list(headless.argv[-len(headless_keeps):]) == headless_keeps
    assert len(headless.argv) == len(commands(DP)[1].argv) + len(headless_keeps)


@pytest.mark.parametrize(
    "env, expected",
    [
        pytest.param(DP, {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}, id="data-parallel-default"),
        pytest.param(RAY, {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}, id="ray-default"),
        pytest.param({**BASE, "INFERENCE_NODES": "2", "PIPELINE_PARALLEL_SIZE": "2"},
                     {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}, id="pipeline-default"),
        pytest.param({**DP, "VLLM_ALLREDUCE_USE_SYMM_MEM": "1"}, {"VLLM_ALLREDUCE_USE_SYMM_MEM": "1"}, id="value"),
        pytest.param({**DP, "VLLM_ALLREDUCE_USE_SYMM_MEM": ""}, {}, id="empty-leaves-vllms-default"),
        pytest.param(BASE, {}, id="one-node-untouched"),
        pytest.param({**BASE, "INFERENCE_NODES": "1", "NUMBER_OF_INSTANCES": "2"}, {}, id="dp-one-node-untouched"),
    ],
)
def test_symmetric_memory_all_reduce_is_off_on_multi_node_vllm(env, expected):
    for cmd in commands(env):
        assert {k: v for k, v in cmd.env.items() if k == "VLLM_ALLREDUCE_USE_SYMM_MEM"} == expected


def test_ray_workers_carry_the_same_command_environment():
    env = {**RAY, "NCCL_NET_GDR_LEVEL": "LOC"}
    head, worker = commands(env)
    assert worker.env == head.env == {"NCCL_NET_GDR_LEVEL": "LOC", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
                                      "VLLM_HOST_IP": "${ENVLAYERS_NODE_ADDR}"}


def test_ray_head_listens_on_the_rendezvous_port():
    # RAY_PORT_BASE empty: Ray's own port defaults, no port flags
    assert ray_head_command(plan({**RAY, "RDZV_PORT": "6379"}), {"RAY_PORT_BASE": ""}) == (
        "ray", "start", "--head", "--port=6379", "--num-gpus=8", "--include-dashboard=false", "--disable-usage-stats",
        "--block")


def test_master_reference_stays_expandable_in_the_printed_line():
    line = shell_line(commands(DP, "${ENVLAYERS_MASTER_ADDR}")[1])
    assert '--data-parallel-address "${ENVLAYERS_MASTER_ADDR}"' in line
    ray_line = shell_line(commands(RAY, "${ENVLAYERS_MASTER_ADDR}")[1])
    assert ray_line == ('VLLM_ALLREDUCE_USE_SYMM_MEM=0 VLLM_HOST_IP="${ENVLAYERS_NODE_ADDR}" ray start "--address=${ENVLAYERS_MASTER_ADDR}:29500" --num-gpus=8 '
                        + " ".join(RAY_WORKER_PORTS) + " --block")


def _value(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


@settings(max_examples=200, deadline=None)
@given(nodes=st.integers(1, 6), gpn=st.integers(1, 8), tp=st.integers(1, 8), inst=st.integers(2, 24))
def test_data_parallel_ranks_cover_every_instance_once(nodes, gpn, tp, inst):
    env = {**BASE, "INFERENCE_NODES": str(nodes), "GPUS_PER_NODE": str(gpn), "TENSOR_PARALLEL_SIZE": str(tp),
           "NUMBER_OF_INSTANCES": str(inst)}
    try:
        p = plan(env)
    except TopologyError:
        return
    if p.shape != "data-parallel":
        return
    covered = []
    for i, cmd in enumerate(commands(env)):
        argv = cmd.argv
        assert _value(argv, "--data-parallel-size") == str(inst)
        assert ("--headless" in argv) == (i > 0)
        if nodes == 1:
            covered += range(inst)
            continue
        start = int(_value(argv, "--data-parallel-start-rank", "0"))
        local = int(_value(argv, "--data-parallel-size-local"))
        assert local * tp <= gpn
        covered += range(start, start + local)
    assert sorted(covered) == list(range(inst))


def test_every_fabric_setting_of_a_layer_goes_on_the_server_command():
    # the CE's netstack hook rewrites NCCL and libfabric defaults after the step environment: only an
    # assignment on the command line wins, so each NCCL_/FI_/RCCL_ key a layer sets goes there
    from envlayers.engines.command import command_env

    env = {"NCCL_NET_GDR_LEVEL": "LOC", "NCCL_MIN_NCHANNELS": "32", "FI_CXI_RDZV_THRESHOLD": "0",
           "RCCL_MSCCL_ENABLE": "0", "NCCL_DEBUG": "", "HF_HOME": "/x"}
    assert list(command_env(env).items()) == [("NCCL_NET_GDR_LEVEL", "LOC"), ("FI_CXI_RDZV_THRESHOLD", "0"),
                                              ("NCCL_MIN_NCHANNELS", "32"), ("RCCL_MSCCL_ENABLE", "0")]
