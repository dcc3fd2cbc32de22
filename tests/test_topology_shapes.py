"""The shapes issue 11 adds (data-parallel, ray, gateway), the derived TP/PP, each refusal with its
exact message, the engine refusals, the reason lines, and the property over every shape."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envlayers.errors import EnvLayersError, TopologyError
from envlayers.topology import RankPlan, plan, reason_lines, topology_lines

NAMES = {"nodes": "INFERENCE_NODES", "gpn": "GPUS_PER_NODE", "tp": "TENSOR_PARALLEL_SIZE",
         "pp": "PIPELINE_PARALLEL_SIZE", "inst": "NUMBER_OF_INSTANCES", "mode": "INFERENCE_MODE",
         "backend": "DISTRIBUTED_BACKEND", "ray_serve": "USE_RAY_SERVE", "engine": "INFERENCE_ENGINE"}


def keys(**kw) -> dict[str, str]:
    return {NAMES.get(k, k): str(v) for k, v in kw.items() if v is not None}


# --------------------------------------------------------------------------- accepted shapes


@pytest.mark.parametrize(
    "env, shape, tp, pp, instances, per_node, backend",
    [
        pytest.param(keys(nodes=2, gpn=8, tp=2, inst=8), "data-parallel", 2, 1, 8, 4, "native",
                     id="dp-2x8-tp2-8-instances"),
        pytest.param(keys(nodes=2, gpn=8, inst=8), "data-parallel", 2, 1, 8, 4, "native", id="dp-tp-derived"),
        pytest.param(keys(nodes=2, gpn=8, inst=2), "data-parallel", 8, 1, 2, 1, "native", id="dp-one-per-node"),
        pytest.param(keys(nodes=1, gpn=8, tp=2, inst=2), "data-parallel", 2, 1, 2, 2, "native",
                     id="dp-one-node-fewer-gpus"),
        pytest.param(keys(nodes=2, gpn=8, tp=2, pp=2, inst=4), "data-parallel", 2, 2, 4, 2, "native",
                     id="dp-with-pp-inside-a-node"),
        pytest.param(keys(nodes=2, gpn=8, tp=16), "ray", 16, 1, 1, 1, "ray", id="ray-tp-beyond-a-node"),
        pytest.param(keys(nodes=2, gpn=4, tp=4, backend="ray"), "ray", 4, 2, 1, 1, "ray", id="ray-forced"),
        pytest.param(keys(nodes=2, gpn=4, tp=8, backend="native"), "pipeline", 8, 1, 1, 1, "native",
                     id="native-forced-tp-across-nodes"),
        pytest.param(keys(nodes=2, gpn=4, tp=8, engine="sglang"), "pipeline", 8, 1, 1, 1, "native",
                     id="sglang-rule-is-native"),
        pytest.param(keys(nodes=2, gpn=4, tp=8, mode="pipeline"), "pipeline", 8, 1, 1, 1, "native",
                     id="explicit-pipeline-mode-is-native"),
        pytest.param(keys(nodes=4), "pipeline", 4, 4, 1, 1, "native", id="pp-derived-from-nodes"),
        pytest.param(keys(nodes=4, gpn=8, tp=16, inst=2), "gateway", 16, 1, 2, 0, "ray",
                     id="gateway-instances-span-nodes"),
        pytest.param(keys(nodes=4, gpn=8, inst=2), "gateway", 8, 2, 2, 0, "ray", id="gateway-tp-pp-derived"),
        pytest.param(keys(nodes=2, gpn=8, tp=2, inst=8, ray_serve="true"), "gateway", 2, 1, 8, 4, "ray",
                     id="gateway-forced"),
        pytest.param(keys(nodes=1, gpn=4, inst=2, ray_serve="TRUE"), "gateway", 2, 1, 2, 2, "ray",
                     id="gateway-one-node"),
        pytest.param(keys(nodes=1, ray_serve="false"), "single", 4, 1, 1, 1, "native", id="ray-serve-false"),
        pytest.param(keys(nodes=1, ray_serve="", backend=""), "single", 4, 1, 1, 1, "native", id="empty-is-default"),
    ],
)
def test_shape_from_the_allocation(env, shape, tp, pp, instances, per_node, backend):
    p = plan(env)
    assert (p.shape, p.tp, p.pp, p.replicas, p.instances_per_node, p.backend) == (
        shape, tp, pp, instances, per_node, backend)
    assert p.world * p.replicas <= p.nodes * p.gpus_per_node


def test_data_parallel_ranks_node_zero_serves_the_others_are_headless():
    p = plan(keys(nodes=2, gpn=8, tp=2, inst=8))
    assert p.ranks == (RankPlan(0, 0, True, 8000), RankPlan(1, 1, False, None))
    assert [p.dp_start_rank(r) for r in p.ranks] == [0, 4]
    assert [(r.node_index, r.port) for r in p.readiness_ranks()] == [(0, 8000)]
    assert (p.multi_node, p.edf_topology, p.dp_rpc_port) == (True, "pipeline", 13345)


def test_data_parallel_rpc_port_comes_from_its_key():
    assert plan(keys(nodes=2, gpn=8, tp=2, inst=8, DATA_PARALLEL_RPC_PORT="14000")).dp_rpc_port == 14000


@pytest.mark.parametrize(
    "env, edf",
    [
        pytest.param(keys(nodes=1, gpn=8, tp=2, inst=4), "single", id="dp-one-node"),
        pytest.param(keys(nodes=1, inst=2, ray_serve="true"), "single", id="gateway-one-node"),
        pytest.param(keys(nodes=2, gpn=8, tp=16), "pipeline", id="ray"),
        pytest.param(keys(nodes=2, mode="replicas"), "replicas", id="replicas"),
    ],
)
def test_edf_variant_follows_whether_ranks_talk_across_nodes(env, edf):
    assert plan(env).edf_topology == edf


def test_a_user_value_is_never_changed():
    p = plan(keys(nodes=2, gpn=4, tp=8))
    assert (p.tp, p.pp) == (8, 1)
    assert p.derived == ("pp=1 (one instance spans 2 node(s), its tp=8 already 2)",)


# --------------------------------------------------------------------------- lines


@pytest.mark.parametrize(
    "env, lines",
    [
        pytest.param(keys(nodes=2, gpn=8, tp=2, inst=8), [
            "why: data-parallel: 8 instances of tp x pp = 2 GPU(s), each fits a node: vLLM data parallelism, "
            "4 per node, one endpoint on node 0",
            "derived: pp=1 (one instance spans 1 node(s))",
            "ENVLAYERS-TOPOLOGY: shape=data-parallel nodes=2 gpus_per_node=8 tp=2 pp=1 world=2 instances=8 "
            "instances_per_node=4 api_rank=0 port=8000",
            "ENVLAYERS-TOPOLOGY: rendezvous=rank0 dp_rpc_port=13345",
            "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=api dp_start_rank=0 dp_local=4 port=8000",
            "ENVLAYERS-TOPOLOGY: rank=1 node_index=1 role=headless dp_start_rank=4 dp_local=4",
        ], id="data-parallel"),
        pytest.param(keys(nodes=2, gpn=8, tp=16), [
            "why: ray: one instance across 2 nodes (tp=16 is larger than a node's 8 GPU(s): tensor parallelism "
            "across nodes uses Ray)",
            "derived: pp=1 (one instance spans 2 node(s), its tp=16 already 2)",
            "ENVLAYERS-TOPOLOGY: shape=ray nodes=2 gpus_per_node=8 tp=16 pp=1 world=16 api_rank=0 port=8000",
            "ENVLAYERS-TOPOLOGY: rendezvous=rank0 backend=ray ray_port=29500",
            "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=api port=8000",
            "ENVLAYERS-TOPOLOGY: rank=1 node_index=1 role=ray-worker",
        ], id="ray"),
        pytest.param(keys(nodes=4, gpn=8, inst=2), [
            "why: gateway: 2 instances that each span nodes: tp x pp = 16 > 8 GPU(s) per node: a Ray Serve "
            "gateway on node 0 in front of 2 vLLM instance(s) on Ray",
            "derived: tp=8 (GPUS_PER_NODE = 8)",
            "derived: pp=2 (one instance spans 2 node(s))",
            "ENVLAYERS-TOPOLOGY: shape=gateway nodes=4 gpus_per_node=8 tp=8 pp=2 world=16 instances=2 "
            "nodes_per_instance=2 api_rank=0 port=8000",
            "ENVLAYERS-TOPOLOGY: rendezvous=rank0 backend=ray ray_port=29500",
            "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=gateway port=8000",
            "ENVLAYERS-TOPOLOGY: rank=1 node_index=1 role=ray-worker",
            "ENVLAYERS-TOPOLOGY: rank=2 node_index=2 role=ray-worker",
            "ENVLAYERS-TOPOLOGY: rank=3 node_index=3 role=ray-worker",
        ], id="gateway"),
        pytest.param(keys(nodes=1, inst=2, ray_serve="true"), [
            "why: gateway: USE_RAY_SERVE=true: a Ray Serve gateway on node 0 in front of 2 vLLM instance(s) on Ray",
            "derived: tp=2 (INFERENCE_NODES x GPUS_PER_NODE / NUMBER_OF_INSTANCES = 4 / 2)",
            "derived: pp=1 (one instance spans 1 node(s))",
            "ENVLAYERS-TOPOLOGY: shape=gateway nodes=1 gpus_per_node=4 tp=2 pp=1 world=2 instances=2 "
            "max_instances_per_node=2 api_rank=0 port=8000",
            "ENVLAYERS-TOPOLOGY: rendezvous=rank0 backend=ray ray_port=29500",
            "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=gateway port=8000",
        ], id="gateway-one-node"),
        pytest.param(keys(nodes=1, tp=4, pp=1), [
            "why: single: one node, one instance: one server",
            "ENVLAYERS-TOPOLOGY: shape=single nodes=1 gpus_per_node=4 tp=4 pp=1 world=4 api_rank=0 port=8000",
            "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=api port=8000",
        ], id="single-nothing-derived"),
    ],
)
def test_reason_and_topology_lines(env, lines):
    p = plan(env)
    assert reason_lines(p) + topology_lines(p) == lines


# --------------------------------------------------------------------------- refusals

IDLE = "would be allocated and billed for the job's full walltime while sitting idle"
WHERE3 = "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE, NUMBER_OF_INSTANCES"
PRODUCT = "NUMBER_OF_INSTANCES x TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE"


@pytest.mark.parametrize(
    "env, message",
    [
        pytest.param(keys(nodes=2, gpn=8, tp=2, inst=3),
                     "NUMBER_OF_INSTANCES, INFERENCE_NODES: NUMBER_OF_INSTANCES = 3 does not divide evenly across "
                     "INFERENCE_NODES = 2 nodes; vLLM data parallelism runs the same number of instances on every "
                     "node; hint: set NUMBER_OF_INSTANCES to a multiple of 2 (2 or 4)", id="dp-uneven"),
        pytest.param(keys(nodes=2, gpn=8, tp=4, inst=8),
                     "NUMBER_OF_INSTANCES, TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: 4 instance(s) per node x "
                     "TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = 4 x 4 x 1 = 16 GPU(s) per node, but a node has "
                     "GPUS_PER_NODE = 8; the servers would fail at start after the job waited in the queue; "
                     "hint: set NUMBER_OF_INSTANCES=4, or TENSOR_PARALLEL_SIZE=2, or INFERENCE_NODES=4",
                     id="dp-node-share-too-big"),
        pytest.param(keys(nodes=2, gpn=8, tp=2, inst=4),
                     f"{WHERE3}: {PRODUCT} = 4 x 2 x 1 uses 8 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 2 x 8 = "
                     f"16 GPU(s) are allocated; the remaining 8 GPU(s) {IDLE}; hint: set NUMBER_OF_INSTANCES=8 "
                     "(4 per node)", id="dp-idle-gpus"),
        pytest.param(keys(nodes=2, gpn=8, tp=2, inst=8, backend="ray"),
                     "DISTRIBUTED_BACKEND, NUMBER_OF_INSTANCES: DISTRIBUTED_BACKEND=ray, but each of the 8 instances "
                     "fits one node, so no instance spans nodes; vLLM's own data parallelism coordinates the nodes; "
                     "hint: set DISTRIBUTED_BACKEND= (empty), or USE_RAY_SERVE=true for a Ray Serve gateway", id="dp-ray"),
        pytest.param(keys(nodes=2, gpn=8, tp=2, inst=8, DATA_PARALLEL_RPC_PORT=8000),
                     "DATA_PARALLEL_RPC_PORT, SERVER_PORT: DATA_PARALLEL_RPC_PORT and SERVER_PORT are both 8000; "
                     "rank 0 binds both on the same node; hint: set DATA_PARALLEL_RPC_PORT=13345, or another "
                     "port", id="dp-port-clash"),
        pytest.param(keys(nodes=4, gpn=8, tp=16, inst=3),
                     f"{WHERE3}: {PRODUCT} = 3 x 16 x 1 needs 48 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 4 x 8 "
                     "= 32 GPU(s) are allocated; 16 GPU(s) are missing, so the servers would fail at start after the "
                     "job waited in the queue; hint: set NUMBER_OF_INSTANCES=2", id="gateway-missing-gpus"),
        pytest.param(keys(nodes=4, gpn=8, tp=8, pp=1, inst=2, ray_serve="true"),
                     f"{WHERE3}: {PRODUCT} = 2 x 8 x 1 uses 16 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 4 x 8 = "
                     f"32 GPU(s) are allocated; the remaining 16 GPU(s) {IDLE}; hint: set NUMBER_OF_INSTANCES=4",
                     id="gateway-idle-gpus"),
        pytest.param(keys(nodes=1, gpn=4, tp=4, inst=2, ray_serve="true"),
                     f"{WHERE3}: {PRODUCT} = 2 x 4 x 1 needs 8 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 1 x 4 = "
                     "4 GPU(s) are allocated; 4 GPU(s) are missing, so the servers would fail at start after the job "
                     "waited in the queue; hint: set NUMBER_OF_INSTANCES=1", id="gateway-one-node-missing"),
        pytest.param(keys(nodes=4, gpn=8, tp=16, inst=2, backend="native"),
                     "DISTRIBUTED_BACKEND: DISTRIBUTED_BACKEND=native, but the plan is a Ray Serve gateway (2 "
                     "instances that each span nodes: tp x pp = 16 > 8 GPU(s) per node), whose instances run on Ray; "
                     "hint: set DISTRIBUTED_BACKEND= (empty) or ray", id="gateway-native"),
        pytest.param(keys(nodes=2, mode="replicas", inst=4),
                     "INFERENCE_MODE, NUMBER_OF_INSTANCES: INFERENCE_MODE=replicas runs one server per node (2), but "
                     "NUMBER_OF_INSTANCES = 4; hint: set NUMBER_OF_INSTANCES=2, or INFERENCE_MODE= (empty) for "
                     "instances behind one endpoint", id="replicas-instances"),
        pytest.param(keys(nodes=2, mode="replicas", ray_serve="true"),
                     "INFERENCE_MODE, USE_RAY_SERVE: INFERENCE_MODE=replicas runs independent servers, one per node, "
                     "but USE_RAY_SERVE=true asks for Ray; hint: set USE_RAY_SERVE=false, or INFERENCE_MODE= (empty)",
                     id="replicas-ray-serve"),
        pytest.param(keys(nodes=2, mode="replicas", backend="ray"),
                     "INFERENCE_MODE, DISTRIBUTED_BACKEND: INFERENCE_MODE=replicas runs independent servers, one per "
                     "node, but DISTRIBUTED_BACKEND=ray asks for Ray; hint: set DISTRIBUTED_BACKEND= (empty), or "
                     "INFERENCE_MODE= (empty)", id="replicas-ray-backend"),
        pytest.param(keys(nodes=1, mode="single", inst=2),
                     "INFERENCE_MODE, NUMBER_OF_INSTANCES: INFERENCE_MODE=single serves one instance without a "
                     "gateway, but NUMBER_OF_INSTANCES=2 asks for another shape; hint: set INFERENCE_MODE= (empty) "
                     "and the planner derives the shape from the numbers", id="single-mode-instances"),
        pytest.param(keys(nodes=2, mode="pipeline", ray_serve="true"),
                     "INFERENCE_MODE, USE_RAY_SERVE: INFERENCE_MODE=pipeline serves one instance without a gateway, "
                     "but USE_RAY_SERVE=true asks for another shape; hint: set INFERENCE_MODE= (empty) "
                     "and the planner derives the shape from the numbers", id="pipeline-mode-ray-serve"),
        pytest.param(keys(nodes=1, backend="ray"),
                     "DISTRIBUTED_BACKEND, INFERENCE_NODES: DISTRIBUTED_BACKEND=ray, but the plan is one server on "
                     "one node, which needs no executor across nodes; hint: set DISTRIBUTED_BACKEND= (empty), or "
                     "USE_RAY_SERVE=true for a Ray Serve gateway on the node", id="ray-on-one-node"),
        pytest.param(keys(nodes=2, gpn=8, tp=16, SERVER_PORT=29500),
                     "RDZV_PORT, SERVER_PORT: RDZV_PORT and SERVER_PORT are both 29500; rank 0 binds both on the "
                     "same node; hint: set RDZV_PORT=29501, or another port",
                     id="ray-port-clash"),
        pytest.param(keys(nodes=2, gpn=4, tp=4, pp=1, backend="ray"),
                     "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = "
                     "4 x 1 uses 4 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 2 x 4 = 8 GPU(s) are allocated; "
                     "4 GPU(s) would sit idle and be billed for the whole walltime; hint: set "
                     "PIPELINE_PARALLEL_SIZE=2, or INFERENCE_MODE=replicas for independent servers", id="ray-idle-gpus"),
        pytest.param(keys(inst=0), "NUMBER_OF_INSTANCES: must be a positive integer, got '0'; hint: set "
                     "NUMBER_OF_INSTANCES=1 (its value when no layer assigns it), or another positive integer",
                     id="instances-zero"),
        pytest.param({"NUMBER_OF_INSTANCES": ""},
                     "NUMBER_OF_INSTANCES: is empty; it must be a positive integer; hint: set NUMBER_OF_INSTANCES=1 "
                     "(its value when no layer assigns it), or another positive integer", id="instances-empty"),
        pytest.param(keys(ray_serve="maybe"),
                     "USE_RAY_SERVE: must be true or false (true/1/yes/on or false/0/no/off, any case), got 'maybe'; "
                     "hint: true forces the Ray Serve gateway; "
                     "false, the default, leaves the shape to the numbers", id="ray-serve-not-a-boolean"),
        pytest.param(keys(backend="mpi"),
                     "DISTRIBUTED_BACKEND: unknown backend 'mpi'; valid backends: native, ray; hint: set "
                     "DISTRIBUTED_BACKEND= (empty) to let the planner choose: native unless tensor parallelism is larger than one "
                     "node's GPUs", id="backend-unknown"),
        pytest.param({"DATA_PARALLEL_RPC_PORT": ""},
                     "DATA_PARALLEL_RPC_PORT: is empty; it must be a TCP port (1-65535); hint: set "
                     "DATA_PARALLEL_RPC_PORT=13345 (its value when no layer assigns it), or another port", id="dp-port-empty"),
        pytest.param({"DATA_PARALLEL_RPC_PORT": "70000"},
                     "DATA_PARALLEL_RPC_PORT: must be a TCP port (1-65535), got '70000'; hint: set "
                     "DATA_PARALLEL_RPC_PORT=13345 (its value when no layer assigns it), or another port",
                     id="dp-port-too-big"),
    ],
)
def test_refusal_names_the_cost_and_the_fix(env, message):
    with pytest.raises(EnvLayersError) as err:  # TopologyError, or KeyValueError for a value of the wrong type
        plan(env)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "env, message",
    [
        pytest.param(keys(nodes=2, gpn=8, tp=2, inst=8, engine="sglang"),
                     "INFERENCE_ENGINE: the plan is data-parallel (8 instances of tp x pp = 2 GPU(s), each fits a "
                     "node), but SGLang puts several instances behind one endpoint through its router (sgl-router), "
                     "not through a data-parallel launch; hint: INFERENCE_MODE=replicas and ROUTER=smg for one SGLang "
                     "server per node behind one router URL, or INFERENCE_ENGINE=vllm", id="sglang-data-parallel"),
        pytest.param(keys(nodes=2, gpn=8, tp=16, backend="ray", engine="sglang"),
                     "INFERENCE_ENGINE: the plan is ray (DISTRIBUTED_BACKEND=ray), but SGLang has no Ray executor: it "
                     "spans nodes with its own rendezvous (--nnodes, --dist-init-addr); hint: set "
                     "DISTRIBUTED_BACKEND= (empty): SGLang then uses its own rendezvous", id="sglang-ray"),
        pytest.param(keys(nodes=4, gpn=8, tp=16, inst=2, engine="sglang"),
                     "INFERENCE_ENGINE: the plan is gateway (2 instances that each span nodes: tp x pp = 16 > 8 "
                     "GPU(s) per node), but the Ray Serve gateway starts a vllm serve with the Ray executor for each "
                     "instance; SGLang has no Ray executor; hint: INFERENCE_ENGINE=vllm, or NUMBER_OF_INSTANCES=1 "
                     "and USE_RAY_SERVE=false", id="sglang-gateway"),
        pytest.param(keys(nodes=1, inst=1, ray_serve="true", engine="sglang"),
                     "INFERENCE_ENGINE: the plan is gateway (USE_RAY_SERVE=true), but the Ray Serve gateway starts a "
                     "vllm serve with the Ray executor for each instance; SGLang has no Ray executor; hint: "
                     "INFERENCE_ENGINE=vllm, or NUMBER_OF_INSTANCES=1 and USE_RAY_SERVE=false",
                     id="sglang-ray-serve"),
    ],
)
def test_engine_that_cannot_serve_the_shape_is_refused(env, message):
    with pytest.raises(TopologyError) as err:
        plan(env)
    assert str(err.value) == message


# --------------------------------------------------------------------------- property


@settings(max_examples=600, deadline=None)
@given(
    nodes=st.integers(1, 8),
    gpn=st.integers(1, 8),
    tp=st.one_of(st.none(), st.integers(1, 32)),
    pp=st.one_of(st.none(), st.integers(1, 8)),
    inst=st.one_of(st.none(), st.integers(1, 16)),
    mode=st.sampled_from([None, "", "single", "pipeline", "replicas"]),
    backend=st.sampled_from([None, "", "native", "ray"]),
    ray_serve=st.sampled_from([None, "true", "false"]),
    engine=st.sampled_from([None, "vllm", "sglang"]),
)
def test_no_accepted_plan_idles_a_gpu_on_several_nodes_or_over_asks(
    nodes, gpn, tp, pp, inst, mode, backend, ray_serve, engine
):
    env = keys(nodes=nodes, gpn=gpn, tp=tp, pp=pp, inst=inst, mode=mode, backend=backend, ray_serve=ray_serve,
               engine=engine)
    try:
        p = plan(env)
    except TopologyError as err:
        assert err.where and err.hint or "must be" in err.message
        return
    total = nodes * gpn
    assert p.world * p.replicas <= total
    if nodes > 1:
        assert p.world * p.replicas == total
    # a value the user set is never changed
    assert tp is None or p.tp == tp
    assert pp is None or p.pp == pp
    assert len(p.ranks) == nodes and [r.rank for r in p.ranks] == list(range(nodes))
    assert engine != "sglang" or p.shape in ("single", "pipeline", "replicas")
    if p.shape == "data-parallel":
        assert p.replicas == (inst or 1) > 1 and p.replicas == p.instances_per_node * nodes
        assert p.instances_per_node * p.world <= gpn
    if p.shape in ("ray", "gateway"):
        assert p.backend == "ray" and engine != "sglang"
    if p.shape != "replicas":
        assert [r.serves_api for r in p.ranks] == [True] + [False] * (nodes - 1)


@pytest.mark.parametrize(
    "env, tp, pp, derived",
    [
        pytest.param(keys(nodes=2, gpn=8, inst=4, pp=2), 2, 2,
                     ("tp=2 (INFERENCE_NODES x GPUS_PER_NODE / NUMBER_OF_INSTANCES = 16 / 4 / "
                      "PIPELINE_PARALLEL_SIZE 2)",),
                     id="tp-from-the-share-and-pp"),
        pytest.param(keys(nodes=1, gpn=4, tp=2), 2, 1, ("pp=1 (one instance spans 1 node(s))",), id="pp-one-node"),
        pytest.param(keys(nodes=4, gpn=4, tp=8), 8, 2, ("pp=2 (one instance spans 4 node(s), its tp=8 already 2)",),
                     id="pp-after-tp-spans-nodes"),
        pytest.param(keys(nodes=2, gpn=4, tp=4, pp=2), 4, 2, (), id="nothing-derived"),
    ],
)
def test_derived_parallelism_says_where_it_came_from(env, tp, pp, derived):
    p = plan(env)
    assert (p.tp, p.pp, p.derived) == (tp, pp, derived)
