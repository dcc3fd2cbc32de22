"""The topology planner: shapes, ranks, ports, and the errors for shapes that waste or over-ask GPUs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envlayers import topology
from envlayers.errors import KeyValueError, TopologyError
from envlayers.topology import Plan, RankPlan, plan, topology_lines


def keys(nodes=None, gpn=None, tp=None, pp=None, mode=None, **extra) -> dict[str, str]:
    env = {
        "INFERENCE_NODES": nodes,
        "GPUS_PER_NODE": gpn,
        "TENSOR_PARALLEL_SIZE": tp,
        "PIPELINE_PARALLEL_SIZE": pp,
        "INFERENCE_MODE": mode,
        **extra,
    }
    return {k: str(v) for k, v in env.items() if v is not None}


# --------------------------------------------------------------------------- defaults and shapes


def test_absent_keys_give_one_node_of_four_gpus_at_tp_four():
    p = plan({})
    assert p == Plan(
        shape="single",
        nodes=1,
        gpus_per_node=4,
        tp=4,
        pp=1,
        replicas=1,
        ranks=(RankPlan(rank=0, node_index=0, serves_api=True, port=8000),),
        api_port=8000,
        rdzv_port=29500,
    )


def test_absent_tensor_parallel_size_follows_gpus_per_node():
    assert plan(keys(gpn=8)).tp == 8


@pytest.mark.parametrize(
    "env, shape",
    [
        pytest.param(keys(nodes=1), "single", id="one-node"),
        pytest.param(keys(nodes=1, mode=""), "single", id="empty-mode-one-node"),
        pytest.param(keys(nodes=4, pp=4), "pipeline", id="four-nodes-pp4"),
        pytest.param(keys(nodes=4, pp=4, mode=""), "pipeline", id="empty-mode-four-nodes"),
        pytest.param(keys(nodes=2, mode="replicas"), "replicas", id="explicit-replicas"),
        pytest.param(keys(nodes=1, mode="replicas"), "replicas", id="replicas-one-node"),
        pytest.param(keys(nodes=1, mode="pipeline"), "single", id="pipeline-on-one-node-is-single"),
        pytest.param(keys(nodes=2, pp=2, mode="pipeline"), "pipeline", id="explicit-pipeline"),
    ],
)
def test_shape_is_derived_from_mode_and_nodes(env, shape):
    assert plan(env).shape == shape


def test_single_node_may_use_fewer_gpus_than_allocated():
    p = plan(keys(tp=2))
    assert (p.shape, p.world) == ("single", 2)
    assert p.notes == ("the server uses 2 of the 4 GPU(s) on the node",)


def test_pipeline_ranks_only_rank_zero_serves_the_api():
    p = plan(keys(nodes=4, pp=4))
    assert p.ranks == (
        RankPlan(0, 0, True, 8000),
        RankPlan(1, 1, False, None),
        RankPlan(2, 2, False, None),
        RankPlan(3, 3, False, None),
    )
    assert p.readiness_ranks() == (RankPlan(0, 0, True, 8000),)
    assert ports(p) == ((0, 8000),)


def test_replicas_every_node_serves_the_api_on_the_same_port():
    p = plan(keys(nodes=2, mode="replicas", SERVER_PORT="9000"))
    assert p.replicas == 2
    assert p.ranks == (RankPlan(0, 0, True, 9000), RankPlan(1, 1, True, 9000))
    assert ports(p) == ((0, 9000), (1, 9000))


def test_replicas_smaller_than_a_node_are_allowed_on_one_node():
    p = plan(keys(nodes=1, tp=2, mode="replicas"))
    assert (p.shape, p.world, p.world * p.replicas) == ("replicas", 2, 2)
    assert p.notes == ("each replica uses 2 of the 4 GPU(s) on its node",)


def test_replicas_smaller_than_a_node_are_refused_on_several_nodes():
    # issue 11: on more than one node, an override whose GPUs do not add up to the allocation is refused
    with pytest.raises(TopologyError) as err:
        plan(keys(nodes=2, tp=2, mode="replicas"))
    assert str(err.value) == (
        "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = 2 x 1 uses "
        "2 GPU(s) per replica, but INFERENCE_MODE=replicas runs one server on each of the 2 nodes of 4 GPU(s); "
        "the remaining 4 GPU(s) would be allocated and billed for the job's full walltime while sitting idle; "
        "hint: set TENSOR_PARALLEL_SIZE=4 to use each node, or set INFERENCE_MODE= (empty) and NUMBER_OF_INSTANCES=4 "
        "for 2 instance(s) per node behind one endpoint (vLLM)"
    )


def test_tensor_parallel_across_nodes_is_allowed_when_every_gpu_is_used():
    # tp larger than a node goes through Ray by default (issue 11); native keeps the engine's rendezvous
    p = plan(keys(nodes=2, tp=8, DISTRIBUTED_BACKEND="native"))
    assert (p.shape, p.tp, p.pp) == ("pipeline", 8, 1)
    assert p.notes == (
        "tp=8 does not fit inside one node of 4 GPU(s): tensor parallelism crosses the network, "
        "which is usually slower than pipeline parallelism across nodes",
    )


@pytest.mark.parametrize(
    "env, api_port, rdzv_port",
    [
        pytest.param({}, 8000, 29500, id="defaults"),
        pytest.param({"SERVER_PORT": "9001", "RDZV_PORT": "30000"}, 9001, 30000, id="values"),
        pytest.param({"SERVER_PORT": " 9001 "}, 9001, 29500, id="surrounding-spaces"),
    ],
)
def test_ports_come_from_server_port_and_rdzv_port(env, api_port, rdzv_port):
    p = plan(env)
    assert (p.api_port, p.rdzv_port) == (api_port, rdzv_port)


# --------------------------------------------------------------------------- errors


IDLE = (
    "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = {tp} x {pp} "
    "uses {used} GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = {nodes} x {gpn} = {total} GPU(s) are allocated; "
    "{idle} GPU(s) would sit idle and be billed for the whole walltime; hint: {hint}"
)
MISSING = (
    "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = {tp} x {pp} "
    "needs {used} GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = {nodes} x {gpn} = {total} GPU(s) are allocated; "
    "{missing} GPU(s) are missing, so the server would fail at start after the job waited in the queue; "
    "hint: {hint}"
)


@pytest.mark.parametrize(
    "env, message",
    [
        pytest.param(
            keys(nodes=2, tp=4, pp=1),
            IDLE.format(tp=4, pp=1, used=4, nodes=2, gpn=4, total=8, idle=4,
                        hint="set PIPELINE_PARALLEL_SIZE=2, or INFERENCE_MODE=replicas for independent servers"),
            id="two-nodes-tp4-pp1",
        ),
        pytest.param(
            keys(nodes=4, tp=4, pp=2),
            IDLE.format(tp=4, pp=2, used=8, nodes=4, gpn=4, total=16, idle=8,
                        hint="set PIPELINE_PARALLEL_SIZE=4, or INFERENCE_NODES=2"),
            id="four-nodes-pp2",
        ),
        pytest.param(
            keys(nodes=2, gpn=4, tp=3, pp=1),
            IDLE.format(tp=3, pp=1, used=3, nodes=2, gpn=4, total=8, idle=5,
                        hint="set TENSOR_PARALLEL_SIZE=4 and PIPELINE_PARALLEL_SIZE=2, "
                        "or INFERENCE_MODE=replicas for independent servers"),
            id="tp-not-dividing-the-allocation",
        ),
    ],
)
def test_multi_node_instance_that_leaves_gpus_idle_is_rejected(env, message):
    with pytest.raises(TopologyError) as err:
        plan(env)
    assert str(err.value) == message
    assert err.value.where == "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE"


def test_absent_nodes_are_the_nodes_the_gpus_fill():
    p = topology.plan(keys(gpn=8, tp=4, pp=4))
    assert (p.shape, p.nodes, p.tp, p.pp) == ("pipeline", 2, 4, 4)
    assert p.derived[0] == "nodes=2 (INFERENCE_NODES absent: tp 4 x pp 4 = 16 GPU(s) at GPUS_PER_NODE = 8)"
    assert topology.plan(keys(gpn=4, tp=4, pp=4)).nodes == 4
    assert topology.plan(keys(gpn=8, tp=1, NUMBER_OF_INSTANCES="8")).nodes == 1
    assert topology.plan(keys(gpn=4, tp=1, NUMBER_OF_INSTANCES="8")).nodes == 2
    with pytest.raises(TopologyError, match=r"INFERENCE_NODES x GPUS_PER_NODE = 4 x 8"):  # a count set is kept
        topology.plan(keys(nodes=4, gpn=8, tp=4, pp=4))
    with pytest.raises(TopologyError):  # 9 GPUs fill no whole number of 4-GPU nodes: refused, not rounded up
        topology.plan(keys(gpn=4, tp=3, pp=3))


@pytest.mark.parametrize(
    "env, message",
    [
        pytest.param(
            keys(nodes=2, tp=4, pp=4),
            MISSING.format(tp=4, pp=4, used=16, nodes=2, gpn=4, total=8, missing=8,
                           hint="set INFERENCE_NODES=4, or PIPELINE_PARALLEL_SIZE=2"),
            id="pipeline-needs-more-nodes",
        ),
        pytest.param(
            keys(nodes=1, tp=8),
            MISSING.format(tp=8, pp=1, used=8, nodes=1, gpn=4, total=4, missing=4,
                           hint="set INFERENCE_NODES=2, or TENSOR_PARALLEL_SIZE=4"),
            id="single-node-tp-beyond-the-node",
        ),
        pytest.param(
            keys(tp=3, pp=3),
            MISSING.format(tp=3, pp=3, used=9, nodes=1, gpn=4, total=4, missing=5,
                           hint="set TENSOR_PARALLEL_SIZE=4 and PIPELINE_PARALLEL_SIZE=1"),
            id="no-simple-fix",
        ),
    ],
)
def test_instance_that_needs_more_gpus_than_allocated_is_rejected(env, message):
    with pytest.raises(TopologyError) as err:
        plan(env)
    assert str(err.value) == message


REPLICA = (
    "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = {tp} x {pp} "
    "needs {used} GPU(s) per replica, but INFERENCE_MODE=replicas runs one independent server per node and a node "
    "has GPUS_PER_NODE = 4 GPU(s); the server would fail at start after the job waited in the queue; hint: {hint}"
)


@pytest.mark.parametrize(
    "env, message",
    [
        pytest.param(
            keys(nodes=4, tp=4, pp=4, mode="replicas"),
            REPLICA.format(tp=4, pp=4, used=16, hint="set INFERENCE_MODE= (empty) for one instance across the "
                           "4 nodes, or set PIPELINE_PARALLEL_SIZE=1 if one node's memory holds the model"),
            id="pipeline-model-as-replicas",
        ),
        pytest.param(
            keys(nodes=3, tp=3, pp=3, mode="replicas"),
            REPLICA.format(tp=3, pp=3, used=9, hint="set TENSOR_PARALLEL_SIZE=4 and PIPELINE_PARALLEL_SIZE=1"),
            id="no-instance-fix",
        ),
    ],
)
def test_replica_larger_than_a_node_hints_the_fix(env, message):
    with pytest.raises(TopologyError) as err:
        plan(env)
    assert str(err.value) == message


def test_replica_larger_than_a_node_is_rejected():
    with pytest.raises(TopologyError) as err:
        plan(keys(nodes=2, tp=8, mode="replicas"))
    assert str(err.value) == (
        "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = 8 x 1 "
        "needs 8 GPU(s) per replica, but INFERENCE_MODE=replicas runs one independent server per node and a node "
        "has GPUS_PER_NODE = 4 GPU(s); the server would fail at start after the job waited in the queue; "
        "hint: set INFERENCE_MODE= (empty) for one instance across the 2 nodes, "
        "or set TENSOR_PARALLEL_SIZE=4 if one node's memory holds the model"
    )


def test_single_mode_on_several_nodes_is_rejected():
    with pytest.raises(TopologyError) as err:
        plan(keys(nodes=3, mode="single"))
    assert str(err.value) == (
        "INFERENCE_MODE, INFERENCE_NODES: INFERENCE_MODE=single runs one server on one node, but "
        "INFERENCE_NODES = 3; 2 node(s) (8 GPU(s)) would sit idle and be billed for the whole walltime; "
        "hint: set INFERENCE_NODES=1, or INFERENCE_MODE=replicas for one server per node, "
        "or INFERENCE_MODE= (empty) for one instance across the nodes"
    )


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(TopologyError) as err:
        plan(keys(mode="pipline"))
    assert str(err.value) == (
        "INFERENCE_MODE: unknown mode 'pipline'; valid modes: single, pipeline, replicas; "
        "hint: set INFERENCE_MODE= (empty) to derive the mode from INFERENCE_NODES and "
        "TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE"
    )


@pytest.mark.parametrize(
    "key, value",
    [
        pytest.param(key, value, id=f"{key}={value}")
        for key in ("INFERENCE_NODES", "GPUS_PER_NODE", "TENSOR_PARALLEL_SIZE", "PIPELINE_PARALLEL_SIZE")
        for value in ("0", "-1", "2.5", "four", "0x4", "+4")
    ],
)
def test_non_integer_or_non_positive_count_names_the_key(key, value):
    with pytest.raises(KeyValueError) as err:
        plan({key: value})
    default = {"INFERENCE_NODES": 1, "GPUS_PER_NODE": 4, "TENSOR_PARALLEL_SIZE": 4, "PIPELINE_PARALLEL_SIZE": 1}[key]
    assert str(err.value) == (f"{key}: must be a positive integer, got {value!r}; hint: set {key}={default} (its "
                              "value when no layer assigns it), or another positive integer")


@pytest.mark.parametrize(
    "key, default",
    [
        pytest.param("INFERENCE_NODES", "1", id="nodes"),
        pytest.param("GPUS_PER_NODE", "4", id="gpus-per-node"),
        pytest.param("TENSOR_PARALLEL_SIZE", "4", id="tp"),
        pytest.param("PIPELINE_PARALLEL_SIZE", "1", id="pp"),
    ],
)
def test_empty_count_is_an_error_not_the_default(key, default):
    with pytest.raises(KeyValueError) as err:
        plan({key: ""})
    assert str(err.value) == (
        f"{key}: is empty; it must be a positive integer; hint: set {key}={default} (its value when no layer "
        "assigns it), or another positive integer"
    )


@pytest.mark.parametrize(
    "key, value, message",
    [
        pytest.param("SERVER_PORT", "", "is empty; it must be a TCP port (1-65535); "
                     "hint: set SERVER_PORT=8000 (its value when no layer assigns it), or another port", id="empty-server-port"),
        pytest.param("RDZV_PORT", "", "is empty; it must be a TCP port (1-65535); "
                     "hint: set RDZV_PORT=29500 (its value when no layer assigns it), or another port", id="empty-rdzv-port"),
        pytest.param("SERVER_PORT", "0", "must be a TCP port (1-65535), got '0'", id="port-zero"),
        pytest.param("SERVER_PORT", "65536", "must be a TCP port (1-65535), got '65536'", id="port-too-big"),
        pytest.param("RDZV_PORT", "http", "must be a TCP port (1-65535), got 'http'", id="port-not-a-number"),
    ],
)
def test_bad_port_names_the_key(key, value, message):
    with pytest.raises(KeyValueError) as err:
        plan({key: value})
    assert str(err.value).startswith(f"{key}: {message}") and f"; hint: set {key}=" in str(err.value)


def test_rendezvous_port_equal_to_server_port_is_rejected_on_a_pipeline():
    with pytest.raises(TopologyError) as err:
        plan(keys(nodes=2, pp=2, SERVER_PORT="29500"))
    assert str(err.value) == (
        "RDZV_PORT, SERVER_PORT: RDZV_PORT and SERVER_PORT are both 29500; rank 0 binds both on the same node; "
        "hint: set RDZV_PORT=29501, or another port"
    )


# --------------------------------------------------------------------------- topology lines


@pytest.mark.parametrize(
    "env, lines",
    [
        pytest.param(
            keys(nodes=4, pp=4),
            [
                "ENVLAYERS-TOPOLOGY: shape=pipeline nodes=4 gpus_per_node=4 tp=4 pp=4 world=16 api_rank=0 port=8000",
                "ENVLAYERS-TOPOLOGY: rendezvous=rank0 rdzv_port=29500",
                "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=api port=8000",
                "ENVLAYERS-TOPOLOGY: rank=1 node_index=1 role=worker",
                "ENVLAYERS-TOPOLOGY: rank=2 node_index=2 role=worker",
                "ENVLAYERS-TOPOLOGY: rank=3 node_index=3 role=worker",
            ],
            id="pipeline",
        ),
        pytest.param(
            {},
            [
                "ENVLAYERS-TOPOLOGY: shape=single nodes=1 gpus_per_node=4 tp=4 pp=1 world=4 api_rank=0 port=8000",
                "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=api port=8000",
            ],
            id="single",
        ),
        pytest.param(
            keys(nodes=2, mode="replicas"),
            [
                "ENVLAYERS-TOPOLOGY: shape=replicas nodes=2 gpus_per_node=4 tp=4 pp=1 world=4 replicas=2 "
                "api_ranks=0,1 port=8000",
                "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=api port=8000",
                "ENVLAYERS-TOPOLOGY: rank=1 node_index=1 role=api port=8000",
            ],
            id="replicas",
        ),
        pytest.param(
            keys(nodes=1, tp=2, mode="replicas"),
            [
                "ENVLAYERS-TOPOLOGY: shape=replicas nodes=1 gpus_per_node=4 tp=2 pp=1 world=2 replicas=1 "
                "api_ranks=0 port=8000",
                "ENVLAYERS-TOPOLOGY: rank=0 node_index=0 role=api port=8000",
                "ENVLAYERS-TOPOLOGY: note: each replica uses 2 of the 4 GPU(s) on its node",
            ],
            id="replicas-with-note",
        ),
    ],
)
def test_topology_lines_say_what_was_decided(env, lines):
    assert topology_lines(plan(env)) == lines


# --------------------------------------------------------------------------- property
# The property over every shape (data-parallel, ray, gateway included) is in test_topology_shapes.py.


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.integers(1, 8),
    gpn=st.integers(1, 8),
    tp=st.integers(1, 16),
    pp=st.integers(1, 8),
    mode=st.sampled_from([None, "", "single", "pipeline", "replicas"]),
)
def test_a_plan_uses_every_gpu_or_fits_its_node_or_is_refused(nodes, gpn, tp, pp, mode):
    try:
        p = plan(keys(nodes=nodes, gpn=gpn, tp=tp, pp=pp, mode=mode))
    except TopologyError as err:
        assert err.where and err.hint
        return
    assert p.tp * p.pp == tp * pp
    assert len(p.ranks) == nodes
    assert [r.rank for r in p.ranks] == list(range(nodes))
    if p.shape in ("pipeline", "ray"):
        assert nodes > 1 and tp * pp == nodes * gpn
        assert [r.serves_api for r in p.ranks] == [True] + [False] * (nodes - 1)
        assert (p.shape == "ray") == (tp > gpn and mode != "pipeline")
    elif p.shape == "replicas":
        assert mode == "replicas" and tp * pp <= gpn and p.replicas == nodes
        assert nodes == 1 or tp * pp == gpn
        assert all(r.serves_api and r.port == p.api_port for r in p.ranks)
    else:
        assert p.shape == "single" and nodes == 1 and tp * pp <= gpn
    assert p.world * p.replicas <= nodes * gpn


def test_a_plan_is_an_immutable_value_whatever_its_reason_says():
    import pickle
    from dataclasses import replace

    p = plan(keys(nodes=2, gpn=4, tp=8))
    assert p.reason and p.derived
    said_otherwise = replace(p, reason="another reason", derived=())
    assert said_otherwise == p and hash(said_otherwise) == hash(p) and said_otherwise.reason == "another reason"
    moved = replace(p, rdzv_port=p.rdzv_port + 1)
    assert moved != p and moved.rdzv_port == p.rdzv_port + 1 and moved.ranks == p.ranks
    back = pickle.loads(pickle.dumps(p))
    assert back == p and (back.reason, back.derived) == (p.reason, p.derived)
    assert repr(p).startswith("Plan(shape='ray', nodes=2, gpus_per_node=4, tp=8, pp=1, replicas=1, ranks=(")
    assert repr(p).endswith(f"reason={p.reason!r}, derived={p.derived!r})")
    with pytest.raises(AttributeError):
        p.tp = 4
    with pytest.raises(TypeError):
        replace(p, no_such_field=1)
    assert p.tp == 8


def ports(p) -> tuple[tuple[int, int], ...]:
    """``(node_index, port)`` of every rank that must answer before the endpoint is live."""
    return tuple((r.node_index, r.port) for r in p.readiness_ranks() if r.port is not None)
