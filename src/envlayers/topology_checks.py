"""The planner's inputs and refusals: launch keys parsed by the absent-vs-empty rule, the
parallelism derived from the allocation when the layers leave it absent, and every
``TopologyError`` a shape can end in, each naming what the mistake would cost, including which
shapes each engine can serve (``ENGINE_SHAPES``) and why not the others. Every hint asks for what a
layer can do (set a value, or empty where empty means "derive it"), never to delete a line: a layer
cannot unset what a lower one sets.

Pure; :mod:`envlayers.topology` decides the shape from what this module parses.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from envlayers import keys
from envlayers.errors import TopologyError

MODES: tuple[str, ...] = keys.allowed("INFERENCE_MODE")
"""Valid values of ``INFERENCE_MODE`` (the keys table declares them)."""
BACKENDS: tuple[str, ...] = keys.allowed("DISTRIBUTED_BACKEND")
"""Valid values of ``DISTRIBUTED_BACKEND`` (the keys table declares them)."""

# the defaults the planner names in its messages: the table's (envlayers.keys)
DEFAULT_NODES = keys.BY_NAME["INFERENCE_NODES"].default
DEFAULT_GPUS_PER_NODE = keys.BY_NAME["GPUS_PER_NODE"].default
DEFAULT_INSTANCES = keys.BY_NAME["NUMBER_OF_INSTANCES"].default
DEFAULT_SERVER_PORT = keys.BY_NAME["SERVER_PORT"].default
DEFAULT_RDZV_PORT = keys.BY_NAME["RDZV_PORT"].default
DEFAULT_DP_RPC_PORT = keys.BY_NAME["DATA_PARALLEL_RPC_PORT"].default

SHAPES: tuple[str, ...] = ("single", "pipeline", "replicas", "data-parallel", "ray", "gateway")

# Which shapes each engine can serve, and why not the others (refused at submit time).
ENGINE_SHAPES: dict[str, tuple[str, ...]] = {
    "vllm": SHAPES,
    "sglang": ("single", "pipeline", "replicas"),
}
_SGLANG_WHY = {
    "data-parallel": ("SGLang puts several instances behind one endpoint through its router (sgl-router), "
                      "not through a data-parallel launch",
                      "INFERENCE_MODE=replicas and ROUTER=smg for one SGLang server per node behind one router "
                      "URL, or INFERENCE_ENGINE=vllm"),
    "ray": ("SGLang has no Ray executor: it spans nodes with its own rendezvous (--nnodes, --dist-init-addr)",
            "set DISTRIBUTED_BACKEND= (empty): SGLang then uses its own rendezvous"),
    "gateway": ("the Ray Serve gateway starts a vllm serve with the Ray executor for each instance; SGLang has "
                "no Ray executor", "INFERENCE_ENGINE=vllm, or NUMBER_OF_INSTANCES=1 and USE_RAY_SERVE=false"),
}

TP_PP = "TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE"
WHERE_TP_PP = "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE"
IDLE_COST = "would be allocated and billed for the job's full walltime while sitting idle"


# --------------------------------------------------------------------------- parsing


def count(env: Mapping[str, str], key: str, default: int | None, *, default_text: str = "") -> int | None:
    """A positive integer key (``envlayers.keys``); absent -> ``default`` (``None``: derived later), empty -> error
    whose hint suggests ``default_text`` (a derived value) or the default."""
    return keys.value(env, key, default, shown=default_text or None)


def port(env: Mapping[str, str], key: str, default: int) -> int:
    """A TCP port key (``envlayers.keys``); absent -> ``default``, empty -> error."""
    return keys.value(env, key, default)


def mode(env: Mapping[str, str]) -> str | None:
    value = env.get("INFERENCE_MODE")
    if value is None or value.strip() == "":
        return None
    text = value.strip()
    if text not in MODES:
        raise TopologyError(
            f"unknown mode {value!r}; valid modes: {', '.join(MODES)}",
            where="INFERENCE_MODE",
            hint="set INFERENCE_MODE= (empty) to derive the mode from INFERENCE_NODES and "
            "TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE",
        )
    return text


def backend(env: Mapping[str, str]) -> str | None:
    """``DISTRIBUTED_BACKEND``: absent or empty -> ``None`` (the planner's rule decides)."""
    value = env.get("DISTRIBUTED_BACKEND")
    if value is None or value.strip() == "":
        return None
    text = value.strip().lower()
    if text not in BACKENDS:
        raise TopologyError(
            f"unknown backend {value!r}; valid backends: {', '.join(BACKENDS)}",
            where="DISTRIBUTED_BACKEND",
            hint="set DISTRIBUTED_BACKEND= (empty) to let the planner choose: native unless tensor parallelism is "
            "larger than one node's GPUs",
        )
    return text


def use_ray_serve(env: Mapping[str, str]) -> bool:
    """``USE_RAY_SERVE``: a boolean key (``envlayers.keys``' one rule); absent or empty -> false."""
    return keys.value(env, "USE_RAY_SERVE")


# --------------------------------------------------------------------------- derivation


class Parallelism(NamedTuple):
    """TP and PP per instance, and which of them the planner derived (``None``: the user's value)."""

    tp: int
    pp: int
    tp_derived: str | None
    pp_derived: str | None


def derive(nodes: int, gpn: int, instances: int, tp: int | None, pp: int | None) -> Parallelism:
    """Fill in an absent TP or PP from the allocation; a value the layers set is kept as it is.

    TP absent: ``GPUS_PER_NODE``, or, when several instances share a node, that node's GPUs
    divided among them. PP absent: the nodes one instance spans (``INFERENCE_NODES /
    NUMBER_OF_INSTANCES``, at least 1), divided by the nodes its tensor-parallel group already
    spans. A shape the numbers cannot fill is left for the checks to refuse, with the fix.
    """
    tp_why = pp_why = None
    if tp is None:
        if instances > nodes and (nodes * gpn) % instances == 0:
            share = nodes * gpn // instances
            per_pp = pp or 1
            tp = share // per_pp if share % per_pp == 0 else share
            tp_why = f"INFERENCE_NODES x GPUS_PER_NODE / NUMBER_OF_INSTANCES = {nodes * gpn} / {instances}"
            if pp and share % pp == 0:
                tp_why += f" / PIPELINE_PARALLEL_SIZE {pp}"
        else:
            tp = gpn
            tp_why = f"GPUS_PER_NODE = {gpn}"
    if pp is None:
        per_instance = nodes // instances if instances <= nodes and nodes % instances == 0 else 1
        tp_nodes = tp // gpn if tp > gpn and tp % gpn == 0 else 1
        pp = per_instance // tp_nodes if per_instance % tp_nodes == 0 and per_instance >= tp_nodes else 1
        if tp_nodes > 1:
            pp_why = f"one instance spans {per_instance} node(s), its tp={tp} already {tp_nodes}"
        else:
            pp_why = f"one instance spans {per_instance} node(s)"
    return Parallelism(tp, pp, tp_why, pp_why)


def pp_for_allocation(nodes: int, gpn: int, tp: int, pp: int) -> int | None:
    """The PP that makes one instance of ``tp`` cover every GPU of the allocation, when a higher layer
    set ``INFERENCE_NODES`` over a lower layer's PP; ``None`` when ``pp`` stays (it already covers the
    allocation, the GPUs do not divide by tp, or it fits one node, where fewer GPUs are allowed) and the
    usual checks judge it."""
    total = nodes * gpn
    if total % tp != 0 or total // tp == pp:
        return None
    if nodes == 1 and tp * pp <= gpn:
        return None
    return total // tp


# --------------------------------------------------------------------------- errors


def alloc_text(nodes: int, gpn: int) -> str:
    return f"INFERENCE_NODES x GPUS_PER_NODE = {nodes} x {gpn} = {nodes * gpn} GPU(s) are allocated"


def idle_error(nodes: int, gpn: int, tp: int, pp: int) -> TopologyError:
    total = nodes * gpn
    used = tp * pp
    fixes: list[str] = []
    if total % tp == 0:
        fixes.append(f"set PIPELINE_PARALLEL_SIZE={total // tp}")
    else:
        fixes.append(f"set TENSOR_PARALLEL_SIZE={gpn} and PIPELINE_PARALLEL_SIZE={nodes}")
    if used <= gpn:
        fixes.append("INFERENCE_MODE=replicas for independent servers")
    elif used % gpn == 0:
        fixes.append(f"INFERENCE_NODES={used // gpn}")
    return TopologyError(
        f"{TP_PP} = {tp} x {pp} uses {used} GPU(s), but {alloc_text(nodes, gpn)}; "
        f"{total - used} GPU(s) would sit idle and be billed for the whole walltime",
        where=WHERE_TP_PP,
        hint=", or ".join(fixes),
    )


def missing_error(nodes: int, gpn: int, tp: int, pp: int) -> TopologyError:
    total = nodes * gpn
    used = tp * pp
    fixes: list[str] = []
    if used % gpn == 0:
        fixes.append(f"set INFERENCE_NODES={used // gpn}")
    if total % tp == 0:
        fixes.append(f"PIPELINE_PARALLEL_SIZE={total // tp}")
    elif total % pp == 0:
        fixes.append(f"TENSOR_PARALLEL_SIZE={total // pp}")
    if not fixes:
        fixes.append(f"set TENSOR_PARALLEL_SIZE={gpn} and PIPELINE_PARALLEL_SIZE={nodes}")
    elif not fixes[0].startswith("set "):
        fixes[0] = "set " + fixes[0]
    return TopologyError(
        f"{TP_PP} = {tp} x {pp} needs {used} GPU(s), but {alloc_text(nodes, gpn)}; "
        f"{used - total} GPU(s) are missing, so the server would fail at start after the job waited in the queue",
        where=WHERE_TP_PP,
        hint=", or ".join(fixes),
    )


def replica_too_big_error(nodes: int, gpn: int, tp: int, pp: int) -> TopologyError:
    used = tp * pp
    fixes = []
    if used == nodes * gpn:
        fixes.append(f"set INFERENCE_MODE= (empty) for one instance across the {nodes} nodes")
    if tp <= gpn and gpn % tp == 0:
        fixes.append(f"PIPELINE_PARALLEL_SIZE={gpn // tp}")
    elif gpn % pp == 0:
        fixes.append(f"TENSOR_PARALLEL_SIZE={gpn // pp}")
    else:
        fixes.append(f"TENSOR_PARALLEL_SIZE={gpn} and PIPELINE_PARALLEL_SIZE=1")
    if not fixes[0].startswith("set INFERENCE_MODE="):
        fixes[0] = "set " + fixes[0]
    elif len(fixes) > 1:
        fixes[1] = f"set {fixes[1]} if one node's memory holds the model"
    return TopologyError(
        f"{TP_PP} = {tp} x {pp} needs {used} GPU(s) per replica, but INFERENCE_MODE=replicas runs one "
        f"independent server per node and a node has GPUS_PER_NODE = {gpn} GPU(s); "
        f"the server would fail at start after the job waited in the queue",
        where=WHERE_TP_PP,
        hint=", or ".join(fixes),
    )


def replicas_idle_error(nodes: int, gpn: int, tp: int, pp: int) -> TopologyError:
    used = tp * pp
    per_node = gpn // used
    return TopologyError(
        f"{TP_PP} = {tp} x {pp} uses {used} GPU(s) per replica, but INFERENCE_MODE=replicas runs one server "
        f"on each of the {nodes} nodes of {gpn} GPU(s); the remaining {(gpn - used) * nodes} GPU(s) {IDLE_COST}",
        where=WHERE_TP_PP,
        hint=f"set TENSOR_PARALLEL_SIZE={gpn // pp if gpn % pp == 0 else gpn} to use each node, or set "
        f"INFERENCE_MODE= (empty) and NUMBER_OF_INSTANCES={per_node * nodes} for {per_node} instance(s) per node "
        "behind one endpoint (vLLM)",
    )


def instance_idle_error(what: str, used: int, nodes: int, gpn: int, hint: str) -> TopologyError:
    """An override whose GPUs do not add up to a multi-node allocation."""
    total = nodes * gpn
    return TopologyError(
        f"{what} uses {used} GPU(s), but {alloc_text(nodes, gpn)}; the remaining {total - used} GPU(s) {IDLE_COST}",
        where=f"{WHERE_TP_PP}, NUMBER_OF_INSTANCES",
        hint=hint,
    )


def instances_missing_error(what: str, used: int, nodes: int, gpn: int, hint: str) -> TopologyError:
    total = nodes * gpn
    return TopologyError(
        f"{what} needs {used} GPU(s), but {alloc_text(nodes, gpn)}; {used - total} GPU(s) are missing, so the "
        "servers would fail at start after the job waited in the queue",
        where=f"{WHERE_TP_PP}, NUMBER_OF_INSTANCES",
        hint=hint,
    )


def conflict(message: str, where: str, hint: str) -> TopologyError:
    return TopologyError(message, where=where, hint=hint)


def check_engine(engine: str | None, shape: str, why_shape: str) -> None:
    if engine is None or engine not in ENGINE_SHAPES or shape in ENGINE_SHAPES[engine]:
        return
    why, hint = _SGLANG_WHY[shape]
    raise TopologyError(f"the plan is {shape} ({why_shape}), but {why}", where="INFERENCE_ENGINE", hint=hint)


def check_ports(a_key: str, a: int, b_key: str, b: int, default: int) -> None:
    if a == b:
        raise TopologyError(
            f"{a_key} and {b_key} are both {a}; rank 0 binds both on the same node",
            where=f"{a_key}, {b_key}",
            hint=f"set {a_key}={default if default != b else default + 1}, or another port",
        )
